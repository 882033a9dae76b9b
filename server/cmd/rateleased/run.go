package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/server"
)

// failFastTimeout is the dial, read, write and pool timeout of Redis calls
// unless the URL sets them.
const failFastTimeout = 500 * time.Millisecond

// failFastMaxBackoff is the longest pause between two tries of a Redis call
// unless the URL sets max_retry_backoff.
const failFastMaxBackoff = 100 * time.Millisecond

// redisFailFast points at the fields of a redis.Options or a
// redis.ClusterOptions that apply sets: the two types share the fields but
// no interface.
type redisFailFast struct {
	dial, read, write, pool, maxBackoff *time.Duration
	retries, dialerRetries              *int
	redirects                           *int // a cluster's MaxRedirects; nil for one node
	contextTimeout                      *bool
}

func clientFailFast(o *redis.Options) redisFailFast {
	return redisFailFast{
		dial: &o.DialTimeout, read: &o.ReadTimeout, write: &o.WriteTimeout, pool: &o.PoolTimeout,
		maxBackoff: &o.MaxRetryBackoff, retries: &o.MaxRetries, dialerRetries: &o.DialerRetries,
		contextTimeout: &o.ContextTimeoutEnabled,
	}
}

func clusterFailFast(o *redis.ClusterOptions) redisFailFast {
	return redisFailFast{
		dial: &o.DialTimeout, read: &o.ReadTimeout, write: &o.WriteTimeout, pool: &o.PoolTimeout,
		maxBackoff: &o.MaxRetryBackoff, retries: &o.MaxRetries, dialerRetries: &o.DialerRetries,
		redirects: &o.MaxRedirects, contextTimeout: &o.ContextTimeoutEnabled,
	}
}

// apply makes Redis calls fail fast: a lease server that cannot reach Redis
// should answer 503 quickly, so that clients move to another server or to
// their fallback instead of waiting.
//
// The bound itself is the server's -store-timeout: every store call of a
// request runs under a context that expires then, and apply sets
// ContextTimeoutEnabled, always, so that go-redis gives up at that deadline
// whatever it is doing (dialing, the connection handshake, writing, reading,
// waiting for a pooled connection or between retries). Without it go-redis
// ignores deadlines on reads and writes, and a Redis that accepts
// connections but does not answer (a stopped process, a full machine) held a
// call for a read timeout per try: 1.5 to 2.2 s were measured.
//
// Within that bound, the parameters the URL leaves out get: a dial, read,
// write and pool timeout of failFastTimeout, no retry, failFastMaxBackoff
// between dial attempts at most, and one dial attempt. No retry, because a
// store call is a Lua script: one whose answer timed out may have run, and
// running it again applies it twice (a refund twice gives back tokens never
// taken; see leases.RedisStore). A call that fails is answered 503, and the
// client retries it with the next server, as it would any failure. The
// URL's own dial_timeout, read_timeout, write_timeout, pool_timeout,
// max_retries, max_retry_backoff and (for a cluster) dialer_retries win.
//
// On a cluster, no redirection either (MaxRedirects −1) unless the URL sets
// max_redirects: go-redis bounds by it, not by MaxRetries, the tries of a
// cluster command, and sends a command that timed out again, on a new
// connection; a master that stalled and resumes then runs every copy (a
// refund given back twice, measured: 100 − 40 − 40 + 40 + 40, the tokens of
// a take that was never made admitted). Without it a MOVED or ASK reply
// fails that op alone (its key's entry or take, see leases.RedisStore),
// and go-redis reloads its map of the slots, so that the key's next op
// goes to its new node: after a failover or a resharding, each moved slot
// costs a failed op, and while a slot migrates, its keys already moved
// fail.
//
// It takes the options redis.ParseURL or redis.ParseClusterURL returned,
// before the client applies its defaults: there a parameter the URL leaves
// out is zero, while a duration the URL sets is positive, or -1 for one set
// to 0 or less (no timeout). max_retries=0 is zero too, which go-redis also
// takes as "the default": it means no retry here, like max_retries=-1.
func (f redisFailFast) apply() {
	for _, d := range []*time.Duration{f.dial, f.read, f.write, f.pool} {
		if *d == 0 {
			*d = failFastTimeout
		}
	}
	if *f.maxBackoff == 0 {
		*f.maxBackoff = failFastMaxBackoff
	}
	if *f.retries == 0 {
		*f.retries = -1
	}
	if *f.dialerRetries == 0 {
		*f.dialerRetries = 1
	}
	if f.redirects != nil && *f.redirects == 0 {
		*f.redirects = -1
	}
	*f.contextTimeout = true
}

// errUsage is wrapped by the errors of bad flags or environment variables.
var errUsage = errors.New("usage")

// config is the parsed command line.
type config struct {
	listen          string
	rules           string
	redisURL        string
	redisCluster    bool
	ownKeys         bool // own hot token buckets (leases.OwningStore)
	insecure        bool
	logLevel        slog.Level
	logFormat       string
	drainDelay      time.Duration
	shutdownTimeout time.Duration
	storeTimeout    time.Duration
	maxKeys         int
	tlsCert         string
	tlsKey          string
	metricsToken    string // hex SHA-256
	debugAddr       string // net/http/pprof listener; empty: none
	adminToken      string // hex SHA-256
	adminName       string // the bootstrap admin's name in the change log
	check           bool   // validate the rules file and exit
	version         bool   // print the build and exit
}

// run is cli with stdout and stderr on one writer.
func run(ctx context.Context, args []string, env func(string) string, stderr io.Writer) error {
	return cli(ctx, args, env, stderr, stderr, nil)
}

// cli is the daemon: it parses args (without the program name), taking flag
// defaults from env, logs to stderr, and serves until ctx is canceled. It
// returns nil after a graceful shutdown. Startup errors are logged and
// returned; flag errors are printed with the usage and wrap errUsage.
// With -version it prints the build to stdout and returns nil; with -check
// it validates the rules file, prints a one-line summary to stdout and
// returns nil, or prints the rule and field at fault to stderr and returns
// the error (wrapping errInvalidRules). When logTo is set, it is given the
// daemon's logger before anything starts: main has the go-redis client log
// through it (a setting of the process's, which tests leave alone).
func cli(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer, logTo func(*slog.Logger)) error {
	cfg, err := parseFlags(args, env, stderr)
	if err != nil {
		return err
	}
	if cfg.version {
		b := server.ReadBuild()
		fmt.Fprintf(stdout, "rateleased %s (revision %s, %s)\n", b.Version, b.Revision, b.GoVersion)
		return nil
	}
	if cfg.check {
		return checkRules(cfg.rules, stdout, stderr)
	}
	log := newLogger(cfg, stderr)
	if logTo != nil {
		logTo(log)
	}
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("rateleased failed", "err", err)
		return err
	}
	return nil
}

// errInvalidRules is wrapped by the error of -check on a rules file that
// does not load.
var errInvalidRules = errors.New("invalid rules file")

// checkRules is -check: it loads the rules file at path as the server
// would, without a store or a listener.
func checkRules(path string, stdout, stderr io.Writer) error {
	r, err := server.LoadRules(path)
	if err != nil {
		fmt.Fprintf(stderr, "rateleased: %v\n", err)
		return fmt.Errorf("%w: %w", errInvalidRules, err)
	}
	fmt.Fprintf(stdout, "rules file %s is valid: %s, %s, default %s, version %s\n",
		path, count(len(r.Policy().Rules()), "rule"), count(len(r.Clients()), "client"), r.Policy().Default(), r.Version()[:12])
	return nil
}

// count returns n and noun, plural unless n is 1: "1 client", "0 clients".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// serve opens the store, builds the server and runs it.
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	var tlsConfig *tls.Config
	if cfg.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return fmt.Errorf("-tls-cert %s, -tls-key %s: %w", cfg.tlsCert, cfg.tlsKey, err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	store, rdb, storeAttrs, closeStore, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeStore()

	// The daemon's registry adds the Go runtime and process metrics to the
	// server's own.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// With Redis, the rule database is there: the rules in force when no
	// -rules file is given (database mode), and what the admin API edits.
	var (
		ruleDB *server.RuleDB
		peers  server.Peers
	)
	if rdb != nil {
		ruleDB = server.NewRuleDB(rdb, server.RuleDBOptions{})
		peers = server.NewRedisPeers(rdb)
	}
	srv, err := server.New(server.Options{
		RuleDB:             ruleDB,
		AdminTokenSHA256:   cfg.adminToken,
		AdminName:          cfg.adminName,
		Registry:           reg,
		Store:              store,
		RulesPath:          cfg.rules,
		ListenAddr:         cfg.listen,
		Insecure:           cfg.insecure,
		Logger:             log,
		DrainDelay:         cfg.drainDelay,
		ShutdownTimeout:    cfg.shutdownTimeout,
		StoreTimeout:       cfg.storeTimeout,
		MaxKeysPerClient:   cfg.maxKeys,
		TLSConfig:          tlsConfig,
		MetricsTokenSHA256: cfg.metricsToken,
		Peers:              peers,
	})
	if err != nil {
		return err
	}
	defer srv.Close()

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (set -listen or RATELEASED_LISTEN to a free address)", cfg.listen, err)
	}
	if cfg.debugAddr != "" {
		dln, err := listenDebug(ctx, cfg.debugAddr)
		if err != nil {
			_ = ln.Close()
			return err
		}
		dctx, stopDebug := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			serveDebug(dctx, dln, log)
		}()
		defer func() {
			stopDebug()
			<-done
		}()
		log.Info("rateleased debug listening", "addr", dln.Addr().String(), "paths", "/debug/pprof/")
	}
	attrs := []any{"addr", ln.Addr().String(), "rules_file", cfg.rules, "rules_source", rulesSource(cfg)}
	if srv.RulesPending() {
		// No rule set read yet: its placeholder's counts and default
		// describe nothing in force (every call is answered 503).
		attrs = append(attrs, "rules_pending", true)
	} else {
		rules := srv.Rules()
		attrs = append(attrs, "rules", len(rules.Policy().Rules()), "clients", len(rules.Clients()), "default", rules.Policy().Default())
	}
	attrs = append(attrs, storeAttrs...)
	if cfg.insecure {
		attrs = append(attrs, "insecure", true)
	}
	attrs = append(attrs, "tls", tlsConfig != nil, "metrics_token", cfg.metricsToken != "", "admin_api", ruleDB != nil, "bootstrap_admin", cfg.adminToken != "", "version", server.ReadBuild().Version)
	log.Info("rateleased listening", attrs...)
	return srv.Run(ctx, ln)
}

// rulesSource says where the rules in force come from: "file", "database"
// (with -redis and no -rules) or "none".
func rulesSource(cfg config) string {
	switch {
	case cfg.rules != "":
		return "file"
	case cfg.redisURL != "":
		return "database"
	}
	return "none"
}

// openStore returns the memory store, or a Redis store and its client when
// cfg names a Redis URL, with attributes that describe it for the log and
// a function that releases it.
func openStore(ctx context.Context, cfg config, log *slog.Logger) (leases.Store, redis.UniversalClient, []any, func(), error) {
	if cfg.redisURL == "" {
		s := leases.NewMemoryStore(leases.MemoryOptions{})
		return s, nil, []any{"store", "memory"}, func() { _ = s.Close() }, nil
	}
	var (
		rdb  redis.UniversalClient
		addr string
	)
	opts, copts, err := parseRedisFlag(cfg.redisURL, cfg.redisCluster)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if copts != nil {
		clusterFailFast(copts).apply()
		rdb, addr = redis.NewClusterClient(copts), strings.Join(copts.Addrs, ",")
	} else {
		clientFailFast(opts).apply()
		rdb, addr = redis.NewClient(opts), opts.Addr
	}
	// The server starts even when Redis is down: /readyz fails and calls
	// get 503 until it answers, and then it recovers by itself.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	noEviction := false
	if err := rdb.Ping(pctx).Err(); redisRefuses(err) {
		log.Error("redis refuses rateleased: check the user, password and database of the -redis URL, and -redis-cluster; serving 503 until it accepts; its maxmemory-policy and persistence are not checked", "redis", addr, "err", err)
	} else if err != nil {
		log.Warn("redis does not answer yet: serving 503 until it does; its maxmemory-policy and persistence are not checked", "redis", addr, "err", err)
	} else {
		noEviction = checkRedisConfig(ctx, rdb, log)
	}
	cancel()
	// Seen to run noeviction at start, Redis cannot lose part of a bucket,
	// and the store skips that check (a command per new bucket). Changing
	// the policy later needs a restart of rateleased to check again.
	var s leases.Store = leases.NewRedisStore(rdb, leases.RedisOptions{NoEviction: noEviction})
	if cfg.ownKeys {
		owning, err := leases.NewOwningStore(s, leases.OwningOptions{Logger: log})
		if err != nil {
			_ = s.Close()
			_ = rdb.Close()
			return nil, nil, nil, nil, err
		}
		s = owning
	}
	release := func() {
		_ = s.Close() // an OwningStore hands back what it owns first
		_ = rdb.Close()
	}
	return s, rdb, []any{"store", "redis", "redis", addr, "redis_cluster", cfg.redisCluster, "own_keys", cfg.ownKeys}, release, nil
}

// parseRedisFlag parses the -redis URL: as a cluster's (the second
// result) with -redis-cluster, else as one node's. Its error names the
// flag and never the URL's password.
func parseRedisFlag(url string, cluster bool) (*redis.Options, *redis.ClusterOptions, error) {
	if cluster {
		opts, err := parseRedisURL(url, redis.ParseClusterURL)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis (with -redis-cluster): %w: want redis://host:port?addr=host2:port", err)
		}
		return nil, opts, nil
	}
	opts, err := parseRedisURL(url, redis.ParseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("-redis: %w: want redis://[user:password@]host:port/db or rediss://…", err)
	}
	return opts, nil, nil
}

// parseRedisURL is parse (redis.ParseURL or redis.ParseClusterURL) with an
// error that quotes no part of the URL's user or password: those of
// net/url quote the whole URL, and both may quote a piece of a password
// that holds a reserved character ('#', '/' or '?' end the host early, and
// the rest is read as a port, a path or a query). When the URL holds an
// '@', its error is that of the same URL with everything before its last
// '@' (which a password cannot follow) replaced by "xxxxx", or, when that
// parses, a message saying that the part replaced does not.
func parseRedisURL[O any](raw string, parse func(string) (*O, error)) (*O, error) {
	o, err := parse(raw)
	if err == nil {
		return o, nil
	}
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return nil, err // no user or password to show
	}
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 && i < at {
		start = i + len("://")
	} else if i := strings.IndexByte(raw, ':'); i >= 0 && i < at {
		start = i + 1
	}
	if _, rerr := parse(raw[:start] + "xxxxx" + raw[at:]); rerr != nil {
		return nil, rerr
	}
	return nil, errors.New("the URL does not parse in its part before the last '@', the user and password (not shown): percent-encode their reserved characters, such as % as %25, @ as %40, / as %2F, ? as %3F, # as %23, and : in a user as %3A")
}

// redisRefuses reports whether err is Redis answering that it refuses the
// client until its configuration or the -redis URL changes: a password
// or a user it does not take (WRONGPASS, NOAUTH), a command the user may
// not run (NOPERM), or a cluster client's command to a Redis that is no
// cluster. Redis down, or answering LOADING, is not such a refusal.
func redisRefuses(err error) bool {
	return redis.IsAuthError(err) || redis.IsPermissionError(err) ||
		redis.HasErrorPrefix(err, "This instance has cluster support disabled")
}

// redisLog is the go-redis client's logger (redis.SetLogger): each line it
// logs (a dial that failed, a cluster's slots reloaded) is a record of log
// at level WARN, message "redis client", its text in attribute "log".
// Without it go-redis writes its lines to stderr through a log.Logger of
// its own, ignoring -log-format and -log-level.
type redisLog struct{ log *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, "redis client", "log", strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// parseFlags parses args with flag defaults taken from env.
func parseFlags(args []string, env func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("rateleased", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var envErrs []error
	str := func(name, def string) string { return cmp.Or(env(name), def) }
	booleanOr := func(name string, def bool) bool {
		v := env(name)
		if v == "" {
			return def
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q: want true or false", name, v))
		}
		return b
	}
	boolean := func(name string) bool { return booleanOr(name, false) }
	duration := func(name string, def time.Duration) time.Duration {
		v := env(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q: want a duration such as 10s", name, v))
			return def
		}
		return d
	}

	integer := func(name string, def int) int {
		v := env(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q: want a whole number", name, v))
			return def
		}
		return n
	}

	var cfg config
	var level, format string
	fs.StringVar(&cfg.listen, "listen", str("RATELEASED_LISTEN", "127.0.0.1:8080"),
		"`address` to listen on; a non-loopback address needs clients in the rules file or -insecure (env RATELEASED_LISTEN)")
	fs.StringVar(&cfg.rules, "rules", str("RATELEASED_RULES", ""),
		"rules `file` (YAML), reloaded when it changes (file mode); empty: with -redis, the rule database in that Redis (database mode), without it no rules, every key unlimited (env RATELEASED_RULES)")
	// No default from the environment: flag prints a flag's default in the
	// usage text (on -h and on every flag error), and the URL may hold a
	// password. RATELEASED_REDIS applies after parsing instead.
	fs.StringVar(&cfg.redisURL, "redis", "",
		"Redis `URL` (redis:// or rediss://) to share buckets across servers; empty: in-memory store (env RATELEASED_REDIS, never printed here: it may hold a password)")
	fs.BoolVar(&cfg.redisCluster, "redis-cluster", boolean("RATELEASED_REDIS_CLUSTER"),
		"the -redis URL names a Redis Cluster; list more seed nodes as ?addr=host:port (env RATELEASED_REDIS_CLUSTER)")
	fs.BoolVar(&cfg.ownKeys, "own-keys", booleanOr("RATELEASED_OWN_KEYS", true),
		"with -redis, own the token bucket of a key this server decides many direct takes of, and decide them from memory (one Redis call per half lease TTL, not one per decision; see leases.OwningStore); false: every take goes to Redis (env RATELEASED_OWN_KEYS)")
	fs.BoolVar(&cfg.insecure, "insecure", boolean("RATELEASED_INSECURE"),
		"allow listening on a non-loopback address without client authentication (env RATELEASED_INSECURE)")
	fs.StringVar(&level, "log-level", str("RATELEASED_LOG_LEVEL", "info"),
		"log `level`: debug, info, warn or error (env RATELEASED_LOG_LEVEL)")
	fs.StringVar(&format, "log-format", str("RATELEASED_LOG_FORMAT", "text"),
		"log `format`: text or json (env RATELEASED_LOG_FORMAT)")
	fs.DurationVar(&cfg.storeTimeout, "store-timeout", duration("RATELEASED_STORE_TIMEOUT", server.DefaultStoreTimeout),
		"bound on the store (Redis) calls of one request: while Redis does not answer, calls get 503 with Retry-After within this plus a few ms, so within 1s at the default (env RATELEASED_STORE_TIMEOUT)")
	fs.IntVar(&cfg.maxKeys, "max-keys-per-client", integer("RATELEASED_MAX_KEYS_PER_CLIENT", server.DefaultMaxKeysPerClient),
		"most distinct keys one client may hold leases on through this server (each server counts its own grants; a key counts until its lease's expiry, even if returned); a lease entry on another key fails with 429 too_many_keys; negative: no cap (env RATELEASED_MAX_KEYS_PER_CLIENT)")
	fs.DurationVar(&cfg.drainDelay, "drain-delay", duration("RATELEASED_DRAIN_DELAY", 0),
		"on SIGTERM, keep serving this long with /readyz answering 503, so that load balancers stop sending traffic, before refusing new connections; 0: refuse them at once (env RATELEASED_DRAIN_DELAY)")
	fs.StringVar(&cfg.tlsCert, "tls-cert", str("RATELEASED_TLS_CERT", ""),
		"certificate `file` (PEM, the chain after the leaf) to serve HTTPS with; needs -tls-key; empty: plain HTTP/1.1 and h2c (env RATELEASED_TLS_CERT)")
	fs.StringVar(&cfg.tlsKey, "tls-key", str("RATELEASED_TLS_KEY", ""),
		"private key `file` (PEM) of -tls-cert (env RATELEASED_TLS_KEY)")
	fs.StringVar(&cfg.metricsToken, "metrics-token-sha256", str("RATELEASED_METRICS_TOKEN_SHA256", ""),
		"hex SHA-256 of a bearer `token` that GET /metrics and GET /status then require (printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1); empty: both are open (env RATELEASED_METRICS_TOKEN_SHA256)")
	fs.StringVar(&cfg.adminToken, "admin-token-sha256", str("RATELEASED_ADMIN_TOKEN_SHA256", ""),
		"hex SHA-256 of the bootstrap admin's bearer `token`, which the admin API (/v1/admin/...) accepts besides the tokens of admin clients (admin: true); needs -redis (the rule database); empty: admin clients only (env RATELEASED_ADMIN_TOKEN_SHA256)")
	fs.StringVar(&cfg.adminName, "admin-name", str("RATELEASED_ADMIN_NAME", server.AdminPrincipal),
		"`name` of the bootstrap admin in the change log and the logs; no admin client may take it (env RATELEASED_ADMIN_NAME)")
	fs.StringVar(&cfg.debugAddr, "debug-addr", str("RATELEASED_DEBUG_ADDR", ""),
		"loopback `address` (such as 127.0.0.1:6060) to serve net/http/pprof on, under /debug/pprof/, apart from the API; empty: none (env RATELEASED_DEBUG_ADDR)")
	fs.BoolVar(&cfg.check, "check", false,
		"validate the -rules file and exit: 0 with a summary, 1 with the rule and field at fault, 2 without -rules (a usage error); starts no server and needs no Redis")
	fs.BoolVar(&cfg.version, "version", false,
		"print the version, VCS revision and Go version, and exit")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", duration("RATELEASED_SHUTDOWN_TIMEOUT", server.DefaultShutdownTimeout),
		"how long in-flight requests may take to finish on SIGTERM, after -drain-delay (env RATELEASED_SHUTDOWN_TIMEOUT)")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, err
		}
		return config{}, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return config{}, usageError(fs, fmt.Errorf("unexpected argument %q: rateleased takes flags only", fs.Arg(0)))
	}
	if !flagSet(fs, "redis") {
		cfg.redisURL = env("RATELEASED_REDIS")
	}
	if len(envErrs) > 0 {
		return config{}, usageError(fs, errors.Join(envErrs...))
	}
	if err := cfg.logLevel.UnmarshalText([]byte(level)); err != nil {
		return config{}, usageError(fs, fmt.Errorf("-log-level %q: want debug, info, warn or error", level))
	}
	switch format {
	case "text", "json":
		cfg.logFormat = format
	default:
		return config{}, usageError(fs, fmt.Errorf("-log-format %q: want text or json", format))
	}
	if cfg.drainDelay < 0 {
		return config{}, usageError(fs, fmt.Errorf("-drain-delay %v: want 0 or a positive duration", cfg.drainDelay))
	}
	if cfg.shutdownTimeout <= 0 {
		return config{}, usageError(fs, fmt.Errorf("-shutdown-timeout %v: want a positive duration", cfg.shutdownTimeout))
	}
	if cfg.maxKeys == 0 {
		return config{}, usageError(fs, errors.New("-max-keys-per-client 0: want a positive number, or a negative one for no cap"))
	}
	if cfg.storeTimeout <= 0 {
		return config{}, usageError(fs, fmt.Errorf("-store-timeout %v: want a positive duration", cfg.storeTimeout))
	}
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return config{}, usageError(fs, errors.New("-tls-cert and -tls-key go together: give both (HTTPS) or neither (plain HTTP)"))
	}
	if cfg.metricsToken != "" {
		if b, err := hex.DecodeString(cfg.metricsToken); err != nil || len(b) != sha256.Size {
			return config{}, usageError(fs, errors.New("-metrics-token-sha256: want 64 hex digits, the SHA-256 of the token: printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1"))
		}
	}
	if cfg.adminToken != "" {
		if b, err := hex.DecodeString(cfg.adminToken); err != nil || len(b) != sha256.Size {
			return config{}, usageError(fs, errors.New("-admin-token-sha256: want 64 hex digits, the SHA-256 of the token: printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1"))
		}
		if cfg.redisURL == "" {
			return config{}, usageError(fs, errors.New("-admin-token-sha256 needs -redis: the admin API edits the rule database in Redis"))
		}
	}
	if err := server.CheckClientName(cfg.adminName); err != nil {
		return config{}, usageError(fs, fmt.Errorf("-admin-name %q: %w", cfg.adminName, err))
	}
	if _, _, err := net.SplitHostPort(cfg.listen); err != nil {
		return config{}, usageError(fs, fmt.Errorf("-listen %q: want host:port, such as 127.0.0.1:8080: %w", cfg.listen, err))
	}
	if cfg.debugAddr != "" {
		if err := checkDebugAddr(cfg.debugAddr); err != nil {
			return config{}, usageError(fs, err)
		}
	}
	if cfg.redisURL != "" {
		if _, _, err := parseRedisFlag(cfg.redisURL, cfg.redisCluster); err != nil {
			return config{}, usageError(fs, err)
		}
	}
	if cfg.check && cfg.rules == "" {
		return config{}, usageError(fs, errors.New("-check needs -rules with the file to check"))
	}
	if cfg.redisCluster && cfg.redisURL == "" {
		return config{}, usageError(fs, errors.New("-redis-cluster needs -redis with the cluster's URL"))
	}
	return cfg, nil
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// usageError prints err to the flag set's output, as flag does for its own
// errors, and returns it wrapped in errUsage.
func usageError(fs *flag.FlagSet, err error) error {
	fmt.Fprintf(fs.Output(), "rateleased: %v\n", err)
	return fmt.Errorf("%w: %w", errUsage, err)
}
