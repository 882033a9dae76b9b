package leases

import (
	"container/heap"
	"fmt"
	"time"
)

// This file is the lease bookkeeping the window algorithms share
// (fixed_window, sliding_window_counter, sliding_window_log), written once:
// the open leases indexed by owner and slot and by deadline, the holders
// counted per client for fair share, the caps, and the one flow of a lease
// call (settle or replace, caps, grant) and of a take. Each algorithm plugs
// in its accounting through windowAlgo. scripts/window_leases.lua is the
// same bookkeeping for Redis, prepended to each window algorithm's script.
//
// Unlike the token bucket's, a window lease has no waiter (a denied owner
// holds nothing) and no share clock: fair share is the per-lease cap
// max(1, limit/h), h counted as the token bucket counts it (clients holding
// open leases × processes of the owner's client holding open leases, the
// owner and its client counted as holding). Both counts are kept as leases
// open and close, so h costs nothing to read.

// winLease is an open lease of a window algorithm: the token bucket's
// record (its expiry is the lease's deadline), with the window it was
// granted in. One type, one heap: the stores order every algorithm's leases
// alike, by (expiry, member), as the Redis indexes do.
type winLease = openLease

// windowLeases are the open leases of one key under a window algorithm,
// indexed by owner and slot (to settle), by deadline (to close the expired
// ones in order) and counted per client (for fair share). No operation
// scans them.
type windowLeases struct {
	leases map[leaseRef]*winLease
	byDL   expiryHeap
	// procs counts, per client, its processes holding an open lease.
	procs map[string]int
	out   int64 // Σ granted over the open leases
}

func (w *windowLeases) holds(o Owner) bool {
	return w.leases[leaseRef{o, 0}] != nil || w.leases[leaseRef{o, 1}] != nil
}

func (w *windowLeases) open(l *winLease) {
	if !w.holds(l.ref.owner) {
		if w.procs == nil {
			w.procs = make(map[string]int)
		}
		w.procs[l.ref.owner.Client]++
	}
	if w.leases == nil {
		w.leases = make(map[leaseRef]*winLease)
	}
	w.leases[l.ref] = l
	heap.Push(&w.byDL, l)
	w.out += l.granted
}

func (w *windowLeases) close(l *winLease) {
	heap.Remove(&w.byDL, l.index)
	delete(w.leases, l.ref)
	w.out -= l.granted
	if !w.holds(l.ref.owner) {
		c := l.ref.owner.Client
		if w.procs[c]--; w.procs[c] <= 0 {
			delete(w.procs, c)
		}
	}
}

// expire closes the leases whose deadline is at or before now, in
// (deadline, member) order, calling fn for each after closing it, and
// returns how many it closed.
func (w *windowLeases) expire(now int64, fn func(l *winLease)) int {
	n := 0
	for len(w.byDL) > 0 && w.byDL[0].expiry <= now {
		l := w.byDL[0]
		w.close(l)
		if fn != nil {
			fn(l)
		}
		n++
	}
	return n
}

// holders returns the parts the key is shared in from o's view: clients
// (o's counted) × processes of o's client (o counted).
func (w *windowLeases) holders(o Owner) int {
	clients, procs := len(w.procs), w.procs[o.Client]
	if procs == 0 {
		clients++
	}
	if !w.holds(o) {
		procs++
	}
	return clients * procs
}

// windowAlgo is the accounting of one window algorithm, which the shared
// flow (windowLease, windowTake) calls. Times are µs.
type windowAlgo interface {
	keyState
	leasesOf() *windowLeases
	// advance brings the state to now: closes the expired leases (counted
	// in the result) and moves or drops what left the window.
	advance(b *Bucket, now int64) int
	// free returns the whole tokens a new spend may take at now.
	free(b *Bucket, now int64) int64
	// spend counts n tokens spent at now by a take.
	spend(b *Bucket, n int64, now int64)
	// grant counts a lease of g tokens granted at now and returns its
	// deadline and its window (see winLease.window).
	grant(b *Bucket, g int64, now int64) (deadline, window int64)
	// settled credits a lease closed by its owner at now with used tokens
	// spent; replaced counts a lease closed unsettled because its owner
	// asked again without its ID (as if fully spent).
	settled(b *Bucket, l *winLease, used int64, now int64)
	replaced(b *Bucket, l *winLease, now int64)
	// retryAfter returns the wait until free reaches need if nothing else
	// happens, −1 when it never can; reset the wait until the key is whole.
	retryAfter(b *Bucket, need int64, now int64) time.Duration
	reset(b *Bucket, now int64) time.Duration
}

// windowLease is the lease call of every window algorithm: settle the named
// lease (or replace the slot's open one as spent), apply the caps, grant.
func windowLease(a windowAlgo, b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome {
	w := a.leasesOf()
	var o LeaseOutcome
	o.Expired = a.advance(b, now)
	ref := leaseRef{owner, op.Slot}
	cur := w.leases[ref]
	if op.LeaseID != "" {
		if cur == nil || cur.id != op.LeaseID {
			return LeaseOutcome{Err: ErrUnknownLease, Expired: o.Expired}
		}
		if op.Used > cur.granted {
			return LeaseOutcome{Err: ErrUsedExceedsGranted, Expired: o.Expired}
		}
		w.close(cur)
		a.settled(b, cur, op.Used, now)
		o.Settled = true
	} else if cur != nil {
		w.close(cur)
		a.replaced(b, cur, now)
		o.Expired++
	}
	o.Holders = w.holders(owner)
	if op.Want > 0 && cur == nil {
		if len(w.leases) >= op.Limits.maxLeases() ||
			(!w.holds(owner) && w.procs[owner.Client] >= op.Limits.maxProcesses()) {
			return LeaseOutcome{Err: ErrTooManyLeases, Expired: o.Expired}
		}
	}
	if op.Want > 0 {
		g := min(op.Want, max(1, b.Limit/int64(o.Holders)), max(0, a.free(b, now)-op.Floor))
		if g > 0 {
			dl, win := a.grant(b, g, now)
			w.open(&winLease{ref: ref, member: member(owner, op.Slot), id: op.NewLeaseID, granted: g, expiry: dl, window: win})
			o.Granted, o.LeaseID, o.TTL = g, op.NewLeaseID, time.Duration(dl-now)*time.Microsecond
		} else {
			o.RetryAfter = a.retryAfter(b, 1+op.Floor, now)
		}
	}
	o.Remaining = a.free(b, now)
	o.Reset = a.reset(b, now)
	return o
}

// windowTake is the take of every window algorithm: cost tokens now, all or
// none, leaving floor free.
func windowTake(a windowAlgo, b *Bucket, cost, floor int64, now int64) TakeOutcome {
	var o TakeOutcome
	o.Expired = a.advance(b, now)
	if cost == 0 || cost+floor <= a.free(b, now) {
		a.spend(b, cost, now)
		o.Taken = true
	} else {
		o.RetryAfter = a.retryAfter(b, cost+floor, now)
	}
	o.Remaining = a.free(b, now)
	o.Reset = a.reset(b, now)
	o.At = now
	return o
}

// floorTo returns the largest multiple of q at or below t.
func floorTo(t, q int64) int64 {
	k := t / q
	if k*q > t {
		k--
	}
	return k * q
}

// ceilTo returns the smallest multiple of q at or above t.
func ceilTo(t, q int64) int64 {
	f := floorTo(t, q)
	if f < t {
		f += q
	}
	return f
}

// validateWindow is the validate of the window algorithms: the limit holds
// per window of Period, and Burst has no meaning.
func validateWindow(b *Bucket) error {
	if b.Burst != 0 && b.Burst != b.Limit {
		return fmt.Errorf("burst: is %d; %s counts limit (%d) per window and has no burst: leave burst out or set it to limit", b.Burst, algName(b), b.Limit)
	}
	return nil
}

// waitOf rounds a wait in µs up to whole ms; a negative wait (never)
// stays −1.
func waitOf(us int64) time.Duration {
	if us < 0 {
		return -1
	}
	return microsToRetry(us)
}
