package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
)

// TestFrozenLeaseReturn drives the settle loop's clock through a renewal:
// the lease a renewal replaces (frozen) is returned by the key's next
// renewal, in the same entry, while the bucket is roomy, and by a call of
// its own at once when it is not, or when its deadline comes near with
// more than its cushion left; with no more than that, a roomy key's frozen
// lease is left to expire. The server runs on real time; only the
// client's clock is driven.
func TestFrozenLeaseReturn(t *testing.T) {
	const rules = `
rules:
  - {name: s, match: "s:*", limit: 1000, period: 1s, lease_ttl: 2s}
  - {name: d, match: "d:*", limit: 1000, period: 1s, burst: 100000, lease_ttl: 2s}
`
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000, LeaseTTL: 2 * time.Second}
	deep := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1000, Period: time.Second, Burst: 100000, LeaseTTL: 2 * time.Second}
	ctx := context.Background()

	// setup leases key (of bucket b) with a first batch of 50 and returns
	// the client, its clock and a function that reads the key's open
	// leases.
	setup := func(t *testing.T, key string, b leases.Bucket, tick time.Duration) (*Client, *testClock, *leases.MemoryStore, func() int) {
		store := leases.NewMemoryStore(leases.MemoryOptions{})
		srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
		clk := newTestClock()
		c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50, SettleInterval: tick}, clk)
		open := func() int {
			st, err := store.State(ctx, key, b)
			require.NoError(t, err)
			return st.Leases
		}
		require.True(t, c.Allow(ctx, key).Allowed)
		require.Eventually(t, func() bool { return c.Stats().KeysHeld == 1 && open() == 1 }, 5*time.Second, time.Millisecond, "%+v open %d", c.Stats(), open())
		return c, clk, store, open
	}
	// renew spends the active lease down to its cushion (a roomy key's
	// renewal point; the others renew with a quarter left) and lets the
	// loop renew it at its next tick; it returns once the new lease
	// decides.
	renew := func(t *testing.T, c *Client, clk *testClock, key string) {
		t.Helper()
		ks := c.state(key)
		old := ks.active.Load()
		require.NotNil(t, old)
		for old.left() > cushion(old) {
			require.True(t, c.Allow(ctx, key).Allowed)
		}
		clk.advance(t, c.cfg.SettleInterval)
		require.Eventually(t, func() bool { return ks.active.Load() != old }, 5*time.Second, time.Millisecond, "renewed")
	}

	t.Run("roomy: returned with the next renewal", func(t *testing.T) {
		c, clk, _, open := setup(t, "s:k", b, 10*time.Millisecond)
		renew(t, c, clk, "s:k")
		calls := c.Stats().ServerCalls
		for range 3 {
			clk.advance(t, 10*time.Millisecond)
		}
		assert.Equal(t, 2, open(), "the frozen lease waits for the next renewal")
		assert.Equal(t, calls, c.Stats().ServerCalls, "no call of its own")

		renew(t, c, clk, "s:k")
		require.Eventually(t, func() bool { return open() == 2 }, 5*time.Second, time.Millisecond)
		assert.Equal(t, calls+1, c.Stats().ServerCalls, "one call renewed the key and returned the frozen lease")
	})

	t.Run("tight: returned at once", func(t *testing.T) {
		c, clk, store, open := setup(t, "s:k", b, 10*time.Millisecond)
		// Another holder leaves the bucket with less than twice the next
		// batch.
		res, err := store.Take(ctx, []leases.TakeOp{{Key: "s:k", Bucket: b, Cost: 900}})
		require.NoError(t, err)
		require.True(t, res[0].Taken)
		renew(t, c, clk, "s:k")
		clk.advance(t, 10*time.Millisecond)
		require.Eventually(t, func() bool { return open() == 1 }, 5*time.Second, time.Millisecond, "the frozen lease is returned on its own")
	})

	t.Run("near its deadline with more than its cushion: returned on its own", func(t *testing.T) {
		// Ticks of 100 ms: the margin is four ticks, 400 ms, and a roomy
		// lease of a 2 s TTL is renewed at 1.2 s at the latest (eight
		// ticks before its deadline). A deep bucket keeps the key roomy.
		c, clk, _, open := setup(t, "d:k", deep, 100*time.Millisecond)
		ks := c.state("d:k")
		first := ks.active.Load()
		for range 10 {
			require.True(t, c.Allow(ctx, "d:k").Allowed)
		}
		for range 11 {
			clk.advance(t, 100*time.Millisecond)
		}
		require.Same(t, first, ks.active.Load(), "at 1.1 s, past half its TTL, a roomy key's lease is not renewed yet")
		clk.advance(t, 100*time.Millisecond)
		require.Eventually(t, func() bool { return ks.active.Load() != first }, 5*time.Second, time.Millisecond, "renewed at its late renewal point, 1.2 s")
		require.Greater(t, first.granted-10, cushion(first), "frozen with more than its cushion left")
		clk.advance(t, 300*time.Millisecond)
		clk.advance(t, 0)
		require.Equal(t, 2, open(), "at 1.5 s the first lease's deadline is 500 ms away: it waits")
		clk.advance(t, 100*time.Millisecond)
		require.Eventually(t, func() bool { return open() == 1 }, 5*time.Second, time.Millisecond, "at 1.6 s, within 400 ms of its deadline, it is returned")
		assert.Equal(t, 1, c.Stats().KeysHeld, "its successor serves on")
	})

	t.Run("roomy, no more than its cushion left: left to expire", func(t *testing.T) {
		c, clk, _, open := setup(t, "d:k", deep, 10*time.Millisecond)
		ks := c.state("d:k")
		renew(t, c, clk, "d:k") // a first small batch, renewed at once (asked for at 10 ms)
		second := ks.active.Load()
		// Spend the second lease at a steady pace, and its last tokens but
		// its cushion just before its late renewal point (1.51 s): it is
		// renewed there, and frozen with its cushion left.
		for range 148 {
			for range second.granted / 160 {
				require.True(t, c.Allow(ctx, "d:k").Allowed)
			}
			clk.advance(t, 10*time.Millisecond)
		}
		for second.left() > cushion(second) {
			require.True(t, c.Allow(ctx, "d:k").Allowed)
		}
		clk.advance(t, 10*time.Millisecond)
		require.Eventually(t, func() bool { return ks.active.Load() != second }, 5*time.Second, time.Millisecond, "renewed")
		require.Equal(t, 2, open(), "the renewal returned the first lease in its entry")
		// The next renewal comes at 3 s, after the second lease's deadline
		// (2.01 s): past it, no call returned it.
		leftToExpire(t, c, clk, ks, open)
	})
	t.Run("roomy, its cushion near at the late renewal point: renewed at its cushion, left to expire", func(t *testing.T) {
		c, clk, _, open := setup(t, "d:k", deep, 10*time.Millisecond)
		ks := c.state("d:k")
		renew(t, c, clk, "d:k") // a first small batch, renewed at once (asked for at 10 ms)
		second := ks.active.Load()
		// Spend the second lease a little slower than it was sized for:
		// at its late renewal point (1.51 s) it has a little more than its
		// cushion left, which the same pace spends down to the cushion a
		// few ticks later, long before its last renewal point (an eighth
		// of its TTL before its deadline, 1.76 s). Renewed at 1.51 s, it
		// would be frozen with more than its cushion and cost a call of
		// its own near its deadline; it is renewed at its cushion instead.
		step := second.granted / 160
		var spent int64
		spend := func() {
			for range step {
				require.True(t, c.Allow(ctx, "d:k").Allowed)
				spent++
			}
		}
		for range 150 {
			spend()
			clk.advance(t, 10*time.Millisecond)
		}
		over := second.left() - cushion(second)
		require.Positive(t, over, "at its late renewal point it has more than its cushion left")
		// When the renewal is asked for is pinned by
		// TestRoomyRenewalAtCushion; here, the end: the lease frozen with
		// no more than its cushion, and no call of its own.
		for ticks := 0; second.left() > cushion(second); ticks++ {
			require.LessOrEqual(t, ticks, int(over/step)+1, "it comes down to its cushion at the same pace")
			require.Same(t, second, ks.active.Load(), "not renewed above its cushion")
			spend()
			clk.advance(t, 10*time.Millisecond)
		}
		clk.advance(t, 10*time.Millisecond)
		require.Eventually(t, func() bool { return ks.active.Load() != second }, 5*time.Second, time.Millisecond, "renewed at its cushion")
		assert.LessOrEqual(t, second.granted-spent, cushion(second), "frozen with no more than its cushion")
		require.Eventually(t, func() bool { return open() == 2 }, 5*time.Second, time.Millisecond, "the renewal returned the first lease in its entry")
		leftToExpire(t, c, clk, ks, open)
	})
}

// leftToExpire checks that the frozen lease of ks, renewed by the active
// one, costs no call of its own over the next 600 ms of 10 ms ticks (past
// its deadline): the server counts it until it expires.
func leftToExpire(t *testing.T, c *Client, clk *testClock, ks *keyState, open func() int) {
	t.Helper()
	active := ks.active.Load()
	calls := c.Stats().ServerCalls
	for range 60 {
		clk.advance(t, 10*time.Millisecond)
	}
	assert.Equal(t, calls, c.Stats().ServerCalls, "the frozen lease cost no call of its own")
	assert.Equal(t, 2, open(), "the server counts it until it expires")
	assert.Same(t, active, ks.active.Load())
}
