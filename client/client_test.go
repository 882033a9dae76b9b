package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const rules = `
default: allow
rules:
  - {name: per-user, match: "user:*", limit: 100, period: 1s, lease_ttl: 2s}
  - {name: tiny, match: "tiny:*", limit: 10, period: 1s, burst: 5, lease_ttl: 1s}
  - {name: fast, match: "fast:*", limit: 100000, period: 1s, lease_ttl: 2s}
`

func newClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	c, err := client.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

func TestAllowLeaseLocally(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}})
	ctx := context.Background()

	d := c.Allow(ctx, "user:1")
	require.True(t, d.Allowed, "%+v", d)
	assert.Equal(t, client.SourceLease, d.Source)
	calls := c.Stats().ServerCalls
	assert.EqualValues(t, 1, calls, "the first Allow leased a batch")
	for range 5 {
		require.True(t, c.Allow(ctx, "user:1").Allowed)
	}
	assert.Equal(t, calls, c.Stats().ServerCalls, "spent locally, no call")

	st := c.Stats()
	assert.EqualValues(t, 6, st.Allowed)
	assert.Equal(t, 1, st.KeysHeld)
	assert.True(t, st.Online)

	// A key that matches no rule under default allow is unlimited.
	d = c.Allow(ctx, "other:1")
	assert.True(t, d.Allowed)
	assert.Equal(t, client.SourceUnlimited, d.Source)
}

func TestColdStartSharesOneRequest(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, InitialBatch: 50})
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.Allow(context.Background(), "user:cold").Allowed {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 20, allowed)
	assert.LessOrEqual(t, c.Stats().ServerCalls, int64(2), "concurrent first calls share the lease request")
}

func TestDeniedLocallyUntilRetryAfter(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, InitialBatch: 100})
	ctx := context.Background()
	allowed := 0
	var last client.Decision
	for range 50 {
		d := c.Allow(ctx, "tiny:1")
		if d.Allowed {
			allowed++
		} else {
			last = d
		}
	}
	assert.LessOrEqual(t, allowed, 6, "burst 5 (+1 refilled at most)")
	assert.GreaterOrEqual(t, allowed, 5)
	assert.False(t, last.Allowed)
	assert.Positive(t, last.RetryAfter)
	assert.LessOrEqual(t, last.RetryAfter, 200*time.Millisecond)

	// While denied, requests make no network call.
	calls := c.Stats().ServerCalls
	for range 1000 {
		d := c.Allow(ctx, "tiny:1")
		if d.Allowed {
			break
		}
		if d.Source != client.SourceRetryAfter {
			continue
		}
	}
	assert.LessOrEqual(t, c.Stats().ServerCalls-calls, int64(2))
}

func TestCloseReturnsTokens(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		testCloseReturnsTokens(t, leases.NewMemoryStore(leases.MemoryOptions{}))
	})
	t.Run("redis", func(t *testing.T) {
		r := redistest.Start(t)
		testCloseReturnsTokens(t, leases.NewRedisStore(r.Client(t), leases.RedisOptions{}))
	})
}

func testCloseReturnsTokens(t *testing.T, store leases.Store) {
	noLeaks(t)
	srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, InitialBatch: 40})
	require.NoError(t, err)
	ctx := context.Background()
	for range 3 {
		require.True(t, c.Allow(ctx, "user:close").Allowed)
	}
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100, LeaseTTL: 2 * time.Second}
	st, err := store.State(ctx, "user:close", b)
	require.NoError(t, err)
	require.Positive(t, st.Outstanding)

	require.NoError(t, c.Close(ctx))
	st, err = store.State(ctx, "user:close", b)
	require.NoError(t, err)
	assert.Zero(t, st.Outstanding, "Close returned every unused token")
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 97, st.Level, 1.5, "3 used, the rest back (plus refill)")

	d := c.Allow(ctx, "user:close")
	assert.False(t, d.Allowed)
	assert.Equal(t, client.SourceClosed, d.Source)
	assert.ErrorIs(t, c.Wait(ctx, "user:close"), client.ErrClosed)
}
