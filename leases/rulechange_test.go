package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
)

// What a rule change (a reload) does to the leases open under the old
// rule: they stay counted until they end, in both stores alike. Three
// findings of the invariant review, each a test that failed on the old
// code.

// ruleChangeStores returns a memory store (no background sweep) and a
// Redis store on one driven clock.
func ruleChangeStores(t *testing.T) (*leases.MemoryStore, *leases.RedisStore, *storetest.Clock) {
	t.Helper()
	mem, red, clock, _ := ruleChangeStoresRDB(t)
	return mem, red, clock
}

// named returns the two stores by name, for the tests that run one
// operation on each and compare.
func named(mem *leases.MemoryStore, red *leases.RedisStore) map[string]leases.Store {
	return map[string]leases.Store{"memory": mem, "redis": red}
}

func ruleChangeStoresRDB(t *testing.T) (*leases.MemoryStore, *leases.RedisStore, *storetest.Clock, *redis.Client) {
	t.Helper()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	rdb := redistest.Start(t).Client(t)
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now, NoEviction: true})
	return mem, red, clock, rdb
}

// TestRuleChangeAlgorithmKeepsOpenLeases: a token bucket with an open lease
// of its whole burst; a reload switches the rule to fixed_window and a
// second switches it back. The memory store dropped the token bucket's
// state at the first switch and, at the second, started a full bucket
// while the lease it forgot was still open and spendable: it granted the
// burst again. Redis keeps each algorithm's state under keys of its own,
// and so does the memory store now.
func TestRuleChangeAlgorithmKeepsOpenLeases(t *testing.T) {
	mem, red, clock := ruleChangeStores(t)
	ctx := context.Background()
	tb := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1, Period: time.Minute, Burst: 100, LeaseTTL: time.Hour}
	fw := leases.Bucket{Algorithm: leases.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: time.Hour}
	a := leases.Owner{Client: "a", Process: "1"}
	for name, s := range named(mem, red) {
		out, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: "k", Bucket: tb, Want: 100, NewLeaseID: "L1"}})
		require.NoError(t, err)
		require.EqualValues(t, 100, out[0].Granted, name)
	}
	clock.Advance(time.Millisecond)
	for _, s := range []leases.Store{mem, red} {
		_, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: fw, Cost: 1}}) // the rule is fixed_window now
		require.NoError(t, err)
	}
	clock.Advance(time.Millisecond)
	got := map[string]int64{}
	for name, s := range named(mem, red) {
		out, err := s.Lease(ctx, leases.Owner{Client: "b", Process: "1"}, []leases.LeaseOp{{Key: "k", Bucket: tb, Want: 100, NewLeaseID: "L2"}})
		require.NoError(t, err)
		got[name] = out[0].Granted
	}
	t.Logf("granted after switching back to token_bucket, with a's lease of 100 still open: %v", got)
	require.Equal(t, got["redis"], got["memory"], "the stores answer alike")
	require.Zero(t, got["memory"], "a's lease of the whole burst is still open: L + O ≤ burst")
}

// TestRuleChangeShorterWindowCountsOpenLeases: fixed_window (and the
// counter) 100 per minute; a client holds a lease of all 100 (deadline
// 30 s, inside its window). A reload shortens the period to one second. At
// the next call the window rolled to a count of 0 while the lease, of the
// old window, stayed open and spendable until its deadline: the new window
// admitted 100 by takes besides, 200 in one second. And the Redis keys
// lived for the one-second window only, 28.5 s less than the lease. The
// roll now carries the open leases' tokens, and the keys live until the
// latest of them ends.
func TestRuleChangeShorterWindowCountsOpenLeases(t *testing.T) {
	for _, alg := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) { shorterWindow(t, alg) })
	}
}

func shorterWindow(t *testing.T, alg leases.Algorithm) {
	mem, red, clock, rdb := ruleChangeStoresRDB(t)
	ctx := context.Background()
	// Start at a minute boundary, so the lease's window is [0, 60 s).
	clock.Advance(time.Duration(60_000_000-clock.Now().UnixMicro()%60_000_000) * time.Microsecond)
	minute := leases.Bucket{Algorithm: alg, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: 30 * time.Second}
	second := minute
	second.Period = time.Second
	a := leases.Owner{Client: "a", Process: "1"}
	for name, s := range named(mem, red) {
		out, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: "k", Bucket: minute, Want: 100, NewLeaseID: "L1"}})
		require.NoError(t, err)
		require.EqualValues(t, 100, out[0].Granted, name)
	}
	clock.Advance(1500 * time.Millisecond) // the reload happened meanwhile
	for name, s := range named(mem, red) {
		st, err := s.State(ctx, "k", second)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Leases, "%s: a's lease of 100 is open (deadline at 30 s)", name)
		out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: second, Cost: 100}})
		require.NoError(t, err)
		// a may spend its lease's 100 in [1 s, 2 s) as well.
		if name == "redis" {
			// The hash's TTL was set for the one-second window, not for
			// the lease's deadline 28.5 s away: it lapsed while the lease
			// was open (the store's clock is driven here; the TTL is in ms).
			h, _, _ := leases.AlgorithmRedisKeys("k", alg)
			pttl, err := rdb.PTTL(ctx, h).Result()
			require.NoError(t, err)
			assert.Greater(t, pttl, 28*time.Second, "redis: the key's TTL (%v) outlives the open lease (28.5 s)", pttl)
		}
		assert.False(t, out[0].Taken, "%s: a window of 1 s admits no take of 100 while a lease of 100 is open in it", name)
	}
}

// TestRuleChangeLongerWindowCountsOpenLeases: fixed_window 10 per 500 ms,
// reloaded to 10 per second. The key's window started at 0.5 s under the
// old period and stays there (a start that ⌊now/W⌋·W does not pass), so a
// lease granted at 0.7 s, under the new rule, gets the deadline
// start + W = 1.5 s; but the window rolls at the next aligned boundary,
// 1.0 s. The roll used to start from zero, and the aligned window [1 s, 2 s)
// admitted its 10 beside the lease's 9 still open in it.
func TestRuleChangeLongerWindowCountsOpenLeases(t *testing.T) {
	mem, red, clock := ruleChangeStores(t)
	ctx := context.Background()
	half := leases.Bucket{Algorithm: leases.FixedWindow, Limit: 10, Period: 500 * time.Millisecond, Burst: 10, LeaseTTL: time.Second}
	full := half
	full.Period = time.Second
	a := leases.Owner{Client: "a", Process: "1"}
	for name, s := range named(mem, red) {
		t.Run(name, func(t *testing.T) {
			clock.Advance(time.Duration(1_000_000-clock.Now().UnixMicro()%1_000_000) * time.Microsecond) // t = 0 on a second boundary
			base := clock.Now()
			at := func(d time.Duration) { clock.Advance(base.Add(d).Sub(clock.Now())) }
			key := "k-" + name
			at(600 * time.Millisecond)
			out, err := s.Take(ctx, []leases.TakeOp{{Key: key, Bucket: half, Cost: 1}}) // window [0.5 s, 1 s) of the old rule
			require.NoError(t, err)
			require.True(t, out[0].Taken)
			at(700 * time.Millisecond) // the rule is 10 per second now
			lo, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: key, Bucket: full, Want: 9, NewLeaseID: "L1"}})
			require.NoError(t, err)
			require.EqualValues(t, 9, lo[0].Granted)
			t.Logf("lease granted at 0.7 s: deadline in %v", lo[0].TTL)
			at(1100 * time.Millisecond)
			st, err := s.State(ctx, key, full)
			require.NoError(t, err)
			require.EqualValues(t, 1, st.Leases, "the lease of 9 is still open at 1.1 s")
			out, err = s.Take(ctx, []leases.TakeOp{{Key: key, Bucket: full, Cost: 10}})
			require.NoError(t, err)
			assert.False(t, out[0].Taken, "the aligned window [1 s, 2 s) admits 10 while a lease of 9, granted under this rule, may still be spent in it")
		})
	}
}

// TestRuleChangeCarrySurvivesDeniedTake (found by the session's final
// review): a roll that carries an open lease's tokens cannot be recomputed
// once the lease has ended; a denied take did not save it in Redis, and the
// next call rolled again from the old window, carrying nothing: Redis then
// admitted a take of 100 beside the lease, the memory store did not.
func TestRuleChangeCarrySurvivesDeniedTake(t *testing.T) {
	for _, alg := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			mem, red, clock := ruleChangeStores(t)
			ctx := context.Background()
			clock.Advance(time.Duration(60_000_000-clock.Now().UnixMicro()%60_000_000) * time.Microsecond)
			minute := leases.Bucket{Algorithm: alg, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: 1600 * time.Millisecond}
			second := minute
			second.Period = time.Second
			a := leases.Owner{Client: "a", Process: "1"}
			for name, s := range named(mem, red) {
				out, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: "k", Bucket: minute, Want: 100, NewLeaseID: "L1"}})
				require.NoError(t, err)
				require.EqualValues(t, 100, out[0].Granted, name)
			}
			clock.Advance(1200 * time.Millisecond) // reload; window [1 s, 2 s); the lease is open until 1.6 s
			for name, s := range named(mem, red) {
				out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: second, Cost: 1}})
				require.NoError(t, err)
				require.False(t, out[0].Taken, name)
			}
			clock.Advance(600 * time.Millisecond) // 1.8 s: the lease has ended, in this window
			got := map[string]bool{}
			for name, s := range named(mem, red) {
				out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: second, Cost: 100}})
				require.NoError(t, err)
				got[name] = out[0].Taken
			}
			t.Logf("take of 100 at 1.8 s: %v", got)
			assert.Equal(t, got["memory"], got["redis"], "stores answer alike")
			assert.False(t, got["redis"], "window [1 s, 2 s) admitted 100 beside the lease of 100 open in it until 1.6 s")
		})
	}
}

// TestRuleChangeShorterWindowWithoutRollKeepsKeys (found by the session's
// final review): a reload shortens the period, and the first call under
// the new rule comes in the new rule's first window, which starts where the
// old one did (no roll): the keys' TTL was set for the new window, though
// the old lease stays open 29 s more. The keys now live as long as the
// latest lease granted or carried (field x).
func TestRuleChangeShorterWindowWithoutRollKeepsKeys(t *testing.T) {
	mem, red, clock, rdb := ruleChangeStoresRDB(t)
	ctx := context.Background()
	clock.Advance(time.Duration(60_000_000-clock.Now().UnixMicro()%60_000_000) * time.Microsecond)
	minute := leases.Bucket{Algorithm: leases.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: 30 * time.Second}
	second := minute
	second.Period = time.Second
	a := leases.Owner{Client: "a", Process: "1"}
	for name, s := range named(mem, red) {
		out, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: "k", Bucket: minute, Want: 100, NewLeaseID: "L1"}})
		require.NoError(t, err)
		require.EqualValues(t, 100, out[0].Granted, name)
	}
	clock.Advance(500 * time.Millisecond) // reload; a call in [0, 1 s)
	for _, s := range []leases.Store{mem, red} {
		_, err := s.Lease(ctx, leases.Owner{Client: "b", Process: "1"}, []leases.LeaseOp{{Key: "k", Bucket: second, Want: 1, NewLeaseID: "L2"}})
		require.NoError(t, err)
	}
	h, _, _ := leases.AlgorithmRedisKeys("k", leases.FixedWindow)
	pttl, err := rdb.PTTL(ctx, h).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 29*time.Second, "redis: key TTL %v while the lease is open for 29.5 s more", pttl)
	clock.Advance(2 * time.Second) // the Redis key lapsed (driven clock: lapse it for real)
	if pttl < 29*time.Second {
		time.Sleep(pttl + 50*time.Millisecond)
	}
	got := map[string]bool{}
	for name, s := range named(mem, red) {
		out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: second, Cost: 100}})
		require.NoError(t, err)
		got[name] = out[0].Taken
	}
	assert.Equal(t, got["memory"], got["redis"], "stores answer alike")
	assert.False(t, got["redis"], "a 1 s window admits 100 beside an open lease of 100")
}
