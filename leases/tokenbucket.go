package leases

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// This file is the token bucket with leases in Go, as the memory store runs
// it. scripts/token_bucket.lua is the same algorithm for Redis, written to
// perform the same floating-point operations in the same order so that both
// stores give identical answers; the conformance suite checks that they do.
//
// State per key: level L, last refill t, outstanding O, open leases.
//
//	refill:  L = max(0, min(burst − O, L + rate·(now − t)))
//	grant:   g ≤ min(want, L, fair share); L −= g; O += g
//	fair share (when other owners hold leases): max(1, burst/holders), and
//	         ⌊rate·(now − vt)/holders + max(0, ⌊L − burst/4⌋)⌋, where vt, the
//	         owner's share clock, advances by holders/rate per token granted
//	         and never lags more than burst/rate behind now
//	settle:  O −= G; L += G − u
//	expiry:  O −= G (nothing credited)
//
// so L + O ≤ burst holds after every step.

// epsilon absorbs floating-point error when comparing a level with a whole
// number of tokens.
const epsilon = 1e-9

type openLease struct {
	owner   string
	slot    int
	id      string
	granted int64
	expiry  int64 // µs
}

// ownerShare is an owner's fair-share clock on a shared key: like a GCRA
// theoretical arrival time, it advances by holders/rate per token granted,
// and never lags more than burst/rate behind now. It is kept after the
// owner's lease closes, until it no longer limits anything.
type ownerShare struct {
	owner string
	vt    float64 // µs
}

type tbState struct {
	level  float64
	last   int64 // µs
	out    int64
	leases []openLease
	shares []ownerShare
	bucket Bucket // parameters of the last operation, for the idle sweep
}

func newTBState(b *Bucket, now int64) *tbState {
	return &tbState{level: float64(b.Burst), last: now, bucket: *b}
}

// reap closes the leases that expired at or before now, without credit.
func (s *tbState) reap(now int64) int {
	n := 0
	kept := s.leases[:0]
	for _, l := range s.leases {
		if l.expiry <= now {
			s.out -= l.granted
			n++
			continue
		}
		kept = append(kept, l)
	}
	clear(s.leases[len(kept):])
	s.leases = kept
	return n
}

func (s *tbState) refill(b *Bucket, now int64) {
	if now > s.last {
		// The explicit conversion forbids a fused multiply-add, so that the
		// result is bit-identical to the Lua script's.
		s.level += float64(b.ratePerMicro() * float64(now-s.last))
		s.last = now
	}
	if c := float64(b.Burst - s.out); s.level > c {
		s.level = c
	}
	// After a rule shrinks below what is outstanding, burst − O is
	// negative: the bucket is empty, not in debt, and refills from zero once
	// the old leases end.
	if s.level < 0 {
		s.level = 0
	}
}

func (s *tbState) find(owner string, slot int) int {
	for i := range s.leases {
		if s.leases[i].owner == owner && s.leases[i].slot == slot {
			return i
		}
	}
	return -1
}

// shareBase returns owner's share clock, at least now − burst/rate, and
// forgets the clocks that have fallen that far behind (they limit nothing).
func (s *tbState) shareBase(b *Bucket, owner string, now int64) float64 {
	floor := float64(now) - float64(b.Burst)/b.ratePerMicro()
	base := floor
	kept := s.shares[:0]
	for _, sh := range s.shares {
		if sh.vt <= floor {
			continue
		}
		if sh.owner == owner {
			base = sh.vt
		}
		kept = append(kept, sh)
	}
	clear(s.shares[len(kept):])
	s.shares = kept
	return base
}

// setShare records owner's share clock.
func (s *tbState) setShare(owner string, vt float64) {
	for i := range s.shares {
		if s.shares[i].owner == owner {
			s.shares[i].vt = vt
			return
		}
	}
	s.shares = append(s.shares, ownerShare{owner: owner, vt: vt})
}

// holders counts the owners holding open leases, plus owner if it holds
// none: an owner with a lease in each slot is one holder.
func (s *tbState) holders(owner string) int {
	n := 0
	for i := range s.leases {
		l := &s.leases[i]
		if l.owner == owner {
			continue
		}
		if l.slot == 1 && s.find(l.owner, 0) >= 0 {
			continue // counted with its slot 0 lease
		}
		n++
	}
	return n + 1
}

func (s *tbState) remove(i int) {
	last := len(s.leases) - 1
	s.leases[i] = s.leases[last]
	s.leases[last] = openLease{}
	s.leases = s.leases[:last]
}

func (s *tbState) remaining() int64 {
	if s.level <= 0 {
		return 0
	}
	return int64(math.Floor(s.level + epsilon))
}

// retryAfter returns the time until the bucket holds target tokens, if no
// operation happens meanwhile: until refill brings the level there and
// enough leases have expired for the cap burst − O to allow it. It returns
// −1 when target exceeds the bucket size.
func (s *tbState) retryAfter(b *Bucket, target float64, now int64) time.Duration {
	if target > float64(b.Burst) {
		return -1
	}
	var wait int64
	if need := target - s.level; need > 0 {
		wait = int64(math.Ceil(float64(need/b.ratePerMicro()) - 1e-6))
	}
	if float64(b.Burst-s.out) < target {
		// Leases must expire first: take them in expiry order until the cap
		// burst − O admits target.
		byExpiry := slices.Clone(s.leases)
		slices.SortFunc(byExpiry, func(a, b openLease) int { return cmp.Compare(a.expiry, b.expiry) })
		out := s.out
		for _, l := range byExpiry {
			out -= l.granted
			if float64(b.Burst-out) >= target {
				wait = max(wait, l.expiry-now)
				break
			}
		}
	}
	return microsToRetry(wait)
}

// microsToRetry rounds a wait up to whole milliseconds, as the protocol
// carries it.
func microsToRetry(us int64) time.Duration {
	if us <= 0 {
		return 0
	}
	ms := (us + 999) / 1000
	return time.Duration(ms) * time.Millisecond
}

// lease settles and grants per op at time now (µs).
func (s *tbState) lease(b *Bucket, owner string, op *LeaseOp, now int64) LeaseOutcome {
	s.bucket = *b
	var o LeaseOutcome
	o.Expired = s.reap(now)
	s.refill(b, now)
	i := s.find(owner, op.Slot)
	base := s.shareBase(b, owner, now)
	if op.LeaseID != "" {
		if i < 0 || s.leases[i].id != op.LeaseID {
			return LeaseOutcome{Err: ErrUnknownLease, Expired: o.Expired}
		}
		l := s.leases[i]
		if op.Used > l.granted {
			return LeaseOutcome{Err: ErrUsedExceedsGranted, Expired: o.Expired}
		}
		s.out -= l.granted
		s.level += float64(l.granted - op.Used)
		s.remove(i)
		o.Settled = true
	} else if i >= 0 {
		// A new lease replaces the open one of this slot, which counts as
		// fully spent.
		s.out -= s.leases[i].granted
		s.remove(i)
		o.Expired++
	}
	holders := s.holders(owner)
	var shareWait int64 // µs until this owner's fair share reaches a token
	var share float64   // tokens of fair share available to owner
	shared := false     // the fair share applied
	if op.Want > 0 {
		g := op.Want
		if holders > 1 {
			// Fair share: at most burst/holders per lease, and at most
			// the owner's share of the refill since its share clock, plus
			// whatever the bucket holds above a quarter full. An owner
			// that asks often gets small grants, one that asks rarely
			// finds a quarter of the bucket kept for it, and no share is
			// wasted.
			g = min(g, max(1, b.Burst/int64(holders)))
			share = float64(b.ratePerMicro()*(float64(now)-base)) / float64(holders)
			spare := 0.0
			if reserve := float64(b.Burst) / 4; s.level > reserve {
				spare = math.Floor(s.level - reserve)
			}
			capf := share + spare
			g = min(g, int64(math.Floor(capf)))
			if g < 1 {
				// Too soon: the owner's share has not reached a token.
				shareWait = int64(math.Ceil(float64((1-capf)*float64(holders)) / b.ratePerMicro()))
			}
			shared = true
		}
		avail := int64(0)
		if s.level > 0 {
			avail = int64(math.Floor(s.level + epsilon))
		}
		g = min(g, avail)
		if g > 0 {
			s.level -= float64(g)
			s.out += g
			s.leases = append(s.leases, openLease{owner: owner, slot: op.Slot, id: op.NewLeaseID, granted: g, expiry: now + b.LeaseTTL.Microseconds()})
			if shared {
				// The clock advances by the tokens taken from the share;
				// tokens taken from the spare above a quarter full are
				// free.
				adv := min(float64(g), share)
				s.setShare(owner, base+float64(float64(adv*float64(holders))/b.ratePerMicro()))
			}
			o.Granted = g
			o.LeaseID = op.NewLeaseID
			o.TTL = b.LeaseTTL
		} else {
			o.RetryAfter = max(s.retryAfter(b, 1, now), microsToRetry(shareWait))
		}
	}
	o.Remaining = s.remaining()
	o.Holders = holders
	return o
}

// take takes cost tokens outright, all or none.
func (s *tbState) take(b *Bucket, cost int64, now int64) TakeOutcome {
	s.bucket = *b
	var o TakeOutcome
	o.Expired = s.reap(now)
	s.refill(b, now)
	if cost == 0 || s.level+epsilon >= float64(cost) {
		s.level -= float64(cost)
		o.Taken = true
	} else {
		o.RetryAfter = s.retryAfter(b, float64(cost), now)
	}
	o.Remaining = s.remaining()
	return o
}

// refund puts back cost tokens taken by take.
func (s *tbState) refund(b *Bucket, cost int64, now int64) {
	s.bucket = *b
	s.reap(now)
	s.refill(b, now)
	s.level = min(s.level+float64(cost), float64(b.Burst-s.out))
}

// idle reports whether the bucket is full with no open lease at now, which
// is the same as no state at all.
func (s *tbState) idle(now int64) bool {
	s.reap(now)
	if len(s.leases) > 0 {
		return false
	}
	s.refill(&s.bucket, now)
	return s.level+epsilon >= float64(s.bucket.Burst)
}
