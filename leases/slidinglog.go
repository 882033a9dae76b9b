package leases

import (
	"sort"
	"time"
)

// This file is sliding_window_log in Go, as the memory store runs it;
// scripts/sliding_window_log.lua is the same for Redis. See the package
// documentation for the bound and its proof.
//
// The log holds entries (start, end, n): n tokens spent at instants in
// [start, end]. An open lease is the entry (grant time, deadline, g); a
// settle makes it (grant time, now, used), an unsettled expiry or a
// replacement leaves it (grant time, deadline, g), a take is (now, now,
// cost). Only ends matter to admission, so the closed entries are merged
// into buckets by their end rounded up to a multiple of q = max(1 ms,
// W/64) (a later end only keeps an entry longer: conservative): one bucket
// per multiple of q, plus the open leases. With sum = Σ n over the entries
// whose end is after now − W (the others are pruned as time passes):
//
//	free:    limit − sum
//	grant:   g ≤ min(want, free, max(1, limit/h)); sum += g;
//	         deadline = now + TTL
//	settle:  sum −= g − used; the bucket ⌈now⌉q += used
//	expiry:  the bucket ⌈deadline⌉q += g (or sum −= g when that bucket has
//	         left the window already)
//	take:    cost ≤ free; the bucket ⌈now⌉q += cost; sum += cost
//	refund:  the bucket ⌈now⌉q −= min(cost, its n); sum likewise

// logBucket is the closed entries of the log whose end rounds up to end.
type logBucket struct {
	end int64 // µs, a multiple of q
	n   int64
}

// swlState is one key under sliding_window_log.
type swlState struct {
	windowLeases
	sum int64 // Σ n over the buckets and the open leases
	// maxEnd is at least the latest end of any entry (an open lease's end
	// counted as its deadline rounded up), 0 when the log is empty.
	maxEnd  int64
	buckets []logBucket // by end
	bucket  Bucket      // parameters of the last operation, for the idle sweep
}

func newSWLState(b *Bucket) *swlState { return &swlState{bucket: *b} }

func (s *swlState) algorithm() Algorithm    { return SlidingWindowLog }
func (s *swlState) leasesOf() *windowLeases { return &s.windowLeases }

// logQuantum returns q, the width of a log bucket, in µs.
func logQuantum(b *Bucket) int64 { return max(1000, b.Period.Microseconds()/64) }

// add adds n tokens to the bucket ending at end.
func (s *swlState) add(end, n int64) {
	if n == 0 {
		return
	}
	i := sort.Search(len(s.buckets), func(i int) bool { return s.buckets[i].end >= end })
	if i < len(s.buckets) && s.buckets[i].end == end {
		s.buckets[i].n += n
		return
	}
	s.buckets = append(s.buckets, logBucket{})
	copy(s.buckets[i+1:], s.buckets[i:])
	s.buckets[i] = logBucket{end, n}
}

func (s *swlState) advance(b *Bucket, now int64) int {
	q, w := logQuantum(b), b.Period.Microseconds()
	n := s.expire(now, func(l *winLease) {
		if e := ceilTo(l.expiry, q); e > now-w {
			s.add(e, l.granted)
		} else {
			s.sum -= l.granted
		}
	})
	i := 0
	for i < len(s.buckets) && s.buckets[i].end <= now-w {
		s.sum -= s.buckets[i].n
		i++
	}
	if i > 0 {
		s.buckets = s.buckets[:copy(s.buckets, s.buckets[i:])]
	}
	s.tidy()
	return n
}

// tidy empties a log that counts nothing, as the Redis store deletes it.
func (s *swlState) tidy() {
	if s.sum == 0 && len(s.leases) == 0 {
		s.buckets = s.buckets[:0]
		s.maxEnd = 0
	}
}

func (s *swlState) free(b *Bucket, now int64) int64 { return max(b.Limit-s.sum, 0) }

func (s *swlState) spend(b *Bucket, n int64, now int64) {
	if n == 0 {
		return
	}
	e := ceilTo(now, logQuantum(b))
	s.add(e, n)
	s.sum += n
	s.maxEnd = max(s.maxEnd, e)
}

func (s *swlState) grant(b *Bucket, g int64, now int64) (int64, int64) {
	dl := now + b.LeaseTTL.Microseconds()
	s.sum += g
	s.maxEnd = max(s.maxEnd, ceilTo(dl, logQuantum(b)))
	return dl, 0
}

func (s *swlState) settled(b *Bucket, l *winLease, used int64, now int64) {
	s.sum -= l.granted - used
	s.add(ceilTo(now, logQuantum(b)), used)
	s.tidy()
}

func (s *swlState) replaced(b *Bucket, l *winLease, now int64) {
	s.add(ceilTo(l.expiry, logQuantum(b)), l.granted)
}

// retryAfter walks the entries in end order (the buckets, then the open
// leases as if they ended unsettled; buckets first at equal ends), at most
// retryWalk of them, until the sum left admits need: the wait is until that
// entry's end leaves the window. Beyond the walk it is bounded by maxEnd.
func (s *swlState) retryAfter(b *Bucket, need int64, now int64) time.Duration {
	if need > b.Limit {
		return -1
	}
	target := s.sum - (b.Limit - need) // tokens that must leave the window
	if target <= 0 {
		return 0
	}
	q, w := logQuantum(b), b.Period.Microseconds()
	ls := s.byDL.firstK(retryWalk)
	bi, li := 0, 0
	var freed int64
	for k := 0; k < retryWalk; k++ {
		var end, n int64
		switch {
		case bi < len(s.buckets) && (li >= len(ls) || s.buckets[bi].end <= ceilTo(ls[li].expiry, q)):
			end, n = s.buckets[bi].end, s.buckets[bi].n
			bi++
		case li < len(ls):
			end, n = ceilTo(ls[li].expiry, q), ls[li].granted
			li++
		default:
			k = retryWalk
			continue
		}
		if freed += n; freed >= target {
			return waitOf(max(end+w-now, 0))
		}
	}
	return waitOf(max(s.maxEnd+w-now, 0))
}

func (s *swlState) reset(b *Bucket, now int64) time.Duration {
	if s.sum == 0 {
		return 0
	}
	return waitOf(max(s.maxEnd+b.Period.Microseconds()-now, 0))
}

func (s *swlState) lease(b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome {
	s.bucket = *b
	o := windowLease(s, b, owner, op, now)
	s.tidy()
	return o
}

func (s *swlState) take(b *Bucket, cost, floor int64, maxDelay time.Duration, now int64) TakeOutcome {
	s.bucket = *b
	return windowTake(s, b, cost, floor, now)
}

// refund gives back up to cost tokens from the bucket of at, where the take
// it follows counted them (nothing once that bucket has left the window).
func (s *swlState) refund(b *Bucket, cost int64, at int64, now int64) {
	s.bucket = *b
	s.advance(b, now)
	if at <= 0 {
		return
	}
	e := ceilTo(at, logQuantum(b))
	i := sort.Search(len(s.buckets), func(i int) bool { return s.buckets[i].end >= e })
	if i == len(s.buckets) || s.buckets[i].end != e {
		return
	}
	n := min(cost, s.buckets[i].n)
	s.sum -= n
	if s.buckets[i].n -= n; s.buckets[i].n == 0 {
		s.buckets = append(s.buckets[:i], s.buckets[i+1:]...)
	}
	s.tidy()
}

func (s *swlState) idle(now int64) bool {
	s.advance(&s.bucket, now)
	return len(s.leases) == 0 && s.sum == 0
}

func (s *swlState) snapshot(b *Bucket, now int64) BucketState {
	q, w := logQuantum(b), b.Period.Microseconds()
	sum, out := s.sum, s.out
	expired := s.byDL.expiredBy(now)
	for _, l := range expired {
		out -= l.granted
		if ceilTo(l.expiry, q) <= now-w {
			sum -= l.granted
		}
	}
	i := 0 // the first bucket still in the window
	for i < len(s.buckets) && s.buckets[i].end <= now-w {
		sum -= s.buckets[i].n
		i++
	}
	free := max(b.Limit-sum, 0)
	st := BucketState{Level: float64(free), Free: free, Outstanding: out, Leases: len(s.leases) - len(expired), Holders: holdersAt(s.procs, expired, slotLookup(s.leases), now)}
	if free < b.Limit {
		// The oldest entry counted: the first bucket in the window, or the
		// first lease (open, or expired and still counted) whose end,
		// rounded up to q, is in it.
		oldest := s.maxEnd
		if i < len(s.buckets) {
			oldest = s.buckets[i].end
		}
		cut := floorTo(now-w, q) // ceilTo(e, q) > now − w ⟺ e > cut
		s.byDL.walk(func(l *openLease) bool {
			if l.expiry <= cut {
				return true
			}
			oldest = min(oldest, ceilTo(l.expiry, q))
			return false
		})
		st.Next = waitOf(max(oldest+w-now, 0))
		st.Full = waitOf(max(s.maxEnd+w-now, 0))
	}
	return st
}
