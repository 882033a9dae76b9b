// Package leases is the accounting engine of ratelease: the rules and their
// matching, the algorithms with leases (token bucket, fixed window, sliding
// window log and counter, leaky bucket), the Store interface with a memory
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
//	         (deferred, below: g ≤ burst − O, spent only after its wait;
//	         L may go below zero, and the refill then pays that debt)
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
//   - The level is clamped at zero, but for the debt of a deferred grant
//     (below). When a rule shrinks below what is outstanding, burst − O is
//     negative; the bucket is then empty, not in debt, and refills from
//     zero once the old leases end. A refill or a credit pays a debt and
//     never deepens it.
//   - Deferred grants (LeaseOp.MaxDelay, protocol max_delay_ms): where a
//     lease would be refused because the level, or the owner's share,
//     does not yet hold its batch, an owner that accepts a deferral is
//     granted the whole batch at once with Delay, the wait until the refill
//     (and its share) covers it, and spends none of it before then. The
//     level goes into debt by the batch: the grant is a take of g at
//     now + Delay, when the level without it would have held g, made
//     early; every later operation sees the debt, and a later deferral
//     waits behind it. So the bound holds (ConcurrentBoundDeferred counts
//     each deferred token at its grant plus its Delay, and fails if they
//     are counted at the grant). It is what makes a saturated key cost one
//     call per batch: refused, every waiting holder was told about the same
//     retry_after, all asked again together, and all but one were refused
//     again. A deferral is made only when the wait is at most MaxDelay
//     and half the lease TTL, the batch fits under the cap burst − O as
//     it stands (a batch waiting for other leases to end would hold the
//     cap down for everyone), the owner's class has no floor, and, when
//     the owner's share comes after the level, the level stays within
//     half the burst until then: the refill above a quarter is spare any
//     holder may take at once, and a batch parked on its share must not
//     hold much of it back (the e2e TestFairness lost 9% of the rule's rate
//     without this; with a quarter, or with the cap burst − O as the
//     limit too, a saturated key's holders deferred nothing, or were
//     refused once before each deferral, for seconds: see
//     tbState.deferral). An ask that accepts a
//     deferral gets its whole batch deferred rather than the part the
//     level or its share holds now, when a deferral may be made: the part
//     would be spent before the share grew again, and the next ask
//     refused. A bucket in debt is not acquired by a lease server
//     (own.go) until the refill has paid the debt: an ownership's expiry
//     empties the bucket, which would forgive it.
//     The floor of a saturated key's calls is then one per fair batch:
//     about rate × holders / burst a second (each holder's batch is at
//     most burst/holders, and the holders together get the refill).
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
// bucket under an older, longer lease (ShorterTTLKeepsOpenLeases). A
// window whose rule changed its period counts the leases of the old rule
// still open until they end, and its keys live as long as they do; a key
// whose rule changed its algorithm keeps the state of each, in both stores
// (storetest.RunRuleChange, on every store; TestRuleChange* for the keys'
// TTLs and the two stores' answers compared). The new algorithm's state
// starts full while the leases granted under the old one stay spendable
// until their deadlines, so across each change of algorithm a key admits
// at most the rule's bound plus one capacity of the new algorithm (a
// token bucket's burst, a window's limit, a leaky bucket's queue), the
// old leases included: 10 tokens leased under 10 per hour, then a change
// to fixed_window, admit 10 more within the hour
// (server.TestReloadAlgorithmChangeBound). A rule's limits are stored by
// their place in Rule.Limits (limitKey): a reload that removes or
// reorders them gives a limit the state of the one that stood at its
// place before, and counts as that place's change of algorithm or
// period, with the same bound ([fixed_window 10/s, token_bucket 100/day]
// with 100 admitted, then [token_bucket 100/day], admits 100 more that
// day, found by the invariant review; server.TestReloadLimitRemovedBound).
// Keys by the limit's own parameters
// would keep a moved limit's count, but would lose the count of a limit
// whose period changes, which is kept now, and would need the stored
// state moved at upgrade. The
// hash's TTL is set with half again of slack, and the Redis time it runs
// to is kept beside x; a write whose need it still covers leaves it
// running, so a renewal runs EVALSHA, TIME, HMGET and HSET, and a PEXPIRE
// only about once in every few (TestRedisStoreHashTTLSlack). The price: an
// idle leased bucket stays up to half its need longer, and that mark moved
// a leased bucket one size class of the allocator up.
// Measured with MEMORY USAGE (Redis 7, keys user:<6 digits>): a bucket of
// direct takes 104 B (152 B taken through an OwningStore, whose record of
// the server that took keeps it a lease TTL at least), a bucket with one
// lease 264 B (232 B without the
// mark), one shared by two clients 328 B (TestRedisMemoryPerBucket; the
// review measured 240 B for a bucket with one lease in the old layout of
// two keys).
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
// On a Redis Cluster one node can fail while the others serve (until a
// replica takes over, or for good with cluster-require-full-coverage no).
// A call of many keys is one pipeline per node, so the store fails the
// ops of that node's keys alone, each in its outcome's Err (wrapping
// ErrStoreUnavailable), and the Engine fails their entries and takes alone
// (a take with such a key gives back what its other keys took; a rule
// whose second limit failed gives back its first limit's grant): the other
// keys are decided as usual. A call with none but that node's keys is told
// from a cluster that is down by the other masters: one ran an op within
// RedisOptions.PartialWindow (100 ms), or says cluster_state:ok then; if
// none does (every node down, or the cluster declared the node failed and
// serves no key, as it does under cluster-require-full-coverage yes), the
// call fails whole, as on a single node (TestRedisClusterShardDown,
// TestEngineClusterShardDown, TestRedisClusterDownIsNotPartial,
// TestRedisClusterHungNodeAlonePartial). A failed op did not run, or ran
// without its answer: what it may have done errs toward the limit (a grant
// nobody spends, a settle not credited; a take's tokens counted), provided
// the client never sends a script twice (see RedisStore:
// TestRedisClusterStalledRefundOnce).
//
// # Owned token buckets
//
// A lease server may own a token bucket (own.go has the contract; both
// stores implement Owning, tokenbucket_own.go and the script's modes own
// and release). The ownership is recorded beside the level, never apart
// from it: in memory in the bucket's state, in Redis in the same string,
// "<level> <clock> <deadline> <contested> =<id> <owner>", where level and
// clock are the owner's L0 and t0 (nothing changes them while it owns the
// bucket), id is the ID of the acquisition that began it (OwnOp.ID) and
// PX outlives the deadline by the refill of the whole burst. (A script
// from before the IDs reads "=<id> <owner>" as another server's name, and
// refuses; a record without the ID reads as ID "".)
// So a bucket nobody owns costs what it always did: a direct take is
// still EVALSHA, TIME, GET and SET, and a take refused because the bucket
// is owned adds at most one SET, for the contested mark
// (TestRedisTakeCommands). Choices the contract leaves open: an acquire
// refused for open leases (waiters too) retries once the last of them ends,
// at most one lease TTL later; a refused lease records no waiter (the
// bucket stays a string); a refund on an owned bucket is ignored (nothing
// was taken from it); a snapshot reports the owner, no free token, the
// most the owner can hold as the level, and the waits as if the ownership
// expired at its deadline, empty. An ownership lost with its string is a
// full bucket again, like any bucket lost whole.
//
// A bucket not owned and with no lease open also records, in the same
// string, the server its last take came through (TakeOp.Server), when,
// and when that server last changed: an acquire is refused while another
// server took within a lease TTL. Without it, HTTP clients that spread a
// key's checks over the servers saw their takes refused at every server
// but the owner until its renewal: a quarter of the admissions of the hot
// and few-users workloads' per-request HTTP system were lost before it.
//
// OwningStore (owning.go) is the owner: a Store over another, used by
// rateleased with Redis (-own-keys). It counts each key's takes; a key
// with OwningOptions.MinTakes (16) of them within a lease TTL is acquired
// at the loop's next tick (every 20 ms), once no take of its own is in
// flight at the store (which would be refused and mark the ownership
// contested). Owned, its takes and refunds run on a tbState in memory —
// the memory store's own code, so its answers are the store's — whose
// clock starts when the acquisition's answer arrived and whose deadline
// runs from when it was sent: the owner credits less refill than the
// store and stops before the store expires it. A take that finds its key
// acquiring or releasing waits for that (one round trip). At half the TTL
// the loop renews a key used since the last renewal and releases one that
// was not; it releases at once a key whose rule's bucket changed, that a
// client leases through this server (Lease waits for the release), or
// whose renewal came back contested, and does not acquire those again for
// ten TTLs. The bound: the owner decides as one exact bucket would from
// the level the store gave it, with less time; what it hands back is
// capped by the store; if it dies, the store empties the bucket at the
// deadline. TestOwning* run it over the memory store and a real Redis on
// a clock the test drives, comparing every answer with one tbState fed
// the same takes at the same times.
//
// A Redis master that stalls past the read timeout runs, when it resumes,
// the ops it had queued, whose answers the owner never saw. An
// acquisition that ran so left the store refusing the owner's takes, and
// the owner's next acquisition was answered as a renewal, without a
// level: it started from an empty bucket (on a real cluster, 73 of 73
// takes of a bucket of 99 tokens refused). Each acquisition now carries a
// new ID and the IDs of the key's acquisitions whose answers were lost;
// the store begins afresh (from L0 + rate·(now − t0), under the burst) an
// ownership that one of those began, since nobody decided from it, and a
// late copy changes nothing, since the ownership it finds is not among
// its own Lost. Renewals and releases name the ownership's ID, so a late
// release cannot end the ownership that followed, and a renewal never
// begins an ownership: one that ran late, after the expiry, began one
// under the ID the owner still renewed, and the owner decided on from the
// bucket the store had emptied (TestOwningLateRenewalBeginsNothing; older
// than the IDs). Why not begin afresh
// any ownership of the same server: the one it finds may be one the owner
// decided from and lost track of (its renewals' answers lost), and
// beginning that afresh would admit again what it admitted; such an
// ownership is handed back at level 0 instead. TestOwningAcquisitionAnswerLost
// drives those orders over both stores, TestRedisClusterOwnAcquisitionStalled
// on a cluster with a master stopped (SIGSTOP).
//
// # Algorithms
//
// Each limit names its algorithm, and both stores dispatch on it through
// one table (algorithm.go): an algorithm is a keyState in Go, which the
// memory store runs, and a Lua script, which the Redis store runs, the two
// performing the same operations in the same order; a differential test
// per algorithm holds them to identical answers. Every algorithm keeps the
// lease contract — a grant, a deadline, a settle with what was used, an
// expiry that counts the lease as fully spent — and a direct take for keys
// that do not lease. Its Redis keys carry its tag after the key's hash
// tag, so a rule that changes algorithm starts its keys afresh (and may
// admit one capacity of the new algorithm more across the change, the
// leases open under the old one included: see Stores). The sections
// below state each algorithm's bound and what leasing costs it.
//
// # Several limits per rule
//
// A rule may hold several limits ("3 per minute and 100 per hour"), each
// with its own algorithm; a request needs all of them. The Engine runs a
// lease entry against every limit in one store call, with one lease ID,
// each limit under its own store key (the key itself for the first limit,
// so that adding a limit keeps the first one's state; the key, a unit
// separator and the limit's index for the others). The grant is the least
// of the limits' grants; a settle reports the same used count to each,
// which credits each with what it granted beyond it. A limit that granted
// more than the least keeps the difference reserved until the settle or
// the expiry: that costs utilization, never a bound, because every limit
// counts at least what the owner may spend. When any limit grants nothing,
// the others' grants are returned at once, in a second store call. A take
// takes its cost from every limit of every key, all or nothing, and gives
// back what the denied takes took. Each limit's own bound therefore holds
// on its own: TestTwoLimits (e2e) checks 5/s and 20/10s together in every
// window across processes and servers.
//
// # Window algorithms: what they share
//
// For the three windows Limit is the limit per window and Period the window
// W; Burst has no meaning (the rules layer sets it to Limit, and validation
// refuses any other value). Their lease bookkeeping is written once
// (windowleases.go; scripts/window_leases.lua, which the Redis store
// prepends to each window's script, after scripts/lease_common.lua, the
// holders' bookkeeping every algorithm's script shares): at most one open lease per owner, key
// and slot, recorded "<id> <granted> <deadline µs> <window µs>" under
// "<slot>|<client>/<process>"; a settle needs the lease's ID
// (ErrUnknownLease) and used ≤ granted (ErrUsedExceedsGranted); a grant
// without the ID replaces the slot's open lease as fully spent (counted in
// Expired); the caps of LeaseLimits apply as for the token bucket, and
// renewals are never refused. Fair share caps a grant at max(1, limit/h),
// with h counted as the token bucket counts it (clients holding open leases
// × processes of the owner's client), from counts kept as leases open and
// close; there is no waiter and no share clock. A grant is never more than
// what is free. Leases are indexed by deadline (a heap; in Redis a sorted
// set), so no call scans them. In Redis a key's state is a hash
// (rl:{key}:<tag>) holding the counts and the leases, the deadline index
// (…:z) while leases are open and, for the log, its buckets (…:s); all
// expire (PEXPIRE, 1 s of slack) once the state can no longer count, and a
// state equivalent to none is deleted at once. TestStoresAgreeWindows runs
// random operation sequences against both stores and requires identical
// answers; storetest.RunWindows checks each algorithm's bound in every
// window, at every start, while goroutines lease, spend at driven times,
// settle and take concurrently, against memory, Redis and Redis Cluster.
//
// The window scripts do not rebuild a partly evicted state as the token
// bucket's does: with the hash lost, the key counts from zero (like a
// bucket lost whole: up to one extra limit); with the deadline index lost
// while leases are open, those leases are never closed by expiry (they
// still settle), which only refuses more (their tokens stay counted, the
// caps fill) until the key is left alone long enough for its hash to
// expire. Run Redis with noeviction.
//
// A Take followed by a Refund (the engine's all-or-nothing across keys and
// limits) gives back only where the take counted: the take's outcome
// carries its stamp (TakeOutcome.At, the store's time), and the refund names
// it (TakeOp.At). fixed_window and the counter give back only a take of the
// current window, the log only from the bucket the take's time fell in.
// A refund whose take's window (or log bucket) has passed gives nothing
// back: that costs utilization, never the bound. Without the stamp, a take
// made just before a window's edge and refunded just after gave back
// tokens that the new window's admissions counted (TakeAndRefund in
// storetest.RunWindows covers that edge).
//
// # fixed_window
//
// Windows are aligned to the epoch (start ⌊now/W⌋·W) and count c: grants
// and takes add, a settle in the lease's own window gives back g − used. A
// take admits cost when c + cost ≤ limit; a grant is at most limit − c.
// A lease's deadline is min(now + TTL, the window's end), reported in
// LeaseOutcome.TTL, so a lease never outlives its window and every token of
// a window is counted in it: each aligned window admits at most limit,
// leases or not. Across an edge two windows' worth can fall within a
// window of length W (limit spent just before the edge, limit just after):
// 2·limit, the algorithm's own weakness, which leasing does not widen
// (TestMemoryStoreWindows/fixed_window/EdgeAndDeadline). A lease of an
// older window has expired: settling it fails with ErrUnknownLease.
// retry_after is the time to the window's end (−1 beyond the limit), Reset
// the window's end. Cost of leasing: a lease granted near the window's end
// is short. Memory: H with 4 fields (104 B in Redis for a key of direct
// takes; 352 B with one lease open, most of it the deadline index).
//
// # sliding_window_counter
//
// The estimate prev·(1 − elapsed/W) + cur, with prev the previous aligned
// window's count and cur the current one's; grants and takes up to
// ⌊limit − estimate⌋. It runs on fixed_window's machinery (one type, one
// script with a flag): deadlines at most the window's end, settles credit
// the lease's own window, a refund only the current window's takes.
// Bound: cur ≤ limit at every admission, so each aligned window admits at
// most limit; a window of length W spans at most two aligned windows, so it
// admits at most 2·limit. The estimate is a heuristic, and the adversary
// gets close to that (limit at the end of one window, then
// limit·elapsed/W through the next: 189 in a window of 100 at limit 100 in
// the Estimate case). Sub-windows would not help: with k sub-windows the
// adversary still spends limit in the last sub-window before an edge and
// limit·(1 − 1/k) after it, ≈ 2·limit for any k; we keep k = 1 (two
// counters). Leasing adds nothing: a lease's tokens are counted in cur at
// its grant, in the window they are spent in (the deadline is the window's
// end). retry_after solves the estimate for the time it admits the
// tokens; Reset is when it reaches zero. Memory: as fixed_window (120 B,
// 352 B with a lease).
//
// # sliding_window_log
//
// Exact: at most limit admitted in any window of length W. The log holds
// entries (start, end, n), n tokens spent at instants in [start, end]: a
// take is (now, now, cost); an open lease is (grant time, deadline, g); a
// settle replaces it by (grant time, min(now, deadline), used); an expired
// or replaced lease stays (grant time, deadline, g). A spend at now counts
// Σ n over the entries with end > now − W, and a grant g is at most limit
// minus that sum.
//
// Proof. Take any window [a, a + W) and, among the entries with a spend in
// it, the one admitted last, at time t; its spends are at s ≥ t with
// s < a + W, so a > t − W. Every other such entry was admitted at or before
// t, and its spend in the window is at s' ≥ a > t − W, so its end ≥ s' >
// t − W: it was counted at t (a later settle only lowers n to what was
// actually spent, and never moves the end past the spends). So the spends
// in the window are at most the sum counted at t plus the last entry's n,
// which admission kept ≤ limit. The sum at t is also the maximum over every
// window that could hold a new spend in [t, t + TTL], since every entry
// starts at or before t: counting it all is not conservative beyond that.
//
// Memory is bounded by merging the closed entries into buckets by their end
// rounded up to a multiple of q = max(1 ms, W/64) (a later end only keeps
// an entry longer: conservative), one bucket per multiple of q, plus one
// entry per open lease; a running sum is kept, and buckets with end ≤
// now − W are pruned as time passes. Costs: an open lease reserves its g
// until it settles, and an unsettled one until its deadline leaves the
// window, so throughput loses about TTL/(W + TTL) to reservations when
// leases run to their deadline; quantization delays a token's return by
// under q, at most q/W = 1/64 of the window. retry_after walks at most 64
// entries in end order (buckets, then open leases as if unsettled), then
// bounds the wait by the latest end; Reset is the latest end + W − now.
// Memory per key ≈ (W + TTL)/q + 1 buckets + the open leases, measured
// with MEMORY USAGE (TestRedisMemoryWindows, Redis 7, keys user:<6
// digits>): 224 B for a key of direct takes, 320 B with one lease open,
// 3,216 B with all 65 buckets of a window in use.
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
// whose request does not go ahead, unless it is given back while its slots
// are still the last ones handed out (a refund names its take by the
// take's stamp, TakeOutcome.At, which for this algorithm is the end of the
// take's slots). The client maps the
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
// lease is deleted at once (and the memory store forgets its TAT then, so
// that the two agree when the clock goes back). Should the hash be evicted alone, TAT restarts
// at the latest expiry in the index, after every slice handed out.
//
// TAT is exact: whole µs and the fraction of a µs apart (lbTime; in Redis
// field q beside a, which holds it to the nearest float64 for a script
// from before it). A float64 of µs on today's clock is spaced 0.25 µs
// apart, so TAT + T rounded to it lost up to 0.125 µs at every slot handed
// out, the same part of T every time when T is not a whole number of µs:
// a rule of 909,091 per second (T = 1.1 µs) handed out slots 1.0 µs apart
// and its queue drained 10% faster than its rate (2,009 slots in 1.9 ms,
// where burst + rate·D allows 1,827; storetest's ShortIntervalKeepsRate).
// A lease's record keeps its slice's start rounded up and its end to the
// nearest: a settle moves TAT back to no earlier than the exact end of the
// slots used, and only while TAT, rounded, is the slice's end.
//
// # Soft, shadow and elastic throttling
//
// Soft (Rule.Soft, 0.05 for 5%) runs each limit with its Limit and Burst
// raised by the share: its bound is the algorithm's own with the raised
// parameters; responses report the base limit, what remains of it and the
// overage in use. Shadow (Rule.Shadow) runs the limits as usual but admits
// every request: a lease is granted what was asked, and its ID remembers
// what the store granted, so that its settle charges the store no more
// than that; Report.ShadowDenials counts what would have been denied.
// Elastic (Rule.Elastic, a pool key governed by a rule of one limit, not a
// leaky_bucket) lets a request its own limits deny borrow from the pool: each key admits at most
// its own bound plus what it borrowed, and all keys together borrow at most
// the pool's bound (elastic.go has the details of leases). The engine keeps
// no state of its own, so these lease IDs carry what the settle needs, with
// a MAC under a key the store keeps for every server that shares it
// (IDKeyStore, leaseid.go): a client cannot make a settle give the pool
// back more than it lent, nor pass an entry off as a settle.
//
// # Priorities with reserves
//
// A request carries a priority class: critical, high, normal (the
// default) or low (protocol.Priorities, highest first). A rule may reserve
// a share of each of its limits for the higher classes (Rule.Reserve, for
// example critical 20% and high 10%). A request of class c may not take a
// limit below its floor,
//
//	floor(c) = ⌈capacity × Σ Reserve[k] over the classes k above c⌉
//
// where capacity is the limit's burst (token bucket), its limit (windows)
// or its queue (leaky bucket), soft overage included (Rule.Floor). The
// Engine computes the floor of each limit and passes it to the store in
// LeaseOp.Floor and TakeOp.Floor (a borrow from an elastic rule's pool
// too, under the floor of the pool's rule for the request's class: it
// borrowed critical's reserve of a pool for low requests, and a critical
// take of the pool was denied); every algorithm, in Go and in Lua
// (ARGV[17]), lets a grant or a take use max(0, free − floor) of what is
// free, where free is what the algorithm would otherwise grant (the
// token bucket's whole tokens, a window's limit less what it counts, a
// leaky bucket's free slots), and its retry_after is the time until
// floor + need are free (a period when the floor leaves a limit nothing it
// could ever grant a lease of the class, and a take whose cost does not
// fit above its floor fails with ErrCostExceedsBurst). Fair share, the
// caps and the bookkeeping are the same for every class; a floor of 0
// changes nothing, and TestStoresAgree and its siblings run random floors
// against both stores. A floor only ever lowers a grant or refuses a take,
// so every bound above holds unchanged.
//
// The guarantee. A class's requests are never denied by a limit while
// that limit holds more than the class's floor plus their cost (for a
// lease, one token above the floor is granted, within fair share); lower
// classes can never take the reserve of the higher ones. So under
// saturation by lower classes, a class c finds at least the reserve of
// the classes from c upwards less what those classes took themselves, and
// the refill above the floor is shared with the lower classes. For a
// token bucket: when the demand of the classes at and above c stays within
// their reserved share of the rate (and their bursts within their reserved
// share of the burst), those requests are admitted however much the lower
// classes ask. Measured (storetest's PrioritySaturation, memory, Redis and
// Redis Cluster; TestEnginePrioritySaturation): a 1000/s bucket of burst
// 100 reserving 20% for critical, best-effort callers asking ten and more
// times the refill by takes and leases every millisecond, critical callers
// taking at 200/s: critical admitted 400 of 400 (100%; the test requires
// 95%), best effort the rest of the refill; without the reserve, critical
// got 0 of 400.
//
// What it costs: the reserve is idle capacity while the higher classes do
// not use it (a low-only workload gets at most capacity − floor at once,
// though the full refill over time). Remaining and Reset report the limit
// as a whole, not the part a class may use.
package leases
