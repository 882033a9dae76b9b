package client_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
)

// TestLeasedDecisionsAllocateNothing: a decision served by a live lease
// allocates nothing, through every entry point of the hot path. An
// allocation per decision makes the garbage collector run in proportion to
// the traffic, and its assists land on decisions: the tail latency of a
// leased key, not its mean, is what an allocation costs.
func TestLeasedDecisionsAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; run without -race")
	}
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 1000})
	ctx := context.Background()
	leaseKey(t, c, "fast:1")
	leaseKey(t, c, "fast:2")
	lim := c.Limiter("fast:1")

	tests := []struct {
		name string
		f    func() bool
	}{
		{"Client.Allow", func() bool { return c.Allow(ctx, "fast:1").Allowed }},
		{"Client.AllowN", func() bool { return c.AllowN(ctx, 2, "fast:1").Allowed }},
		{"Client.Allow two keys", func() bool { return c.Allow(ctx, "fast:1", "fast:2").Allowed }},
		{"Limiter.Allow", lim.Allow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allowed := true
			allocs := testing.AllocsPerRun(20, func() { allowed = tt.f() && allowed })
			assert.True(t, allowed, "the lease served every decision")
			assert.Zero(t, allocs, "allocations per decision")
		})
	}
}
