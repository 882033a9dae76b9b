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

const priorityRules = `
rules:
  - {name: reserved, match: "r:*", limit: 10, period: 1h, reserve: {critical: 30%}}
  - {name: half, match: "h:*", limit: 40, period: 1h, lease_ttl: 5s, reserve: {critical: 50%}}
`

// TestPriorityDirect: a low-priority process takes a key down to its
// floor and is then denied, locally; a critical call on the same key is
// still decided by the server, under its own class, and takes the
// reserve.
func TestPriorityDirect(t *testing.T) {
	srv := leasetest.Start(t, priorityRules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, Priority: client.PriorityLow, LeaseMinTokens: 1000})
	ctx := context.Background()
	allowed := 0
	for range 20 {
		if c.Allow(ctx, "r:1").Allowed {
			allowed++
		}
	}
	assert.Equal(t, 7, allowed, "10 less the 3 reserved for critical")
	d := c.Allow(ctx, "r:1")
	require.False(t, d.Allowed)
	assert.Equal(t, client.SourceRetryAfter, d.Source, "low is denied locally until the retry")

	crit := client.WithPriority(ctx, client.PriorityCritical)
	for i := range 3 {
		d := c.Allow(crit, "r:1")
		require.True(t, d.Allowed, "critical call %d: %+v", i, d)
		assert.Equal(t, client.SourceDirect, d.Source)
	}
	d = c.Allow(crit, "r:1")
	assert.False(t, d.Allowed, "the limit is spent")
	assert.Equal(t, client.SourceDirect, d.Source)
	assert.Equal(t, client.SourceRetryAfter, c.Allow(ctx, "r:1").Source, "a critical denial does not change low's")

	p, ok := client.PriorityFrom(crit)
	assert.True(t, ok)
	assert.Equal(t, client.PriorityCritical, p)
	_, ok = client.PriorityFrom(ctx)
	assert.False(t, ok)
}

// TestPriorityLeased: a leased key's lease carries the process's class, so
// its grants stop at the class's floor; a call of another class is never
// served from the lease but decided directly, and takes the reserve.
func TestPriorityLeased(t *testing.T) {
	srv := leasetest.Start(t, priorityRules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, Priority: client.PriorityLow, LeaseMinTokens: 1, InitialBatch: 10})
	ctx := context.Background()
	allowed := leaseKey(t, c, "h:1")
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		d := c.Allow(ctx, "h:1")
		if d.Allowed {
			allowed++
			continue
		}
		if d.Source == client.SourceRetryAfter || d.Source == client.SourceDirect {
			break
		}
		time.Sleep(time.Millisecond)
	}
	assert.LessOrEqual(t, allowed, 20, "low never takes the half kept for critical")
	assert.GreaterOrEqual(t, allowed, 15, "low gets what lies above its floor, less what its lease still holds")

	crit := client.WithPriority(ctx, client.PriorityCritical)
	calls := c.Stats().ServerCalls
	d := c.Allow(crit, "h:1")
	require.True(t, d.Allowed, "%+v", d)
	assert.Equal(t, client.SourceDirect, d.Source, "never from the low lease")
	assert.Greater(t, c.Stats().ServerCalls, calls)
}

func TestPriorityConfig(t *testing.T) {
	tests := []struct {
		name     string
		priority string
		err      string
	}{
		{"default", "", ""},
		{"critical", client.PriorityCritical, ""},
		{"unknown", "urgent", `client: invalid Config: Priority: "urgent" is not a priority class`},
		{"case matters", "LOW", `"LOW" is not a priority class`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:1"}, Priority: tt.priority, ProbeTimeout: -1})
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				assert.ErrorIs(t, err, client.ErrInvalidConfig)
				return
			}
			require.NoError(t, err)
			_ = c.Close(context.Background())
		})
	}
}
