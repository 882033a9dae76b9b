// Package client is the Go SDK of ratelease: global rate limits decided
// locally, in nanoseconds, from tokens leased in batches from the lease
// servers.
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
// # How a decision is made
//
// Each key holds at most one active lease: a batch of tokens granted by a
// server, valid until a deadline that the client counts from the moment it
// sent the request plus the lease's TTL, so the lease ends locally no later
// than the server expires it. Spending is an atomic subtraction from the
// lease's remaining count: no lock, no allocation, no system call. In the
// lease's first half one spend in eight also reads the monotonic clock (in
// user space, through the vDSO); in its second half every spend does, so
// that no token is spent past the deadline even if the background loop is
// late. A process paused across a deadline (SIGSTOP, a frozen VM) stops
// spending the expired lease at its first clock check after resuming, so
// it spends at most seven tokens of it per key, and usually none: the
// settle loop checks every lease first thing after a pause. This is the
// one place the client relaxes the design's "tokens left at the deadline
// are not spent": a clock read on every spend would cost more than the
// rest of the hot path. A key never seen waits for its first
// lease at most Config.ColdStartTimeout; concurrent callers share one
// request. A grant of zero comes with retry_after, and the key is then
// denied locally until that time: excess requests cost no network call.
//
// # The settle loop
//
// One goroutine keeps time for the leases and, at each tick
// (Config.SettleInterval), sends one call that carries every key needing
// work: a lease with about a quarter left or past half its TTL is renewed; a
// spent-out lease is settled and replaced in one step; idle keys
// (Config.IdleTimeout) and the least recently used keys beyond
// Config.MaxKeys are returned and forgotten. The batch asked for is the
// key's demand (tokens used plus tokens asked for in vain, averaged so that
// it follows a rise within about 100 ms and a fall within about a second)
// over Config.Horizon, but at most half a lease TTL's worth, and at most a
// quarter of the time the bucket takes to fill: tokens held in a lease count
// as taken from the bucket until spent, so on a shared key big batches would
// leave the bucket idle. A key asks at most once per tick, and a key whose
// lease ran out is denied (not delayed) until its next batch arrives.
//
// Renewal is double-buffered. The protocol lets a client hold one lease per
// key in each of two slots (protocol.LeaseEntry.Slot, an addition to the
// design's protocol). The client asks for the next lease in the free slot
// while the current one keeps serving; when the new lease arrives it
// becomes active, the old one is frozen (its remaining count swapped for a
// large negative number, which makes the used count exact without a lock)
// and settled in the next call. So requests never wait for a renewal, and
// no token is ever spent after the server closed its lease: the accuracy
// bound of the design, burst + rate·W over any window W, holds for the
// spending of all clients together, not just for the server's accounting.
// Settling a lease while still spending it would break that bound by up to
// a round trip's worth of tokens per client.
//
// # Failures
//
// Calls go to one server at a time; on failure the next server is tried at
// once, then the whole list again after a capped backoff (go-retryablehttp;
// no wait is longer than Config.MaxRetryWait, whatever Retry-After says). A
// server that answers garbage, impossible grants (more than asked, another
// key), 5xx or nothing counts as failed. While no server answers, open
// leases keep serving until their deadlines; after that Config.Fallback
// decides: FallbackSafeRate (the default) limits each key with a local
// x/time/rate limiter at the last safe_rate a server gave, the rule's rate
// divided by the clients holding the key, so the fleet stays near the limit;
// FallbackOpen allows everything; FallbackClosed denies everything. When a
// server answers again, leases resume. Decision.Source says which path
// decided.
//
// # HTTP
//
// Client.Transport wraps an http.RoundTripper so that every outgoing request
// spends from its keys' budget first, and Client.RetryableClient does the
// same for every attempt of a go-retryablehttp client. An upstream 429 with
// Retry-After denies the request's keys locally until then (DenyFor).
package client
