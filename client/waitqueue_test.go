package client

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWaitFIFO: Wait callers of a key whose bucket is empty are served in
// the order they called, one token each as the bucket refills, and a
// caller that gives up leaves the queue without holding up the others.
func TestWaitFIFO(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: slow, match: "slow:*", limit: 20, period: 1s, burst: 1}
`, leasetest.Options{})
	c, err := New(Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()
	require.True(t, c.Allow(ctx, "slow:k").Allowed, "the bucket's one token")
	ks := c.state("slow:k")
	queued := func() int {
		ks.mu.Lock()
		defer ks.mu.Unlock()
		return len(ks.mu.waiters)
	}

	const waiters = 5
	done := make(chan int, waiters+1)
	gaveUp, cancel := context.WithCancel(ctx)
	for i := range waiters {
		wctx := ctx
		if i == 2 {
			wctx = gaveUp // the third gives up while it waits
		}
		go func() {
			if err := c.Wait(wctx, "slow:k"); err == nil {
				done <- i
			} else {
				done <- -1
			}
		}()
		// Each joins the queue before the next calls.
		require.Eventually(t, func() bool { return queued() == i+1 }, 5*time.Second, time.Millisecond)
	}
	cancel()
	var order []int
	for range waiters {
		select {
		case i := <-done:
			order = append(order, i)
		case <-time.After(5 * time.Second):
			t.Fatalf("waiters served so far: %v", order)
		}
	}
	assert.Equal(t, []int{-1, 0, 1, 3, 4}, order, "the one that gave up first; the others in the order they called")
	assert.Zero(t, queued())
}
