package storetest

import (
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// snapshotCase is one algorithm's expected snapshots in the scenario of
// RunSnapshot.
type snapshotCase struct {
	alg leases.Algorithm
	// busy is the snapshot at 130 ms (Now aside).
	busy leases.BucketState
	// partly is when some leases have expired unsettled and one owner
	// still holds its lease of slot 1; leases and holders are its counts
	// then. gone is when every lease has expired.
	partly                time.Duration
	partLeases, partHolds int
	gone                  time.Duration
}

// RunSnapshot checks Store.State, for every algorithm, against the stores
// newStore returns: level, free tokens, outstanding tokens, open leases,
// distinct holders, and the times to the next token, to a whole bucket and
// to the window's end, exactly, on a driven clock; leases past their
// expiry are not counted, yet a snapshot closes nothing (the next call
// does).
//
// The scenario, with a limit of 10 per second (a burst or queue of 10) and
// a lease TTL of 200 ms, from a time aligned to every window: at 0, owner
// a/1 leases 3 in slot 0, a/2 and b/1 lease 1 each; at 100 ms a/1 leases 2
// in slot 1 and 2 tokens are taken directly. At 130 ms four leases of
// seven tokens are open, held by three owners.
func RunSnapshot(t *testing.T, newStore Factory) {
	ms := time.Millisecond
	cases := []snapshotCase{{
		// Level 10 − 5 at 0 (at its cap burst − O); at 100 ms 2 leased
		// and 2 taken: 1, refilled by 0.3 by 130 ms. One token every
		// 100 ms: the next whole one in 70 ms, the cap 10 − 7 in 170 ms.
		alg:    leases.TokenBucket,
		busy:   leases.BucketState{Level: 1.3, Free: 1, Outstanding: 7, Leases: 4, Holders: 3, Next: 70 * ms, Full: 170 * ms},
		partly: 250 * ms, partLeases: 1, partHolds: 1, gone: 350 * ms,
	}, {
		// 9 counted in the window [0, 1 s): 1 free until its end.
		alg:    leases.FixedWindow,
		busy:   leases.BucketState{Level: 1, Free: 1, Outstanding: 7, Leases: 4, Holders: 3, Next: 870 * ms, Full: 870 * ms, WindowEnd: 870 * ms},
		partly: 250 * ms, partLeases: 1, partHolds: 1, gone: 350 * ms,
	}, {
		// 9 in the current window, none in the previous: 2 free once the
		// estimate 9·(1 − e/W) is at most 8 in the next window, e =
		// ⌈W/9⌉ = 111.112 ms after its start (982 ms from 130 ms); zero at
		// the next window's end.
		alg:    leases.SlidingWindowCounter,
		busy:   leases.BucketState{Level: 1, Free: 1, Outstanding: 7, Leases: 4, Holders: 3, Next: 982 * ms, Full: 1870 * ms, WindowEnd: 870 * ms},
		partly: 250 * ms, partLeases: 1, partHolds: 1, gone: 350 * ms,
	}, {
		// Log buckets of q = 15.625 ms: the take ends at ⌈100 ms⌉q =
		// 109.375 ms, the oldest entry, which leaves the window at
		// 1109.375 ms; the newest, the lease of slot 1, ends at ⌈300 ms⌉q =
		// 312.5 ms and leaves at 1312.5 ms.
		alg:    leases.SlidingWindowLog,
		busy:   leases.BucketState{Level: 1, Free: 1, Outstanding: 7, Leases: 4, Holders: 3, Next: 980 * ms, Full: 1183 * ms},
		partly: 250 * ms, partLeases: 1, partHolds: 1, gone: 350 * ms,
	}, {
		// One slot every 100 ms. Slices: a/1 [0, 300), a/2 [300, 400), b/1
		// [400, 500), a/1's slot 1 [500, 700), the take [700, 900). At 130
		// ms the queue is 7.7 slots long: 2 free, a third once it is 7
		// long (70 ms), empty in 770 ms. A lease expires at its slice's
		// end (later than its TTL here).
		alg:    leases.LeakyBucket,
		busy:   leases.BucketState{Level: 7.7, Free: 2, Outstanding: 7, Leases: 4, Holders: 3, Next: 70 * ms, Full: 770 * ms},
		partly: 450 * ms, partLeases: 2, partHolds: 2, gone: 750 * ms,
	}}
	for _, c := range cases {
		t.Run(string(c.alg), func(t *testing.T) { testSnapshot(t, newFixture(t, newStore), c) })
	}
}

func testSnapshot(t *testing.T, f *fixture, c snapshotCase) {
	b := leases.Bucket{Algorithm: c.alg, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: 200 * time.Millisecond}
	const key = "snap"
	start := f.clock.Now()
	// at returns the snapshot at offset d from the start.
	at := func(d time.Duration) leases.BucketState {
		t.Helper()
		f.clock.Advance(start.Add(d).Sub(f.clock.Now()))
		st := f.state(key, b)
		assert.True(t, st.Now.Equal(f.clock.Now()), "the store's clock")
		st.Now = time.Time{}
		return st
	}

	fresh := at(0)
	assert.EqualValues(t, 10, fresh.Free, "a key never seen is whole")
	assert.Zero(t, fresh.Holders)
	assert.Zero(t, fresh.Next)
	assert.Zero(t, fresh.Full)

	for _, g := range []struct {
		owner         string
		slot          int
		want, granted int64
	}{{"a/1", 0, 3, 3}, {"a/2", 0, 1, 1}, {"b/1", 0, 1, 1}} {
		o := f.leaseSlot(g.owner, key, g.slot, b, g.want, "", 0)
		require.NoError(t, o.Err)
		require.EqualValues(t, g.granted, o.Granted, g.owner)
	}
	at(100 * time.Millisecond)
	o := f.leaseSlot("a/1", key, 1, b, 2, "", 0)
	require.NoError(t, o.Err)
	require.EqualValues(t, 2, o.Granted, "a/1 slot 1")
	require.True(t, f.take(key, b, 2).Taken)

	busy := at(130 * time.Millisecond)
	assert.InDelta(t, c.busy.Level, busy.Level, 1e-9, "level")
	busy.Level = c.busy.Level
	assert.Equal(t, c.busy, busy)

	// Leases past their expiry are neither counted nor closed.
	part := at(c.partly)
	assert.Equal(t, c.partLeases, part.Leases, "leases at %v", c.partly)
	assert.Equal(t, c.partHolds, part.Holders, "holders at %v", c.partly)
	part.Now = time.Time{}
	again := at(c.partly)
	assert.Equal(t, part, again, "a snapshot changes nothing")
	gone := at(c.gone)
	assert.Zero(t, gone.Leases)
	assert.Zero(t, gone.Holders)
	assert.Zero(t, gone.Outstanding)
	assert.Equal(t, 4, f.take(key, b, 0).Expired, "the next call closes the four leases")
}
