package storetest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WindowOptions tune RunWindows.
type WindowOptions struct {
	// ConcurrentTicks is the number of clock ticks (1 ms each) each
	// concurrent bound test runs; 0 means 1500.
	ConcurrentTicks int
	// Retention returns how long the store keeps key's state under
	// algorithm a if no call touches it (the least TTL of its Redis keys),
	// or a negative duration when it keeps none. Nil skips the checks of
	// retention.
	Retention func(t *testing.T, key string, a leases.Algorithm) time.Duration
}

// The window algorithms RunWindows checks.
var windowAlgorithms = []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog}

// window returns the parameters of a window algorithm: limit per period,
// burst as the rules layer sets it.
func window(a leases.Algorithm, limit int64, period, ttl time.Duration) leases.Bucket {
	return leases.Bucket{Algorithm: a, Limit: limit, Period: period, Burst: limit, LeaseTTL: ttl}
}

// RunWindows runs the conformance suite of the window algorithms
// (fixed_window, sliding_window_counter, sliding_window_log) against the
// stores newStore returns: the lease contract shared with the token bucket
// (grant, settle, expiry, replacement, ownership, caps, fair share), each
// algorithm's own arithmetic, and its bound checked in every window of a
// concurrent run on a driven clock. The clock starts at a time aligned to
// every window the suite uses.
func RunWindows(t *testing.T, newStore Factory, opts WindowOptions) {
	if opts.ConcurrentTicks == 0 {
		opts.ConcurrentTicks = 1500
	}
	for _, a := range windowAlgorithms {
		t.Run(string(a), func(t *testing.T) {
			t.Run("GrantSettleReturn", func(t *testing.T) { testWinGrantSettle(t, newFixture(t, newStore), a) })
			t.Run("SettleTwiceAndForeign", func(t *testing.T) { testWinSettleErrors(t, newFixture(t, newStore), a) })
			t.Run("ExpiryCountsAsSpent", func(t *testing.T) { testWinExpiry(t, newFixture(t, newStore), a) })
			t.Run("NewLeaseReplacesOpenOne", func(t *testing.T) { testWinReplace(t, newFixture(t, newStore), a) })
			t.Run("LeaseCaps", func(t *testing.T) { testWinCaps(t, newFixture(t, newStore), a) })
			t.Run("FairShare", func(t *testing.T) { testWinFairShare(t, newFixture(t, newStore), a) })
			t.Run("TakeAndRefund", func(t *testing.T) { testWinTakeRefund(t, newFixture(t, newStore), a) })
			t.Run("Idle", func(t *testing.T) { testWinIdle(t, newFixture(t, newStore), a, opts) })
			t.Run("ConcurrentBound", func(t *testing.T) { testWinConcurrent(t, newFixture(t, newStore), a, opts.ConcurrentTicks) })
		})
	}
	t.Run(string(leases.FixedWindow)+"/EdgeAndDeadline", func(t *testing.T) { testFixedEdge(t, newFixture(t, newStore)) })
	t.Run(string(leases.SlidingWindowCounter)+"/Estimate", func(t *testing.T) { testCounterEstimate(t, newFixture(t, newStore)) })
	t.Run(string(leases.SlidingWindowLog)+"/Exact", func(t *testing.T) { testLogExact(t, newFixture(t, newStore)) })
	t.Run(string(leases.SlidingWindowLog)+"/LeasesInTheLog", func(t *testing.T) { testLogLeases(t, newFixture(t, newStore)) })
}

func testWinGrantSettle(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 100, time.Second, 200*time.Millisecond)
	o := f.lease("a/1", "k", b, 30, "", 0)
	require.NoError(t, o.Err)
	assert.EqualValues(t, 30, o.Granted)
	assert.Equal(t, 200*time.Millisecond, o.TTL)
	assert.EqualValues(t, 70, o.Remaining)
	assert.Equal(t, 1, o.Holders)
	st := f.state("k", b)
	assert.InDelta(t, 70, st.Level, 1e-9)
	assert.EqualValues(t, 30, st.Outstanding)
	assert.Equal(t, 1, st.Leases)

	// Renew 10 ms later: 10 of 30 used, 20 come back, 25 more granted.
	f.clock.Advance(10 * time.Millisecond)
	o2 := f.lease("a/1", "k", b, 25, o.LeaseID, 10)
	require.NoError(t, o2.Err)
	assert.True(t, o2.Settled)
	assert.EqualValues(t, 25, o2.Granted)
	assert.EqualValues(t, 100-10-25, o2.Remaining)
	// Return with 5 used.
	o3 := f.lease("a/1", "k", b, 0, o2.LeaseID, 5)
	require.NoError(t, o3.Err)
	assert.True(t, o3.Settled)
	assert.Zero(t, o3.Granted)
	st = f.state("k", b)
	assert.Zero(t, st.Outstanding)
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 100-10-5, st.Level, 1e-9)
}

func testWinSettleErrors(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 100, time.Second, 500*time.Millisecond)
	o := f.lease("a/1", "k", b, 40, "", 0)
	require.EqualValues(t, 40, o.Granted)
	before := f.state("k", b)
	bad := f.lease("a/1", "k", b, 10, o.LeaseID, 41)
	assert.ErrorIs(t, bad.Err, leases.ErrUsedExceedsGranted)
	assert.Zero(t, bad.Granted)
	for _, owner := range []string{"b/1", "a/2", "b/a/1"} {
		x := f.lease(owner, "k", b, 0, o.LeaseID, 0)
		assert.ErrorIs(t, x.Err, leases.ErrUnknownLease, owner)
	}
	assert.ErrorIs(t, f.leaseSlot("a/1", "k", 1, b, 0, o.LeaseID, 0).Err, leases.ErrUnknownLease, "the other slot")
	assert.Equal(t, before, f.state("k", b), "failed settles change nothing")
	s := f.lease("a/1", "k", b, 0, o.LeaseID, 40)
	require.NoError(t, s.Err)
	assert.True(t, s.Settled)
	again := f.lease("a/1", "k", b, 5, o.LeaseID, 0)
	assert.ErrorIs(t, again.Err, leases.ErrUnknownLease, "settled already")
	assert.Zero(t, again.Granted)
	assert.InDelta(t, 60, f.state("k", b).Level, 1e-9)
}

func testWinExpiry(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 100, time.Second, 200*time.Millisecond)
	o := f.lease("a/1", "k", b, 40, "", 0)
	require.EqualValues(t, 40, o.Granted)
	f.clock.Advance(199 * time.Millisecond)
	assert.EqualValues(t, 40, f.state("k", b).Outstanding, "open 1 ms before its deadline")
	f.clock.Advance(time.Millisecond)
	st := f.state("k", b)
	assert.Zero(t, st.Outstanding)
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 60, st.Level, 1e-9, "its tokens stay counted as spent")
	late := f.lease("a/1", "k", b, 5, o.LeaseID, 0)
	assert.ErrorIs(t, late.Err, leases.ErrUnknownLease)
	assert.Equal(t, 1, late.Expired)
	n := f.lease("a/1", "k", b, 5, "", 0)
	require.NoError(t, n.Err)
	assert.EqualValues(t, 5, n.Granted)
	assert.Zero(t, n.Expired, "closed by the call before")
}

func testWinReplace(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 100, time.Second, 500*time.Millisecond)
	o := f.lease("a/1", "k", b, 30, "", 0)
	n := f.lease("a/1", "k", b, 10, "", 0)
	require.NoError(t, n.Err)
	assert.EqualValues(t, 10, n.Granted)
	assert.Equal(t, 1, n.Expired, "the open lease was closed as spent")
	st := f.state("k", b)
	assert.EqualValues(t, 10, st.Outstanding)
	assert.Equal(t, 1, st.Leases)
	assert.InDelta(t, 60, st.Level, 1e-9)
	assert.ErrorIs(t, f.lease("a/1", "k", b, 0, o.LeaseID, 0).Err, leases.ErrUnknownLease)
	// Two slots: a lease in slot 1 leaves slot 0 open.
	s1 := f.leaseSlot("a/1", "k", 1, b, 10, "", 0)
	assert.EqualValues(t, 10, s1.Granted)
	assert.Zero(t, s1.Expired)
	assert.Equal(t, 1, s1.Holders, "one process, whatever its slots")
	assert.Equal(t, 2, f.state("k", b).Leases)
}

func testWinCaps(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 1000, time.Second, 500*time.Millisecond)
	lim := leases.LeaseLimits{MaxLeasesPerKey: 5, MaxProcessesPerClient: 2}
	op := func(owner string, slot int, want int64, id string) leases.LeaseOutcome {
		out, err := f.store.Lease(f.ctx, own(owner), []leases.LeaseOp{{Key: "k", Bucket: b, Want: want, LeaseID: id, NewLeaseID: leases.NewLeaseID(), Slot: slot, Limits: lim}})
		require.NoError(t, err)
		return out[0]
	}
	a1 := op("a/1", 0, 1, "")
	require.NoError(t, a1.Err)
	require.NoError(t, op("a/1", 1, 1, "").Err)
	require.NoError(t, op("a/2", 0, 1, "").Err)
	before := f.state("k", b)
	tooMany := op("a/3", 0, 1, "")
	require.ErrorIs(t, tooMany.Err, leases.ErrTooManyLeases, "a third process of a")
	assert.Equal(t, before, f.state("k", b), "a refused grant changes nothing")
	require.NoError(t, op("b/1", 0, 1, "").Err)
	require.NoError(t, op("c/1", 0, 1, "").Err)
	require.ErrorIs(t, op("d/1", 0, 1, "").Err, leases.ErrTooManyLeases)
	r := op("a/1", 0, 1, a1.LeaseID)
	require.NoError(t, r.Err, "a renewal is never refused")
	require.True(t, r.Settled)
	require.NoError(t, op("a/1", 0, 0, r.LeaseID).Err)
	require.NoError(t, op("d/1", 0, 1, "").Err, "the return freed a place")
	require.NoError(t, op("e/1", 0, 0, "").Err, "asking for nothing opens nothing")
}

func testWinFairShare(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 100, time.Second, 500*time.Millisecond)
	assert.EqualValues(t, 10, f.lease("a/1", "k", b, 10, "", 0).Granted, "alone: no cap")
	bo := f.lease("b/1", "k", b, 100, "", 0)
	assert.EqualValues(t, 50, bo.Granted, "two holders: limit/2")
	assert.Equal(t, 2, bo.Holders)
	c := f.lease("c/1", "k", b, 100, "", 0)
	assert.EqualValues(t, 33, c.Granted, "three holders: limit/3")
	a2 := f.lease("a/2", "k", b, 100, "", 0)
	assert.Equal(t, 6, a2.Holders, "3 clients × 2 processes of a")
	assert.EqualValues(t, 7, a2.Granted, "min(limit/6, what is free)")
	d := f.lease("d/1", "k", b, 1, "", 0)
	assert.Zero(t, d.Granted)
	assert.Positive(t, d.RetryAfter)
}

func testWinTakeRefund(t *testing.T, f *fixture, a leases.Algorithm) {
	b := window(a, 10, time.Second, 500*time.Millisecond)
	op := func(cost int64) []leases.TakeOp { return []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost}} }
	out, err := f.store.Take(f.ctx, op(4))
	require.NoError(t, err)
	assert.True(t, out[0].Taken)
	assert.EqualValues(t, 6, out[0].Remaining)
	assert.Equal(t, f.clock.Now().UnixMicro(), out[0].At, "the take's time, for its refund")
	refund := func(cost int64, at int64) []leases.TakeOp {
		return []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost, At: at}}
	}
	at4 := out[0].At
	out, err = f.store.Take(f.ctx, op(7))
	require.NoError(t, err)
	assert.False(t, out[0].Taken)
	assert.Positive(t, out[0].RetryAfter)
	assert.InDelta(t, 6, f.state("k", b).Level, 1e-9, "a denied take changes nothing")
	out, err = f.store.Take(f.ctx, op(11))
	require.NoError(t, err)
	assert.False(t, out[0].Taken)
	assert.Negative(t, out[0].RetryAfter, "more than the limit can never be served")
	out, err = f.store.Take(f.ctx, op(0))
	require.NoError(t, err)
	assert.True(t, out[0].Taken)
	require.NoError(t, f.store.Refund(f.ctx, op(4)))
	assert.InDelta(t, 6, f.state("k", b).Level, 1e-9, "a refund that does not name its take's time gives back nothing")
	require.NoError(t, f.store.Refund(f.ctx, refund(4, at4)))
	assert.InDelta(t, 10, f.state("k", b).Level, 1e-9)
	// A refund gives back takes only, never a lease's tokens.
	l := f.lease("a/1", "k", b, 3, "", 0)
	require.EqualValues(t, 3, l.Granted)
	require.NoError(t, f.store.Refund(f.ctx, refund(5, at4)))
	st := f.state("k", b)
	assert.InDelta(t, 7, st.Level, 1e-9)
	assert.EqualValues(t, 3, st.Outstanding)

	// A take at the end of a window, refunded after the next one began
	// and admitted requests: the refund must not give back what those
	// admissions count (the engine's all-or-nothing give-back races the
	// window's edge this way).
	f.clock.Advance(2*time.Second - time.Duration(f.clock.Now().UnixMicro()%1_000_000)*time.Microsecond - time.Millisecond)
	out, err = f.store.Take(f.ctx, []leases.TakeOp{{Key: "edge", Bucket: b, Cost: 4}})
	require.NoError(t, err)
	require.True(t, out[0].Taken)
	atEdge := out[0].At
	f.clock.Advance(20 * time.Millisecond) // a new window, and a new log bucket
	next := int64(10)
	if a != leases.FixedWindow {
		next = int64(f.state("edge", b).Level + 1e-9) // what the window still admits
	}
	out, err = f.store.Take(f.ctx, []leases.TakeOp{{Key: "edge", Bucket: b, Cost: next}})
	require.NoError(t, err)
	require.True(t, out[0].Taken, "%d more", next)
	require.NoError(t, f.store.Refund(f.ctx, []leases.TakeOp{{Key: "edge", Bucket: b, Cost: 4, At: atEdge}}))
	switch a {
	case leases.SlidingWindowLog:
		// Exact: the 4 came back from where they were counted.
		assert.InDelta(t, 4, f.state("edge", b).Level, 1e-9)
	default:
		// The window's admissions still count whole: nothing more fits.
		out, err = f.store.Take(f.ctx, []leases.TakeOp{{Key: "edge", Bucket: b, Cost: 1}})
		require.NoError(t, err)
		assert.False(t, out[0].Taken, "the refund of the window before gave nothing back here")
	}
}

// testWinIdle: once nothing needs the state it is gone (swept from memory,
// expired in Redis), and while something does it is kept.
func testWinIdle(t *testing.T, f *fixture, a leases.Algorithm, opts WindowOptions) {
	b := window(a, 10, 100*time.Millisecond, 30*time.Millisecond)
	out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 3}})
	require.NoError(t, err)
	require.True(t, out[0].Taken)
	l := f.lease("a/1", "k", b, 2, "", 0)
	require.EqualValues(t, 2, l.Granted)
	if opts.Retention != nil {
		d := opts.Retention(t, "k", a)
		// The window ends in 100 ms (the counter's estimate and the log
		// need one more window); the store adds a second of slack.
		assert.GreaterOrEqual(t, d, 100*time.Millisecond, "kept while counted")
		assert.LessOrEqual(t, d, 200*time.Millisecond+time.Second+50*time.Millisecond, "not kept beyond need")
	}
	f.clock.Advance(time.Second)
	f.sweepIfAny()
	st := f.state("k", b)
	assert.InDelta(t, 10, st.Level, 1e-9)
	assert.Zero(t, st.Leases)
	if m, ok := f.store.(interface{ Len() int }); ok {
		assert.Zero(t, m.Len(), "the idle key was swept")
	}
	// A return that empties the state drops it at once in Redis.
	l = f.lease("a/1", "k2", b, 2, "", 0)
	require.NoError(t, f.lease("a/1", "k2", b, 0, l.LeaseID, 0).Err)
	if opts.Retention != nil && a == leases.SlidingWindowLog {
		assert.Negative(t, opts.Retention(t, "k2", a), "a log that counts nothing is no state")
	}
}

// testWinConcurrent: workers lease, spend their leases' tokens at driven
// times, settle, abandon leases and take directly while the clock advances
// 1 ms a tick. Every token spent is recorded at its tick, and the
// algorithm's bound is checked in every window of W ticks, at every start.
func testWinConcurrent(t *testing.T, f *fixture, a leases.Algorithm, ticks int) {
	const (
		workers = 8
		limit   = 60
		wTicks  = 40 // W = 40 ms
	)
	b := window(a, limit, wTicks*time.Millisecond, 15*time.Millisecond)
	var (
		mu    sync.Mutex
		spent = make([]int64, ticks+2)
		cr    crowd
	)
	record := func(tk int, n int64) {
		if n > 0 {
			mu.Lock()
			spent[tk] += n
			mu.Unlock()
		}
	}
	cr.start(workers, func(w int) {
		rng := rand.New(rand.NewPCG(uint64(w), 11))
		owner := fmt.Sprintf("w%d/%d", w%3, w)
		var (
			id             string
			granted, used  int64
			deadline       time.Time
			haveLease      bool
			leaseOpsBefore int
		)
		for !cr.done.Load() {
			f.clock.Hold(func(now time.Time) {
				defer cr.ops.Add(1)
				// The tick of the instant the driven clock reads, held
				// for this call (crowd.drive moves it between calls).
				tk := int(now.Sub(epoch) / time.Millisecond)
				// Spend from the open lease while it is valid.
				if haveLease && now.Before(deadline) && used < granted && rng.IntN(2) == 0 {
					n := 1 + rng.Int64N(granted-used)
					used += n
					record(tk, n)
				}
				if rng.IntN(4) == 0 {
					cost := 1 + rng.Int64N(5)
					out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "hot", Bucket: b, Cost: cost}})
					if err != nil {
						cr.fail(err)
						return
					}
					if out[0].Taken {
						record(tk, cost)
					}
					return
				}
				leaseOpsBefore++
				if haveLease && now.Before(deadline) && leaseOpsBefore%3 != 0 {
					return // keep spending this lease
				}
				settleID := id
				if rng.IntN(8) == 0 {
					settleID = "" // abandon: replaced as spent
				}
				if !haveLease {
					settleID = ""
				}
				out, err := f.store.Lease(f.ctx, own(owner), []leases.LeaseOp{{Key: "hot", Bucket: b, Want: 1 + rng.Int64N(20), LeaseID: settleID, Used: used, NewLeaseID: leases.NewLeaseID()}})
				if err != nil {
					cr.fail(err)
					return
				}
				o := out[0]
				if o.Err != nil && !(o.Err == leases.ErrUnknownLease && !now.Before(deadline)) {
					cr.fail(fmt.Errorf("owner %s at tick %d: %w", owner, tk, o.Err))
					return
				}
				haveLease = o.Err == nil && o.Granted > 0
				id, granted, used = o.LeaseID, o.Granted, 0
				deadline = now.Add(o.TTL)
			})
		}
	})
	cr.drive(t, f, ticks, workers)

	prefix := make([]int64, len(spent)+1)
	for i, s := range spent {
		prefix[i+1] = prefix[i] + s
	}
	in := func(from, to int) int64 { // ticks [from, to)
		from, to = max(from, 0), min(to, len(spent))
		return prefix[to] - prefix[from]
	}
	var worstAny, worstAligned int64
	for s := -wTicks + 1; s < len(spent); s++ {
		worstAny = max(worstAny, in(s, s+wTicks))
	}
	for s := 0; s < len(spent); s += wTicks {
		worstAligned = max(worstAligned, in(s, s+wTicks))
	}
	total := prefix[len(spent)]
	t.Logf("%s: %d tokens spent in %d ticks; worst aligned window %d, worst window %d (limit %d per %d ms)",
		a, total, ticks, worstAligned, worstAny, limit, wTicks)
	switch a {
	case leases.SlidingWindowLog:
		assert.LessOrEqual(t, worstAny, int64(limit), "every window of W")
	default:
		assert.LessOrEqual(t, worstAligned, int64(limit), "every aligned window")
		assert.LessOrEqual(t, worstAny, int64(2*limit), "every window of W")
	}
	// Demand exceeds supply: the limit must be well used, or the test
	// would pass vacuously.
	capacity := int64(limit) * int64(ticks/wTicks)
	assert.Greater(t, total, capacity/3, "utilization: %d of %d", total, capacity)
}

// testFixedEdge: fixed_window admits limit per aligned window, and across
// an edge 2·limit within 2 ms: the algorithm's own weakness. A lease never
// outlives its window.
func testFixedEdge(t *testing.T, f *fixture) {
	b := window(leases.FixedWindow, 100, time.Second, 300*time.Millisecond)
	f.clock.Advance(800 * time.Millisecond)
	l := f.lease("a/1", "k", b, 60, "", 0)
	require.EqualValues(t, 60, l.Granted)
	assert.Equal(t, 200*time.Millisecond, l.TTL, "the deadline is the window's end")
	assert.Equal(t, 200*time.Millisecond, l.Reset)
	f.clock.Advance(199 * time.Millisecond) // 999 ms
	tk, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 40}})
	require.NoError(t, err)
	require.True(t, tk[0].Taken)
	tk, err = f.store.Take(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 1}})
	require.NoError(t, err)
	require.False(t, tk[0].Taken, "limit per window")
	assert.Equal(t, time.Millisecond, tk[0].RetryAfter, "until the window's end")
	f.clock.Advance(time.Millisecond) // 1000 ms: a new window
	st := f.state("k", b)
	assert.Zero(t, st.Leases, "the lease ended with its window")
	assert.InDelta(t, 100, st.Level, 1e-9)
	late := f.lease("a/1", "k", b, 100, l.LeaseID, 0)
	assert.ErrorIs(t, late.Err, leases.ErrUnknownLease, "a lease of an older window is gone")
	n := f.lease("a/1", "k", b, 100, "", 0)
	require.NoError(t, n.Err)
	assert.EqualValues(t, 100, n.Granted, "2·limit within 2 ms across the edge")
	assert.Equal(t, 300*time.Millisecond, n.TTL)
	// Settled in its window, the unused part comes back.
	s := f.lease("a/1", "k", b, 0, n.LeaseID, 30)
	require.True(t, s.Settled)
	assert.EqualValues(t, 70, s.Remaining)
}

// testCounterEstimate: the counter's estimate, retry_after and its worst
// case above the limit in an unaligned window.
func testCounterEstimate(t *testing.T, f *fixture) {
	b := window(leases.SlidingWindowCounter, 100, time.Second, 100*time.Millisecond)
	take := func(cost int64) leases.TakeOutcome {
		out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost}})
		require.NoError(t, err)
		return out[0]
	}
	f.clock.Advance(900 * time.Millisecond)
	require.True(t, take(100).Taken) // 100 at 0.9 s
	f.clock.Advance(100 * time.Millisecond)
	// 1.0 s: the estimate is 100·(1 − 0) + 0.
	d := take(1)
	require.False(t, d.Taken)
	assert.Equal(t, 10*time.Millisecond, d.RetryAfter, "100·(1 − e/W) ≤ 99 at e = 10 ms")
	assert.Equal(t, time.Second, d.Reset)
	f.clock.Advance(500 * time.Millisecond)
	// 1.5 s: estimate 50: 50 free.
	assert.InDelta(t, 50, f.state("k", b).Level, 1e-9)
	require.True(t, take(50).Taken)
	f.clock.Advance(390 * time.Millisecond)
	// 1.89 s: estimate 100·0.11 + 50 = 61: 39 free.
	assert.False(t, take(40).Taken)
	require.True(t, take(39).Taken)
	// Window [0.9 s, 1.9 s) saw 189 tokens: more than the limit, under 2·limit.
	// A lease's deadline is capped at the window's end.
	f.clock.Advance(50 * time.Millisecond)
	l := f.lease("a/1", "k", b, 100, "", 0)
	assert.LessOrEqual(t, l.Granted, int64(100))
	if l.Granted > 0 {
		assert.LessOrEqual(t, l.TTL, 60*time.Millisecond)
	}
}

// testLogExact: the log admits at most limit in any window of W, whatever
// its start, and frees a token exactly when it leaves (its end rounded up
// to a multiple of q = W/64 = 15.625 ms).
func testLogExact(t *testing.T, f *fixture) {
	b := window(leases.SlidingWindowLog, 100, time.Second, 100*time.Millisecond)
	take := func(cost int64) leases.TakeOutcome {
		out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost}})
		require.NoError(t, err)
		return out[0]
	}
	f.clock.Advance(999 * time.Millisecond)
	require.True(t, take(100).Taken) // ends at 1000 ms after rounding
	f.clock.Advance(time.Millisecond)
	d := take(1)
	require.False(t, d.Taken, "no edge: the window slides")
	assert.Equal(t, time.Second, d.RetryAfter)
	assert.Equal(t, time.Second, d.Reset)
	f.clock.Advance(999 * time.Millisecond) // 1999 ms
	require.False(t, take(1).Taken)
	f.clock.Advance(time.Millisecond) // 2000 ms
	require.True(t, take(100).Taken)
	// Takes 10 at each 100 ms: each leaves its window W later, rounded.
	f.clock.Advance(time.Second)
	for i := range 10 {
		require.True(t, take(10).Taken, "take %d", i)
		f.clock.Advance(100 * time.Millisecond)
	}
	// now = 4000 ms; the first 10 (at 3000 ms) leave at 4000 ms exactly.
	require.True(t, take(10).Taken)
	require.False(t, take(1).Taken)
}

// testLogLeases: an open lease reserves its grant until its deadline; a
// settle replaces it by what was used, ending now; an unsettled lease
// counts until its deadline leaves the window.
func testLogLeases(t *testing.T, f *fixture) {
	b := window(leases.SlidingWindowLog, 100, time.Second, 200*time.Millisecond)
	l := f.lease("a/1", "k", b, 60, "", 0)
	require.EqualValues(t, 60, l.Granted)
	assert.Equal(t, 200*time.Millisecond, l.TTL, "no window end caps a log's lease")
	f.clock.Advance(50 * time.Millisecond)
	s := f.lease("a/1", "k", b, 0, l.LeaseID, 10)
	require.True(t, s.Settled)
	assert.EqualValues(t, 90, s.Remaining, "50 unused come back at once")
	// b leases 90 and never settles: its deadline, 250 ms, is a multiple
	// of q = 15.625 ms; it counts until 1250 ms.
	u := f.lease("b/1", "k", b, 100, "", 0)
	require.EqualValues(t, 90, u.Granted)
	f.clock.Advance(1050 * time.Millisecond) // 1100 ms: a's 10 (ended 62.5 ms) have left
	st := f.state("k", b)
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 10, st.Level, 1e-9)
	d := f.lease("c/1", "k", b, 50, "", 0)
	assert.EqualValues(t, 10, d.Granted)
	assert.Equal(t, 1, d.Expired)
	d2 := f.lease("c/2", "k", b, 50, "", 0)
	require.Zero(t, d2.Granted)
	assert.Equal(t, 150*time.Millisecond, d2.RetryAfter, "until 1250 ms")
	f.clock.Advance(149 * time.Millisecond)
	require.Zero(t, f.lease("c/2", "k", b, 50, "", 0).Granted, "1 ms early")
	f.clock.Advance(time.Millisecond)
	d2 = f.lease("c/2", "k", b, 50, "", 0)
	assert.EqualValues(t, 50, d2.Granted, "b's 90 have left; c/1's 10 stay")
}
