package client

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// Fallback says how a client decides a key once it holds no live lease for
// it and no lease server answers.
type Fallback int

const (
	// FallbackSafeRate limits each key locally with an x/time/rate limiter
	// at the safe_rate the servers gave for that key: the rule's rate
	// divided by the clients holding leases on it, so that the fleet as a
	// whole stays near the limit. The client keeps about the lowest safe
	// rate given lately (a drop is followed at once, a rise slowly). A key
	// the client never leased has no safe rate and uses
	// Config.DefaultSafeRate (0: denied). The limiter's burst is a tenth of
	// a second's worth, at least 1 token: a decision for more tokens than
	// that is denied, with no RetryAfter, while the fallback decides. The
	// default.
	FallbackSafeRate Fallback = iota
	// FallbackOpen allows every request: availability over the limit.
	FallbackOpen
	// FallbackClosed denies every request: the limit over availability.
	FallbackClosed
)

// String returns "safe_rate", "open" or "closed".
func (f Fallback) String() string {
	switch f {
	case FallbackSafeRate:
		return "safe_rate"
	case FallbackOpen:
		return "open"
	case FallbackClosed:
		return "closed"
	}
	return fmt.Sprintf("Fallback(%d)", int(f))
}

// Config configures a Client. Only Servers is required; every zero value
// means the documented default. New fails with an error matching
// ErrInvalidConfig, naming the field, on a value it cannot work with,
// among them any negative duration or count but ProbeTimeout (whose
// negative skips New's probe).
type Config struct {
	// Servers are the base URLs of the lease servers, for example
	// "http://10.0.0.1:8080" (a path is kept, for a server behind a
	// proxy; a query, a fragment, an API path such as /v1/leases, or no
	// host name fails New). Lease calls go to one at a time, moving to
	// the next when one fails; direct takes are routed by key (see
	// NoKeyRouting). Required.
	Servers []string
	// NoKeyRouting turns off the routing of direct takes by key. By
	// default (false), with several Servers, each direct take goes to the
	// server its first key prefers: the first, in the key's rendezvous
	// order over Servers (highest random weight of the server's URL and
	// the key), that is not avoided after a failure; so a key's direct
	// takes, from every process that lists the same URLs in any order,
	// meet at one server, which can concentrate their demand. The takes
	// of one moment go as one call per server, concurrently. Routing only
	// concentrates: any server decides any key correctly. With
	// NoKeyRouting, direct takes go like lease calls, to one server at a
	// time.
	NoKeyRouting bool
	// Token is sent as "Authorization: Bearer <Token>" when set. A token
	// holding a control character (a newline kept from the file it was
	// read from) fails New: no HTTP header carries it.
	Token string
	// ClientID names this process to the servers: 1 to
	// protocol.MaxClientIDBytes bytes of printable ASCII without spaces
	// (New fails on another, which the servers refuse); default
	// "<hostname>-<pid>-<random>", the hostname cut to fit and its other
	// bytes replaced by '_'. Two processes must not share one.
	ClientID string
	// Fallback applies to a key once its lease has ended and no server
	// answers. Default FallbackSafeRate.
	Fallback Fallback
	// Priority is the process's default priority class: critical, high,
	// normal or low (see WithPriority); empty means normal. Every lease
	// the client takes, and every decision without a class of its own,
	// carries it: a rule that reserves shares for the classes above it
	// serves them only from what lies beyond their reserve.
	Priority string
	// DefaultSafeRate is the rate, in requests per second, FallbackSafeRate
	// allows for a key the client never got a safe_rate for. Default 0:
	// such keys are denied.
	DefaultSafeRate float64

	// ColdStartTimeout is not used.
	//
	// Deprecated: a key without a live lease is decided by a direct take,
	// which waits for its answer (about one round trip) and never for a
	// lease; the fallback decides only while no server answers. Bound a
	// decision with its context.
	ColdStartTimeout time.Duration
	// LeaseMinTokens moves a key to leases once this process is admitted at
	// least this many of its tokens over one lease TTL (an average of its
	// direct decisions), or half as many at a pace of twice as many per
	// TTL (a key that just became hot; the decisions waiting for a young
	// key's answer count, as far as the bucket has room for them); below
	// that each decision is a direct take. A
	// leased key returns to direct takes when a lease is not spent from by
	// half its TTL, or its demand over a lease TTL falls below half
	// this. A key whose bucket is smaller than four times this is never
	// leased: a batch is at most a quarter of the bucket, and a smaller one
	// would run out before it saved a call. Default 8; 1 leases a key after
	// its first decision.
	LeaseMinTokens int64
	// SettleInterval is the tick of the background settle loop: at each
	// tick, one call carries every key that needs settling. Default 10ms;
	// at least MinSettleInterval (1ms), or New fails.
	SettleInterval time.Duration
	// Horizon is how far ahead a batch should last: the client asks for
	// its recent demand (an EWMA) times Horizon, at most half the lease
	// TTL's worth. Default 1s. A roomy key's renewal (see the package
	// documentation) lasts instead until its late renewal point, three
	// quarters of the lease TTL.
	Horizon time.Duration
	// InitialBatch is the least first batch of a key that moves to leases
	// (its demand measured so far may lag). Default 10. A batch is never
	// more than a quarter of the key's bucket.
	InitialBatch int64
	// MaxBatch caps any batch asked for. Default protocol.MaxCount (the
	// server caps a grant by the bucket size anyway), as is any value
	// above it.
	MaxBatch int64
	// IdleTimeout returns the lease of a key not used for this long and
	// forgets the key. Default 30s.
	IdleTimeout time.Duration
	// MaxWait is the longest Wait waits for the slot of a key whose rule
	// shapes (leaky_bucket): a Wait whose slot starts later fails at once
	// with an error matching ErrRateLimited and takes nothing, as a
	// reservation of golang.org/x/time/rate that is cancelled. The
	// context's deadline bounds it too; WithMaxWait sets it for one call.
	// Default DefaultMaxWait (1s).
	MaxWait time.Duration
	// MaxKeys is the most keys holding a lease at once: before a new key's
	// lease is installed, the least recently used keys are settled,
	// returned and forgotten to make room. Default 10,000.
	MaxKeys int

	// RequestTimeout bounds one HTTP attempt. Default 1s.
	RequestTimeout time.Duration
	// MaxRetryWait caps any wait between two attempts, whatever a server's
	// Retry-After says. Default 1s.
	MaxRetryWait time.Duration
	// ProbeTimeout bounds the probe New sends before it returns (GET
	// /v1/rules with Token, to each server in turn until one answers): New
	// fails when a server answers 401 or 403, and starts anyway when none
	// answers within ProbeTimeout. Default 2s; negative skips the probe.
	ProbeTimeout time.Duration
	// HTTPClient makes the calls to the lease servers; nil means a pooled
	// client of its own (go-cleanhttp's, keeping at least six idle
	// connections per server). Its Timeout is replaced by RequestTimeout,
	// which bounds each attempt.
	HTTPClient *http.Client
	// Logger receives the client's logs; nil discards them.
	Logger *slog.Logger
	// OnServerError, when set, is called after a call to the lease servers
	// failed on every server, and after each call a server refused as a
	// whole (its error matches ErrServerRefused: see Stats.Refusals), from
	// the settle loop or from the goroutine of a direct call (which may be
	// a deciding one); it must not block.
	OnServerError func(err error)
}

// MinSettleInterval is the shortest Config.SettleInterval New accepts.
const MinSettleInterval = time.Millisecond

// Errors of New.
var (
	// ErrInvalidConfig is matched by the error of New for a Config it
	// cannot work with (a Servers URL that is not one, a Token net/http
	// cannot send, a ClientID the servers refuse, an unknown Fallback or
	// Priority, a negative duration or count, a SettleInterval below
	// MinSettleInterval, a DefaultSafeRate negative or not a number): the
	// error names the field.
	// It is never a rate limit nor a refusal by a server: New checks the
	// Config before it calls any.
	ErrInvalidConfig = errors.New("client: invalid Config")
	// ErrNoServers is returned by New when Config.Servers is empty. It
	// matches ErrInvalidConfig.
	ErrNoServers = fmt.Errorf("%w: no lease servers configured: set Config.Servers", ErrInvalidConfig)
)

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if len(cfg.Servers) == 0 {
		return cfg, ErrNoServers
	}
	servers := make([]string, len(cfg.Servers))
	for i, s := range cfg.Servers {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, fmt.Errorf("%w: Servers: %q is not an http:// or https:// URL", ErrInvalidConfig, s)
		}
		if err := checkBaseURL(s, u); err != nil {
			return cfg, fmt.Errorf("%w: Servers: %q %w", ErrInvalidConfig, s, err)
		}
		servers[i] = strings.TrimRight(s, "/")
	}
	cfg.Servers = servers
	if i := strings.IndexFunc(cfg.Token, isControl); i >= 0 {
		// net/http refuses to send such a header: every call failed as
		// if no server answered, and the fallback decided (found by the
		// API review: a token read from a file, its newline kept).
		return cfg, fmt.Errorf("%w: Token holds a control character (%q at byte %d; a trailing newline from the file it was read from?): an HTTP header cannot carry it", ErrInvalidConfig, cfg.Token[i], i)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = defaultClientID()
	} else if err := protocol.ValidateClientID(cfg.ClientID); err != nil {
		// The servers refuse every call of it (invalid_client_id).
		return cfg, fmt.Errorf("%w: ClientID: %w", ErrInvalidConfig, err)
	}
	if err := protocol.ValidatePriority(cfg.Priority); err != nil {
		return cfg, fmt.Errorf("%w: Priority: %w", ErrInvalidConfig, err)
	}
	cfg.Priority = normalPriority(cfg.Priority)
	if cfg.Fallback < FallbackSafeRate || cfg.Fallback > FallbackClosed {
		return cfg, fmt.Errorf("%w: Fallback: unknown fallback %d", ErrInvalidConfig, cfg.Fallback)
	}
	if !(cfg.DefaultSafeRate >= 0) {
		return cfg, fmt.Errorf("%w: DefaultSafeRate is %g; it must be 0 or more", ErrInvalidConfig, cfg.DefaultSafeRate)
	}
	// A negative duration or count has no meaning (but ProbeTimeout's):
	// taken for zero, its default was put in its place without a word
	// (IdleTimeout -1, meant as "never", forgot keys after 30 s; found by
	// the API review). The inbound limiters refuse a negative MaxWait so.
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"SettleInterval", cfg.SettleInterval},
		{"Horizon", cfg.Horizon},
		{"IdleTimeout", cfg.IdleTimeout},
		{"RequestTimeout", cfg.RequestTimeout},
		{"MaxRetryWait", cfg.MaxRetryWait},
		{"MaxWait", cfg.MaxWait},
	} {
		if f.v < 0 {
			return cfg, fmt.Errorf("%w: %s is %v, negative; zero means its default", ErrInvalidConfig, f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"LeaseMinTokens", cfg.LeaseMinTokens},
		{"InitialBatch", cfg.InitialBatch},
		{"MaxBatch", cfg.MaxBatch},
		{"MaxKeys", int64(cfg.MaxKeys)},
	} {
		if f.v < 0 {
			return cfg, fmt.Errorf("%w: %s is %d, negative; zero means its default", ErrInvalidConfig, f.name, f.v)
		}
	}
	if cfg.SettleInterval > 0 && cfg.SettleInterval < MinSettleInterval {
		// An idle client ticking every microsecond used a third of a
		// core (367 ms of CPU a second at 1 ns, 6.5 ms at the default).
		return cfg, fmt.Errorf("%w: SettleInterval is %v, below MinSettleInterval (%v): the settle loop would spin", ErrInvalidConfig, cfg.SettleInterval, MinSettleInterval)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.SettleInterval, 10*time.Millisecond)
	def(&cfg.Horizon, time.Second)
	def(&cfg.IdleTimeout, 30*time.Second)
	def(&cfg.RequestTimeout, time.Second)
	def(&cfg.MaxRetryWait, time.Second)
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 2 * time.Second
	}
	def(&cfg.MaxWait, DefaultMaxWait)
	if cfg.LeaseMinTokens == 0 {
		cfg.LeaseMinTokens = 8
	}
	if cfg.InitialBatch == 0 {
		cfg.InitialBatch = 10
	}
	if cfg.MaxBatch == 0 || cfg.MaxBatch > protocol.MaxCount {
		cfg.MaxBatch = protocol.MaxCount
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = 10_000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// isControl reports whether r is an ASCII control character, which no
// HTTP header value carries (but for a tab, refused here too).
func isControl(r rune) bool { return r < ' ' || r == 0x7f }

// defaultClientID returns "<hostname>-<pid>-<random>", the hostname cut
// to what a client_id holds and each byte of it that is not printable
// ASCII, or is a space, replaced by '_': the servers refuse any other.
func defaultClientID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "client"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := fmt.Sprintf("-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	h := []byte(host[:min(len(host), protocol.MaxClientIDBytes-len(suffix))])
	for i, c := range h {
		if c <= ' ' || c >= 0x7f {
			h[i] = '_'
		}
	}
	return string(h) + suffix
}

// checkBaseURL returns why u, parsed from s, cannot be a lease server's
// base URL, which each call appends its API path to (protocol.PathLeases,
// ...): a query or a fragment would swallow the path (every call a 404),
// an API path of its own doubles it, and a URL without a host name dials
// this machine.
func checkBaseURL(s string, u *url.URL) error {
	switch {
	case u.Hostname() == "":
		return errors.New("has no host name")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("has a query: give the server's base URL, to which the client appends the API's paths")
	case strings.Contains(s, "#"):
		return errors.New("has a fragment: give the server's base URL, to which the client appends the API's paths")
	}
	path := strings.TrimRight(u.Path, "/")
	for _, p := range []string{protocol.PathLeases, protocol.PathCheck, protocol.PathRules} {
		if strings.HasSuffix(path, p) {
			return fmt.Errorf("ends with the API path %s: give the server's base URL, to which the client appends it", p)
		}
	}
	return nil
}
