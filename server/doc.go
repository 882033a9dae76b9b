// Package server is the HTTP API of a ratelease lease server: protocol v1
// over the accounting engine of package leases. The daemon
// server/cmd/rateleased is a thin main around it; embed a Server in your own
// process when you want the lease server and something else in one binary.
//
//	store := leases.NewMemoryStore(leases.MemoryOptions{})
//	srv, err := server.New(server.Options{Store: store, RulesPath: "rules.yaml", Logger: logger})
//	if err != nil { ... }
//	ln, err := net.Listen("tcp", "127.0.0.1:8080")
//	if err != nil { ... }
//	err = srv.Run(ctx, ln) // until ctx is canceled, then a graceful shutdown
//
// # Routes
//
//	POST /v1/leases      acquire, renew and return leases (protocol.LeaseRequest)
//	POST /v1/check       one all-or-nothing decision (protocol.CheckRequest)
//	GET  /v1/rules       the rules the caller's key patterns reach, and those patterns (protocol.RulesResponse)
//	GET  /v1/keys/{key}  a key's rule and, per limit, its state (protocol.KeyStateResponse; see "The operator's view")
//	GET  /healthz        the process is alive
//	GET  /readyz         the store answers, the server is not shutting down (and in database mode it has read the rules); a failed rules reload is in its detail
//	GET  /metrics        Prometheus metrics (Options.MetricsTokenSHA256 may require a token)
//	GET  /status         the status page of the fleet (guarded like /metrics; see "The operator's view")
//	/v1/admin/...        the admin API: rules, clients, overrides, changes, settings (see "The rule database and the admin API")
//
// Every error is an RFC 9457 application/problem+json body
// (protocol.Problem) with a stable code, including unknown routes (404) and
// wrong methods (405, with an Allow header). A key or name in a path is
// percent-encoded as one segment, '/' as %2F: a path that is not canonical
// (it holds "//", "/./" or "/../", as "path:/a/../b" sent unescaped makes)
// gets 400 invalid_path, never a redirect to its cleaned form, which would
// be another key's. Bad input is refused before the
// engine runs, so it changes nothing in the store.
//
// A /v1/check that is denied answers 200 with "allowed": false and a
// Retry-After header, not 429: the request was served, and its answer is
// "no". Callers branch on the body; status codes are kept for requests that
// could not be served.
//
// # Rules and clients
//
// The rules file (RulesFile) holds the rules of package leases and a
// clients section. Each client has a name, the SHA-256 of its bearer token
// (the token itself is never stored) and the glob patterns of the keys it
// may use. When the file lists clients, every /v1 request needs
// "Authorization: Bearer <token>"; the token's hash is compared with every
// client's in constant time. A lease entry for a key outside the client's
// patterns fails alone with code forbidden; a check with such a key fails
// whole. Leases are owned by "<client name>/<client_id>", so a client cannot
// settle another client's lease even by claiming its client_id. With no
// clients, the API is open and every caller is AnonymousClient.
//
// # Keys per client
//
// Each server caps the distinct keys on which one client (a client name of
// the rules file, or the anonymous client; all its processes together)
// holds leases it granted: Options.MaxKeysPerClient, 100,000 by default,
// the daemon's -max-keys-per-client. A key counts from a grant until the
// latest expiry of the client's leases on it (the grant's time plus its
// TTL), even when the lease is returned sooner, so a client that churns
// through keys cannot escape the cap by returning leases. A lease entry
// that asks for tokens on another key of a client at the cap fails alone
// with code too_many_keys (429) and never reaches the store; settles (entries
// with a lease_id), keys the client holds, and keys neither a rule nor an
// override limits are never refused. The count is per lease server: each counts what it granted, so
// behind N servers a client can hold up to N times the cap. Direct takes
// (checks, and the takes of a lease call) are not counted, as the SDK
// decides per-user keys with them: the state a take creates expires once
// its bucket is full again (at most the time the rule takes to refill a
// whole bucket, or a lease TTL for a token bucket taken through an
// OwningStore, plus a second in Redis or until the memory store's next
// sweep: see Options.MaxKeysPerClient), so the
// state a client's takes keep is bounded by the distinct keys it takes
// from per unit of time times that time, not by the cap. The work per
// call is proportional to its entries (a map and a min-heap of expiries
// per client, emptied lazily; no scans).
//
// A server without clients refuses to listen on an address that is not
// loopback unless Options.Insecure is set: leasing trusts its callers (a
// caller can spend what it holds), so an open server belongs on loopback or
// a network where everyone is trusted.
//
// The server polls the rules file (Options.ReloadInterval, 500ms by
// default) and compares its content, not its modification time, so a
// change is in force within a second, however the file was written; write
// it atomically (a temporary file renamed over it), since a poll may catch
// a file rewritten in place half written (see Server.Reload). An empty file
// (whitespace and comments only) is refused while rules or clients are in
// force (ErrEmptyRulesFile): it is most likely such a file, and would drop
// every rule and turn authentication off. So is a file of more than one
// YAML document (after a "---" line) at start and at reload: a decoder
// reads the first alone. A file
// that does not validate leaves the old rules in force and is logged at
// level error with the rule or client and field at fault; until a reload
// succeeds (or the file is back to the rules in force), GET /readyz still
// answers 200 but its detail says the reload failed and why,
// Server.ReloadError returns the error, and the gauge
// ratelease_rules_last_reload_success is 0. Polling was chosen
// over file-system notifications because it needs no platform code, follows
// a file replaced by rename or a Kubernetes ConfigMap symlink swap alike,
// and costs one small read per interval.
//
// # The rule database and the admin API
//
// With Options.RuleDB and no RulesPath the server runs in database mode:
// rules, clients and per-key overrides live in Redis (see RuleDB for the
// layout), each server holds the rule set compiled in memory and rebuilds
// it when the set's version moves, and looks overrides up on first use
// through an LRU cache with a TTL (leases.Overrides, consulted by the
// engine before the Policy). A change publishes on a channel, which wakes
// every server at once; a version check every Options.DBCheckInterval
// (1s) is the safety net. A server whose database does not answer at
// New starts all the same and answers every call 503 store_unavailable,
// and /readyz too, until its syncer has read the rule set, checked then
// against the listen address as a reload is; a Redis that answers but
// refuses the database's commands (NOPERM: an ACL whose key patterns
// reach the buckets, rl:*, and not the database, {rl:db}:*) is waited for
// so too, and logged at ERROR as the misconfiguration it is. On Redis Cluster nothing changes: the database's
// keys share one hash tag (one slot), and Redis Cluster delivers a PUBLISH
// to subscribers on every node (TestRuleDBCluster checks both paths). A
// rule set in the database that does not validate (written behind the
// API's back) keeps the rules in force, and /readyz says why, as a failed
// file reload does (logged at level error); overrides go on following
// their changes meanwhile, on every server within the same second. So
// does an item that does not decode at all (not "<version>|<JSON>"): the
// admin API answers 422 invalid_rule naming every such item to a listing
// of its kind (GET /v1/admin/rules, /v1/admin/clients, a page of
// overrides that holds it), to a GET of it and to a rule set change that
// leaves it in place, and accepts a DELETE or PUT of it, which repairs
// the set.
//
// The admin API (/v1/admin/rules, /v1/admin/clients, /v1/admin/overrides,
// /v1/admin/changes, /v1/admin/settings; see adminRoutes in admin.go)
// needs an admin's token:
// the bootstrap admin's (Options.AdminTokenSHA256, named
// Options.AdminName, "admin" by default) or that of a client of the rules
// in force with admin: true, named by its client name, so that several
// operators each have a token of their own. Another client's token gets
// 403 admin_forbidden. Admin tokens are checked against the rules in force
// at each request: a demoted or deleted admin client is refused from the
// next request on the server that made the change, and on the others once
// they sync (at once through pub/sub, within Options.DBCheckInterval at the
// latest). An admin may demote or delete its own client (logged at WARN);
// on a server in database mode without a bootstrap admin, a change that
// would leave no admin client is refused (422, ErrAdminLockout), so the
// admin API cannot be locked silently (see admins.go). Writes are
// validated against the whole set (422 invalid_rule, nothing stored),
// conditional on If-Match (412 precondition_failed), atomic (one Lua
// script), versioned, written to the change log with the admin's name and
// logged at INFO with who and what. Overrides, which may number millions,
// are listed a page at a time (GET /v1/admin/overrides
// ?prefix=&cursor=&limit=, RuleDB.ListOverrides): each page is a bounded
// run of HSCAN with MATCH on the prefix, its glob metacharacters escaped,
// and ends with a cursor; nothing loads them all.
//
// # Store and failures
//
// The Server builds its leases.Engine itself from Options.Store: it owns
// the rules (it swaps them on reload, with the engine, in one atomic step so
// that a request sees one version of rules and clients) and it hooks the
// engine's store calls for the store latency histogram. When the store does
// not answer, /v1 calls get 503 store_unavailable with "Retry-After: 1"
// once Options.StoreTimeout (800ms by default) has passed, so within a
// second, and /readyz fails; nothing needs restarting when the store comes
// back. (For a Redis store, set ContextTimeoutEnabled on the go-redis
// client: see Options.StoreTimeout.) When it fails for some keys only (a
// Redis Cluster node down, see leases.RedisOptions.PartialWindow), their
// entries and takes fail alone with store_unavailable, logged at level
// warn with the cause at most once a second, and the others are decided; a lease
// call every entry of which failed so is a 503 store_unavailable with
// "Retry-After: 1" whose problem carries every entry's result (leases),
// and so is a check of such a key. Any
// other store error fails the call with 500 internal, and is logged at level
// error with its cause.
//
// # Shutdown
//
// When Run's context is canceled, GET /readyz answers 503 with code
// shutting_down. What a load balancer sees depends on Options.DrainDelay:
//
//   - Zero (the default): Run closes its listener at once, so new
//     connections are refused and only a request already in flight can see
//     the 503. A load balancer learns of the shutdown from the refused
//     connections.
//   - Positive: Run keeps serving every route for DrainDelay, with /readyz
//     answering 503, so that a load balancer that polls it takes the server
//     out of rotation while it still answers; then it closes its listener.
//
// Either way, in-flight requests then have Options.ShutdownTimeout to
// finish before their connections are closed. The daemon's flags are
// -drain-delay and -shutdown-timeout.
//
// # Metrics
//
// Metrics go to Options.Registry (a fresh registry when nil, never the
// global one) under the "ratelease" namespace: grants_total, denials_total,
// settles_total, expiries_total, open_leases (see below),
// request_duration_seconds{route,code} (each
// request counted once: its _count is the request count),
// store_latency_seconds{op}, store_errors_total{op}, rules_loaded,
// rules_info{version} (always 1: the version of the rules in force),
// rules_reloads_total{result}, rules_last_reload_success (0 while the file
// on disk failed to load and older rules serve),
// rule_decisions_total{rule,result} (see "The operator's view"),
// shadow_denials_total (entries and checks of shadow rules admitted though
// their limits denied), elastic_borrows_total (entries and checks of
// elastic rules their pool served),
// build_info{version,revision,goversion} (see ReadBuild), and, in database
// mode, override_lookups_total, override_cache_misses_total,
// override_cache_stale_total and override_cache_entries (the override
// cache; dbmode.go), and, when
// Options.Store is a leases.OwningStore (rateleased -own-keys),
// owned_buckets, owned_takes_total and ownerships_total{event}
// (owningmetrics.go), and, when Options.Peers counts its commands (a
// RedisPeers does), peer_commands_total (the Redis commands of the fleet
// view: see RedisPeers.Commands). The route label
// is the ServeMux pattern ("POST /v1/leases"; "/" for unknown routes and
// paths refused as not canonical),
// never the raw path, so its cardinality is fixed.
//
// ratelease_open_leases counts the leases granted through this server
// that are not yet settled through it and whose deadline (grant time on
// Options.Now plus the TTL) has not passed. Redis cannot count a fleet's
// open leases without scanning every bucket, so each server counts its own
// grants: a lease settled through another server, or closed by the store
// without a settle (replaced, or expired), counts until its deadline; an
// open lease this server granted is never missed. Summed over the servers
// (as the status page does) it bounds the open leases from above. A grant
// costs a map insert and a heap push under one mutex per call, a settle a
// map delete, with no allocation once grown (see openleases.go).
//
// GET /metrics is open unless Options.MetricsTokenSHA256 names the SHA-256
// of a bearer token it then requires (the daemon's -metrics-token-sha256);
// the clients of the rules file do not apply to it.
//
// # The operator's view
//
// GET /v1/keys/{key} returns a key's rule and, per limit, the bucket's level,
// free tokens, tokens outstanding in open leases, open leases, the distinct
// processes holding them, and, for every algorithm, the time to the next
// token and to a whole bucket, plus for the fixed and sliding-counter
// windows the time to the window's end (protocol.KeyStateResponse, which
// says what each time means per algorithm). It is authenticated like the
// lease routes: a client sees only the keys its patterns allow. It changes
// nothing: the store's snapshot (leases.Store.State) reads, and leases past
// their expiry are left for the next call to close.
//
// GET /status is a read-only HTML page (no JavaScript) of the fleet: the
// rules in force and their version, each rule's decisions
// (ratelease_rule_decisions_total {rule,result}, result granted, denied or
// shadow_denied, counted by the handlers from the engine's results) with
// rates over the last minute, the busiest and the most denied keys, the open
// leases, and the servers sharing the store. The keys are found by a
// space-saving top-K summary of 100 counters per list and server (see
// topK): each count is at most total/100 over the key's true count, and
// every key above that is listed. Servers sharing a Redis store record
// themselves in the sorted set rl:servers every PeerInterval (2s;
// Options.Peers, NewRedisPeers; the daemon sets it with -redis; one ZADD,
// the record's upkeep once a minute) and publish a status snapshot at the
// same time when it changed, at least every 4s, a JSON string key
// {rl:status}:<server name> that lives SnapshotTTL (6s): one hash tag, so
// one MGET reads them all on Redis Cluster too. A page lists the servers
// seen in the last PeerWindow and sums their snapshots with its own live
// figures: counts and rates add up, top-K summaries merge with their error
// bounds added (mergeKeys), open leases add up. The servers table says
// which were counted and how old each snapshot is. Without peers (the
// memory store) or when the store fails, the page shows this server's
// figures alone and says so. /status is guarded like /metrics:
// Options.MetricsTokenSHA256, when set, applies.
//
// # TLS
//
// With Options.TLSConfig, Run serves HTTPS, HTTP/1.1 and HTTP/2 by ALPN,
// instead of HTTP/1.1 and h2c (the daemon's -tls-cert and -tls-key). A
// client trusts the certificate through its HTTP client
// (client.Config.HTTPClient with a tls.Config whose RootCAs hold it, when it
// is not signed by a public authority).
package server
