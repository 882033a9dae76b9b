package client

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The API review's tests that need the client's insides (a driven clock,
// a held call).

// TestStatsAllowedMonotonic: Stats.Allowed, a count (exported by
// clientmetrics as a Prometheus counter), never goes down between two
// calls. A decision over a leased key and a direct one spends the leased
// key's token, then waits for the direct take; denied, it gives the token
// back: a Stats read during the take counted it, and the one after did
// not (found by the API review: a counter that falls is a reset to
// Prometheus, whose rate() then counts the whole total again).
func TestStatsAllowedMonotonic(t *testing.T) {
	const rules = `
rules:
  - {name: s, match: "s:*", limit: 1000, period: 1s, lease_ttl: 2s}
  - {name: one, match: "one:*", limit: 1, period: 1h, burst: 1}
`
	srv := leasetest.Start(t, rules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	proxy, held := holdTakesOf(t, srv.URL(), "one:b")
	c := clockedClient(t, Config{Servers: []string{proxy}, LeaseMinTokens: 1, ProbeTimeout: -1}, newTestClock())
	other := clockedClient(t, Config{Servers: []string{srv.URL()}, ProbeTimeout: -1}, newTestClock())
	ctx := context.Background()

	leaseOnClock(t, c, "s:a")
	require.True(t, other.Allow(ctx, "one:b").Allowed, "one:b's only token goes to another client")

	before := c.Stats().Allowed
	done := make(chan Decision, 1)
	go func() { done <- c.Allow(ctx, "s:a", "one:b") }()
	select {
	case <-held.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the take of one:b never came")
	}
	during := c.Stats().Allowed
	held.release()
	d := <-done
	require.False(t, d.Allowed, "one:b's bucket is empty: %+v", d)
	after := c.Stats().Allowed
	t.Logf("Allowed before %d, during the take %d, after %d", before, during, after)
	assert.GreaterOrEqual(t, during, before)
	assert.GreaterOrEqual(t, after, during, "Stats.Allowed went down")
}
