// Package client is the Go SDK of ratelease: global rate limits decided
// locally, in nanoseconds, from tokens leased in batches from the lease
// servers where a key's local demand makes a batch worthwhile, and by one
// coalesced call per decision where it does not.
//
//	c, err := client.New(client.Config{Servers: []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"}})
//	if err != nil { ... }
//	defer c.Close(ctx)                          // returns every unused token
//
//	d := c.Allow(ctx, "user:42", "api:search") // all or nothing across keys
//	l := c.Limiter("user:42")                  // a handle for the hot path
//	if l.Allow() { ... }                       // one atomic operation
//
// The package imports protocol but neither leases nor server, so a service
// that embeds it does not link the lease server.
//
// # Direct or leased
//
// Each key is decided, per process, in one of two ways.
//
// Direct: a key starts here. A decision is a direct take at a lease server
// (the tokens taken outright, all or nothing across its keys, no lease left
// open), sent at once and coalesced with the decisions of the process in
// flight at that moment: at most four calls carrying takes are in flight,
// and a decision that finds them busy goes in the next call with every
// decision that arrived meanwhile. A decision waits about one round trip.
// A decision that finds no other waiting makes its call in its own
// goroutine, without a hand-off; when its context ends first it returns at
// once, and its call is canceled (the take may still have happened at the
// server: lost to utilization, never to accuracy), which is no failure of
// the server. Until that server next answers a direct call, the decisions
// after it go through a sender goroutine, whose calls their callers leave
// without canceling them: the servers are then judged by their answers,
// so that a server slower than its callers wait is not taken for dead
// (the fallback would decide beside it, adding to the limit), and one that
// hangs is, Config.RequestTimeout after the first such call was sent
// (with several servers, it is avoided, and its keys fail over). A
// decision that returned while it was queued is not sent; nor is one
// queued when a call finds that no server answers (it is decided as
// below).
// With several servers, each take goes to the server its first key prefers
// (rendezvous hashing over Config.Servers, the same in every process that
// lists the same URLs, in any order; Config.NoKeyRouting turns it off), so
// that a key's direct takes, from all the processes, meet at one server:
// the takes coalesced at one moment go as one call per server, sent
// concurrently, and count together as one of the four calls (so a server
// has at most four calls of takes from a process in flight, but for a
// moment after a failover), and each decision waits for its own server's
// answer only. Routing only concentrates a key's demand: any server decides
// any key correctly.
// The answer teaches the client the key's rule; a denial comes with the
// time the key's bucket needs to serve again, and the key is denied
// locally until then, without a call. While a key is young — its rule
// not learned yet, or, on a bucket big enough to lease, fewer than half of
// Config.LeaseMinTokens admitted in its first quarter of a lease TTL — a
// decision that finds a take of it in flight waits for that answer (once,
// at most Config.RequestTimeout) rather than send a take of its own: the
// key may be hot (see Leased), and then they are served from its first
// lease; otherwise they pay a round trip more, during its first few
// answers only. This is the right mode for the keys
// the mission cares most about — per-user limits whose requests a load
// balancer spreads over many processes, so that each process sees a few per
// second of each user: a lease there would hold tokens the other processes
// need, and renewing it would cost more calls than the decisions it saves.
//
// Leased: once this process is admitted at least Config.LeaseMinTokens
// (default 8) of a key over one lease TTL, or half as many at twice that
// pace; the decisions waiting for an answer of a young key count with the
// admitted tokens, as far as the bucket still had room for them, so that a
// key hot from its first request is promoted at its first answers; and so
// do its denials, on a bucket big enough to lease. At a saturated key the
// lease holders are served in turn, their deferred grants ahead of the
// refill, and a process left on direct takes would find the bucket taken
// at every retry (measured: a few tokens or none in seconds, while the
// first process promoted took most of the refill); with its own lease it
// is served its share. Such a key's first lease asks for two ticks of the
// bucket's refill only, until one is granted, since a deferred grant waits
// for its whole batch's refill. The settle loop takes the key over and
// leases it batches sized to its demand (below); a decision for more
// tokens than the key's batch holds is taken directly. A lease not spent
// from by half its TTL (from when it could be spent from: a deferred
// batch's wait does not count) is returned, not renewed, and the key goes
// back to direct decisions, its decisions taken directly while the return
// is on its way; so does a key whose
// demand over a lease TTL falls below half the threshold, and a key the
// server refuses more leases on (too_many_leases), and a key whose lease
// was refused because a lease server owns its bucket (see
// leases.OwningStore: the server decides the key's direct takes from
// memory, and hands the bucket back once told a lease was wanted), which
// is not leased again for a lease TTL. An idle key costs no call and holds
// no token.
//
// Once promoted, a key's decisions wait for its first lease, which the
// loop asks for at once (about one round trip; a decision's waits, for an
// answer and for a lease, take Config.RequestTimeout at most in all, and
// hold no token of the decision's other keys), and are served from it: taking directly
// meanwhile would cost a call and the store's work per decision on exactly
// the keys hot enough to lease (at the benchmark's hot key, before a
// young key's answers and the first lease were waited for, about a dozen
// takes per process start, a third of the Redis work of the whole run;
// now one or two). If
// no lease comes — refused, none granted, the call failed or is slower —
// the decisions go on as they would have: by direct takes, or by the
// fallback when no server answers, never denied for want of the lease.
// While a leased key's lease has run out and its next one is not in yet,
// its decisions are denied (they count as demand for the next batch; while
// lease calls fail, until the spent lease's deadline, then they are taken
// directly) —
// but on a roomy key (see below), whose lease runs out only when its
// renewal is late (a paused process, a starved CPU), they wait for the
// renewal like a first lease, until its answer (a refusal ends the wait
// too), whether or not the settle loop has already closed the spent-out
// lease.
//
// The fallback (Config.Fallback) decides only while no server answers: a
// slow answer is waited for, because a fallback decision made while the
// servers are deciding too adds to the limit. "No server answers" is what
// the direct takes find: a failed lease call of the settle loop stops
// decisions from waiting for leases (they go on by direct takes, but a
// key's spent lease denies it until its deadline, without a take) and
// sends none to the fallback, since the servers may still answer takes (a
// server or a proxy that fails lease calls alone); a direct take that then
// fails is what sends them there. An answer to either kind of call brings
// direct decisions back at once.
//
// # Spending a lease
//
// Each key holds at most one active lease: a batch of tokens granted by a
// server, valid until a deadline that the client counts from the moment it
// sent the request plus the lease's TTL, so the lease ends locally no later
// than the server expires it. Spending is an atomic subtraction from the
// lease's remaining count: no lock, no allocation, no system call. Until
// the lease's late renewal point (three quarters of its TTL, at least eight
// ticks before its deadline, never before half of it) one spend in eight
// also reads the monotonic clock (in user space, through the vDSO); from
// then on every spend does, so that no token is spent past the deadline
// even if the background loop is late. A process paused across a deadline
// (SIGSTOP, a frozen VM) stops spending the expired lease at its first
// clock check after resuming, so it spends at most seven tokens of it per
// key, and usually none: the settle loop checks every lease first thing
// after a pause. This is the
// one place the client relaxes the design's "tokens left at the deadline
// are not spent": a clock read on every spend would cost more than the
// rest of the hot path. A grant of zero comes with retry_after, and the key
// is then denied locally until that time: excess requests cost no network
// call. The server counts other holders' leases until they expire, so a
// wait on them can run to a lease TTL, while a busy key's holders settle
// them long before: a local denial lasts at most the time the bucket takes
// to fill (at least two ticks), and the key then asks again (one call per
// fill time at most; at the benchmark's saturated key, three of six
// processes refused at its start were denied a whole TTL, 2 s, before
// this). On a key other processes hold too, the wait is the retry_after plus
// up to half as much again, at random (then cut to the fill time): every
// holder refused at one moment
// is told about the same retry_after, and asking together all but one
// would be refused again (at the saturated key of the benchmark this cut
// the calls from about 130 to about 90 per 1,000 decisions; a spread of a
// whole retry_after cut them to 78 but lost up to a point of admissions).
//
// A key whose lease ran out asks for the next one accepting a deferred
// grant (leases.LeaseOp.MaxDelay): where the bucket, or this process's
// fair share, cannot serve the batch yet, the server grants it with the
// wait before it may be spent, and the key is denied locally until its
// answer's arrival plus that wait — then spends the batch without another
// call. A key whose latest lease request was refused or deferred (bound)
// is not renewed early: a renewal with tokens left would be refused, or
// would replace the lease that still has them; it settles and asks in one
// entry that accepts a deferral once spent out, or near its deadline, and
// an unspent one is returned as idle. At the saturated key of the benchmark (e2e/compare,
// 4 s runs) this cut the calls from about 90 to 50–70 per 1,000
// decisions, and to 26–32 once the server deferred a whole batch rather
// than grant a part of it (see leases/doc.go; the floor there is 20); its
// Redis commands per decision went from 0.57 before these changes
// (BENCHMARKS.md at commit 8f67f6e) to 0.16 in the committed BENCHMARKS.md
// (27 lease calls per 1,000 decisions there). It loses 0.6–1.0% of the
// exact bucket's admissions in a 4 s run (0.63%, 26 tokens, in the
// committed one; 0.59% to 1.00% in fifteen runs alone) and 0.26%, about
// 30 tokens, in one 12 s run (go test -run '^$' -bench
// 'Compare/^(hot|saturated)$/a-lease' -benchtime 12s ./e2e/compare/, not
// committed as a report): about as many as were granted out of the refill
// and still held in leases when the run stops (Stats.TokensHeld less the
// bucket's debt then: 75 − 45 = 30 beside 26 lost in the committed run).
//
// # Priorities
//
// Config.Priority is the process's default priority class (critical,
// high, normal or low); a rule may reserve shares of its limits for the
// classes above a request's (rules file: reserve: {critical: 20%}), and
// then serves a class only from what lies beyond their reserve. Every
// lease the client takes carries the default class, so a lease belongs to
// one class. WithPriority gives one decision another class: it is decided
// by a direct take that carries its class, never from the key's lease and
// never denied locally by another class's denial, so a critical call
// never spends a best-effort lease, nor the reverse.
//
// # The settle loop
//
// Its time comes through the client's clock (the monotonic clock; the
// package's tests drive their own, so renewals, returns and idle keys are
// tested at chosen instants rather than by sleeping).
//
// One goroutine keeps time for the leases of the leased keys (it never
// visits a direct key, so a process may decide millions of keys directly
// at no cost to the loop) and, at each tick (Config.SettleInterval), sends
// one call that carries every key needing work: a lease with about a
// quarter left or past half its TTL is renewed (a bound key's, below, is
// not); a spent-out lease is settled and replaced in one step; idle keys
// (Config.IdleTimeout) and the least recently used keys beyond
// Config.MaxKeys are returned and forgotten. The batch asked for is the
// key's demand (tokens used plus tokens asked for in vain, averaged so that
// it follows a rise within about 100 ms and a fall within about a second)
// over Config.Horizon, but at most half a lease TTL's worth, and at most a
// quarter of the time the bucket takes to fill, and never more than a
// quarter of the bucket: tokens held in a lease count as taken from the
// bucket until spent, so on a shared key big batches would leave the bucket
// idle, and the first process to come must not take a small bucket whole.
// A key asks at most once per tick.
//
// A roomy key (its latest grant was all it asked for and left the bucket
// at least twice that) is renewed later: with a sixteenth of its batch
// left (its cushion), or at three quarters of its TTL (at least eight
// ticks before its deadline, never before half of it), and its batch is
// the rate its lease was spent at over that time, so that it lasts until
// then. A hot key then costs the store a renewal every three quarters of
// a TTL rather than every three eighths or so. A lease that has more than
// its cushion left at three quarters, but that the pace it is spent at
// brings down to its cushion by an eighth of its TTL before its deadline,
// is
// renewed at its cushion instead: the lease a renewal replaces is frozen,
// and one frozen with more than its cushion costs a call of its own to
// return (below). Its idle lease is still returned at half its TTL. Its
// lease is spent without a clock read per spend until three quarters of
// its TTL (see above).
//
// Renewal is double-buffered. The protocol lets a client hold one lease per
// key in each of two slots (protocol.LeaseEntry.Slot, an addition to the
// design's protocol). The client asks for the next lease in the free slot
// while the current one keeps serving; when the new lease arrives it
// becomes active, the old one is frozen (its remaining count swapped for a
// large negative number, which makes the used count exact without a lock)
// and settled: in the next call when the bucket is tight (the grant was
// less than asked, or left less than twice itself in the bucket) or the key
// is denied, since its remainder is then what other holders wait for;
// otherwise with the key's next renewal, which goes into the frozen lease's
// slot and settles it in the same entry, so that a hot key costs one call
// per batch rather than two (a frozen lease near its deadline is settled on
// its own). A roomy key renewed late freezes its lease a quarter of a TTL
// before its deadline, before its next renewal: when no more than its
// sixteenth is left, and holding it open does not cap a small bucket (the
// holders' leases of its size within a quarter of it), it is not settled
// at all but expires at the server, its remainder counted as spent, toward
// the limit; returning those few tokens would cost the store as much as
// the renewal saved. So requests wait for a renewal only when a roomy
// key's lease ran out before its late renewal came in (a starved loop), and
// no token is ever spent after the server closed its lease: the accuracy
// bound of the design, burst + rate·W over any window W, holds for the
// spending of all clients together, not just for the server's accounting.
// Settling a lease while still spending it would break that bound by up to
// a round trip's worth of tokens per client.
//
// # Failures
//
// Lease calls go to one server at a time; on failure the next server is
// tried at once, then the whole list again after a capped backoff
// (go-retryablehttp; no wait is longer than Config.MaxRetryWait, whatever
// Retry-After says). A server that answers garbage, impossible grants (more
// than asked, another key), 5xx or nothing counts as failed. A routed direct
// take whose server failed goes at once to the next server of its key's
// rendezvous order, then, when every one failed, the key's list again after
// the same backoff; and every routed take avoids the failed server for a
// while (from Config.SettleInterval, doubling with each failure in a row, at
// most Config.MaxRetryWait), then one take probes it, and its answer brings
// the server's keys back: a dead server costs a failed attempt per backoff,
// not one per key. When every server of a key's order is avoided, its take
// goes to the first. A refusal (401, 403) moves no take on: see
// Misconfiguration. While no server answers, open
// leases keep serving until their deadlines; after that Config.Fallback
// decides, and one decision per backoff period tries the servers again: FallbackSafeRate (the default) limits each key with a local
// x/time/rate limiter at the last safe_rate a server gave, the rule's rate
// divided by the clients holding the key, so the fleet stays near the limit;
// FallbackOpen allows everything; FallbackClosed denies everything. When a
// server answers again, leases resume. Decision.Source says which path
// decided.
//
// A server whose store fails for some keys only (a Redis Cluster node down)
// answers: those keys' entries and takes fail alone with store_unavailable
// (a lease call all of whose entries failed so is a 503 that carries every
// entry's result, an answer, not a failed server). The client stays
// online, and decides each such key as when no server answers (its live
// lease serves, a spent-out one is denied until its deadline, then the
// fallback) for a hold of a second, without a call; then the key's next
// decision, or the settle loop, asks again. A take of several keys that
// fails so holds none of them (which key failed is not known). This is
// logged at level warn at most once a second.
//
// # Misconfiguration
//
// A refusal is not a rate limit. A server that refuses the client's calls
// as a whole — 401 for a missing or wrong Config.Token, 403, or another 4xx
// — is answering, so the fallback does not decide: the decisions that need
// a server are denied with Source SourceRefused and Decision.Err set to a
// *RefusedError (matching ErrServerRefused, and ErrUnauthorized or
// ErrForbidden), for about a second without a call, then asked again.
// Wait, Transport and RetryableClient return that error at once, never
// one matching ErrRateLimited. Stats.Refusals counts the refused calls; the
// first refusal after an answer is logged at level error, once, and
// Config.OnServerError sees each. A key the client's token may not use is
// denied with Source SourceDenied and an Err matching ErrForbidden. New
// probes the servers (GET /v1/rules, within Config.ProbeTimeout) and fails
// when the first that answers refuses the client with 401 or 403; when none
// answers, it starts, because servers that are down are an outage, which
// the fallback is for.
//
// A decision for more tokens than a key's rule can ever hold is denied with
// an Err matching ErrCostExceedsBurst, which Wait returns at once: no wait
// serves it. A 429 that does not answer the call's entries comes from
// something between the client and the server (a gateway's quota): a
// failed server, never a refusal of the client.
//
// # A server that lies
//
// The client checks every answer against what it asked and what any rule
// could be: a grant larger than asked, a lease ID the protocol forbids, a
// TTL, delay or retry_after out of range, a period beyond any rule's, more
// limits than a rule holds, an answer for another key or entry. Such an
// answer is a failed call (ErrServerResponse), handled as a server that did
// not answer: nothing of it is spent or believed.
//
// # HTTP
//
// Client.Transport wraps an http.RoundTripper so that every outgoing request
// spends from its keys' budget first, and Client.RetryableClient does the
// same for every attempt of a go-retryablehttp client. An upstream 429 with
// Retry-After denies the request's keys locally until then (DenyFor).
package client
