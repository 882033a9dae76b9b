package leases

import (
	"container/heap"
	"errors"
	"math"
	"time"
)

// This file is the leaky bucket with leases in Go, as the memory store runs
// it. scripts/leaky_bucket.lua is the same algorithm for Redis, performing
// the same floating-point operations in the same order, so that both stores
// give identical answers; TestStoresAgreeLeaky checks that they do.
//
// The leaky bucket is a shaper (GCRA): requests leave at the constant rate
// Limit/Period, one every T = Period/Limit, and at most Burst of them wait
// in the queue. The state of a key is one theoretical arrival time, TAT
// (µs with its fraction: T need not be a whole number of µs), the end of
// the last slot handed out; TAT ≤ now means the queue is empty.
//
//	grant g at now:  start = max(TAT, now)
//	                 g ≤ want, g ≤ ⌊Burst − (start − now)/T⌋ (the queue),
//	                 g ≤ max(1, ⌊Burst/h⌋) (fair share among h holders)
//	                 the lease holds the slice [start, start + g·T);
//	                 TAT = start + g·T; Delay = start − now
//	settle, u used:  if TAT = the lease's slice end (nothing was handed out
//	                 after it): TAT = max(now, start + u·T); else nothing
//	expiry:          nothing comes back (the slots count as used)
//	take n at now:   start = max(TAT, now); taken when n slots fit the
//	                 queue (n ≤ ⌊Burst − (start − now)/T⌋), then
//	                 TAT = start + n·T and Delay = start − now
//	refund:          nothing (see lbState.refund)
//
// Slices never overlap: each starts at or after the TAT that the previous
// one set, and a settle moves TAT back only while no later slice exists.
//
// TAT is kept exact (lbTime): whole µs and the fraction of a µs apart. A
// float64 of µs on the store's clock is spaced 0.25 µs apart (until 2041,
// then 0.5): TAT + T rounded to it lost up to 0.125 µs at every slot
// handed out, always the same part of T when T is not a whole number of
// µs, so the slots of a fast rule were closer than T and its queue drained
// faster than its rate (909,091/s, T = 1.1 µs: 9% faster, 2,009 slots
// where burst + rate·D allows 1,827; ShortIntervalKeepsRate in
// storetest).

// errLeakyBurst is the validation error of a leaky bucket without a queue.
var errLeakyBurst = errors.New("burst: a leaky bucket needs a queue of at least 1 request")

func validateLeaky(b *Bucket) error {
	if b.Burst < 1 {
		return errLeakyBurst
	}
	return nil
}

// lbLease is an open lease of a leaky bucket: its record and the time slice
// it holds.
type lbLease struct {
	openLease
	// start is the slice's start rounded up to a float64 (µs), end its end
	// rounded to the nearest: what the Redis store keeps in the lease's
	// record. A settle moves TAT back from start, which is never before
	// the exact start (a later start only loses part of a µs), and only
	// while TAT, rounded, is still end.
	start, end float64
}

// lbState is one key's leaky bucket. Open leases are indexed by owner and
// slot (to settle), by expiry (to drop the expired ones without a scan) and
// counted per client (for the fair share).
type lbState struct {
	tat    lbTime // the end of the last slot handed out
	out    int64  // Σ granted over the open leases
	leases map[leaseRef]*lbLease
	byExp  expiryHeap
	procs  map[string]int // client → its processes holding an open lease
	bucket Bucket         // parameters of the last operation, for the idle sweep
}

// newLBState returns a key's state with no TAT (zero, before any now): an
// empty queue whatever the clock says, as a key without a hash in Redis.
func newLBState(b *Bucket, _ int64) *lbState {
	return &lbState{bucket: *b}
}

func (s *lbState) algorithm() Algorithm { return LeakyBucket }

// interval returns T, the emission interval, in µs.
func (b *Bucket) interval() float64 {
	return float64(b.Period.Microseconds()) / float64(b.Limit)
}

// lbTime is an instant on the store's clock, exact: i whole µs (a float64
// holding an integer, exact below 2^53 µs, the year 2255) and f the
// fraction of a µs after it, 0 ≤ f < 1. The Lua script keeps the same two
// numbers and performs the same operations on them.
type lbTime struct{ i, f float64 }

// lbAt returns now (µs) as an lbTime.
func lbAt(now int64) lbTime { return lbTime{float64(now), 0} }

// lbFrom returns the float64 v (µs, positive) as an lbTime: exact, since
// the fraction of a float64 is one.
func lbFrom(v float64) lbTime {
	i := math.Floor(v)
	return lbTime{i, v - i}
}

// add returns the instant x µs later (earlier when x < 0), rounding only
// the sum of x and the fraction: an error relative to x (2^-53 of it), not
// to the clock's reading.
func (a lbTime) add(x float64) lbTime {
	s := a.f + x
	k := math.Floor(s)
	out := lbTime{a.i + k, s - k}
	if out.f >= 1 {
		out.i++
		out.f--
	}
	return out
}

// after reports whether a is later than now.
func (a lbTime) after(now int64) bool {
	n := float64(now)
	return a.i > n || (a.i == n && a.f > 0)
}

// since returns a − now in µs (negative when a is earlier).
func (a lbTime) since(now int64) float64 { return float64(a.i-float64(now)) + a.f }

// nearest returns a rounded to the nearest float64; up, the least float64
// at or after it; ceil the least whole µs at or after it.
func (a lbTime) nearest() float64 { return a.i + a.f }
func (a lbTime) up() float64      { return addUp(a.i, a.f) }
func (a lbTime) ceil() int64 {
	c := int64(a.i)
	if a.f > 0 {
		c++
	}
	return c
}

// later returns the later of a and now.
func (a lbTime) later(now int64) lbTime {
	if a.after(now) {
		return a
	}
	return lbAt(now)
}

// addUp returns the least float64 at or above the exact sum a + b (a
// TwoSum: s is a + b rounded to the nearest, e what that rounding lost).
// The Lua script's add_up performs the same operations.
func addUp(a, b float64) float64 {
	s := a + b
	bb := s - a
	e := (a - (s - bb)) + (b - bb)
	if e > 0 {
		s = math.Nextafter(s, math.Inf(1))
	}
	return s
}

// free returns how many slots of the queue are free when the next slot
// starts at start: ⌊Burst − (start − now)/T⌋, which may be negative after a
// rule shrank.
func lbFree(b *Bucket, start lbTime, now int64, t float64) int64 {
	return int64(math.Floor(float64(b.Burst) - float64(start.since(now)/t) + epsilon))
}

func (s *lbState) holds(o Owner) bool {
	return s.leases[leaseRef{o, 0}] != nil || s.leases[leaseRef{o, 1}] != nil
}

func (s *lbState) open(l *lbLease) {
	if !s.holds(l.ref.owner) {
		if s.procs == nil {
			s.procs = make(map[string]int)
		}
		s.procs[l.ref.owner.Client]++
	}
	if s.leases == nil {
		s.leases = make(map[leaseRef]*lbLease)
	}
	s.leases[l.ref] = l
	heap.Push(&s.byExp, &l.openLease)
	s.out += l.granted
}

func (s *lbState) close(l *lbLease) {
	heap.Remove(&s.byExp, l.index)
	delete(s.leases, l.ref)
	s.out -= l.granted
	if !s.holds(l.ref.owner) {
		c := l.ref.owner.Client
		if s.procs[c]--; s.procs[c] <= 0 {
			delete(s.procs, c)
		}
	}
}

// expire drops the leases whose expiry is at or before now. Nothing comes
// back: their slots count as used. It returns the number dropped.
func (s *lbState) expire(now int64) int {
	n := 0
	for len(s.byExp) > 0 && s.byExp[0].expiry <= now {
		s.close(s.leases[s.byExp[0].ref])
		n++
	}
	return n
}

// holders returns the parts the key is shared in from o's point of view, as
// tbState.holders counts them.
func (s *lbState) holders(o Owner) int {
	clients := len(s.procs)
	procs := s.procs[o.Client]
	if procs == 0 {
		clients++
	}
	if !s.holds(o) {
		procs++
	}
	return clients * procs
}

// usToMillisUp rounds a duration in µs (a float) up to whole milliseconds.
func usToMillisUp(us float64) time.Duration {
	if us <= 0 {
		return 0
	}
	return microsToRetry(int64(math.Ceil(us - 1e-6)))
}

// status returns Remaining and Reset at now.
func (s *lbState) status(b *Bucket, now int64, t float64) (int64, time.Duration) {
	start := s.tat.later(now)
	return max(0, lbFree(b, start, now, t)), usToMillisUp(s.tat.since(now))
}

// forget forgets TAT when the queue is empty and no lease is open at now,
// as the Redis store deletes such a state whenever it writes one: a state
// the same as none while the clock moves on, but not when it goes back
// (Redis TIME after a failover to a replica whose clock is behind, the
// memory store's wall clock stepped back). The memory store kept TAT, so
// after the clock went back 1 ms it found a queue (12 slots free of 13)
// where Redis found none (13).
func (s *lbState) forget(now int64) {
	if len(s.leases) == 0 && !s.tat.after(now) {
		s.tat = lbTime{}
	}
}

func (s *lbState) lease(b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome {
	o := s.leaseOp(b, owner, op, now)
	s.forget(now) // the Redis script writes the state at every lease call
	return o
}

func (s *lbState) leaseOp(b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome {
	s.bucket = *b
	t := b.interval()
	var o LeaseOutcome
	o.Expired = s.expire(now)
	ref := leaseRef{owner, op.Slot}
	cur := s.leases[ref]
	if op.LeaseID != "" {
		if cur == nil || cur.id != op.LeaseID {
			return LeaseOutcome{Err: ErrUnknownLease, Expired: o.Expired}
		}
		if op.Used > cur.granted {
			return LeaseOutcome{Err: ErrUsedExceedsGranted, Expired: o.Expired}
		}
		s.close(cur)
		if s.tat.nearest() == cur.end {
			// Nothing was handed out after this slice: its unused tail
			// comes back (what is past now is gone either way).
			s.tat = lbFrom(cur.start).add(float64(op.Used) * t).later(now)
		}
		o.Settled = true
	} else if cur != nil {
		// A new lease replaces the open one of this slot, as if fully
		// used.
		s.close(cur)
		o.Expired++
	}
	h := s.holders(owner)
	o.Holders = h
	if op.Want > 0 && cur == nil {
		if limit := op.Limits.maxLeases(); len(s.leases) >= limit {
			return LeaseOutcome{Err: ErrTooManyLeases, Expired: o.Expired}
		}
		if limit := op.Limits.maxProcesses(); !s.holds(owner) && s.procs[owner.Client] >= limit {
			return LeaseOutcome{Err: ErrTooManyLeases, Expired: o.Expired}
		}
	}
	if op.Want > 0 {
		start := s.tat.later(now)
		g := min(op.Want, lbFree(b, start, now, t)-op.Floor)
		if h > 1 {
			g = min(g, max(1, b.Burst/int64(h)))
		}
		if g > 0 {
			end := start.add(float64(g) * t)
			s.tat = end
			exp := max(end.ceil(), now+b.LeaseTTL.Microseconds())
			s.open(&lbLease{openLease: openLease{ref: ref, member: member(owner, op.Slot), id: op.NewLeaseID, granted: g, expiry: exp}, start: start.up(), end: end.nearest()})
			o.Granted = g
			o.LeaseID = op.NewLeaseID
			o.TTL = time.Duration(exp-now) * time.Microsecond
			o.Delay = usToMillisUp(start.since(now))
		} else {
			// One slot fits once the queue ahead of it is Burst − 1 long.
			o.RetryAfter = usToMillisUp(start.since(now) - float64(float64(b.Burst-op.Floor-1)*t))
		}
	}
	o.Remaining, o.Reset = s.status(b, now, t)
	return o
}

func (s *lbState) take(b *Bucket, cost, floor int64, maxDelay time.Duration, now int64) TakeOutcome {
	s.bucket = *b
	t := b.interval()
	var o TakeOutcome
	o.Expired = s.expire(now)
	start := s.tat.later(now)
	switch {
	case cost == 0:
		o.Taken = true
	case cost+floor > b.Burst:
		o.RetryAfter = -1
	case lbFree(b, start, now, t) >= cost+floor && maxDelay >= 0 && start.since(now) > float64(maxDelay.Microseconds()):
		// The slot is further away than the caller waits: not taken.
		o.RetryAfter = usToMillisUp(start.since(now) - float64(maxDelay.Microseconds()))
	case lbFree(b, start, now, t) >= cost+floor:
		o.Taken = true
		s.tat = start.add(float64(cost) * t)
		o.Delay = usToMillisUp(start.since(now))
		// The take's stamp is its slots' end: a refund gives them back
		// only while they are still the last ones handed out.
		o.At = int64(s.tat.i)
	default:
		o.RetryAfter = usToMillisUp(start.since(now) - float64(float64(b.Burst-floor-cost)*t))
	}
	o.Remaining, o.Reset = s.status(b, now, t)
	if (o.Taken && cost > 0) || o.Expired > 0 {
		s.forget(now) // the Redis script writes the state only then
	}
	return o
}

// refund gives back the slots of the take whose stamp (its slots' end,
// in whole µs) is at, while they are still the last ones handed out: TAT
// moves back by cost·T, no earlier than now. Once another take or grant
// followed, they are lost (utilization, never the bound). With T under
// 1 µs two takes' ends could share a stamp, so such a rule gives nothing
// back.
func (s *lbState) refund(b *Bucket, cost int64, at int64, now int64) {
	s.bucket = *b
	if s.expire(now) > 0 {
		defer s.forget(now) // the Redis script writes the state then
	}
	t := b.interval()
	if at <= 0 || cost <= 0 || t < 1 || s.tat.i != float64(at) {
		return
	}
	s.tat = s.tat.add(-(float64(cost) * t)).later(now)
	s.forget(now)
}

// idle reports whether the queue is empty and no lease is open at now.
func (s *lbState) idle(now int64) bool {
	s.expire(now)
	return len(s.leases) == 0 && !s.tat.after(now)
}

// snapshot returns the queue at now: Level is its length in slots (0 when
// empty), Outstanding the slots held by open leases, Next the time until
// one more slot is free and Full until the queue is empty.
func (s *lbState) snapshot(b *Bucket, now int64) BucketState {
	t := b.interval()
	level := 0.0
	if s.tat.after(now) {
		level = float64(s.tat.since(now) / t)
	}
	expired := s.byExp.expiredBy(now)
	out := s.out
	for _, l := range expired {
		out -= l.granted
	}
	st := BucketState{Level: level, Outstanding: out, Leases: len(s.leases) - len(expired)}
	st.Holders = holdersAt(s.procs, expired, func(ref leaseRef) (int64, bool) {
		l := s.leases[ref]
		if l == nil {
			return 0, false
		}
		return l.expiry, true
	}, now)
	var full time.Duration
	st.Free, full = s.status(b, now, t)
	if st.Free < b.Burst {
		// One more slot is free once the queue ahead is Burst − Free − 1
		// long.
		start := s.tat.later(now)
		st.Next = usToMillisUp(start.since(now) - float64(float64(b.Burst-(st.Free+1))*t))
		st.Full = full
	}
	return st
}
