// Package leases is the accounting engine of ratelease: the rules and their
// matching, the token bucket with leases, the Store interface with a memory
// store and a Redis store, and the Engine that applies rules to requests.
// It knows nothing of HTTP; package server puts it on the wire.
//
// # Why leases
//
// A central token bucket is exact but costs a network round trip per
// request. A lease hands a client a batch of tokens for a short time; the
// client spends them locally and settles later (reports what it used, gives
// back the rest, takes the next batch). Accounting stays exact because the
// server keeps, per key, the level L of the bucket and the tokens O
// outstanding in open leases, and keeps L + O ≤ burst at every step:
//
//	refill:  L = max(0, min(burst − O, L + rate·(now − t)))
//	grant:   g ≤ min(want, L, fair share);  L −= g;  O += g
//	settle:  O −= G;  L += G − used
//	expiry:  O −= G   (nothing credited: assume all spent)
//
// Over any interval of length W the tokens spent by all clients together are
// therefore at most burst + rate·W, the bound of one central token bucket.
// Leasing adds no overshoot: a lease that is never settled costs
// utilization (its unused tokens are lost until it expires), never
// accuracy. The suite in leases/storetest checks the bound for every window
// while many goroutines lease and settle concurrently, against both stores.
//
// # Choices beyond the design
//
// These refine ../shared/DESIGN.md without weakening its invariant:
//
//   - The level is clamped at zero. When a rule shrinks below what is
//     outstanding, burst − O is negative; the bucket is then empty, not in
//     debt, and refills from zero once the old leases end. Clamping only
//     ever lowers L, so L + O ≤ burst holds as soon as the old leases end.
//   - The cap burst − O is applied at every operation, so refill that would
//     have happened while leases held the whole burst is not banked. This is
//     what the design's refill formula says; it makes a contended key err
//     towards fewer tokens.
//   - Fair share goes further than the design's per-lease cap
//     max(1, burst / holders), which alone did not protect small clients: a
//     client that asks every few milliseconds takes whatever has refilled,
//     and a client that asks rarely finds the bucket empty. So each owner of
//     a shared key also has a share clock, like a GCRA theoretical arrival
//     time: a grant may not exceed the owner's share of the refill since its
//     clock (rate / holders per unit of time), plus whatever the bucket
//     holds above a quarter full, and the clock advances by holders / rate per
//     token taken from the share. An owner that asks often gets small
//     grants; an owner below its share finds a quarter of the bucket kept
//     for it (a half left the others' refill unused too often);
//     unused shares are not wasted. An owner asking too soon gets 0 and a
//     retry_after for when its share reaches a token. The end-to-end
//     fairness test holds clients below their share to at least 95% of
//     their demand. Both caps only ever lower a grant, so the bound holds.
//   - Two slots per owner and key (protocol.LeaseEntry.Slot): an owner may
//     hold two open leases on a key, so the SDK can take its next lease
//     before it settles the current one. Fair share and safe rate count
//     owners, not slots.
//   - At most one lease per owner, key and slot is open: asking again
//     without the lease ID closes the open lease as if fully spent (counted
//     in LeaseOutcome.Expired), which is always safe.
//   - retry_after is the time until the bucket can serve one token (a check:
//     its cost) if nothing else happens: until refill brings the level there
//     and, when open leases hold the bucket, until enough of them expire. A
//     lease settled early can only make it shorter.
//   - A settle that names an expired, settled or foreign lease fails with
//     ErrUnknownLease and grants nothing, so a client cannot mint tokens by
//     replaying or guessing lease IDs.
//
// # Stores
//
// MemoryStore keeps buckets in this process, for a single lease server.
// RedisStore keeps them in Redis, for any number of servers, with the
// algorithm in an embedded Lua script that performs the same floating-point
// operations as the Go code; a test runs random operation sequences against
// both and requires identical answers. Both drop buckets that are full and
// hold no lease, so memory follows the active keys.
//
// # Other algorithms
//
// Rule.Algorithm names the algorithm, and the Store dispatches on it. Only
// the token bucket is implemented; fixed window, sliding window (counter and
// log) and leaky bucket are reserved names that fail validation with
// ErrAlgorithmNotImplemented. Each will keep the lease contract (a grant, a
// deadline, a settle), so adding one changes no wire type.
package leases
