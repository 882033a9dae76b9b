package client

import (
	"context"
	"slices"
	"sync"
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

// TestShareBoundRenewal: a key whose lease request was refused for want
// of tokens (a saturated key, or this process's share of it spent) is not
// renewed early, with a quarter of its lease left, as an ample key is: the
// server would refuse that renewal too. It asks again once the lease is
// spent out.
func TestShareBoundRenewal(t *testing.T) {
	const rules = `
rules:
  - {name: t, match: "t:*", limit: 100, period: 1s, lease_ttl: 2s}
`
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100, LeaseTTL: 2 * time.Second}
	ctx := context.Background()
	mem := leases.NewMemoryStore(leases.MemoryOptions{})
	store := &countingStore{Store: mem}
	srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 20}, clk)
	require.True(t, c.Allow(ctx, "t:k").Allowed)
	require.Eventually(t, func() bool { return c.Stats().KeysHeld == 1 }, 5*time.Second, time.Millisecond)
	ks := c.state("t:k")

	// Another holder empties the bucket; this one spends its lease out and
	// is refused the next (the server runs on real time: a few tokens
	// refill meanwhile, fewer than half a batch).
	st, err := mem.State(ctx, "t:k", b)
	require.NoError(t, err)
	res, err := mem.Take(ctx, []leases.TakeOp{{Key: "t:k", Bucket: b, Cost: int64(st.Level)}})
	require.NoError(t, err)
	require.True(t, res[0].Taken)
	spend := func(until func(l *lease) bool) {
		for l := ks.active.Load(); l != nil && !until(l); {
			require.True(t, c.Allow(ctx, "t:k").Allowed)
		}
	}
	spend(func(l *lease) bool { return l.left() == 0 })
	clk.advance(t, 10*time.Millisecond)
	require.Eventually(t, func() bool { return ks.denyUntil.Load() > clk.nanos() }, 5*time.Second, time.Millisecond, "refused, with a retry_after")

	// Once the bucket has refilled ten tokens (on the server's clock), a
	// lease comes; the key is share-bound.
	require.Eventually(t, func() bool {
		st, err := mem.State(ctx, "t:k", b)
		return err == nil && st.Level >= 10
	}, 5*time.Second, time.Millisecond)
	ks.need.Store(true)         // demand, as a denied decision would leave it
	clk.advance(t, time.Second) // past the denial
	require.Eventually(t, func() bool {
		l := ks.active.Load()
		return l != nil && l.left() >= 10
	}, 5*time.Second, time.Millisecond, "a lease after the refusal")
	l := ks.active.Load()
	spend(func(l *lease) bool { return l.left() <= l.granted/4 })
	require.Positive(t, l.left())
	asked := len(store.settled())
	for range 3 {
		clk.advance(t, 10*time.Millisecond)
	}

	// Spent out, it asks, settling the lease in the same entry. A key
	// asks in one call at a time, so an early renewal would have reached
	// the store before this.
	spend(func(l *lease) bool { return l.left() == 0 })
	clk.advance(t, 10*time.Millisecond)
	require.Eventually(t, func() bool { return slices.Contains(store.settled(), l.id) }, 5*time.Second, time.Millisecond, "settled once spent out")
	assert.Equal(t, []string{l.id}, store.settled()[asked:], "one lease entry, which settles the spent lease and asks for the next: no early renewal")
}

// countingStore is a real store that records the lease entries it is
// given: the lease each settles ("" for none).
type countingStore struct {
	leases.Store
	mu      sync.Mutex
	entries []string
}

func (s *countingStore) Lease(ctx context.Context, owner leases.Owner, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	s.mu.Lock()
	for _, op := range ops {
		s.entries = append(s.entries, op.LeaseID)
	}
	s.mu.Unlock()
	return s.Store.Lease(ctx, owner, ops)
}

// settled returns the lease each entry so far settled.
func (s *countingStore) settled() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.entries)
}
