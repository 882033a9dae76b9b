package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGoneDecisionsNotSent: decisions queued behind maxDirectCalls calls in
// flight whose callers give up before a sender is free are not sent: their
// takes would spend tokens that no one uses. The decision queued with them
// that still waits is sent and answered.
func TestGoneDecisionsNotSent(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, maxDirectCalls)
	var mu sync.Mutex
	var seen []string
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		held := false
		mu.Lock()
		for _, tk := range req.Takes {
			seen = append(seen, tk.Keys...)
			held = held || strings.HasPrefix(tk.Keys[0], "q:held")
		}
		mu.Unlock()
		if held {
			arrived <- struct{}{}
			<-release
		}
		return allowAnswer(req)
	})
	c := clockedClient(t, Config{Servers: []string{url}, Fallback: FallbackOpen}, newTestClock())

	var wg sync.WaitGroup
	for i := range maxDirectCalls {
		wg.Go(func() { assert.True(t, c.Allow(context.Background(), fmt.Sprintf("q:held%d", i)).Allowed) })
	}
	for range maxDirectCalls {
		<-arrived // every call the client may have in flight is held
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		d := c.Allow(ctx, fmt.Sprintf("q:gone%d", i))
		cancel()
		require.False(t, d.Allowed, "decided without an answer")
	}
	live := make(chan Decision, 1)
	go func() { live <- c.Allow(context.Background(), "q:live") }()
	require.Eventually(t, func() bool {
		c.direct.mu.Lock()
		defer c.direct.mu.Unlock()
		return len(c.direct.pending) == 4
	}, 5*time.Second, time.Millisecond, "the live decision queued behind the calls in flight")
	close(release)
	d := <-live
	assert.True(t, d.Allowed)
	assert.Equal(t, SourceDirect, d.Source)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, seen, "q:live")
	for _, k := range seen {
		assert.NotContains(t, k, "q:gone", "a take sent for a decision that had returned")
	}
	assert.Len(t, seen, maxDirectCalls+1)
}
