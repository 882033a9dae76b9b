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
