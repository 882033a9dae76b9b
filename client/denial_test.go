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

// TestDenialAtMostFill: a local denial lasts at most the time the key's
// bucket takes to fill (and two ticks): a longer retry_after is a wait on
// other holders' leases, which they return long before they expire.
func TestDenialAtMostFill(t *testing.T) {
	c := policyClient(t, Config{SettleInterval: 10 * time.Millisecond})
	for _, tc := range []struct {
		name  string
		fill  time.Duration // 0: no answer learned yet
		retry time.Duration
		want  time.Duration
	}{
		{"fill unknown: as told", 0, time.Minute, time.Minute},
		{"within the fill time: as told", 2 * time.Second, 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"longer: the fill time", 2 * time.Second, time.Minute, 2 * time.Second},
		{"a fill shorter than two ticks: two ticks", 5 * time.Millisecond, time.Second, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.ruleFill.Store(int64(tc.fill))
			assert.Equal(t, tc.want, c.denial(ks, tc.retry))
		})
	}
}

// TestDenialOnHeldBucket: a key whose bucket another process holds whole in
// a lease of a minute is refused with the server's wait for that lease to
// end, but is denied locally only until the bucket could have filled (2 s
// here), and then asks again.
func TestDenialOnHeldBucket(t *testing.T) {
	const rules = `
rules:
  - {name: h, match: "h:*", limit: 10, period: 1s, burst: 20, lease_ttl: 1m}
`
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 20, LeaseTTL: time.Minute}
	ctx := context.Background()
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
	out, err := store.Lease(ctx, leases.Owner{Client: "other", Process: "p"}, []leases.LeaseOp{{Key: "h:k", Bucket: b, Want: 20, NewLeaseID: leases.NewLeaseID()}})
	require.NoError(t, err)
	require.EqualValues(t, 20, out[0].Granted, "the other process holds the whole bucket")

	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}}, clk)
	d := c.Allow(ctx, "h:k")
	require.False(t, d.Allowed)
	assert.Equal(t, 2*time.Second, d.RetryAfter, "the fill time, not the minute the lease has left")
	calls := c.Stats().ServerCalls
	d = c.Allow(ctx, "h:k")
	require.False(t, d.Allowed)
	assert.Equal(t, SourceRetryAfter, d.Source, "denied locally")
	assert.LessOrEqual(t, d.RetryAfter, 2*time.Second)
	assert.Equal(t, calls, c.Stats().ServerCalls, "without a call")

	clk.move(2 * time.Second)
	d = c.Allow(ctx, "h:k")
	assert.False(t, d.Allowed, "the lease still holds the bucket")
	assert.Greater(t, c.Stats().ServerCalls, calls, "asked again once the bucket could have filled")
}
