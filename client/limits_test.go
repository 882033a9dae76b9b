package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDecisionCarriesEveryLimit: a rule of two limits ("3 per minute and 5
// per hour") is enforced as both, and every decision says where each stands
// fleet-wide, with its reset, enough to write RateLimit headers.
func TestDecisionCarriesEveryLimit(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - name: login
    match: "login:*"
    limits:
      - {limit: 3, period: 1m}
      - {limit: 5, period: 1h}
`, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}})
	ctx := context.Background()
	start := time.Now()
	for i := range 3 {
		d := c.Allow(ctx, "login:ann")
		require.True(t, d.Allowed, "request %d", i)
		require.Len(t, d.Limits, 2)
		assert.Equal(t, client.LimitState{Algorithm: "token_bucket", Limit: 3, Period: time.Minute, Burst: 3, Remaining: int64(2 - i), Reset: d.Limits[0].Reset}, d.Limits[0])
		assert.EqualValues(t, 4-i, d.Limits[1].Remaining)
		assert.WithinDuration(t, start.Add(time.Duration(i+1)*20*time.Second), d.Limits[0].Reset, 2*time.Second, "3/min: 20 s per token to refill")
		assert.WithinDuration(t, start.Add(time.Duration(i+1)*12*time.Minute), d.Limits[1].Reset, 2*time.Second, "5/h: 12 min per token")
	}
	d := c.Allow(ctx, "login:ann")
	require.False(t, d.Allowed, "the per-minute limit binds")
	assert.InDelta(t, 20*time.Second, d.RetryAfter, float64(2*time.Second))
	require.Len(t, d.Limits, 2)
	assert.Zero(t, d.Limits[0].Remaining)
	assert.EqualValues(t, 2, d.Limits[1].Remaining, "the denied request took nothing from the hourly limit")
}
