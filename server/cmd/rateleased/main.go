// Command rateleased is the ratelease lease server: it serves protocol v1
// (see package server) over a memory store, or over Redis so that any number
// of lease servers share the limits.
//
// Usage:
//
//	rateleased [flags]
//
// Every flag takes its default from an environment variable when that is
// set:
//
//	-listen               RATELEASED_LISTEN               address to listen on (default 127.0.0.1:8080)
//	-rules                RATELEASED_RULES                rules file; empty: with -redis, the rule database; else no rules
//	-redis                RATELEASED_REDIS                redis:// or rediss:// URL; empty: memory store
//	-redis-cluster        RATELEASED_REDIS_CLUSTER        the -redis URL names a Redis Cluster
//	-own-keys             RATELEASED_OWN_KEYS             with -redis, own hot keys' token buckets and decide them from memory (default true)
//	-insecure             RATELEASED_INSECURE             allow a non-loopback address without clients
//	-log-level            RATELEASED_LOG_LEVEL            debug, info, warn or error (default info)
//	-log-format           RATELEASED_LOG_FORMAT           text or json (default text)
//	-drain-delay          RATELEASED_DRAIN_DELAY          keep serving this long after SIGTERM, /readyz failing (default 0)
//	-shutdown-timeout     RATELEASED_SHUTDOWN_TIMEOUT     grace period for in-flight requests (default 10s)
//	-store-timeout        RATELEASED_STORE_TIMEOUT        bound on one request's Redis calls (default 800ms)
//	-max-keys-per-client  RATELEASED_MAX_KEYS_PER_CLIENT  keys one client may hold leases on through this server (default 100000; negative: no cap)
//	-tls-cert             RATELEASED_TLS_CERT             certificate file (PEM): serve HTTPS; needs -tls-key
//	-tls-key              RATELEASED_TLS_KEY              private key file (PEM) of -tls-cert
//	-metrics-token-sha256 RATELEASED_METRICS_TOKEN_SHA256 hex SHA-256 of the bearer token GET /metrics and /status require; empty: open
//	-admin-token-sha256   RATELEASED_ADMIN_TOKEN_SHA256   hex SHA-256 of the bootstrap admin's token; needs -redis
//	-admin-name           RATELEASED_ADMIN_NAME           the bootstrap admin's name in the change log (default admin)
//	-debug-addr           RATELEASED_DEBUG_ADDR           loopback address serving net/http/pprof (/debug/pprof/); empty: none
//
// A flag given on the command line wins over its variable. The usage text
// (-h, and after a bad flag) shows the defaults the environment sets, but
// never RATELEASED_REDIS's: its URL may hold a password, which rateleased
// never prints (the error of a URL that does not parse quotes no part of
// its user or password; the logs name the Redis by its address).
//
// Where the rules come from: with -rules, the file (file mode), reloaded
// when it changes; with -redis and no -rules, the rule database in that
// Redis (database mode; see server.RuleDB), followed within a second of
// every change; with neither, no rules. The admin API (/v1/admin/...)
// edits the database whenever -redis is given; it accepts the bootstrap
// admin's token (-admin-token-sha256, named -admin-name in the change log)
// and the tokens of the clients with admin: true, each named by its client
// name. In file mode its changes are stored but not in force (use it, or
// `ratelease rules apply`, to seed the database).
//
// Two flags do something else and exit:
//
//	-check     validate the -rules file: exit 0 with a one-line summary on
//	           stdout, or 1 with the rule or client and field at fault on
//	           stderr, or 2 without -rules (a usage error, as a bad flag
//	           is); starts no server and needs no Redis
//	-version   print the module version, VCS revision and Go version
//	           (from the binary's build information) and exit 0
//
// The server reloads the rules file when it changes. SIGINT or SIGTERM
// shuts it down gracefully: GET /readyz answers 503 at once; the server
// goes on serving for -drain-delay, if set, so that a load balancer polling
// /readyz stops sending traffic; then it refuses new connections, gives
// in-flight requests -shutdown-timeout to finish, and exits 0 (1 when some
// outlive it: it closes their connections and logs that at ERROR). A second
// signal kills it at once. A startup error (a bad rules file, say) is
// logged and it exits 1; a bad flag or environment variable exits 2,
// before anything starts: one that does not parse, and one whose value is
// refused without the network or a file (a -redis URL that does not
// parse, a -listen or -debug-addr that is no host:port, a -debug-addr IP
// that is not loopback, an -admin-name that is no client name).
//
// Logs go to stderr through log/slog, in -log-format at -log-level, the
// go-redis client's included (message "redis client", at WARN: a failed
// dial, say), so that with -log-format json every line is a JSON record.
//
// With -tls-cert and -tls-key (both or neither) it serves HTTPS, HTTP/1.1
// and HTTP/2, instead of plain HTTP/1.1 and h2c. The files are read at
// start: restart the server to serve a renewed certificate.
//
// When Redis does not answer (down, or hung: connections open but nothing
// answers), every call gets 503 store_unavailable with "Retry-After: 1"
// within -store-timeout plus a few milliseconds, so within 1s at the
// default, and /readyz fails; the server recovers by itself when Redis
// answers again. That holds for a server started while Redis is down
// too: in database mode it answers 503 until it has read the rule
// database, within a second of Redis answering. A Redis that answers but
// refuses rateleased at start (a
// wrong user or password, a user without the commands, -redis-cluster on
// a Redis that is no cluster; in database mode also a user whose ACL key
// patterns do not reach the rule database's keys, {rl:db}:*) is a
// misconfiguration: logged at ERROR, naming what to fix, and served as a
// Redis down until it accepts. The Redis client honours the request's deadline
// (go-redis ContextTimeoutEnabled) in every step: dial, handshake, read,
// write, retries and waiting for a pooled connection.
//
// At start, rateleased checks the Redis configuration (every master of a
// cluster) and logs a warning when maxmemory-policy is not noeviction (an
// evicted bucket forgets its open leases) or when neither RDB snapshots nor
// AOF are on (a restart forgets them all): either can let one extra burst
// through. When CONFIG is refused, as managed Redis services do, it logs at
// level info that it could not check. It never fails the start for this.
//
// With -debug-addr, rateleased serves the net/http/pprof profiles
// (/debug/pprof/profile, heap, goroutine, trace, ...) on a listener of its
// own, apart from the API and its authentication; it refuses an address
// that is not loopback, since profiles show the process's internals. For
// example, a 30-second CPU profile:
//
//	rateleased -debug-addr 127.0.0.1:6060 ...
//	go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=30
//
// For a cluster URL, list every seed node as an addr parameter:
// redis://host1:6379?addr=host2:6379&addr=host3:6379.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default handling: a second one
	// kills the process even while it drains.
	context.AfterFunc(ctx, stop)
	// go-redis logs through a logger of the process's: the daemon's, so
	// that its lines follow -log-format and -log-level.
	logTo := func(log *slog.Logger) { redis.SetLogger(redisLog{log}) }
	err := cli(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, logTo)
	stop()
	os.Exit(exitCode(err))
}

// exitCode is the exit status for run's result: 0 after a graceful shutdown
// or -h, 2 for a bad flag or environment variable, 1 for any other error.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		return 1
	}
}
