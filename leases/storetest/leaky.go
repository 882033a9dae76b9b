package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaky returns leaky-bucket parameters: limit per period (one slot every
// period/limit), a queue of burst, lease TTL ttl.
func leaky(limit int64, period time.Duration, burst int64, ttl time.Duration) leases.Bucket {
	return leases.Bucket{Algorithm: leases.LeakyBucket, Limit: limit, Period: period, Burst: burst, LeaseTTL: ttl}
}

// RunLeaky runs the conformance suite of the leaky bucket (a shaper with
// leases) against the stores newStore returns. Of opts it uses
// ConcurrentTicks and Retention (which must look at the leaky bucket's
// keys).
func RunLeaky(t *testing.T, newStore Factory, opts Options) {
	if opts.ConcurrentTicks == 0 {
		opts.ConcurrentTicks = 2000
	}
	t.Run("GrantSettle", func(t *testing.T) { testLBGrantSettle(t, newFixture(t, newStore)) })
	t.Run("SettleAfterAnotherGrantLosesTail", func(t *testing.T) { testLBLostTail(t, newFixture(t, newStore)) })
	t.Run("Ownership", func(t *testing.T) { testLBOwnership(t, newFixture(t, newStore)) })
	t.Run("ExpiryAtSliceEnd", func(t *testing.T) { testLBExpiry(t, newFixture(t, newStore), opts) })
	t.Run("NewLeaseReplacesOpenOne", func(t *testing.T) { testLBReplace(t, newFixture(t, newStore)) })
	t.Run("TwoSlots", func(t *testing.T) { testLBSlots(t, newFixture(t, newStore)) })
	t.Run("LeaseCaps", func(t *testing.T) { testLBCaps(t, newFixture(t, newStore)) })
	t.Run("QueueFull", func(t *testing.T) { testLBQueueFull(t, newFixture(t, newStore)) })
	t.Run("FairShare", func(t *testing.T) { testLBFairShare(t, newFixture(t, newStore)) })
	t.Run("MaxDelay", func(t *testing.T) { testLBMaxDelay(t, newFixture(t, newStore)) })
	t.Run("RefundNamesItsTake", func(t *testing.T) { testLBRefund(t, newFixture(t, newStore)) })
	t.Run("FractionalInterval", func(t *testing.T) { testLBFractional(t, newFixture(t, newStore)) })
	t.Run("ShortIntervalKeepsRate", func(t *testing.T) { testLBShortInterval(t, newFixture(t, newStore)) })
	t.Run("ConcurrentSlots", func(t *testing.T) { testLBConcurrent(t, newFixture(t, newStore), opts.ConcurrentTicks) })
}

func (f *fixture) take(key string, b leases.Bucket, cost int64) leases.TakeOutcome {
	f.t.Helper()
	out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: key, Bucket: b, Cost: cost}})
	require.NoError(f.t, err)
	require.Len(f.t, out, 1)
	return out[0]
}

func testLBGrantSettle(t *testing.T, f *fixture) {
	// One slot every 100 ms, a queue of 10.
	b := leaky(10, time.Second, 10, time.Second)
	a := f.lease("a/1", "k", b, 4, "", 0)
	require.NoError(t, a.Err)
	assert.EqualValues(t, 4, a.Granted)
	assert.Zero(t, a.Delay, "the queue was empty: the slice starts now")
	assert.Equal(t, time.Second, a.TTL, "the slice ends at 400 ms: the lease lives its TTL")
	assert.EqualValues(t, 6, a.Remaining)
	assert.Equal(t, 400*time.Millisecond, a.Reset, "the queue is empty again at 400 ms")
	assert.Equal(t, 1, a.Holders)

	// b joins: two holders, a fair share of 5; its slice follows a's.
	bo := f.lease("b/1", "k", b, 10, "", 0)
	require.NoError(t, bo.Err)
	assert.EqualValues(t, 5, bo.Granted)
	assert.Equal(t, 400*time.Millisecond, bo.Delay)
	assert.Equal(t, 2, bo.Holders)
	assert.EqualValues(t, 1, bo.Remaining)
	assert.Equal(t, 900*time.Millisecond, bo.Reset)
	st := f.state("k", b)
	assert.InDelta(t, 9, st.Level, 1e-9, "nine slots queued")
	assert.EqualValues(t, 9, st.Outstanding)
	assert.Equal(t, 2, st.Leases)

	// b uses 2 of its 5 and settles 150 ms later: its slice is the last
	// one, so its tail comes back: the queue ends at 400 + 2·100 ms.
	f.clock.Advance(150 * time.Millisecond)
	s := f.lease("b/1", "k", b, 0, bo.LeaseID, 2)
	require.NoError(t, s.Err)
	assert.True(t, s.Settled)
	assert.Equal(t, 450*time.Millisecond, s.Reset, "600 ms − 150 ms")
	assert.EqualValues(t, 5, s.Remaining, "4.5 slots queued: 5 whole ones free")

	// a settles with 1 of its 4 used: b's slice came after, so a's tail
	// is lost.
	s = f.lease("a/1", "k", b, 0, a.LeaseID, 1)
	require.NoError(t, s.Err)
	assert.True(t, s.Settled)
	assert.Equal(t, 450*time.Millisecond, s.Reset)
	st = f.state("k", b)
	assert.Zero(t, st.Outstanding)
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 4.5, st.Level, 1e-9)

	// A pure return of a lease whose slice has passed gives nothing back.
	f.clock.Advance(450 * time.Millisecond)
	c := f.lease("a/1", "k", b, 3, "", 0)
	require.EqualValues(t, 3, c.Granted)
	assert.Zero(t, c.Delay)
	f.clock.Advance(900 * time.Millisecond) // its slice has passed; its TTL not
	s = f.lease("a/1", "k", b, 0, c.LeaseID, 0)
	require.NoError(t, s.Err)
	assert.Zero(t, s.Reset)
	assert.EqualValues(t, 10, s.Remaining)
}

func testLBLostTail(t *testing.T, f *fixture) {
	b := leaky(10, time.Second, 10, time.Second)
	a := f.lease("a/1", "k", b, 3, "", 0)
	require.EqualValues(t, 3, a.Granted)
	tk := f.take("k", b, 1)
	require.True(t, tk.Taken)
	assert.Equal(t, 300*time.Millisecond, tk.Delay, "the take's slot follows the lease's slice")
	// a used nothing, but a slot was handed out after its slice: nothing
	// comes back, or the next slot would overlap the take's.
	s := f.lease("a/1", "k", b, 0, a.LeaseID, 0)
	require.True(t, s.Settled)
	assert.Equal(t, 400*time.Millisecond, s.Reset)
	next := f.take("k", b, 1)
	assert.Equal(t, 400*time.Millisecond, next.Delay)
}

func testLBOwnership(t *testing.T, f *fixture) {
	b := leaky(10, time.Second, 10, time.Second)
	a := f.lease("a/1", "k", b, 5, "", 0)
	require.EqualValues(t, 5, a.Granted)
	before := f.state("k", b)
	for _, owner := range []string{"b/1", "a/2", "b/a/1"} {
		o := f.lease(owner, "k", b, 0, a.LeaseID, 0)
		assert.ErrorIs(t, o.Err, leases.ErrUnknownLease, owner)
	}
	bad := f.lease("a/1", "k", b, 3, a.LeaseID, 6)
	assert.ErrorIs(t, bad.Err, leases.ErrUsedExceedsGranted)
	assert.Zero(t, bad.Granted)
	wrong := f.lease("a/1", "k", b, 3, "0123456789abcdef", 0)
	assert.ErrorIs(t, wrong.Err, leases.ErrUnknownLease)
	assert.Equal(t, before, f.state("k", b), "failed settles change nothing")
	ok := f.lease("a/1", "k", b, 0, a.LeaseID, 0)
	require.NoError(t, ok.Err)
	require.True(t, ok.Settled)
	assert.EqualValues(t, 10, ok.Remaining, "the whole slice came back")
	again := f.lease("a/1", "k", b, 0, a.LeaseID, 0)
	assert.ErrorIs(t, again.Err, leases.ErrUnknownLease, "settled once only")
}

func testLBExpiry(t *testing.T, f *fixture, opts Options) {
	// A slice of 10 slots of 100 ms ends at 1 s, after the 100 ms TTL: the
	// lease lives until its slice ends.
	b := leaky(10, time.Second, 10, 100*time.Millisecond)
	a := f.lease("a/1", "k", b, 10, "", 0)
	require.EqualValues(t, 10, a.Granted)
	assert.Equal(t, time.Second, a.TTL)
	if opts.Retention != nil {
		assert.GreaterOrEqual(t, opts.Retention(t, "k"), time.Second, "the state outlives the lease")
	}
	f.clock.Advance(999 * time.Millisecond)
	assert.Equal(t, 1, f.state("k", b).Leases, "alive 1 ms before its slice ends")
	f.clock.Advance(time.Millisecond)
	st := f.state("k", b)
	assert.Zero(t, st.Leases, "expired at its slice's end")
	assert.Zero(t, st.Outstanding)
	late := f.lease("a/1", "k", b, 0, a.LeaseID, 0)
	assert.ErrorIs(t, late.Err, leases.ErrUnknownLease)
	assert.Equal(t, 1, late.Expired)

	// Expired unsettled before its slice ends (a slice shorter than the
	// TTL): nothing comes back.
	c := f.lease("a/1", "k2", b, 2, "", 0)
	require.EqualValues(t, 2, c.Granted)
	assert.Equal(t, 200*time.Millisecond, c.TTL)
	f.clock.Advance(200 * time.Millisecond)
	o := f.take("k2", b, 1)
	assert.Equal(t, 1, o.Expired)
	assert.Zero(t, o.Delay)
	f.sweepIfAny()
}

func testLBReplace(t *testing.T, f *fixture) {
	b := leaky(10, time.Second, 10, time.Second)
	o := f.lease("a/1", "k", b, 3, "", 0)
	n := f.lease("a/1", "k", b, 2, "", 0)
	require.NoError(t, n.Err)
	assert.EqualValues(t, 2, n.Granted)
	assert.Equal(t, 1, n.Expired, "the open lease was closed, as fully used")
	assert.Equal(t, 300*time.Millisecond, n.Delay, "its slots are not given back")
	assert.ErrorIs(t, f.lease("a/1", "k", b, 0, o.LeaseID, 0).Err, leases.ErrUnknownLease)
	st := f.state("k", b)
	assert.Equal(t, 1, st.Leases)
	assert.EqualValues(t, 2, st.Outstanding)
}

func testLBSlots(t *testing.T, f *fixture) {
	b := leaky(10, time.Second, 10, time.Second)
	a0 := f.leaseSlot("a/1", "k", 0, b, 3, "", 0)
	a1 := f.leaseSlot("a/1", "k", 1, b, 3, "", 0)
	require.EqualValues(t, 3, a1.Granted)
	assert.Equal(t, 300*time.Millisecond, a1.Delay)
	assert.Equal(t, 1, a1.Holders, "one process, two slots")
	assert.ErrorIs(t, f.leaseSlot("a/1", "k", 0, b, 0, a1.LeaseID, 0).Err, leases.ErrUnknownLease)
	// Settling slot 1 (the last slice) gives its slots back; slot 0 stays.
	s := f.leaseSlot("a/1", "k", 1, b, 0, a1.LeaseID, 0)
	require.True(t, s.Settled)
	assert.Equal(t, 300*time.Millisecond, s.Reset)
	st := f.state("k", b)
	assert.Equal(t, 1, st.Leases)
	// Now slot 0's slice is the last one again.
	s = f.leaseSlot("a/1", "k", 0, b, 0, a0.LeaseID, 1)
	require.True(t, s.Settled)
	assert.Equal(t, 100*time.Millisecond, s.Reset)
}

func testLBCaps(t *testing.T, f *fixture) {
	b := leaky(1000, time.Second, 1000, time.Second)
	lim := leases.LeaseLimits{MaxLeasesPerKey: 3, MaxProcessesPerClient: 1}
	op := func(owner string, slot int, want int64, id string) leases.LeaseOutcome {
		out, err := f.store.Lease(f.ctx, own(owner), []leases.LeaseOp{{Key: "k", Bucket: b, Want: want, LeaseID: id, NewLeaseID: leases.NewLeaseID(), Slot: slot, Limits: lim}})
		require.NoError(t, err)
		return out[0]
	}
	a := op("a/1", 0, 1, "")
	require.NoError(t, a.Err)
	require.NoError(t, op("a/1", 1, 1, "").Err)
	before := f.state("k", b)
	tooMany := op("a/2", 0, 1, "")
	require.ErrorIs(t, tooMany.Err, leases.ErrTooManyLeases, "a second process of client a")
	assert.Zero(t, tooMany.Granted)
	assert.Equal(t, before, f.state("k", b), "a refused grant changes nothing")
	require.NoError(t, op("b/1", 0, 1, "").Err)
	require.ErrorIs(t, op("c/1", 0, 1, "").Err, leases.ErrTooManyLeases, "three leases open")
	r := op("a/1", 0, 1, a.LeaseID)
	require.NoError(t, r.Err, "a renewal is never refused")
	require.True(t, r.Settled)
	require.NoError(t, op("a/1", 0, 0, r.LeaseID).Err, "nor a return")
	require.NoError(t, op("c/1", 0, 1, "").Err, "the return freed a place")
}

func testLBQueueFull(t *testing.T, f *fixture) {
	// One slot every 100 ms, a queue of 5.
	b := leaky(10, time.Second, 5, time.Second)
	for i := range 5 {
		o := f.take("k", b, 1)
		require.True(t, o.Taken, "take %d", i)
		assert.Equal(t, time.Duration(i)*100*time.Millisecond, o.Delay, "take %d waits for its slot", i)
		assert.EqualValues(t, 4-i, o.Remaining)
	}
	d := f.take("k", b, 1)
	assert.False(t, d.Taken, "the queue is full")
	assert.Equal(t, 100*time.Millisecond, d.RetryAfter)
	assert.Zero(t, d.Delay)
	assert.Equal(t, 500*time.Millisecond, d.Reset)
	l := f.lease("a/1", "k", b, 3, "", 0)
	assert.Zero(t, l.Granted)
	assert.Equal(t, 100*time.Millisecond, l.RetryAfter)
	two := f.take("k", b, 2)
	assert.False(t, two.Taken)
	assert.Equal(t, 200*time.Millisecond, two.RetryAfter)
	never := f.take("k", b, 6)
	assert.False(t, never.Taken)
	assert.Negative(t, never.RetryAfter, "more than the queue can never be served")

	f.clock.Advance(99 * time.Millisecond)
	assert.False(t, f.take("k", b, 1).Taken, "1 ms early")
	f.clock.Advance(time.Millisecond)
	o := f.take("k", b, 1)
	require.True(t, o.Taken, "exactly at retry_after")
	assert.Equal(t, 400*time.Millisecond, o.Delay)
	// A lease gets what fits.
	f.clock.Advance(300 * time.Millisecond)
	l = f.lease("a/1", "k", b, 10, "", 0)
	assert.EqualValues(t, 3, l.Granted)
	assert.Equal(t, 200*time.Millisecond, l.Delay)
	assert.Zero(t, l.Remaining)
}

func testLBFairShare(t *testing.T, f *fixture) {
	b := leaky(100, time.Second, 12, time.Second)
	require.EqualValues(t, 12, f.lease("a/1", "k", b, 12, "", 0).Granted, "alone: the whole queue")
	f.clock.Advance(120 * time.Millisecond)
	o := f.lease("b/1", "k", b, 12, "", 0)
	assert.EqualValues(t, 6, o.Granted, "two holders: a queue of 12 / 2")
	o = f.lease("c/1", "k", b, 12, "", 0)
	assert.EqualValues(t, 4, o.Granted, "three holders: 12 / 3")
	assert.Equal(t, 3, o.Holders)
}

func testLBMaxDelay(t *testing.T, f *fixture) {
	b := leaky(10, time.Second, 10, time.Second)
	take := func(cost int64, maxDelay time.Duration) leases.TakeOutcome {
		out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost, MaxDelay: &maxDelay}})
		require.NoError(t, err)
		return out[0]
	}
	o := take(1, 0)
	require.True(t, o.Taken, "an empty queue: the slot is now")
	assert.Zero(t, o.Delay)
	o = take(1, 0)
	assert.False(t, o.Taken, "the next slot is 100 ms away: an Allow does not take it")
	assert.Equal(t, 100*time.Millisecond, o.RetryAfter)
	o = take(1, 50*time.Millisecond)
	assert.False(t, o.Taken)
	assert.Equal(t, 50*time.Millisecond, o.RetryAfter, "until the slot is 50 ms away")
	o = take(1, 100*time.Millisecond)
	require.True(t, o.Taken, "a caller that waits 100 ms takes it")
	assert.Equal(t, 100*time.Millisecond, o.Delay)
	f.clock.Advance(200 * time.Millisecond)
	o = take(1, 0)
	assert.True(t, o.Taken, "the queue drained: now again")
}

func testLBRefund(t *testing.T, f *fixture) {
	b := leaky(10, time.Second, 10, time.Second)
	refund := func(cost, at int64) {
		require.NoError(t, f.store.Refund(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost, At: at}}))
	}
	o := f.take("k", b, 2)
	require.True(t, o.Taken)
	refund(2, 0)
	n := f.take("k", b, 1)
	assert.Equal(t, 200*time.Millisecond, n.Delay, "a refund that names no take gives nothing back")
	// The last take's slots come back when its refund names it.
	refund(1, n.At)
	n2 := f.take("k", b, 1)
	assert.Equal(t, 200*time.Millisecond, n2.Delay, "the refunded slot is handed out again")
	// Not once another take followed: its slots stay with it.
	a := f.take("k", b, 2)
	require.True(t, a.Taken)
	c := f.take("k", b, 1)
	require.True(t, c.Taken)
	refund(2, a.At)
	d := f.take("k", b, 1)
	assert.Equal(t, c.Delay+100*time.Millisecond, d.Delay, "a refund of a take that is no longer the last gives nothing back")
}

func testLBFractional(t *testing.T, f *fixture) {
	// 3 per second: one slot every 333.33 ms. Delays round up.
	b := leaky(3, time.Second, 3, time.Second)
	d := []time.Duration{0, 334 * time.Millisecond, 667 * time.Millisecond}
	for i, want := range d {
		o := f.take("k", b, 1)
		require.True(t, o.Taken)
		assert.Equal(t, want, o.Delay, "take %d", i)
	}
	o := f.take("k", b, 1)
	assert.False(t, o.Taken)
	assert.Equal(t, 334*time.Millisecond, o.RetryAfter)
	f.clock.Advance(333 * time.Millisecond)
	assert.False(t, f.take("k", b, 1).Taken)
	f.clock.Advance(time.Millisecond)
	o = f.take("k", b, 1)
	require.True(t, o.Taken)
	assert.Equal(t, 666*time.Millisecond, o.Delay, "its slot is at 1000 ms")
}

// testLBShortInterval (found by the invariant review of the bounds on
// input): a leaky bucket of 909,091 per second, one slot every 1.0999989
// µs, saturated for 1.9 ms by takes, leases, settles and refunds, each
// attempted until the queue refuses. The store keeps TAT as a float64 of
// µs on its clock, whose spacing near 2026 is 0.25 µs: TAT + T rounded to
// the nearest, now + 1.0 µs, every time, so each slot handed out was 9%
// shorter than T and the queue drained 10% faster than the rate (about
// 2,000 slots where burst + rate·D allows 1,827). TAT now rounds up, to
// the least float64 at or after the exact sum: slots are never closer
// than T, at the cost of at most one spacing of the clock per operation.
func testLBShortInterval(t *testing.T, f *fixture) {
	const burst = 100
	b := leaky(909_091, time.Second, burst, time.Second)
	owner := func(key string) string { return key + "/1" }
	// Each attempt returns the slots it handed out for good: 0 once the
	// queue refuses.
	attempts := map[string]func(key string) int64{
		"take": func(key string) int64 {
			if f.take(key, b, 1).Taken {
				return 1
			}
			return 0
		},
		"lease": func(key string) int64 {
			// A lease of one slot; the next replaces it as fully used.
			return f.lease(owner(key), key, b, 1, "", 0).Granted
		},
		"settle": func(key string) int64 {
			// A lease of two, settled at once with one used: TAT moves
			// back to the end of the used slot.
			l := f.lease(owner(key), key, b, 2, "", 0)
			if l.Granted == 0 {
				return 0
			}
			s := f.lease(owner(key), key, b, 0, l.LeaseID, 1)
			require.NoError(t, s.Err)
			return 1
		},
		"refund": func(key string) int64 {
			// A take of two, one given back at once.
			o := f.take(key, b, 2)
			if !o.Taken {
				return 0
			}
			require.NoError(t, f.store.Refund(f.ctx, []leases.TakeOp{{Key: key, Bucket: b, Cost: 1, At: o.At}}))
			return 1
		},
	}
	const ticks, step = 20, 100 * time.Microsecond
	d := time.Duration(ticks-1) * step
	allowed := burst + int64(float64(b.Limit)*d.Seconds())
	for name, attempt := range attempts {
		var n int64
		for i := range ticks {
			if i > 0 {
				f.clock.Advance(step)
			}
			for k := 0; k <= 2*burst; k++ {
				got := attempt(name)
				if got == 0 {
					break
				}
				n += got
			}
		}
		assert.LessOrEqual(t, n, allowed, "%s: slots handed out in %v, burst + rate·D allows %d", name, d, allowed)
	}
}

// testLBConcurrent: many goroutines lease, settle and take on one key at
// driven times; every slot handed out and not given back is recorded (its
// start, on the store's clock). No two slots may be closer than T, every
// window of D holds at most ⌊D/T⌋+1 of them, and none lies beyond the
// queue's horizon when it was handed out.
func testLBConcurrent(t *testing.T, f *fixture, ticks int) {
	const (
		workers = 8
		limit   = 1000 // per second: T = 1 ms, one tick
		burst   = 20
	)
	tUs := int64(time.Second/time.Microsecond) / limit
	b := leaky(limit, time.Second, burst, 5*time.Millisecond)
	var (
		mu    sync.Mutex
		slots []int64 // µs
		late  []string
		cr    crowd
	)
	// record records n slots from start, handed out at now.
	record := func(now, start, n int64) {
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			s := start + i*tUs
			slots = append(slots, s)
			if s+tUs-now > burst*tUs {
				late = append(late, fmt.Sprintf("slot at %d handed out at %d", s, now))
			}
		}
	}
	cr.start(workers, func(w int) {
		rng := rand.New(rand.NewPCG(uint64(w), 11))
		owner := own(fmt.Sprintf("w%d/1", w%3))
		owner.Process = fmt.Sprint(w)
		var id string
		var granted, start, at int64
		for !cr.done.Load() {
			f.clock.Hold(func(nowT time.Time) {
				now := nowT.UnixMicro()
				defer cr.ops.Add(1)
				if rng.IntN(4) == 0 {
					cost := 1 + rng.Int64N(2)
					out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "hot", Bucket: b, Cost: cost}})
					if err != nil {
						cr.fail(err)
						return
					}
					if o := out[0]; o.Taken {
						record(now, now+o.Delay.Microseconds(), cost)
					}
					return
				}
				var used int64
				if granted > 0 {
					used = rng.Int64N(granted + 1)
				}
				leaseID := id
				if rng.IntN(8) == 0 {
					leaseID = "" // abandoned: replaced, as fully used
				}
				out, err := f.store.Lease(f.ctx, owner, []leases.LeaseOp{{Key: "hot", Bucket: b, Want: 1 + rng.Int64N(8), LeaseID: leaseID, Used: used, NewLeaseID: leases.NewLeaseID()}})
				if err != nil {
					cr.fail(err)
					return
				}
				o := out[0]
				switch {
				case o.Err == nil && o.Settled:
					record(at, start, used)
				case o.Err == nil || o.Err == leases.ErrUnknownLease:
					record(at, start, granted) // nothing came back
				default:
					cr.fail(fmt.Errorf("%v: %w", owner, o.Err))
					return
				}
				id, granted, at = o.LeaseID, o.Granted, now
				start = now + o.Delay.Microseconds()
			})
		}
		record(at, start, granted)
	})
	cr.drive(t, f, ticks, workers)
	assert.Empty(t, late, "slots beyond the queue's horizon")
	slices.Sort(slots)
	require.NotEmpty(t, slots)
	for i := 1; i < len(slots); i++ {
		require.GreaterOrEqual(t, slots[i]-slots[i-1], tUs, "slots %d and %d at %d and %d µs", i-1, i, slots[i-1], slots[i])
	}
	// Every window of D µs, D = 0 … 50 T and the whole run, holds at most
	// ⌊D/T⌋ + 1 slots: two pointers over the sorted slots for each D.
	for _, d := range []int64{0, 1, tUs - 1, tUs, 2 * tUs, 5*tUs + 1, 50 * tUs, slots[len(slots)-1] - slots[0]} {
		bound := d/tUs + 1
		j := 0
		for i := range slots {
			for slots[i]-slots[j] > d {
				j++
			}
			require.LessOrEqual(t, int64(i-j+1), bound, "window of %d µs ending at %d", d, slots[i])
		}
	}
	span := slots[len(slots)-1] - slots[0]
	t.Logf("%d slots over %d ms (%.0f%% of the rate)", len(slots), span/1000, 100*float64(len(slots))*float64(tUs)/float64(span+tUs))
	assert.Greater(t, float64(len(slots)), 0.5*float64(ticks), "utilization")
}
