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
// (µs, a float64: T need not be a whole number of µs), the end of the last
// slot handed out; TAT ≤ now means the queue is empty.
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
	start, end float64 // µs: the slice [start, end)
}

// lbState is one key's leaky bucket. Open leases are indexed by owner and
// slot (to settle), by expiry (to drop the expired ones without a scan) and
// counted per client (for the fair share).
type lbState struct {
	tat    float64 // µs: the end of the last slot handed out
	out    int64   // Σ granted over the open leases
	leases map[leaseRef]*lbLease
	byExp  expiryHeap
	procs  map[string]int // client → its processes holding an open lease
	bucket Bucket         // parameters of the last operation, for the idle sweep
}

func newLBState(b *Bucket, now int64) *lbState {
	return &lbState{tat: float64(now), bucket: *b}
}

func (s *lbState) algorithm() Algorithm { return LeakyBucket }

// interval returns T, the emission interval, in µs.
func (b *Bucket) interval() float64 {
	return float64(b.Period.Microseconds()) / float64(b.Limit)
}

// free returns how many slots of the queue are free when the next slot
// starts at start: ⌊Burst − (start − now)/T⌋, which may be negative after a
// rule shrank.
func lbFree(b *Bucket, start float64, now int64, t float64) int64 {
	return int64(math.Floor(float64(b.Burst) - float64((start-float64(now))/t) + epsilon))
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
	start := max(s.tat, float64(now))
	return max(0, lbFree(b, start, now, t)), usToMillisUp(s.tat - float64(now))
}

func (s *lbState) lease(b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome {
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
		if s.tat == cur.end {
			// Nothing was handed out after this slice: its unused tail
			// comes back (what is past now is gone either way).
			s.tat = max(float64(now), cur.start+float64(float64(op.Used)*t))
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
		start := max(s.tat, float64(now))
		g := min(op.Want, lbFree(b, start, now, t)-op.Floor)
		if h > 1 {
			g = min(g, max(1, b.Burst/int64(h)))
		}
		if g > 0 {
			end := start + float64(float64(g)*t)
			s.tat = end
			exp := max(int64(math.Ceil(end)), now+b.LeaseTTL.Microseconds())
			s.open(&lbLease{openLease: openLease{ref: ref, member: member(owner, op.Slot), id: op.NewLeaseID, granted: g, expiry: exp}, start: start, end: end})
			o.Granted = g
			o.LeaseID = op.NewLeaseID
			o.TTL = time.Duration(exp-now) * time.Microsecond
			o.Delay = usToMillisUp(start - float64(now))
		} else {
			// One slot fits once the queue ahead of it is Burst − 1 long.
			o.RetryAfter = usToMillisUp(start - float64(now) - float64(float64(b.Burst-op.Floor-1)*t))
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
	start := max(s.tat, float64(now))
	switch {
	case cost == 0:
		o.Taken = true
	case cost+floor > b.Burst:
		o.RetryAfter = -1
	case lbFree(b, start, now, t) >= cost+floor && maxDelay >= 0 && start-float64(now) > float64(maxDelay.Microseconds()):
		// The slot is further away than the caller waits: not taken.
		o.RetryAfter = usToMillisUp(start - float64(now) - float64(maxDelay.Microseconds()))
	case lbFree(b, start, now, t) >= cost+floor:
		o.Taken = true
		s.tat = start + float64(float64(cost)*t)
		o.Delay = usToMillisUp(start - float64(now))
		// The take's stamp is its slots' end: a refund gives them back
		// only while they are still the last ones handed out.
		o.At = int64(math.Floor(s.tat))
	default:
		o.RetryAfter = usToMillisUp(start - float64(now) - float64(float64(b.Burst-floor-cost)*t))
	}
	o.Remaining, o.Reset = s.status(b, now, t)
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
	s.expire(now)
	t := b.interval()
	if at <= 0 || cost <= 0 || t < 1 || math.Floor(s.tat) != float64(at) {
		return
	}
	s.tat = max(s.tat-float64(float64(cost)*t), float64(now))
}

// idle reports whether the queue is empty and no lease is open at now.
func (s *lbState) idle(now int64) bool {
	s.expire(now)
	return len(s.leases) == 0 && s.tat <= float64(now)
}

// snapshot returns the queue at now: Level is its length in slots (0 when
// empty), Outstanding the slots held by open leases, Next the time until
// one more slot is free and Full until the queue is empty.
func (s *lbState) snapshot(b *Bucket, now int64) BucketState {
	t := b.interval()
	level := 0.0
	if s.tat > float64(now) {
		level = float64((s.tat - float64(now)) / t)
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
		start := max(s.tat, float64(now))
		st.Next = usToMillisUp(start - float64(now) - float64(float64(b.Burst-(st.Free+1))*t))
		st.Full = full
	}
	return st
}
