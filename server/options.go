package server

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// Defaults of Options.
const (
	// DefaultReloadInterval is how often the rules file is checked for
	// changes when Options.ReloadInterval is zero.
	DefaultReloadInterval = 500 * time.Millisecond
	// DefaultStoreTimeout bounds one request's store calls when
	// Options.StoreTimeout is zero. It leaves a fifth of a second for the
	// rest of the request, so that while the store hangs a call is answered
	// 503 within one second (see Options.StoreTimeout).
	DefaultStoreTimeout = 800 * time.Millisecond
	// DefaultShutdownTimeout is how long Run waits for in-flight requests
	// when Options.ShutdownTimeout is zero.
	DefaultShutdownTimeout = 10 * time.Second
	// ReadyTimeout bounds the store ping of GET /readyz.
	ReadyTimeout = time.Second
	// DefaultMaxKeysPerClient is the cap on the keys one client may hold
	// leases on through one server when Options.MaxKeysPerClient is zero.
	DefaultMaxKeysPerClient = 100_000
)

// Registry is where a Server registers its metrics and what GET /metrics
// serves. A *prometheus.Registry is one.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Options configure a Server. Only Store is required; the zero value of
// every other field is a sane default.
type Options struct {
	// Store keeps the buckets and leases: leases.NewMemoryStore for a single
	// lease server, leases.NewRedisStore to share the limits across
	// servers. Required. The Server never closes it: the caller does, after
	// Run has returned.
	Store leases.Store

	// RulesPath is the rules file (YAML, see RulesFile). It is read by New,
	// which fails when the file is missing or invalid, and then polled for
	// changes. Empty means no rules file: every key is unlimited and the
	// API needs no authentication.
	RulesPath string

	// ReloadInterval is how often the rules file is checked for changes.
	// Zero means DefaultReloadInterval; a negative value disables polling
	// (Reload still works).
	ReloadInterval time.Duration

	// ListenAddr is the address the server will listen on, used to refuse
	// an address that is not loopback when the rules file configures no
	// clients (see Insecure), at start and at every reload. New checks it
	// when it is set, so that a daemon fails before it binds; Run checks
	// its listener's address in every case. When it is empty and Run is
	// not used (Handler mounted in an http.Server of your own), no check is
	// made: exposing the handler safely is then the caller's job.
	ListenAddr string

	// Insecure allows listening on a non-loopback address without client
	// authentication, for a network where every caller is trusted.
	Insecure bool

	// Logger receives the server's logs. Nil discards them.
	Logger *slog.Logger

	// Registry receives the server's metrics and is what GET /metrics
	// serves. Nil means a fresh prometheus.NewRegistry(); the global
	// default registry is never used implicitly. Two Servers cannot share
	// one Registry: their metrics would collide.
	Registry Registry

	// MaxBodyBytes is the largest request body accepted. Zero means
	// protocol.MaxBodyBytes, which is also the most: larger values are
	// lowered to it.
	MaxBodyBytes int64

	// StoreTimeout bounds the store calls of one request, so that a hung
	// store answers 503 rather than holding the caller: the request's
	// context for the store expires after StoreTimeout, and the call is then
	// answered 503 store_unavailable with "Retry-After: 1". Zero means
	// DefaultStoreTimeout.
	//
	// The bound holds only when the store gives up at its context's
	// deadline. The memory store never blocks; a Redis store does when its
	// go-redis client has ContextTimeoutEnabled set (without it go-redis
	// ignores deadlines on reads and writes, and a hung Redis holds the
	// call for its ReadTimeout and every retry). rateleased sets it.
	StoreTimeout time.Duration

	// DrainDelay is how long Run keeps serving after its context is
	// canceled, before it stops accepting connections. During the delay GET
	// /readyz answers 503 (code shutting_down) while every other route
	// serves as usual, so that a load balancer that polls /readyz takes the
	// server out of rotation while it still answers. Set it to the time the
	// load balancer needs to notice: its check interval times the failures
	// it waits for (for a Kubernetes readiness probe, periodSeconds ×
	// failureThreshold), plus a margin.
	//
	// Zero, the default, means no delay: Run stops accepting connections
	// as soon as its context is canceled, so only requests already in
	// flight can see /readyz answer 503, and a load balancer learns of the
	// shutdown from refused connections. A negative value is zero. The
	// delay comes before ShutdownTimeout and is not part of it.
	DrainDelay time.Duration

	// ShutdownTimeout is how long Run waits for in-flight requests once it
	// has stopped accepting connections (after DrainDelay), before it
	// closes the remaining connections. Zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	// MaxKeysPerClient caps the distinct keys on which one client (an
	// authenticated client name, or the anonymous client of a server
	// without clients, whatever the client_id) holds leases granted by this
	// server: the state its leases keep in the store, which lives as long
	// as they do. A key counts from the grant of a lease on it until the
	// latest of its leases' expiries (the grant's time plus its TTL), even
	// when the lease was returned sooner. The count is per lease server:
	// each server counts the leases it granted, so behind N servers a
	// client may hold up to N times the cap.
	//
	// Direct takes (POST /v1/check, and the takes of POST /v1/leases) are
	// not counted: they are how the SDK decides per-user keys, millions of
	// them, and a cap would refuse users. The state a take creates
	// expires once its bucket is full again: for a token bucket at most
	// burst/rate after the take (the rule's period when burst is the
	// limit), but a lease TTL after it at least when the take went
	// through a leases.OwningStore (rateleased -own-keys, the default),
	// which records the server that took for that long (see
	// leases.Owning); for fixed_window at the window's end, for
	// sliding_window_counter two windows after the take's window starts,
	// for sliding_window_log a window after the take (rounded up to 1/64
	// of it), for leaky_bucket once its queue has drained. RedisStore's
	// keys live a second more (TestRedisTakeStateExpiry), MemoryStore
	// drops the bucket at its next sweep. So the state a
	// client's takes keep is bounded by the distinct keys it takes from
	// per unit of time times that time, not by this cap: bound that rate
	// with the client's key patterns and at its callers.
	//
	// A lease entry that asks for tokens on a key the client does not hold
	// while it holds the cap fails alone with code too_many_keys (429) and
	// never reaches the store; the other entries of the call are served.
	// Entries that settle a lease (with a lease_id), entries on keys the
	// client holds, and keys neither a rule nor an override limits (they
	// keep no state) are never refused. Zero means DefaultMaxKeysPerClient; a negative value means
	// no cap.
	MaxKeysPerClient int

	// Now returns the current time, for the expiries of MaxKeysPerClient.
	// Nil means time.Now; tests set it to drive expiries.
	Now func() time.Time

	// TLSConfig, when set, makes Run serve HTTPS (HTTP/1.1 and HTTP/2
	// negotiated by ALPN) instead of plain HTTP/1.1 and h2c. It must hold a
	// certificate (Certificates or GetCertificate); Run serves a clone.
	// rateleased builds it from -tls-cert and -tls-key.
	TLSConfig *tls.Config

	// MetricsTokenSHA256, when set, is the hex SHA-256 of a bearer token
	// that GET /metrics and GET /status require ("Authorization: Bearer
	// <token>"; compute it with `printf %s "$TOKEN" | sha256sum | cut -d' '
	// -f1`): a request without it gets 401. Empty leaves both open, as they
	// are by default. The clients of the rules file do not apply to them: a
	// scraper is not a client.
	MetricsTokenSHA256 string

	// Peers, when set, is where the servers sharing the store record
	// themselves every PeerInterval and publish their status snapshots
	// every other one (see fleet.go), so
	// that the status page (/status) lists those seen in the last
	// PeerWindow and shows the figures of them all: NewRedisPeers over the
	// Redis client of the store. Nil shows this server alone.
	Peers Peers
	// RuleDB is the rule database (rules, clients and per-key overrides in
	// Redis; see RuleDB). With RuleDB set and RulesPath empty, the server
	// runs in database mode: New reads the rule set from the database and
	// fails when it is invalid. When the database does not answer, New
	// returns a server that answers every API call (and /readyz) 503
	// store_unavailable until it has read the rule set, which it tries
	// every DBCheckInterval; its exposure (ListenAddr) is checked then. So
	// it does when Redis answers but refuses its commands on the database
	// (a wrong password, NOPERM for an ACL whose key patterns do not reach
	// the database's keys), a misconfiguration it logs at ERROR, and the
	// 503's detail says which of these it waits for. The
	// server follows the database's changes within
	// DBCheckInterval (at once, through pub/sub, as a rule); per-key
	// overrides are looked up on first use and cached (OverrideCacheSize,
	// OverrideCacheTTL). With RulesPath set too, the rules file is in
	// force (file mode) and the database is only what the admin API
	// edits, for instance to seed it before servers move to database mode.
	// The admin API needs RuleDB, and AdminTokenSHA256 or an admin client
	// in the rules in force.
	RuleDB *RuleDB

	// AdminTokenSHA256 is the hex SHA-256 of the bearer token of the
	// bootstrap admin, which the admin API (/v1/admin/...) accepts besides
	// the tokens of the admin clients of the rules in force (clients with
	// admin: true). Empty means no bootstrap admin: only admin clients may
	// use the admin API, and a change of the rule database that would leave
	// none is refused (see Server.adminRoutes). rateleased takes it from
	// -admin-token-sha256.
	AdminTokenSHA256 string

	// AdminName is the name of the bootstrap admin in the change log and
	// the logs. Empty means AdminPrincipal ("admin"). It follows the rules
	// of client names, and no admin client may take it while a bootstrap
	// admin is configured, so that the change log tells them apart.
	// rateleased takes it from -admin-name.
	AdminName string

	// DBCheckInterval is how often a server in database mode checks the
	// database's version, in case it missed a change notice. Zero means
	// DefaultDBCheckInterval.
	DBCheckInterval time.Duration

	// OverrideCacheSize bounds the overrides (and keys known to have none)
	// a server in database mode caches, least recently used first out.
	// Zero means DefaultOverrideCacheSize.
	OverrideCacheSize int

	// OverrideCacheTTL is how long a cached override, or a key's lack of
	// one, is used before it is read again; changes invalidate it sooner.
	// Zero means DefaultOverrideCacheTTL.
	OverrideCacheTTL time.Duration
}

// withDefaults validates o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Store == nil {
		return o, errors.New("server: Options.Store is nil: pass leases.NewMemoryStore(leases.MemoryOptions{}) or a leases.NewRedisStore")
	}
	if o.ReloadInterval == 0 {
		o.ReloadInterval = DefaultReloadInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.MaxBodyBytes <= 0 || o.MaxBodyBytes > protocol.MaxBodyBytes {
		o.MaxBodyBytes = protocol.MaxBodyBytes
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.DrainDelay < 0 {
		o.DrainDelay = 0
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.MaxKeysPerClient == 0 {
		o.MaxKeysPerClient = DefaultMaxKeysPerClient
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.DBCheckInterval <= 0 {
		o.DBCheckInterval = DefaultDBCheckInterval
	}
	if o.OverrideCacheSize <= 0 {
		o.OverrideCacheSize = DefaultOverrideCacheSize
	}
	if o.OverrideCacheTTL <= 0 {
		o.OverrideCacheTTL = DefaultOverrideCacheTTL
	}
	if o.AdminTokenSHA256 != "" {
		if b, err := hex.DecodeString(o.AdminTokenSHA256); err != nil || len(b) != sha256.Size {
			return o, fmt.Errorf("server: Options.AdminTokenSHA256 is not 64 hex digits: give the SHA-256 of the token, printf %%s \"$TOKEN\" | sha256sum | cut -d' ' -f1")
		}
	}
	if o.AdminName == "" {
		o.AdminName = AdminPrincipal
	}
	if !validClientName(o.AdminName) {
		return o, fmt.Errorf("server: Options.AdminName %q: must be 1 to %d bytes of ASCII letters, digits, '.', '_' and '-'", o.AdminName, maxClientNameBytes)
	}
	if o.TLSConfig != nil && len(o.TLSConfig.Certificates) == 0 && o.TLSConfig.GetCertificate == nil && o.TLSConfig.GetConfigForClient == nil {
		return o, errors.New("server: Options.TLSConfig holds no certificate: set Certificates (tls.LoadX509KeyPair) or GetCertificate")
	}
	if o.MetricsTokenSHA256 != "" {
		if b, err := hex.DecodeString(o.MetricsTokenSHA256); err != nil || len(b) != sha256.Size {
			return o, fmt.Errorf("server: Options.MetricsTokenSHA256 is not 64 hex digits: give the SHA-256 of the token, printf %%s \"$TOKEN\" | sha256sum | cut -d' ' -f1")
		}
	}
	return o, nil
}

// ErrInsecureListen is wrapped by the error of New, Run and Reload when the
// server would accept unauthenticated calls on an address that is not
// loopback.
var ErrInsecureListen = errors.New("refusing to serve a non-loopback address without client authentication")

// ErrEmptyRulesFile is wrapped by the error of Reload when the rules file
// holds nothing but whitespace and comments while the rules in force have
// rules or clients: most likely a file caught while it is rewritten in
// place, which would drop every rule and turn authentication off. A file
// that removes every rule says so: "rules: []".
var ErrEmptyRulesFile = errors.New("the rules file is empty (caught while it is rewritten in place?); write \"rules: []\" to remove every rule")

// checkExposure returns an error wrapping ErrInsecureListen when addr is not
// a loopback address, rules configure no clients, and insecure is false.
func checkExposure(addr string, rules *Rules, insecure bool) error {
	if insecure || rules.authRequired() || isLoopback(addr) {
		return nil
	}
	return fmt.Errorf("server: listen address %q: %w: add a clients section to the rules file (see examples/rules-auth.yaml), listen on a loopback address such as 127.0.0.1:8080, or pass -insecure (Options.Insecure) if every caller on the network is trusted",
		addr, ErrInsecureListen)
}

// isLoopback reports whether the host of addr ("host:port" or a bare host)
// is a loopback address: in 127.0.0.0/8, ::1, or the name "localhost". An
// empty host and unspecified addresses (0.0.0.0, ::) listen on every
// interface and are not loopback; other names are not resolved and count as
// not loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i] // zone, as in fe80::1%eth0
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
