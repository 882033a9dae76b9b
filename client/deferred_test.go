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

// TestDeferredGrant drives the client's clock through a deferred grant: a
// key whose lease runs out while its bucket is empty asks for the next
// batch accepting a deferral, gets it with the wait until the refill
// covers it, and is denied locally until then, without a call; then the
// batch serves, again without a call. The server runs on real time: the
// wait it gives shrinks by the milliseconds the test takes between the
// take that emptied the bucket and the deferral.
func TestDeferredGrant(t *testing.T) {
	const rules = `
rules:
  - {name: s, match: "s:*", limit: 10, period: 1s, burst: 20, lease_ttl: 2s}
`
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 20, LeaseTTL: 2 * time.Second}
	ctx := context.Background()
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 5}, clk)

	require.True(t, c.Allow(ctx, "s:k").Allowed)
	ks := c.state("s:k")
	require.Eventually(t, func() bool { return ks.active.Load() != nil }, 5*time.Second, time.Millisecond, "the first lease")
	first := ks.active.Load()
	// Another holder empties the bucket.
	st, err := store.State(ctx, "s:k", b)
	require.NoError(t, err)
	res, err := store.Take(ctx, []leases.TakeOp{{Key: "s:k", Bucket: b, Cost: st.Free}})
	require.NoError(t, err)
	require.True(t, res[0].Taken)

	// The lease is spent out; the next decision is denied until the next
	// batch, which the loop, woken, asks for at once.
	for first.left() > 0 {
		require.True(t, c.Allow(ctx, "s:k").Allowed)
	}
	d := c.Allow(ctx, "s:k")
	require.False(t, d.Allowed)
	require.Eventually(t, func() bool { l := ks.active.Load(); return l != nil && l != first }, 5*time.Second, time.Millisecond, "the deferred batch")
	next := ks.active.Load()
	require.Positive(t, next.granted)
	st, err = store.State(ctx, "s:k", b)
	require.NoError(t, err)
	assert.Negative(t, st.Level, "the server's bucket is in debt for it")
	assert.Equal(t, next.granted, c.Stats().TokensHeld, "held, deferred")

	// Denied locally until the wait has passed, without a call: the
	// wait is the refill of the batch at 10/s.
	calls := c.Stats().ServerCalls
	d = c.Allow(ctx, "s:k")
	require.False(t, d.Allowed)
	assert.Equal(t, SourceRetryAfter, d.Source)
	wait := time.Duration(next.granted) * 100 * time.Millisecond
	assert.LessOrEqual(t, d.RetryAfter, wait, "the refill of %d tokens", next.granted)
	assert.Greater(t, d.RetryAfter, wait-time.Second, "the refill of %d tokens, less the test's own time", next.granted)
	clk.move(d.RetryAfter - time.Millisecond)
	assert.False(t, c.Allow(ctx, "s:k").Allowed, "a millisecond early")
	assert.Equal(t, next.granted, next.left(), "nothing spent early")

	// Then the batch serves, whole.
	clk.move(time.Millisecond)
	for range next.granted {
		d := c.Allow(ctx, "s:k")
		require.True(t, d.Allowed)
		require.Equal(t, SourceLease, d.Source)
	}
	assert.Equal(t, calls, c.Stats().ServerCalls, "no call from the deferral to the batch's last token")
	assert.Zero(t, c.Stats().TokensHeld, "all spent")
}
