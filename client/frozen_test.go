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
// its own at once when it is not, or when its deadline comes near. The
// server runs on real time; only the client's clock is driven.
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
	// renew spends the active lease down to its renewal point and lets
	// the loop renew it at its next tick; it returns once the new lease
	// decides.
	renew := func(t *testing.T, c *Client, clk *testClock, key string) {
		t.Helper()
		ks := c.state(key)
		old := ks.active.Load()
		require.NotNil(t, old)
		for old.left() > old.granted/4 {
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

	t.Run("near its deadline: returned on its own", func(t *testing.T) {
		// Ticks of 300 ms make the margin (four ticks, 1.2 s) longer than
		// the time from the renewal to the new lease's own renewal point,
		// which otherwise always comes first; a deep bucket lets a batch
		// last longer than two such ticks of demand.
		c, clk, _, open := setup(t, "d:k", deep, 300*time.Millisecond)
		renew(t, c, clk, "d:k") // the first lease was sent at 0 (deadline 2 s), its successor at 0.3 s
		clk.advance(t, 300*time.Millisecond)
		clk.advance(t, 0)
		require.Equal(t, 2, open(), "at 0.6 s the first lease's deadline is 1.4 s away: it waits")
		clk.advance(t, 300*time.Millisecond)
		require.Eventually(t, func() bool { return open() == 1 }, 5*time.Second, time.Millisecond, "at 0.9 s, within 1.2 s of its deadline, it is returned")
		assert.Equal(t, 1, c.Stats().KeysHeld, "its successor serves on")
	})
}
