package leases

import (
	"math"
	"time"
)

// This file is fixed_window and sliding_window_counter in Go, as the memory
// store runs them; scripts/fixed_window.lua is the same for Redis (one
// script for both, as here one type), performing the same operations in
// the same order. See the package documentation for their bounds.
//
// State per key: the current window's start ws = ⌊now/W⌋·W, its count c
// (tokens granted and taken in it, less what settles gave back), the
// previous window's count p (sliding_window_counter only), the tokens of c
// taken directly (so a refund gives back takes only), and the open leases.
//
//	roll:    at a call in a later window: p = c if it is the next window
//	         (counter only), else 0; c = the tokens of the leases still
//	         open. Under one rule there are none: a lease's deadline is at
//	         most its window's end, so every one has ended and was closed
//	         unsettled. After a rule change there may be (a shorter period,
//	         or a longer one whose windows start before the old window's
//	         end): their tokens may still be spent, so the new window counts
//	         them (their settle gives nothing back: they are of another
//	         window). It once started from 0, and a window admitted its
//	         limit beside them.
//	fresh:   a state with nothing in it (no count, no lease) starts in
//	         now's window, as Redis, which deletes such a state, does.
//	estimate e = c (fixed) or p·(1 − (now − ws)/W) + c (counter)
//	free:    ⌊limit − e⌋ (+ε against rounding), at least 0
//	grant:   g ≤ min(want, free, max(1, limit/h)); c += g;
//	         deadline = min(now + TTL, ws + W)
//	settle:  c −= g − used when the lease is of this window (a lease of an
//	         older window has expired: ErrUnknownLease)
//	take:    cost ≤ free; c += cost
//	refund:  c −= min(cost, tokens taken directly in this window)

// fwState is one key under fixed_window, or sliding_window_counter when
// counter is set.
type fwState struct {
	windowLeases
	counter bool
	start   int64 // µs
	cur     int64
	prev    int64
	taken   int64  // the part of cur taken directly
	bucket  Bucket // parameters of the last operation, for the idle sweep
}

func newFWState(b *Bucket, now int64, counter bool) *fwState {
	return &fwState{counter: counter, start: floorTo(now, b.Period.Microseconds()), bucket: *b}
}

func (s *fwState) algorithm() Algorithm {
	if s.counter {
		return SlidingWindowCounter
	}
	return FixedWindow
}

func (s *fwState) leasesOf() *windowLeases { return &s.windowLeases }

// roll moves the counts to the window of now, carrying the tokens of the
// leases still open (see the top of this file). A clock that went back, or
// a rule whose longer period puts now's window start before ws, stays in
// ws.
func (s *fwState) roll(b *Bucket, now int64) {
	w := b.Period.Microseconds()
	st := floorTo(now, w)
	if st <= s.start {
		return
	}
	if s.counter && st == s.start+w {
		s.prev = s.cur
	} else {
		s.prev = 0
	}
	s.cur, s.taken, s.start = s.out, 0, st
}

func (s *fwState) advance(b *Bucket, now int64) int {
	if len(s.leases) == 0 && s.cur == 0 && s.prev == 0 && s.taken == 0 {
		s.start = floorTo(now, b.Period.Microseconds()) // fresh
	}
	n := s.expire(now, nil)
	s.roll(b, now)
	return n
}

// estimate returns the tokens counted against a spend at now.
func (s *fwState) estimate(b *Bucket, now int64) float64 {
	if !s.counter {
		return float64(s.cur)
	}
	w := b.Period.Microseconds()
	el := max(now-s.start, 0)
	// The explicit conversions forbid a fused multiply-add, so that the
	// result is bit-identical to the Lua script's.
	return float64(float64(s.prev)*float64(1-float64(el)/float64(w))) + float64(s.cur)
}

func (s *fwState) free(b *Bucket, now int64) int64 {
	if !s.counter {
		return max(b.Limit-s.cur, 0)
	}
	f := math.Floor(float64(b.Limit) - s.estimate(b, now) + epsilon)
	if f <= 0 {
		return 0
	}
	return int64(f)
}

func (s *fwState) spend(b *Bucket, n int64, now int64) {
	s.cur += n
	s.taken += n
}

func (s *fwState) grant(b *Bucket, g int64, now int64) (int64, int64) {
	s.cur += g
	return min(now+b.LeaseTTL.Microseconds(), s.start+b.Period.Microseconds()), s.start
}

func (s *fwState) settled(b *Bucket, l *winLease, used int64, now int64) {
	if l.window == s.start {
		s.cur = max(s.cur-(l.granted-used), 0)
	}
}

func (s *fwState) replaced(*Bucket, *winLease, int64) {}

// retryAfter: fixed_window frees nothing before the window's end, when it
// frees everything. The counter's estimate falls as the previous window's
// weight does, then, in the next window, as the current one's does.
func (s *fwState) retryAfter(b *Bucket, need int64, now int64) time.Duration {
	if need > b.Limit {
		return -1
	}
	w := b.Period.Microseconds()
	end := s.start + w
	if !s.counter {
		return waitOf(end - now)
	}
	r := b.Limit - need // the estimate that admits need
	if s.cur <= r && s.prev > 0 {
		e := int64(math.Ceil(float64(float64(w)*float64(1-float64(r-s.cur)/float64(s.prev))) - 1e-6))
		if e < w {
			return waitOf(max(s.start+e-now, 0))
		}
	}
	if s.cur <= r {
		return waitOf(end - now)
	}
	e := int64(math.Ceil(float64(float64(w)*float64(1-float64(r)/float64(s.cur))) - 1e-6))
	return waitOf(end + e - now)
}

// reset: fixed_window's window end; for the counter, when the estimate is
// back at zero.
func (s *fwState) reset(b *Bucket, now int64) time.Duration {
	w := b.Period.Microseconds()
	switch {
	case !s.counter:
		return waitOf(s.start + w - now)
	case s.cur > 0:
		return waitOf(s.start + 2*w - now)
	case s.prev > 0:
		return waitOf(s.start + w - now)
	}
	return 0
}

func (s *fwState) lease(b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome {
	s.bucket = *b
	return windowLease(s, b, owner, op, now)
}

func (s *fwState) take(b *Bucket, cost, floor int64, maxDelay time.Duration, now int64) TakeOutcome {
	s.bucket = *b
	start, cur, prev, taken := s.start, s.cur, s.prev, s.taken
	o := windowTake(s, b, cost, floor, now)
	if !o.Taken && o.Expired == 0 && (s.start == start || s.out == 0) {
		// A denial that closed no lease and carried none into a new
		// window changes nothing: the Redis store writes nothing then,
		// and the next call rolls again from the window it stored. Keep
		// that window here too: after a reload to a longer period, the
		// memory store counted from a window that a denied take had
		// rolled to (nothing), Redis from the one before (the tokens
		// spent in it).
		s.start, s.cur, s.prev, s.taken = start, cur, prev, taken
	}
	return o
}

// refund gives back up to cost of the tokens taken directly in this
// window, for a take made in it at at: a take of an earlier window is not
// carried across (it would give back tokens that this window's admissions
// count).
func (s *fwState) refund(b *Bucket, cost int64, at int64, now int64) {
	s.bucket = *b
	s.advance(b, now)
	if at <= 0 || floorTo(at, b.Period.Microseconds()) != s.start {
		return
	}
	n := min(cost, s.taken)
	s.cur = max(s.cur-n, 0)
	s.taken -= n
}

func (s *fwState) idle(now int64) bool {
	s.advance(&s.bucket, now)
	return len(s.leases) == 0 && s.cur == 0 && s.prev == 0 && s.taken == 0
}

func (s *fwState) snapshot(b *Bucket, now int64) BucketState {
	expired := s.byDL.expiredBy(now)
	out := s.out
	for _, l := range expired {
		out -= l.granted
	}
	cp := fwState{counter: s.counter, start: s.start, cur: s.cur, prev: s.prev}
	if len(s.leases) == 0 && s.cur == 0 && s.prev == 0 && s.taken == 0 {
		cp.start = floorTo(now, b.Period.Microseconds()) // fresh, as advance
	}
	cp.out = out
	cp.roll(b, now)
	st := BucketState{
		Level:       max(float64(b.Limit)-cp.estimate(b, now), 0),
		Free:        cp.free(b, now),
		Outstanding: out,
		Leases:      len(s.leases) - len(expired),
		Holders:     holdersAt(s.procs, expired, slotLookup(s.leases), now),
		WindowEnd:   waitOf(cp.start + b.Period.Microseconds() - now),
	}
	if st.Free < b.Limit {
		st.Next, st.Full = cp.retryAfter(b, st.Free+1, now), cp.reset(b, now)
	}
	return st
}
