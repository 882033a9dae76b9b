package client

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// frozen is stored in a lease's remaining count when the settle loop stops
// it: far enough below zero that no spend or give-back brings it back.
const frozen = math.MinInt64 / 4

// lease is one lease granted by a server, spent by the hot path.
//
// remaining is the only field the hot path writes. A spend subtracts and
// checks the result; a failed spend adds back. The settle loop freezes a
// lease by swapping remaining for frozen: spends that landed before the
// swap are counted as used, later ones fail. So the used count reported to
// the server is exact, with no lock.
type lease struct {
	_         [64]byte // keep remaining off the cache line of other data
	remaining atomic.Int64
	// strict is set once the lease is past its late renewal point
	// (Client.lateAt), or paused: from then on each spend also reads the
	// clock against deadline and pausedUntil, so no token is spent after
	// the deadline even if the settle loop is late.
	strict      atomic.Bool
	pausedUntil atomic.Int64 // client clock: spends are denied before this (DenyFor)
	_           [40]byte

	id       string
	slot     int
	granted  int64
	halfway  int64 // client clock (ns): when its request was sent + TTL/2
	deadline int64 // when its request was sent + TTL: the server expires it no sooner
	// shape is the slot schedule of a lease of a shaping rule
	// (leaky_bucket), nil for the others. Such a lease is always strict:
	// its spends take the schedule's lock, off the other leases' hot path.
	shape *slots
}

// sent returns when the lease's request was sent (client clock): its
// deadline less its TTL.
func (l *lease) sent() int64 { return 2*l.halfway - l.deadline }

// ttl returns the lease's TTL (ns).
func (l *lease) ttl() int64 { return 2 * (l.deadline - l.halfway) }

// clockShift sets how often a spend reads the clock before its lease is
// strict (see Client.lateAt): once per 1<<clockShift tokens.
const clockShift = 3

// spend takes n tokens; it reports false and changes nothing when the lease
// has fewer, is frozen, or is past its deadline.
//
// From the lease's late renewal point on (strict: see Client.lateAt)
// every spend reads the clock. Before it, one spend in eight does: the
// settle loop normally makes the lease strict long before its deadline,
// but a process paused across the deadline (SIGSTOP, a frozen VM) resumes
// with every goroutine at once, and the sampled check stops the hot path
// within a few tokens even if the loop runs last. Reading the clock on every spend would cost more than the rest
// of the hot path together.
func (l *lease) spend(n int64, c *Client) bool {
	if l.strict.Load() {
		now := c.nanos()
		if now >= l.deadline || now < l.pausedUntil.Load() {
			return false
		}
		if l.shape != nil {
			// A slot now, or nothing: Allow does not wait.
			_, ok := l.shape.reserve(l, n, now, 0)
			return ok
		}
	}
	if l.remaining.Load() < n {
		// Not enough left (or frozen: negative). Checked before the
		// subtraction: a spend of more than the lease holds (a large
		// AllowN) drove remaining below zero for a moment, and a
		// concurrent small spend then failed on a lease with thousands
		// of tokens left, and was denied (found by review).
		return false
	}
	v := l.remaining.Add(-n)
	if v < 0 {
		l.remaining.Add(n)
		return false
	}
	if (v+n)>>clockShift != v>>clockShift && c.nanos() >= l.deadline {
		l.strict.Store(true)
		l.remaining.Add(n)
		return false
	}
	return true
}

// spendAgain is called when l, ks's active lease as a decision read it,
// could not serve n tokens: it spends them from the lease active now, if
// another, and returns it, or nil when no live lease can serve them; and
// the last lease it tried (l when none other). The settle loop installs a
// renewal and then closes the lease it replaced (see applyOne), so a lease
// read just before the swap may be closed by the time it is spent from;
// the decision was then denied, the renewal taken for a lease not run out
// (found by make bench: one decision in 73 M denied on a renewal installed
// a moment before with 27 M tokens). Each lease is tried once, and a key's
// lease is replaced at most once a renewal round trip, so this ends. Off
// the fast path: called only when a spend failed. l may be nil (no lease
// was active).
func (ks *keyState) spendAgain(l *lease, n int64, c *Client) (served, tried *lease) {
	for retried := false; ; {
		nl := ks.active.Load()
		if nl == l && l != nil && !retried && l.left() >= n {
			// The same lease, which holds n now: concurrent spends that
			// fit one by one but not together took it below zero for a
			// moment. Once more.
			retried = true
			if l.spend(n, c) {
				return l, l
			}
			continue
		}
		if nl == l || nl == nil {
			return nil, l
		}
		if l = nl; l.spend(n, c) {
			return l, l
		}
	}
}

// giveBack returns n tokens taken by spend (multi-key all or nothing). The
// slots of a shaped lease are not given back: later requests may have
// taken the slots after them, so they are lost (utilization only).
func (l *lease) giveBack(n int64) {
	if l.shape == nil {
		l.remaining.Add(n)
	}
}

// freeze stops the lease and returns the tokens it had left.
func (l *lease) freeze() int64 {
	v := l.remaining.Swap(frozen)
	if v < 0 {
		return 0
	}
	return v
}

// left returns the tokens left, 0 when frozen.
func (l *lease) left() int64 {
	v := l.remaining.Load()
	if v < 0 {
		return 0
	}
	return v
}

// keyState is everything the client holds for one key.
//
// A key is in one of these states; the fields that make it so are named:
//
//	cold        not in Client.keys: its first decision creates it, direct.
//	            While it is young (see Client.young: its rule not learned,
//	            or its first few admissions not in), a decision that finds
//	            a take of it in flight (probing) waits for that answer,
//	            once, and is then decided again.
//	direct      decided by direct takes (leasing false). Its demand is
//	            averaged on each admission (mu.rate); at
//	            Config.LeaseMinTokens per lease TTL it is promoted.
//	denied      denyUntil in the future: decided locally (denied) without
//	            a call until then, whatever else holds. From a server's
//	            retry_after (direct or leased; at most the bucket's fill
//	            time, see Client.denial), or DenyFor (denyForUntil, which
//	            a server's answer does not shorten; a lease it outlasts is
//	            returned at once, one it does not is paused).
//	refused     refused with denied: the server refused the key (no rule
//	            under default deny, or not this client's); asked again
//	            after the denial.
//	unlimited   unlimited: no rule limits it; allowed locally until
//	            unlimitedExp (0: until the loop learns otherwise).
//	store-down  storeDown in the future: a server answered that its
//	            store failed for this key alone (a Redis Cluster node
//	            down, while the others answer). Until then (storeDownHold)
//	            a decision that needs a server is made as offline makes
//	            it, without a call: its live lease serves, a spent-out one
//	            is denied until its deadline, then the fallback decides.
//	            The loop does not ask for the key meanwhile. The client
//	            stays online: the other keys are decided as usual.
//	leasing     leasing set, no lease in yet: the settle loop owns it (it is
//	            in loopState.leased) and asks for a batch; a decision waits
//	            for the first one (at most Config.RequestTimeout), and is
//	            decided directly if none comes.
//	leased      leasing set, active lease live: decided locally from the
//	            lease; when it runs out, denied until the next batch. A
//	            deferred batch (the server's answer to a key whose bucket
//	            or share could not serve it yet) is active but paused,
//	            with the key denied, until its delay has passed.
//	demoting    the loop returns its leases (run.demote, leaving), then
//	            sets leasing false: direct again. Its decisions are taken
//	            directly meanwhile (leaving), as those of a key being
//	            forgotten are.
//	forgotten   dead: idle for Config.IdleTimeout (direct keys, swept
//	            every second) or evicted beyond Config.MaxKeys (leased
//	            keys, after their leases were returned); the next decision
//	            starts a new cold key.
//
// Ownership shows at every access: the hot path reads active and unlimited
// and spends from the active lease; the other atomics are shared; ks.mu.x
// is under the key's mutex; ks.run.x belongs to the settle loop alone.
type keyState struct {
	key string

	// Read by the hot path.
	active    atomic.Pointer[lease]
	unlimited atomic.Bool

	// Atomics read and written by the decisions, the direct path and the
	// loop.
	denyUntil    atomic.Int64                 // client clock (ns): denied locally until then
	safeRate     atomic.Uint64                // float64 bits of the last safe_rate
	unserved     atomic.Int64                 // tokens asked for that no lease served (demand)
	unlimitedOK  atomic.Int64                 // requests allowed as unlimited
	fallbackOK   atomic.Int64                 // requests allowed by the fallback
	need         atomic.Bool                  // the key wants a lease (promoted, or its lease ran out)
	refused      atomic.Bool                  // the server refused the key (no rule, forbidden)
	refusal      atomic.Pointer[RefusedError] // why, when it was forbidden; nil for no rule
	beyondUntil  atomic.Int64                 // client clock (ns): a take beyond the key's batch was denied; takes of beyondCost or more are denied locally until then
	beyondCost   atomic.Int64                 // see beyondUntil
	leaving      atomic.Bool                  // the loop returns its leases to demote or forget it (see leave): decided directly meanwhile
	denyForUntil atomic.Int64                 // client clock (ns): DenyFor denies the key until then (denyUntil is never set before it, see setDenial)
	dead         atomic.Bool                  // forgotten by the client; resolve again
	closedUsed   atomic.Int64                 // tokens used from leases no longer active
	deadline     atomic.Int64                 // client clock: deadline of the latest lease
	lastGrant    atomic.Int64                 // tokens granted in the latest lease (see Client.ranOutRoomy)
	leasing      atomic.Bool                  // the key is leased: the settle loop keeps its leases
	lastDirect   atomic.Int64                 // client clock of the last direct decision, or of creation
	unlimitedExp atomic.Int64                 // client clock: a key a direct take found unlimited is asked again then; 0: never
	leaseTTL     atomic.Int64                 // ns: the rule's lease TTL, from any answer
	ruleBurst    atomic.Int64                 // the rule's burst, from any answer
	ruleFill     atomic.Int64                 // ns the rule's bucket takes to fill, from any answer
	directUntil  atomic.Int64                 // client clock: not promoted before this (a server refused it more leases)
	probing      atomic.Bool                  // young (see Client.young), a direct take of it in flight: other decisions wait for its answer
	waiting      atomic.Int64                 // tokens of the decisions waiting for that answer (demand, see admitted)
	limits       atomic.Pointer[[]LimitState] // the rule's limits as of the latest answer (see LimitState)
	shaped       atomic.Bool                  // the key's rule shapes (leaky_bucket), from any answer
	storeDown    atomic.Int64                 // client clock: decided as offline until then, without a call (the store failed for this key alone)
	answers      atomic.Int64                 // lease answers (or failures) the loop applied to the key: see answered

	// mu guards its fields.
	mu struct {
		sync.Mutex
		ready    chan struct{}   // closed and replaced when the key's state changes
		waiters  []chan struct{} // Wait callers in arrival order; the first's channel is closed: its turn
		fallback *rate.Limiter   // the FallbackSafeRate limiter
		rate     float64         // tokens admitted directly per ns (an average over a lease TTL)
		rateAt   int64           // client clock of rate
		admitted int64           // tokens admitted directly since since
		seen     int64           // the most admitted plus the tokens then waiting for an answer (see admitted)
		since    int64           // client clock of the first of them
	}

	// run is owned by the settle loop goroutine: nothing else reads or
	// writes it.
	run struct {
		slots      [2]*lease // open leases by slot (active or frozen, not yet returned)
		returnUsed [2]int64  // used count of a frozen lease awaiting return
		inflight   bool      // an entry for this key is in the call in flight
		lastAsk    int64     // client clock when the key was last in a call
		ewma       float64   // demand, tokens per second
		lastUsed   int64     // used+denied total at the last tick
		lastActive int64     // client clock when demand was last seen
		demote     bool      // return every lease and go back to direct decisions
		forget     bool      // return everything and drop the key
		// roomy is set when the latest grant was all that was asked and
		// left the bucket at least twice that: a frozen lease's remainder
		// is then not what the other holders are waiting for, and its
		// return rides with the key's next renewal instead of a call of
		// its own (see plan).
		roomy bool
		// bound is set when the key's latest lease request was refused or
		// deferred: its bucket, or its share, holds no batch beyond the
		// one it has. Its lease is then not renewed early (the renewal
		// would be refused, or would replace a lease that still has
		// tokens) but once spent out, or near its deadline, by a request
		// that accepts a deferral: one call per batch.
		bound bool
		// starved is set when the key is promoted while denied (its
		// denials counted as demand, see admitted): its first lease asks
		// for two ticks of the bucket's refill only, so that a deferred
		// grant, which waits for the whole batch's refill, serves it soon
		// (see plan).
		starved bool
	}
}

func newKeyState(key string) *keyState {
	ks := &keyState{key: key}
	ks.mu.ready = make(chan struct{})
	return ks
}

// enqueue adds a Wait caller to the key's queue and returns the channel
// closed when its turn comes (at once when the queue was empty).
func (ks *keyState) enqueue() chan struct{} {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	turn := make(chan struct{})
	ks.mu.waiters = append(ks.mu.waiters, turn)
	if len(ks.mu.waiters) == 1 {
		close(turn)
	}
	return turn
}

// dequeue removes a Wait caller, done or given up, from the key's queue,
// and gives the turn to the next when it held it.
func (ks *keyState) dequeue(turn chan struct{}) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for i, w := range ks.mu.waiters {
		if w != turn {
			continue
		}
		ks.mu.waiters = append(ks.mu.waiters[:i], ks.mu.waiters[i+1:]...)
		if i == 0 && len(ks.mu.waiters) > 0 {
			close(ks.mu.waiters[0])
		}
		return
	}
}

// waitCh returns the channel closed at the key's next change.
func (ks *keyState) waitCh() <-chan struct{} {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.mu.ready
}

// answered counts an answer to a lease call for the key (a grant, a
// refusal, an entry's error, the call's failure) and wakes its waiters: a
// decision waiting for its lease waits on through the other changes (a
// lease closed at its deadline), until an answer or its time is up.
func (ks *keyState) answered() {
	ks.answers.Add(1)
	ks.notify()
}

// notify wakes every caller waiting on the key.
func (ks *keyState) notify() {
	ks.mu.Lock()
	close(ks.mu.ready)
	ks.mu.ready = make(chan struct{})
	ks.mu.Unlock()
}

func (ks *keyState) getSafeRate() float64 { return math.Float64frombits(ks.safeRate.Load()) }

// usedTotal returns every token used from this key's leases so far.
func (ks *keyState) usedTotal() int64 {
	n := ks.closedUsed.Load()
	if l := ks.active.Load(); l != nil {
		// A frozen lease is being closed: its used count goes to
		// closedUsed, read above or not. Counted as granted − 0 it added
		// its unspent tokens too, which Stats' running maximum then kept;
		// counted as nothing it is missed at most for this read, which the
		// maximum hides (TestUsedTotalFrozenActiveLease).
		if v := l.remaining.Load(); v >= 0 {
			n += l.granted - v
		}
	}
	return n
}

// denial returns how long ks is denied locally after a server said that
// its bucket can serve again in retry: at most the time the bucket takes
// to fill (and two ticks), when that is known. A longer wait is one on
// other holders' leases, or on a debt of deferred grants: the server
// counts those leases until they expire, since it cannot know better, but
// the holders of a busy key settle them long before (at every batch once
// it is bound, at half the TTL at the latest), and what they return is
// free at once. So the key asks again once its bucket could have filled,
// one call per fill time at most, rather than be denied for up to a lease
// TTL after its reason ended. Measured: on the benchmark's saturated key
// (e2e/compare), three of its six processes, refused at the start, were
// denied a whole TTL, 2 s, while the other three renewed every 30 ms.
func (c *Client) denial(ks *keyState, retry time.Duration) time.Duration {
	if fill := max(time.Duration(ks.ruleFill.Load()), 2*c.cfg.SettleInterval); ks.ruleFill.Load() > 0 && retry > fill {
		return fill
	}
	return retry
}

// extendDenial denies the key locally until until, unless it already is
// for longer.
func (ks *keyState) extendDenial(until int64) {
	extend(&ks.denyUntil, until)
}

// setDenial sets the key's denial from a server's answer to until, earlier
// or later than the one in force (the bucket can serve sooner than an
// earlier answer said), but never before the end of a DenyFor: a renewal
// in flight when DenyFor was called, answered with a short retry_after,
// cut a DenyFor of a minute to that retry_after (found by review). DenyFor
// extends denyForUntil before denyUntil, so a DenyFor that runs meanwhile
// either changes denyUntil (the CAS fails, and the next round reads its
// denyForUntil) or extends denyUntil after.
func (ks *keyState) setDenial(until int64) {
	for {
		cur := ks.denyUntil.Load()
		v := max(until, ks.denyForUntil.Load())
		if cur == v || ks.denyUntil.CompareAndSwap(cur, v) {
			return
		}
	}
}

// extend sets v to until if that is later.
func extend(v *atomic.Int64, until int64) {
	for {
		cur := v.Load()
		if cur >= until || v.CompareAndSwap(cur, until) {
			return
		}
	}
}

// setUnlimited records that no rule limits the key, until exp (client
// clock), when it is asked again.
func (ks *keyState) setUnlimited(exp int64) {
	ks.unlimitedExp.Store(exp)
	ks.unlimited.Store(true)
}

// learn records the key's rule from an answer: limit tokens per period,
// bucket size burst, lease TTL.
func (ks *keyState) learn(limit, periodMillis, burst, ttlMillis int64) {
	if ttlMillis > 0 {
		ks.leaseTTL.Store(ttlMillis * int64(time.Millisecond))
	}
	if burst > 0 {
		ks.ruleBurst.Store(burst)
	}
	if limit > 0 && periodMillis > 0 {
		ks.ruleFill.Store(int64(float64(burst) / float64(limit) * float64(periodMillis) * float64(time.Millisecond)))
	}
}
