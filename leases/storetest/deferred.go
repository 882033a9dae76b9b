package storetest

import (
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runDeferred checks deferred grants of a token bucket (LeaseOp.MaxDelay)
// on a driven clock: the batch granted with the wait until the refill and
// the owner's share cover it, the level in debt meanwhile and every other
// operation seeing the debt, a wait set by the owner's share rather than
// the level, the limits of a deferral, and an ownership refused while the
// bucket is in debt.
func runDeferred(t *testing.T, newStore Factory) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, f *fixture)
	}{
		{"GrantInDebt", testDeferredGrant},
		{"Limits", testDeferredLimits},
		{"ShareWait", testDeferredShareWait},
		{"WholeRatherThanPart", testDeferredWhole},
		{"OwnRefusedInDebt", testDeferredOwn},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, newFixture(t, newStore)) })
	}
}

// leaseDeferred runs one LeaseOp that accepts a grant deferred by up to
// maxDelay.
func (f *fixture) leaseDeferred(owner, key string, b leases.Bucket, want int64, leaseID string, used int64, maxDelay time.Duration) leases.LeaseOutcome {
	f.t.Helper()
	out, err := f.store.Lease(f.ctx, own(owner), []leases.LeaseOp{{Key: key, Bucket: b, Want: want, LeaseID: leaseID, Used: used, NewLeaseID: leases.NewLeaseID(), MaxDelay: maxDelay}})
	require.NoError(f.t, err)
	require.Len(f.t, out, 1)
	return out[0]
}

func testDeferredGrant(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 20, 2*time.Second) // a token every 10 ms
	a1 := f.lease("a/1", "k", b, 20, "", 0)
	require.EqualValues(t, 20, a1.Granted)

	// a spent all 20 and wants 10 more: the bucket is empty, so without a
	// deferral nothing; with one, all 10, to be spent 100 ms from now.
	a2 := f.leaseDeferred("a/1", "k", b, 10, a1.LeaseID, 20, time.Second)
	require.NoError(t, a2.Err)
	assert.True(t, a2.Settled)
	assert.EqualValues(t, 10, a2.Granted)
	assert.Equal(t, 100*time.Millisecond, a2.Delay)
	assert.NotEmpty(t, a2.LeaseID)
	assert.Zero(t, a2.RetryAfter)
	assert.Zero(t, a2.Remaining)
	assert.Equal(t, 300*time.Millisecond, a2.Reset, "the refill of the debt and of the burst")

	// The level is 10 in debt: a direct take waits for the debt and its
	// own token, and the state says so.
	tk := f.take("k", b, 1)
	assert.False(t, tk.Taken)
	assert.Equal(t, 110*time.Millisecond, tk.RetryAfter)
	st := f.state("k", b)
	assert.InDelta(t, -10, st.Level, 1e-9)
	assert.Zero(t, st.Free)
	assert.EqualValues(t, 10, st.Outstanding)
	assert.Equal(t, 110*time.Millisecond, st.Next)
	assert.Equal(t, 200*time.Millisecond, st.Full, "to burst − outstanding, from the debt")

	// b, a second client: a fair batch is burst/2 = 10, and its share (the
	// refill of burst/rate over 2 holders) covers it; the level reaches it
	// after the debt is paid: 200 ms.
	b1 := f.leaseDeferred("b/1", "k", b, 30, "", 0, time.Second)
	assert.EqualValues(t, 10, b1.Granted)
	assert.Equal(t, 200*time.Millisecond, b1.Delay)
	assert.Equal(t, 2, b1.Holders)
	assert.InDelta(t, -20, f.state("k", b).Level, 1e-9)

	// c, a third: every token the bucket can hold is outstanding, so the
	// batch waits for a lease to end; longer than half a TTL, no
	// deferral: refused, as without MaxDelay.
	c1 := f.leaseDeferred("c/1", "k", b, 10, "", 0, time.Second)
	assert.Zero(t, c1.Granted)
	assert.Zero(t, c1.Delay)
	assert.Equal(t, 2030*time.Millisecond, c1.RetryAfter, "a's lease ends in 2 s; half a batch (3) refills 30 ms later")

	// 100 ms later a spends its deferred 10 and settles: the refill has
	// paid 10 of the debt.
	f.clock.Advance(100 * time.Millisecond)
	a3 := f.lease("a/1", "k", b, 0, a2.LeaseID, 10)
	require.NoError(t, a3.Err)
	assert.True(t, a3.Settled)
	assert.InDelta(t, -10, f.state("k", b).Level, 1e-9)
	// 100 ms later b spends its 10: 40 tokens in 200 ms, the bound of
	// burst + rate·W exactly, and the bucket is at zero, out of debt.
	f.clock.Advance(100 * time.Millisecond)
	b2 := f.lease("b/1", "k", b, 0, b1.LeaseID, 10)
	require.NoError(t, b2.Err)
	st = f.state("k", b)
	assert.InDelta(t, 0, st.Level, 1e-9)
	assert.Zero(t, st.Outstanding)
	// A deferred lease returned unused pays back its own debt.
	d1 := f.leaseDeferred("a/1", "k", b, 5, "", 0, time.Second)
	require.EqualValues(t, 5, d1.Granted)
	assert.Equal(t, 50*time.Millisecond, d1.Delay)
	assert.InDelta(t, -5, f.state("k", b).Level, 1e-9)
	require.True(t, f.lease("a/1", "k", b, 0, d1.LeaseID, 0).Settled)
	assert.InDelta(t, 0, f.state("k", b).Level, 1e-9)
}

func testDeferredLimits(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 20, 2*time.Second)
	require.True(t, f.take("k", b, 20).Taken, "emptied by a take")
	// The refill to 10 takes 100 ms: a MaxDelay below that refuses as
	// without one, with the same retry_after (one token: 10 ms).
	o := f.leaseDeferred("a/1", "k", b, 10, "", 0, 99*time.Millisecond)
	assert.Zero(t, o.Granted)
	assert.Zero(t, o.Delay)
	assert.Equal(t, 10*time.Millisecond, o.RetryAfter)
	// Half the TTL caps the wait whatever MaxDelay says.
	short := bucket(100, time.Second, 20, 150*time.Millisecond)
	o = f.leaseDeferred("a/1", "k2", short, 20, "", 0, 0)
	require.EqualValues(t, 20, o.Granted)
	o = f.leaseDeferred("a/1", "k2", short, 10, o.LeaseID, 20, time.Minute)
	assert.Zero(t, o.Granted, "100 ms is more than half the 150 ms TTL")
	o = f.leaseDeferred("a/1", "k2", short, 7, "", 0, time.Minute)
	assert.EqualValues(t, 7, o.Granted, "70 ms is within it")
	assert.Equal(t, 70*time.Millisecond, o.Delay)
	// A batch larger than the bucket is never deferred.
	o = f.leaseDeferred("a/1", "k3", b, 21, "", 0, time.Minute)
	assert.EqualValues(t, 20, o.Granted, "the level, at once")
	o = f.leaseDeferred("a/1", "k3", b, 21, o.LeaseID, 20, time.Minute)
	assert.Zero(t, o.Granted)
	// A class with a floor never defers.
	out, err := f.store.Lease(f.ctx, own("p/1"), []leases.LeaseOp{{Key: "k4", Bucket: b, Want: 20, NewLeaseID: leases.NewLeaseID(), MaxDelay: time.Second, Floor: 5}})
	require.NoError(t, err)
	assert.EqualValues(t, 15, out[0].Granted, "what lies above the floor")
	out, err = f.store.Lease(f.ctx, own("p/2"), []leases.LeaseOp{{Key: "k4", Bucket: b, Want: 5, NewLeaseID: leases.NewLeaseID(), MaxDelay: time.Second, Floor: 5}})
	require.NoError(t, err)
	assert.Zero(t, out[0].Granted)
	assert.Zero(t, out[0].Delay)
}

func testDeferredOwn(t *testing.T, f *fixture) {
	if _, ok := f.store.(leases.Owning); !ok {
		t.Skip("the store does not implement leases.Owning")
	}
	b := bucket(100, time.Second, 20, 2*time.Second)
	a1 := f.lease("a/1", "k", b, 20, "", 0)
	a2 := f.leaseDeferred("a/1", "k", b, 10, a1.LeaseID, 20, time.Second)
	require.EqualValues(t, 10, a2.Granted)
	// Settled at once (a client that spent early: the store cannot tell),
	// the bucket holds no lease but is 10 in debt. An owner would start
	// from a level its deadline's emptying would forgive: refused until
	// the refill has paid the debt.
	require.True(t, f.lease("a/1", "k", b, 0, a2.LeaseID, 10).Settled)
	o := f.own("s1", "k", b)
	assert.False(t, o.Owned)
	assert.Equal(t, 100*time.Millisecond, o.RetryAfter)
	f.clock.Advance(100 * time.Millisecond)
	o = f.own("s1", "k", b)
	assert.True(t, o.Acquired)
	assert.InDelta(t, 0, o.Level, 1e-9)
}

// testDeferredShareWait: on a shared key, a batch the level could cover
// soon waits for the owner's fair share when that comes later, and is
// deferred only while the level stays within half the burst meanwhile
// (the refill above a quarter is spare any holder may take at once); a
// deferral moves the owner's share clock, so the next waits behind it.
func testDeferredShareWait(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 20, 2*time.Second) // a token every 10 ms; half is 10
	a1 := f.lease("a/1", "k", b, 10, "", 0)
	require.EqualValues(t, 10, a1.Granted, "alone: no share")
	// b, a second holder, starts with a full share (burst/2) and takes a
	// fair batch, the level's last 10: its share is spent.
	b1 := f.lease("b/1", "k", b, 10, "", 0)
	require.EqualValues(t, 10, b1.Granted)
	require.Equal(t, 2, b1.Holders)
	require.InDelta(t, 0, f.state("k", b).Level, 1e-9)

	// b spent it and wants 6: the whole 6 need 120 ms of b's share (the
	// refill split over 2 holders), while the level would rise to 12,
	// above half: refused, with the wait for half a batch (3) of share,
	// 60 ms, not the level's 30 ms.
	o := f.leaseDeferred("b/1", "k", b, 6, b1.LeaseID, 10, time.Second)
	require.NoError(t, o.Err)
	assert.Zero(t, o.Granted)
	assert.Zero(t, o.Delay)
	assert.Equal(t, 60*time.Millisecond, o.RetryAfter)

	// 2 tokens: the level covers them in 20 ms, the share in 40 ms, and
	// the level reaches 4 meanwhile: deferred 40 ms, the level 2 in debt.
	o = f.leaseDeferred("b/1", "k", b, 2, "", 0, time.Second)
	require.NoError(t, o.Err)
	assert.EqualValues(t, 2, o.Granted)
	assert.Equal(t, 40*time.Millisecond, o.Delay, "the share's wait")
	st := f.state("k", b)
	assert.InDelta(t, -2, st.Level, 1e-9)
	assert.EqualValues(t, 12, st.Outstanding)
	assert.Equal(t, 30*time.Millisecond, f.take("k", b, 1).RetryAfter, "a take waits for the debt")

	// The deferral moved b's share clock 40 ms ahead: its share is 2 in
	// debt. Asking for 5 more at once (its other slot): the share covers
	// them in 140 ms, and the level would reach 12 by then, above half:
	// refused, until the share covers half the batch (3), 100 ms.
	slot1 := func(want int64) leases.LeaseOutcome {
		t.Helper()
		out, err := f.store.Lease(f.ctx, own("b/1"), []leases.LeaseOp{{Key: "k", Bucket: b, Want: want, Slot: 1, NewLeaseID: leases.NewLeaseID(), MaxDelay: time.Second}})
		require.NoError(t, err)
		return out[0]
	}
	r := slot1(5)
	assert.Zero(t, r.Granted)
	assert.Zero(t, r.Delay)
	assert.Equal(t, 100*time.Millisecond, r.RetryAfter)
	// 4: the share covers them in 120 ms, the level reaches 10, not above
	// half: deferred behind the first, 120 ms.
	r = slot1(4)
	assert.EqualValues(t, 4, r.Granted)
	assert.Equal(t, 120*time.Millisecond, r.Delay)
	assert.InDelta(t, -6, f.state("k", b).Level, 1e-9)

	// 40 ms later b spends its first 2: the level is 2 in debt again.
	f.clock.Advance(40 * time.Millisecond)
	require.True(t, f.lease("b/1", "k", b, 0, o.LeaseID, 2).Settled)
	assert.InDelta(t, -2, f.state("k", b).Level, 1e-9)
}

// testDeferredWhole: an ask that accepts a deferral gets its whole batch
// deferred rather than the part the level holds now; one that does not
// gets the part.
func testDeferredWhole(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 20, 2*time.Second)
	require.True(t, f.take("k", b, 14).Taken)
	part := f.lease("a/1", "k", b, 10, "", 0)
	assert.EqualValues(t, 6, part.Granted, "without MaxDelay: the 6 the level holds (at least half a batch)")
	assert.Zero(t, part.Delay)

	require.True(t, f.take("k2", b, 14).Taken)
	whole := f.leaseDeferred("a/1", "k2", b, 10, "", 0, time.Second)
	assert.EqualValues(t, 10, whole.Granted, "with it: the whole batch")
	assert.Equal(t, 40*time.Millisecond, whole.Delay, "once the level holds it")
	assert.InDelta(t, -4, f.state("k2", b).Level, 1e-9)
}
