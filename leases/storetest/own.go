package storetest

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runOwn checks the ownership of token buckets by lease servers (see
// leases.Owning) on a driven clock: acquire, refusals of everyone else,
// renewal, release, expiry, and bad input. The store must implement
// leases.Owning.
func runOwn(t *testing.T, newStore Factory, opts Options) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, f *fixture)
	}{
		{"Acquire", testOwnAcquire},
		{"RefusedWithOpenLeases", testOwnOpenLeases},
		{"RefusesTakesAndLeases", testOwnRefusals},
		{"Renew", testOwnRenew},
		{"ReleaseCapped", testOwnRelease},
		{"ExpiryEmptiesBucket", testOwnExpiry},
		{"ReleaseByOtherServer", testOwnOtherRelease},
		{"NotOwnable", testOwnNotOwnable},
		{"BadLevel", testOwnBadLevel},
		{"Kept", func(t *testing.T, f *fixture) { testOwnKept(t, f, opts) }},
		{"SharedTakes", testOwnSharedTakes},
		{"IDs", testOwnIDs},
		{"BadIDs", testOwnBadIDs},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, newFixture(t, newStore)) })
	}
}

// ownOp runs one OwnOp and returns its outcome.
func (f *fixture) ownOp(op leases.OwnOp) leases.OwnOutcome {
	f.t.Helper()
	s, ok := f.store.(leases.Owning)
	require.True(f.t, ok, "the store implements leases.Owning")
	out, err := s.Own(f.ctx, []leases.OwnOp{op})
	require.NoError(f.t, err)
	require.Len(f.t, out, 1)
	return out[0]
}

// own acquires or renews server's ownership of key.
func (f *fixture) own(server, key string, b leases.Bucket) leases.OwnOutcome {
	f.t.Helper()
	return f.ownOp(leases.OwnOp{Key: key, Bucket: b, Server: server})
}

// release releases server's ownership of key at level.
func (f *fixture) release(server, key string, b leases.Bucket, level float64) leases.OwnOutcome {
	f.t.Helper()
	return f.ownOp(leases.OwnOp{Key: key, Bucket: b, Server: server, Release: true, Level: level})
}

func testOwnAcquire(t *testing.T, f *fixture) {
	b := bucket(10, time.Second, 10, time.Second) // a token every 100 ms
	require.True(t, f.take("k", b, 4).Taken)
	f.clock.Advance(50 * time.Millisecond)
	o := f.own("s1", "k", b)
	require.NoError(t, o.Err)
	assert.True(t, o.Owned)
	assert.True(t, o.Acquired)
	assert.InDelta(t, 6.5, o.Level, 1e-9, "the bucket's level at the acquisition")
	assert.Equal(t, f.clock.Now().UnixMicro(), o.At, "the store's clock")
	assert.Equal(t, time.Second, o.TTL)
	assert.False(t, o.Contested)
	assert.Zero(t, o.RetryAfter)

	// The store reports the owner, nothing free, and the most the owner
	// can hold; its waits assume the ownership expires, empty, at its
	// deadline (1 s): a token 100 ms later, a whole bucket 1 s later.
	st := f.state("k", b)
	assert.Equal(t, "s1", st.Owner)
	assert.Zero(t, st.Free)
	assert.InDelta(t, 6.5, st.Level, 1e-9)
	assert.Equal(t, 1100*time.Millisecond, st.Next)
	assert.Equal(t, 2000*time.Millisecond, st.Full)
	f.clock.Advance(200 * time.Millisecond)
	st = f.state("k", b)
	assert.InDelta(t, 8.5, st.Level, 1e-9)
	assert.Equal(t, 900*time.Millisecond, st.Next)

	// A second server is refused until the deadline.
	o2 := f.own("s2", "k", b)
	assert.False(t, o2.Owned)
	assert.False(t, o2.Acquired)
	assert.Equal(t, 800*time.Millisecond, o2.RetryAfter)
	assert.Equal(t, "s1", f.state("k", b).Owner)

	// The owner's second Own renews: nothing else changes.
	r := f.own("s1", "k", b)
	assert.True(t, r.Owned)
	assert.False(t, r.Acquired, "a renewal")
	assert.Equal(t, time.Second, r.TTL)
	assert.Equal(t, time.Second, f.own("s2", "k", b).RetryAfter, "the deadline moved to now + TTL")
	assert.InDelta(t, 8.5, f.state("k", b).Level, 1e-9)
}

func testOwnOpenLeases(t *testing.T, f *fixture) {
	b := bucket(10, time.Second, 10, 2*time.Second)
	l := f.lease("a/1", "k", b, 3, "", 0)
	require.EqualValues(t, 3, l.Granted)
	f.clock.Advance(500 * time.Millisecond)
	before := f.state("k", b)
	o := f.own("s1", "k", b)
	assert.False(t, o.Owned)
	assert.Equal(t, 1500*time.Millisecond, o.RetryAfter, "until the lease ends")
	assert.Equal(t, before, f.state("k", b), "a refused acquire changes nothing")
	// Once the lease is settled, the bucket can be owned.
	require.True(t, f.lease("a/1", "k", b, 0, l.LeaseID, 1).Settled)
	lvl := f.state("k", b).Level
	o = f.own("s1", "k", b)
	assert.True(t, o.Acquired)
	assert.InDelta(t, lvl, o.Level, 1e-9)

	// A lease that expired unsettled is closed first, without credit.
	require.EqualValues(t, 3, f.lease("a/1", "k2", b, 3, "", 0).Granted)
	f.clock.Advance(2 * time.Second)
	o = f.own("s1", "k2", b)
	assert.True(t, o.Acquired)
	assert.InDelta(t, 7, o.Level, 1e-9, "no refill while the lease held the rest of the bucket")
}

func testOwnRefusals(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)
	require.True(t, f.own("s1", "k", b).Acquired)
	assert.False(t, f.own("s1", "k", b).Contested)
	before := f.state("k", b)

	tk := f.take("k", b, 1)
	assert.False(t, tk.Taken)
	assert.Equal(t, 100*time.Millisecond, tk.RetryAfter, "at most 100 ms: the owner may release sooner")
	assert.Zero(t, tk.Remaining)
	l := f.lease("a/1", "k", b, 5, "", 0)
	require.NoError(t, l.Err)
	assert.Zero(t, l.Granted)
	assert.Equal(t, 100*time.Millisecond, l.RetryAfter)
	assert.True(t, l.Owned, "refused because the bucket is owned")
	assert.False(t, f.lease("a/1", "k", b, 0, "", 0).Owned, "asking for nothing is not refused")
	assert.ErrorIs(t, f.lease("a/1", "k", b, 5, "no-such-lease", 1).Err, leases.ErrUnknownLease)
	require.NoError(t, f.store.Refund(f.ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 5}}))
	assert.Equal(t, before, f.state("k", b), "refusals and refunds change nothing but the mark; no waiter is recorded")

	r := f.own("s1", "k", b)
	assert.True(t, r.Owned)
	assert.True(t, r.Contested, "takes and leases were refused since the last renewal")
	assert.False(t, f.own("s1", "k", b).Contested, "the mark is cleared by the renewal")

	// Asking for nothing refuses nothing.
	require.NoError(t, f.lease("a/1", "k", b, 0, "", 0).Err)
	assert.False(t, f.own("s1", "k", b).Contested)
	// A lease alone marks it; near the deadline, RetryAfter is the time
	// left.
	f.clock.Advance(970 * time.Millisecond)
	assert.Equal(t, 30*time.Millisecond, f.lease("b/1", "k", b, 1, "", 0).RetryAfter)
	assert.True(t, f.own("s1", "k", b).Contested)
	f.clock.Advance(970 * time.Millisecond)
	assert.Equal(t, 30*time.Millisecond, f.take("k", b, 1).RetryAfter)
}

func testOwnRenew(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)
	require.True(t, f.own("s1", "k", b).Acquired)
	f.clock.Advance(900 * time.Millisecond)
	r := f.own("s1", "k", b)
	require.True(t, r.Owned)
	require.False(t, r.Acquired)
	f.clock.Advance(600 * time.Millisecond) // past the first deadline
	assert.False(t, f.take("k", b, 1).Taken, "still owned")
	assert.Equal(t, 400*time.Millisecond, f.own("s2", "k", b).RetryAfter)
	assert.Equal(t, "s1", f.state("k", b).Owner)
	f.clock.Advance(400 * time.Millisecond) // the renewed deadline
	o := f.own("s2", "k", b)
	assert.True(t, o.Acquired, "the ownership expired")
	assert.InDelta(t, 0, o.Level, 1e-9, "empty at the deadline")
}

func testOwnRelease(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)
	require.True(t, f.take("k", b, 100).Taken)
	o := f.own("s1", "k", b)
	require.True(t, o.Acquired)
	require.InDelta(t, 0, o.Level, 1e-9)
	f.clock.Advance(200 * time.Millisecond)
	// Claiming the whole burst brings back at most L0 + rate·elapsed.
	r := f.release("s1", "k", b, 100)
	assert.False(t, r.Owned)
	assert.Zero(t, r.RetryAfter)
	st := f.state("k", b)
	assert.Empty(t, st.Owner)
	assert.InDelta(t, 20, st.Level, 1e-9)
	assert.EqualValues(t, 20, st.Free)
	f.clock.Advance(50 * time.Millisecond)
	assert.InDelta(t, 25, f.state("k", b).Level, 1e-9, "refilling from the release")
	// A second release is no owner's: nothing changes.
	f.release("s1", "k", b, 100)
	assert.InDelta(t, 25, f.state("k", b).Level, 1e-9)

	// A release below the cap sets the owner's level.
	require.True(t, f.own("s1", "k2", b).Acquired)
	f.clock.Advance(100 * time.Millisecond)
	f.release("s1", "k2", b, 30.5)
	assert.InDelta(t, 30.5, f.state("k2", b).Level, 1e-9)
	tk := f.take("k2", b, 30)
	assert.True(t, tk.Taken)
	assert.Zero(t, tk.Remaining)
}

func testOwnExpiry(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)
	require.InDelta(t, 100, f.own("s1", "k", b).Level, 1e-9)
	f.clock.Advance(time.Second + 10*time.Millisecond)
	// Empty at the deadline, 10 ms of refill since: one token.
	st := f.state("k", b)
	assert.Empty(t, st.Owner)
	assert.InDelta(t, 1, st.Level, 1e-9)
	tk := f.take("k", b, 1)
	assert.True(t, tk.Taken)
	assert.Zero(t, tk.Remaining)
	tk = f.take("k", b, 1)
	assert.False(t, tk.Taken)
	assert.Equal(t, 10*time.Millisecond, tk.RetryAfter)
	// The late owner brings nothing back; its next Own is a new
	// ownership.
	f.release("s1", "k", b, 100)
	assert.InDelta(t, 0, f.state("k", b).Level, 1e-9)
	o := f.own("s1", "k", b)
	assert.True(t, o.Acquired)
	assert.InDelta(t, 0, o.Level, 1e-9)

	// A lease, or another server, after an expiry sees the same.
	require.True(t, f.own("s1", "k2", b).Acquired)
	require.True(t, f.own("s1", "k3", b).Acquired)
	f.clock.Advance(1500 * time.Millisecond)
	assert.EqualValues(t, 50, f.lease("a/1", "k2", b, 100, "", 0).Granted)
	o = f.own("s2", "k3", b)
	assert.True(t, o.Acquired)
	assert.InDelta(t, 50, o.Level, 1e-9)
}

func testOwnOtherRelease(t *testing.T, f *fixture) {
	b := bucket(10, time.Second, 10, time.Second)
	require.True(t, f.take("k", b, 3).Taken)
	require.True(t, f.own("s1", "k", b).Acquired)
	before := f.state("k", b)
	r := f.release("s2", "k", b, 10)
	assert.False(t, r.Owned)
	assert.Equal(t, before, f.state("k", b), "another server's release changes nothing")
	o := f.own("s1", "k", b)
	assert.True(t, o.Owned, "s1 still owns the bucket")
	assert.False(t, o.Acquired)

	// Nor does a release of a bucket nobody owns.
	require.True(t, f.take("u", b, 5).Taken)
	f.release("s2", "u", b, 10)
	assert.InDelta(t, 5, f.state("u", b).Level, 1e-9)
	f.release("s2", "fresh", b, 0)
	assert.InDelta(t, 10, f.state("fresh", b).Level, 1e-9)
}

func testOwnNotOwnable(t *testing.T, f *fixture) {
	tb := bucket(10, time.Second, 10, time.Second)
	for _, a := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog, leases.LeakyBucket} {
		b := leases.Bucket{Algorithm: a, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
		s := f.store.(leases.Owning)
		out, err := s.Own(f.ctx, []leases.OwnOp{{Key: "k", Bucket: tb, Server: "s1"}, {Key: "k2", Bucket: b, Server: "s1"}, {Key: "k2", Bucket: b, Server: "s1", Release: true}})
		require.NoError(t, err)
		require.Len(t, out, 3)
		assert.NoError(t, out[0].Err, a)
		assert.True(t, out[0].Owned, a)
		for _, o := range out[1:] {
			assert.ErrorIs(t, o.Err, leases.ErrNotOwnable, a)
			assert.False(t, o.Owned, a)
		}
		assert.True(t, f.take("k2", b, 1).Taken, "%s: the bucket is untouched", a)
	}
}

func testOwnBadLevel(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)
	for _, c := range []struct {
		name  string
		level float64
		want  float64 // after 100 ms owned from full
	}{
		{"negative", -5, 0},
		{"NaN", math.NaN(), 0},
		{"-Inf", math.Inf(-1), 0},
		{"+Inf", math.Inf(1), 100},
		{"above burst", 1e300, 100},
		{"zero", 0, 0},
	} {
		require.True(t, f.own("s1", c.name, b).Acquired, c.name)
		f.clock.Advance(100 * time.Millisecond)
		f.release("s1", c.name, b, c.level)
		st := f.state(c.name, b)
		assert.InDelta(t, c.want, st.Level, 1e-9, c.name)
		assert.Empty(t, st.Owner, c.name)
		f.clock.Advance(10 * time.Millisecond)
		assert.InDelta(t, min(c.want+1, 100), f.state(c.name, b).Level, 1e-9, "%s: the bucket refills as usual", c.name)
	}
}

// testOwnKept: an owned bucket's record is kept while the ownership lasts
// and until the bucket would be full after its expiry, even when it was
// full at the acquisition (an idle bucket otherwise).
func testOwnKept(t *testing.T, f *fixture, opts Options) {
	b := bucket(10, time.Second, 10, 10*time.Second)
	require.True(t, f.own("s1", "k", b).Acquired)
	f.clock.Advance(5 * time.Second)
	f.sweepIfAny()
	if opts.Retention != nil {
		assert.GreaterOrEqual(t, opts.Retention(t, "k"), 6*time.Second, "the deadline and then the refill from empty")
	}
	assert.Equal(t, "s1", f.state("k", b).Owner)
	assert.False(t, f.own("s2", "k", b).Owned)
	f.clock.Advance(5*time.Second + 500*time.Millisecond)
	f.sweepIfAny()
	st := f.state("k", b)
	assert.Empty(t, st.Owner)
	assert.InDelta(t, 5, st.Level, 1e-9, "expired at 10 s, empty, and 500 ms of refill")
}

// takeAs takes cost tokens of key as lease server server (TakeOp.Server).
func (f *fixture) takeAs(server, key string, b leases.Bucket, cost int64) leases.TakeOutcome {
	f.t.Helper()
	out, err := f.store.Take(f.ctx, []leases.TakeOp{{Key: key, Bucket: b, Cost: cost, Server: server}})
	require.NoError(f.t, err)
	require.Len(f.t, out, 1)
	return out[0]
}

// testOwnSharedTakes: a bucket whose takes came through another server
// within a lease TTL is not given to an owner (the owner would refuse that
// server's takes); one taken through the acquiring server alone, or not
// through a server lately, is.
func testOwnSharedTakes(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)

	// Taken through s2 only: s2 may own it, s1 may not for a TTL.
	require.True(t, f.takeAs("s2", "one", b, 1).Taken)
	o := f.own("s1", "one", b)
	assert.False(t, o.Owned, "taken through s2 within a TTL")
	assert.Equal(t, time.Second, o.RetryAfter, "ask again a TTL later")
	assert.True(t, f.own("s2", "one", b).Acquired, "its only taker")

	// Taken through both: neither may, until a TTL without mixing.
	require.True(t, f.takeAs("s1", "both", b, 1).Taken)
	f.clock.Advance(10 * time.Millisecond)
	require.True(t, f.takeAs("s2", "both", b, 1).Taken)
	f.clock.Advance(10 * time.Millisecond)
	require.True(t, f.takeAs("s1", "both", b, 1).Taken)
	assert.False(t, f.own("s1", "both", b).Owned, "taken through two servers lately")
	assert.False(t, f.own("s2", "both", b).Owned)
	f.clock.Advance(time.Second)
	require.True(t, f.takeAs("s1", "both", b, 1).Taken)
	assert.True(t, f.own("s1", "both", b).Acquired, "a TTL through s1 alone")

	// Takes that name no server (a server that owns nothing) do not count.
	require.True(t, f.take("anon", b, 1).Taken)
	assert.True(t, f.own("s1", "anon", b).Acquired)

	// A denied take records nothing.
	require.True(t, f.takeAs("s1", "denied", b, 100).Taken)
	assert.False(t, f.takeAs("s2", "denied", b, 1).Taken)
	assert.True(t, f.own("s1", "denied", b).Acquired, "s2 took nothing")
}

// testOwnIDs: the store keeps the ID of the op that began an ownership; a
// renewal or release with another ID changes nothing; an acquisition that
// finds an ownership of its server begun by one of its Lost begins afresh,
// from the level the bucket would have had without it.
func testOwnIDs(t *testing.T, f *fixture) {
	b := bucket(100, time.Second, 100, time.Second)
	op := func(id string, release bool, lost ...string) leases.OwnOutcome {
		t.Helper()
		o := f.ownOp(leases.OwnOp{Key: "k", Bucket: b, Server: "s1", ID: id, Lost: lost, Release: release, Level: 100})
		require.NoError(t, o.Err)
		return o
	}
	require.True(t, f.take("k", b, 30).Taken)
	o := op("a1", false)
	require.True(t, o.Acquired)
	assert.Equal(t, "a1", o.ID)
	assert.InDelta(t, 70, o.Level, 1e-9)

	f.clock.Advance(100 * time.Millisecond)
	o = op("a1", false) // a renewal: the deadline moves to 1.1 s
	assert.True(t, o.Owned)
	assert.False(t, o.Acquired)
	assert.Equal(t, "a1", o.ID)

	f.clock.Advance(100 * time.Millisecond)
	o = op("b2", false) // another acquisition, not naming a1 lost
	assert.True(t, o.Owned, "owned by s1")
	assert.False(t, o.Acquired, "through an ownership op does not know")
	assert.Equal(t, "a1", o.ID)
	assert.InDelta(t, 0, o.Level, 1e-9)
	op("b2", true) // nor does a release with another ID end it
	assert.Equal(t, "s1", f.state("k", b).Owner)
	assert.Equal(t, 900*time.Millisecond, f.own("s2", "k", b).RetryAfter, "the deadline did not move")

	f.clock.Advance(100 * time.Millisecond)
	o = op("c3", false, "b2", "a1") // a1's answer was lost: afresh
	assert.True(t, o.Acquired)
	assert.Equal(t, "c3", o.ID)
	assert.InDelta(t, 100, o.Level, 1e-9, "70 and 300 ms of refill, under the burst")
	assert.Equal(t, time.Second, f.own("s2", "k", b).RetryAfter, "a new deadline")
	o = op("d4", false, "c3") // c3's answer lost too
	assert.True(t, o.Acquired)
	assert.Equal(t, "d4", o.ID)
	o = op("c3", false, "a1", "b2") // a late copy: d4 is not among its Lost
	assert.False(t, o.Acquired)
	assert.Equal(t, "d4", o.ID)
	assert.Equal(t, time.Second, f.own("s2", "k", b).RetryAfter, "nothing changed")

	// The release with the ownership's ID ends it, capped as always.
	require.True(t, f.take("k2", b, 50).Taken)
	o = f.ownOp(leases.OwnOp{Key: "k2", Bucket: b, Server: "s1", ID: "e5"})
	require.True(t, o.Acquired)
	f.clock.Advance(200 * time.Millisecond)
	o = f.ownOp(leases.OwnOp{Key: "k2", Bucket: b, Server: "s1", ID: "e5", Lost: []string{"e5"}})
	assert.False(t, o.Acquired, "its own ID in Lost: a renewal")
	f.ownOp(leases.OwnOp{Key: "k2", Bucket: b, Server: "s1", ID: "e5", Release: true, Level: 100})
	st := f.state("k2", b)
	assert.Empty(t, st.Owner)
	assert.InDelta(t, 70, st.Level, 1e-9)

	// An ownership begun afresh keeps its contested mark.
	require.True(t, f.ownOp(leases.OwnOp{Key: "k3", Bucket: b, Server: "s1", ID: "f6"}).Acquired)
	assert.False(t, f.takeAs("s2", "k3", b, 1).Taken)
	require.True(t, f.ownOp(leases.OwnOp{Key: "k3", Bucket: b, Server: "s1", ID: "f7", Lost: []string{"f6"}}).Acquired)
	assert.True(t, f.ownOp(leases.OwnOp{Key: "k3", Bucket: b, Server: "s1", ID: "f7"}).Contested)
}

// testOwnBadIDs: an op with a bad ID or Lost fails alone and changes
// nothing.
func testOwnBadIDs(t *testing.T, f *fixture) {
	b := bucket(10, time.Second, 10, time.Second)
	s := f.store.(leases.Owning)
	many := make([]string, leases.MaxOwnLost+1)
	for i := range many {
		many[i] = "a"
	}
	bad := []leases.OwnOp{
		{Key: "k", Bucket: b, Server: "s1", ID: "A1"},
		{Key: "k", Bucket: b, Server: "s1", ID: "a b"},
		{Key: "k", Bucket: b, Server: "s1", ID: "=1"},
		{Key: "k", Bucket: b, Server: "s1", ID: strings.Repeat("a", leases.MaxOwnIDLen+1)},
		{Key: "k", Bucket: b, Server: "s1", ID: "a", Lost: []string{""}},
		{Key: "k", Bucket: b, Server: "s1", ID: "a", Lost: []string{"b c"}},
		{Key: "k", Bucket: b, Server: "s1", ID: "a", Lost: many},
		{Key: "k", Bucket: b, Server: "s1", ID: "\xff"},
	}
	out, err := s.Own(f.ctx, append(bad, leases.OwnOp{Key: "k2", Bucket: b, Server: "s1", ID: "a"}))
	require.NoError(t, err)
	require.Len(t, out, len(bad)+1)
	for i := range bad {
		assert.Error(t, out[i].Err, "op %d", i)
		assert.False(t, out[i].Owned, "op %d", i)
	}
	assert.True(t, out[len(bad)].Acquired, "the good op of the call")
	assert.Empty(t, f.state("k", b).Owner, "nothing changed")
	assert.True(t, f.take("k", b, 10).Taken)
}
