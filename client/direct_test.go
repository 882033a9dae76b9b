package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowProxy forwards to target after delay: a lease server that answers,
// slowly.
func slowProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay) // the server's slowness is what is under test
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSlowServerIsNoOutage: a server that answers slowly is waited for; the
// fallback never decides while servers answer (it would add to the
// limit). The old client fell back after a 50 ms cold start.
func TestSlowServerIsNoOutage(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	slow := slowProxy(t, srv.URL(), 150*time.Millisecond)
	c := newClient(t, client.Config{Servers: []string{slow}, Fallback: client.FallbackOpen})
	for range 3 {
		d := c.Allow(context.Background(), "tiny:slow")
		require.True(t, d.Allowed)
		assert.Equal(t, client.SourceDirect, d.Source)
	}
	st := c.Stats()
	assert.Zero(t, st.FallbackDecisions)
	assert.True(t, st.Online)
}

// TestIdleLeaseReturned: a leased key nobody spends from is returned at
// its renewal point, not renewed: it holds no tokens and costs no calls.
func TestIdleLeaseReturned(t *testing.T) {
	const idleRules = `
rules:
  - {name: short, match: "s:*", limit: 1000, period: 1s, lease_ttl: 400ms}
`
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, idleRules, leasetest.Options{Store: store})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50})
	leaseKey(t, c, "s:idle")
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000, LeaseTTL: 400 * time.Millisecond}
	st, err := store.State(context.Background(), "s:idle", b)
	require.NoError(t, err)
	require.Positive(t, st.Outstanding)

	// No more demand: by the lease's halfway point (200 ms) the client
	// returns what is left instead of renewing.
	require.Eventually(t, func() bool {
		st, err := store.State(context.Background(), "s:idle", b)
		return err == nil && st.Outstanding == 0 && st.Leases == 0
	}, 2*time.Second, 5*time.Millisecond, "the unspent lease was returned")
	require.Eventually(t, func() bool { return c.Stats().KeysHeld == 0 }, time.Second, 5*time.Millisecond)
	calls := c.Stats().ServerCalls
	assert.Never(t, func() bool { return c.Stats().ServerCalls != calls }, 600*time.Millisecond, 20*time.Millisecond,
		"an idle key costs no calls")
	// The key is decided directly again on demand, and promoted again; until
	// its new lease is in, it is still decided directly, never denied for
	// want of the lease it returned.
	d := c.Allow(context.Background(), "s:idle")
	assert.True(t, d.Allowed)
	assert.Equal(t, client.SourceDirect, d.Source)
	for range 5 {
		d := c.Allow(context.Background(), "s:idle")
		assert.True(t, d.Allowed, "%v", d.Source)
	}
}

// TestKeyCapRefusalIsAnAnswer: a lease call whose every entry the server's
// per-client key cap refuses is answered 429 with the entries; the client
// does not retry it, and decides the refused key directly.
func TestKeyCapRefusalIsAnAnswer(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{MaxKeysPerClient: 1})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1})
	leaseKey(t, c, "user:first")
	// The second key is promoted, and its lease refused by the cap.
	require.True(t, c.Allow(context.Background(), "user:second").Allowed)
	require.Eventually(t, func() bool {
		d := c.Allow(context.Background(), "user:second")
		return d.Allowed && d.Source == client.SourceDirect && c.Stats().ServerCalls >= 4
	}, 3*time.Second, 5*time.Millisecond)
	st := c.Stats()
	assert.Zero(t, st.ServerErrors, "a refusal by a cap is an answer, not a failure")
	assert.True(t, st.Online)
	assert.Equal(t, 1, st.KeysHeld, "only the first key holds a lease")
	// Over several of the loop's ticks, the key is not promoted again: one
	// call per decision.
	calls := st.ServerCalls
	for range 10 {
		d := c.Allow(context.Background(), "user:second")
		require.True(t, d.Allowed)
		require.Equal(t, client.SourceDirect, d.Source)
		time.Sleep(5 * time.Millisecond) // spread the decisions over ticks: the time is what is under test
	}
	assert.LessOrEqual(t, c.Stats().ServerCalls-calls, int64(10+1), "one call per direct decision, no lease asked again")
}
