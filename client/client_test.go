package client_test

import (
	"context"
	"fmt"
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

// leaseKey decides key until a lease decides it: a key starts with direct
// takes and moves to leases once the process is admitted
// Config.LeaseMinTokens of it over a lease TTL. It returns the tokens it
// was allowed.
func leaseKey(t *testing.T, c *client.Client, key string) int {
	t.Helper()
	allowed := 0
	require.Eventually(t, func() bool {
		d := c.Allow(context.Background(), key)
		if d.Allowed {
			allowed++
		}
		return d.Source == client.SourceLease
	}, 5*time.Second, time.Millisecond, "key %q never leased", key)
	return allowed
}

func TestDirectThenLeased(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 4})
	ctx := context.Background()

	d := c.Allow(ctx, "user:1")
	require.True(t, d.Allowed, "%+v", d)
	assert.Equal(t, client.SourceDirect, d.Source, "a cold key is decided by a direct take")
	assert.EqualValues(t, 99, d.Remaining, "the bucket's remaining tokens, not a lease's")
	st := c.Stats()
	assert.EqualValues(t, 1, st.ServerCalls, "one call decided it")
	assert.EqualValues(t, 1, st.DirectDecisions)
	assert.Zero(t, st.KeysHeld, "one decision leases nothing")

	// Four admissions within a lease TTL move the key to leases.
	allowed := 1 + leaseKey(t, c, "user:1")
	calls := c.Stats().ServerCalls
	for range 5 {
		d := c.Allow(ctx, "user:1")
		require.True(t, d.Allowed)
		require.Equal(t, client.SourceLease, d.Source)
		allowed++
	}
	st = c.Stats()
	assert.Equal(t, calls, st.ServerCalls, "spent locally, no call")
	assert.EqualValues(t, allowed, st.Allowed)
	assert.Equal(t, 1, st.KeysHeld)
	assert.True(t, st.Online)
	assert.Zero(t, st.FallbackDecisions)

	// A key that matches no rule under default allow is unlimited: the
	// first decision learns it, the next are local.
	d = c.Allow(ctx, "other:1")
	assert.True(t, d.Allowed)
	calls = c.Stats().ServerCalls
	d = c.Allow(ctx, "other:1")
	assert.True(t, d.Allowed)
	assert.Equal(t, client.SourceUnlimited, d.Source)
	assert.Equal(t, calls, c.Stats().ServerCalls)
}

// TestDirectDecisionsCoalesce: concurrent decisions on cold keys share
// calls: one call carries every decision in flight when it is sent.
func TestDirectDecisionsCoalesce(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1000})
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	start := make(chan struct{})
	for i := range 40 {
		wg.Go(func() {
			<-start
			if c.Allow(context.Background(), fmt.Sprint("user:cold", i%8)).Allowed {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	assert.Equal(t, 40, allowed)
	st := c.Stats()
	assert.EqualValues(t, 40, st.DirectDecisions)
	assert.Less(t, st.ServerCalls, int64(40), "concurrent decisions share calls")
	t.Logf("40 concurrent decisions in %d calls", st.ServerCalls)
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
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, InitialBatch: 40, LeaseMinTokens: 1})
	require.NoError(t, err)
	ctx := context.Background()
	used := leaseKey(t, c, "user:close")
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100, LeaseTTL: 2 * time.Second}
	st, err := store.State(ctx, "user:close", b)
	require.NoError(t, err)
	require.Positive(t, st.Outstanding)

	require.NoError(t, c.Close(ctx))
	st, err = store.State(ctx, "user:close", b)
	require.NoError(t, err)
	assert.Zero(t, st.Outstanding, "Close returned every unused token")
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 100-used, st.Level, 1.5, "what was used is gone, the rest is back (plus refill)")

	d := c.Allow(ctx, "user:close")
	assert.False(t, d.Allowed)
	assert.Equal(t, client.SourceClosed, d.Source)
	assert.ErrorIs(t, c.Wait(ctx, "user:close"), client.ErrClosed)
}
