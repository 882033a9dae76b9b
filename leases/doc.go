// Package leases is the accounting engine of ratelease: the rules and their
// matching, the token bucket and the leaky bucket with leases, the Store interface with a memory
// store and a Redis store, and the Engine that applies rules to requests.
// It knows nothing of HTTP; package server puts it on the wire.
//
// # Why leases
//
// A central token bucket is exact but costs a network round trip per
// request. A lease hands a client a batch of tokens for a short time; the
// client spends them locally and settles later (reports what it used, gives
// back the rest, takes the next batch).
//
// Accounting stays exact because the store keeps, per key, the level L of
// the bucket, its refill clock t and the open leases (each with a grant G
// and an expiry e), and keeps L + O ≤ burst at every instant, where
// O = Σ G over the open leases:
//
//	advance: for each lease with e ≤ now, in expiry order:
//	             L = clamp(L + rate·(e − t), 0, burst − O);  t = e;  O −= G
//	         L = clamp(L + rate·(now − t), 0, burst − O);  t = now
//	grant:   g ≤ min(want, L, fair share);  L −= g;  O += g
//	settle:  O −= G;  L += G − used
//	take:    n ≤ L;  L −= n
//
// An expired lease is closed without credit: its tokens count as spent.
// Over any interval of length W the tokens spent by all clients together are
// therefore at most burst + rate·W, the bound of one central token bucket.
// Leasing adds no overshoot: a lease that is never settled costs
// utilization (its unused tokens are lost until it expires), never
// accuracy. The suite in leases/storetest checks the bound for every window
// while many goroutines lease and settle concurrently, against both stores,
// and replays each finding of the invariant review as a case of its own.
//
// # Piecewise refill
//
// The refill is applied piecewise: up to each expired lease's expiry under
// the cap burst − O that held until then, in expiry order, and only then to
// now. Closing the expired leases first and refilling over the whole gap
// after would bring back the refill their tokens held back: with burst 100
// and a 2 s lease of the whole bucket spent just before its deadline, the
// next caller would be handed another 100 at once — 2×burst within a few
// milliseconds (UnsettledExpiryKeepsBound). The design's one-line refill
// formula hides this, and so do steady-load tests, where every call moves
// the refill clock. The same caps make retry_after exact: a denied caller
// waits for the leases that must expire, then for the refill from the cap
// that held until each of them ended (see tbState.retryAfter).
//
// # Choices beyond the design
//
// These refine the project's design document without weakening its
// invariant:
//
//   - O is kept as a running sum beside the leases it sums, not recomputed
//     from them at every call. The design asks that it be derived from the
//     leases, "never stored beside them", because the review found it
//     stored in another Redis key, where eviction could drop one and keep
//     the other. Here it lives with the leases under the same lock (memory)
//     or in the same hash, written by the same script (Redis), so it can no
//     more drift from them than any field of a lease; recomputing it would
//     cost a scan of every lease on every call, which the bounded-work
//     requirement forbids.
//   - No call scans the leases. They are indexed by owner and slot (to
//     settle), by expiry (a heap in memory; in Redis a list inline in the
//     bucket hash up to 16 leases, a sorted set beyond), and counted per
//     client (for fair share). A call costs O(log n) plus the leases it
//     closes, each of which it closes once; retry_after walks at most 64
//     leases in expiry order and bounds the rest by the latest expiry,
//     which can only lengthen a wait. With 5,000 holders on a key a call
//     runs exactly the Redis commands it runs with 20
//     (TestRedisWorkFlatWithHolders).
//   - Caps bound a key's leases (LeaseLimits): open leases per key (default
//     10,000) and processes of one client holding leases on it (default
//     1,000). Beyond them a new lease fails with ErrTooManyLeases
//     (too_many_leases, 429); renewals in the same slot, settles and
//     returns are never refused.
//   - The level is clamped at zero. When a rule shrinks below what is
//     outstanding, burst − O is negative; the bucket is then empty, not in
//     debt, and refills from zero once the old leases end.
//   - Fair share splits a shared key between clients first, then between
//     the processes of each client. An Owner is the authenticated client
//     and the process (client_id, free text); from an owner's view the key
//     is shared among h = clients × processes-of-its-client parts, so a
//     client that runs, or invents, 100 process ids gets no more than a
//     client with one (FairShareBetweenClients). Within that, the design's
//     per-lease cap max(1, burst/h) alone did not protect small clients: a
//     client that asks every few milliseconds takes whatever has refilled,
//     and a client that asks rarely finds the bucket empty. So each owner
//     of a shared key also has a share clock, like a GCRA theoretical
//     arrival time: a grant may not exceed the owner's share of the refill
//     since its clock (rate/h per unit of time), plus whatever the bucket
//     holds above a quarter full, and the clock advances by h/rate per
//     token taken from the share. An owner below its share finds a quarter
//     of the bucket kept for it; unused shares are not wasted. On a shared
//     key a grant is half a fair batch (min(want, burst/h)/2) at least, or
//     nothing and a retry_after for when the share and the bucket will
//     hold it: an owner that asked every tick used to get a token or two
//     per call, so a saturated key cost a call per few decisions; asking
//     for whole batches only, small clients waited too long (the e2e
//     fairness test fell to 91% of their demand); half a batch keeps both.
//     All of these only ever lower a grant, so the bound holds.
//   - A denied owner holds a lease of zero tokens (a waiter) for one lease
//     TTL, unless it holds one in that slot. Without it, an owner denied
//     once holds nothing, is invisible to the others' share, and the
//     processes that keep their leases keep all of the refill. A waiter
//     changes no level and no outstanding count, is not reported (no lease
//     ID, not counted as expired) and cannot be settled.
//   - Two slots per owner and key (protocol.LeaseEntry.Slot): an owner may
//     hold two open leases on a key, so the SDK can take its next lease
//     before it settles the current one. Fair share and safe rate count
//     processes, not slots.
//   - At most one lease per owner, key and slot is open: asking again
//     without the lease ID closes the open lease as if fully spent (counted
//     in LeaseOutcome.Expired), which is always safe.
//   - A settle that names an expired, settled or foreign lease fails with
//     ErrUnknownLease and grants nothing, so a client cannot mint tokens by
//     replaying or guessing lease IDs.
//
// # Stores
//
// MemoryStore keeps buckets in this process, for a single lease server,
// and drops idle ones (full, no open lease) in a background sweep whether
// or not requests arrive. RedisStore keeps them in Redis, for any number of
// servers, with the algorithm in an embedded Lua script that performs the
// same floating-point operations as the Go code; TestStoresAgree runs
// random operation sequences against both and requires identical answers.
//
// A Redis bucket is one hash (rl:{key}) while at most 16 leases are open,
// plus a sorted set of expiries (rl:{key}:z) beyond, plus a sorted set of
// share clocks (rl:{key}:s) while it is shared; all carry the key's hash
// tag, so a script touches one Redis Cluster slot. The keys expire once the
// latest open lease has ended and the bucket would be full again, whatever
// the rule says now, so a reload that shortens lease_ttl cannot drop a
// bucket under an older, longer lease (ShorterTTLKeepsOpenLeases).
// Measured with MEMORY USAGE (Redis 7, keys user:<6 digits>): a bucket of
// direct takes 104 B, a bucket with one lease 232 B, one shared by two
// clients 448 B (TestRedisMemoryPerBucket; the review measured 240 B for a
// bucket with one lease in the old layout of two keys).
//
// Redis must run with maxmemory-policy noeviction and with persistence.
// Should it evict part of a bucket anyway, the script rebuilds it
// conservatively (PartLost): without the hash, the leases still in the
// expiry index stand as one ghost lease of the whole burst until the last
// of them ends, and the level starts empty; without the expiry index (a
// key crowded beyond 16 leases checks for it at every call), the index is
// rebuilt from the hash's leases and the expired ones are closed in order. A bucket lost whole — evicted,
// or a Redis restarted without its data — is a full bucket that has
// forgotten its open leases: that can admit one extra burst, and nothing
// in the store can tell.
//
// # Leaky bucket: a shaper with leases
//
// Algorithm leaky_bucket (leakybucket.go, scripts/leaky_bucket.lua) shapes
// instead of limiting bursts: requests leave at the constant rate
// Limit/Period, one every T = Period/Limit, and at most Burst of them wait
// in the queue. Its state per key is one theoretical arrival time TAT, the
// end of the last slot handed out (GCRA). At now:
//
//	grant g:  start = max(TAT, now); g ≤ want, g ≤ max(1, ⌊Burst/h⌋) among
//	          h holders, and g ≤ ⌊Burst − (start − now)/T⌋, so that the
//	          slice's end stays within the queue's horizon:
//	          start + g·T − now ≤ Burst·T. The lease holds the slice
//	          [start, start + g·T), its i-th slot at start + i·T;
//	          TAT = start + g·T; Delay = start − now.
//	settle u: if TAT still equals the slice's end (no slot was handed out
//	          after it), TAT = max(now, start + u·T): the unused tail comes
//	          back; otherwise the unused slots are lost.
//	expiry:   nothing comes back.
//	take n:   start = max(TAT, now); taken when the n slots fit the queue,
//	          then TAT = start + n·T and Delay = start − now: the caller
//	          must wait until its slot. Denied otherwise, with retry_after
//	          the time until they fit.
//
// The lease's deadline is the later of its slice's end and now + the
// rule's lease TTL: its owner can spend every slot of its slice, and can
// settle it at its usual renewal pace even when the slice is short. (An
// expiry credits nothing, so a later deadline costs no accuracy; it only
// keeps the lease counted among the holders and against the caps.)
// Remaining is the free slots of the queue, Reset the time until it is
// empty (TAT − now).
//
// The bound. Every slice starts at or after the TAT of the moment it is
// granted, and TAT only moves back on a settle while the settled slice is
// the last one handed out, to the end of the slots its owner used (or to
// now). So the slices ever handed out, cut to their used slots, never
// overlap, and every slot starts at least T after the previous one. When
// clients honour their slots (a request goes ahead at a slot's start or
// later, and within it), admitted requests are spaced at least T apart
// across the whole fleet, so any window of length D admits at most
// ⌊D/T⌋ + 1 of them: a constant outflow at rate, whatever the number of
// holders and servers. Measured as a meter (requests counted when they are
// handed their slot, as a token bucket counts), a window of length D sees
// at most the queue handed out at its start plus what drained into it:
// Burst + rate·D, because no slot lies more than Burst·T ahead of the
// moment it was handed out. The storetest suite (RunLeaky) checks both on
// every store: no two slots closer than T, at most ⌊D/T⌋ + 1 in every
// window, and none beyond the queue's horizon, while many goroutines lease,
// settle, abandon and take at driven times.
//
// What leasing costs: slots, never the bound. A lease settled after
// another grant, or never settled, loses its unused tail; so does a take
// whose request does not go ahead (Refund gives nothing back for this
// algorithm: a refund names a cost, not the take, and giving back cost·T
// whenever TAT sits at some take's end would hand out again a slot whose
// request goes ahead. Giving it back exactly needs the take's end in the
// refund, a change of TakeOp that is left for later). The client maps the
// slice onto its own clock conservatively: it starts it when the answer
// arrived plus the delay, and ends it when the request was sent plus the
// delay (rounded down) plus g·T, so a client never spends a slot early or
// late whatever the offset between its clock and the store's; the round
// trip and the millisecond rounding are the slice's tolerance, and cost
// about ⌈(RTT + 1 ms)/T⌉ slots per lease.
//
// In Redis a leaky bucket is one hash, rl:{key}:lb (TAT, the open leases
// with their slices, the holder counts), plus a sorted set of expiries,
// rl:{key}:lb:z, while a lease is open. Both expire once the queue is
// empty and the last lease has ended; a key with an empty queue and no
// lease is deleted at once. Should the hash be evicted alone, TAT restarts
// at the latest expiry in the index, after every slice handed out.
//
// # Other algorithms
//
// Rule.Algorithm names the algorithm, and the Store dispatches on it. The
// token bucket and the leaky bucket are implemented; fixed window and the
// sliding windows (counter and log) are reserved names that fail
// validation with ErrAlgorithmNotImplemented. Each keeps the lease contract
// (a grant, a deadline, a settle), so adding one changes no wire type.
package leases
