package client

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// TestRefusalAfterDetachNotFallback (found by the second review of this
// change): a refusal answers the calls given up on before it. A refused
// call made through a sender left its mark, and once the refusal's hold
// ended the next decision took the mark for a server that hangs: the
// client went offline and the fallback (open) allowed a decision for a
// client the server refuses.
func TestRefusalAfterDetachNotFallback(t *testing.T) {
	var refuse atomic.Bool
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		if refuse.Load() {
			return http.StatusUnauthorized, protocol.Problem{Title: "unauthorized", Status: http.StatusUnauthorized, Code: protocol.CodeUnauthorized}
		}
		if len(req.Takes) > 0 && req.Takes[0].Keys[0] == "slow" {
			time.Sleep(100 * time.Millisecond) // slower than its caller waits
		}
		return allowAnswer(req)
	})
	clk := newTestClock()
	clk.move(time.Millisecond)
	c := clockedClient(t, Config{Servers: []string{url}, Fallback: FallbackOpen,
		RequestTimeout: 200 * time.Millisecond, ProbeTimeout: -1}, clk)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	c.Allow(ctx, "slow") // its caller gives up: the next calls go through senders
	cancel()
	require.True(t, c.detach.Load())
	refuse.Store(true)
	require.Equal(t, SourceRefused, c.Allow(context.Background(), "a").Source)
	clk.move(refusalHold + time.Millisecond) // the hold ends: the next decision asks again
	d := c.Allow(context.Background(), "b")
	t.Logf("next decision: %+v; stats %+v", d, c.Stats())
	assert.Equal(t, SourceRefused, d.Source, "the server, which refuses the client, is asked again")
	assert.Zero(t, c.Stats().FallbackDecisions)
}

// TestHungCallCountedOnce (found by the second review of this change): a
// call made through a sender that hangs is an outage RequestTimeout after
// it was sent (checkDetached), and its own failure, after its retries, is
// the same outage: reported once to OnServerError, the backoff doubled
// once.
func TestHungCallCountedOnce(t *testing.T) {
	release := make(chan struct{})
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		<-release
		return allowAnswer(req)
	})
	t.Cleanup(func() { close(release) })
	const rt = 100 * time.Millisecond
	var errs atomic.Int64
	clk := newTestClock()
	clk.move(time.Millisecond)
	c := clockedClient(t, Config{Servers: []string{url}, Fallback: FallbackOpen, RequestTimeout: rt,
		MaxRetryWait: 20 * time.Millisecond, ProbeTimeout: -1,
		OnServerError: func(error) { errs.Add(1) }}, clk)
	impatient := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		c.Allow(ctx, key)
	}
	impatient("h1") // canceled: the next call goes through a sender
	impatient("h2") // the sender's call: the only call in flight from here on
	clk.move(rt)
	require.Equal(t, SourceFallback, c.Allow(context.Background(), "x").Source, "an outage RequestTimeout after the call was sent")
	require.EqualValues(t, 1, errs.Load())
	backoff := c.directBackoff.Load()
	require.Eventually(t, func() bool { // the call's own end, its retries over
		c.direct.mu.Lock()
		defer c.direct.mu.Unlock()
		return c.direct.inflight == 0
	}, 5*time.Second, time.Millisecond)
	t.Logf("OnServerError %d, backoff %v, stats %+v", errs.Load(), time.Duration(c.directBackoff.Load()), c.Stats())
	assert.EqualValues(t, 1, errs.Load(), "one hung call, reported once")
	assert.Equal(t, backoff, c.directBackoff.Load(), "the backoff doubled once")
}

// TestDetachedByServer (found by the second review of this change): routed,
// a server that a caller gave up on sends through senders the decisions of
// the keys it is first for, and of the keys whose takes go to it now, and
// no other: its mark lasts as long as it does not answer (a host gone),
// and cost every direct decision to the other servers a hand-off (65% more
// CPU per decision). The final review found the second half: a key whose
// first server is avoided fails over, and a server there that its callers
// gave up on was never judged (the key denied for ever).
func TestDetachedByServer(t *testing.T) {
	c := clockedClient(t, Config{Servers: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, ProbeTimeout: -1}, newTestClock())
	keyOf := func(srv int) []*keyState {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("k%d", i); func() bool { top, _ := c.http.route(hashString(k), 0); return top == srv }() {
				return []*keyState{newKeyState(k)}
			}
		}
	}
	h0, h1 := &c.http.health[0], &c.http.health[1]
	h0.detach.Store(true)
	assert.True(t, c.detached(keyOf(0), 0), "a key of the server given up on")
	assert.False(t, c.detached(keyOf(1), 0), "a key of the other server")
	h0.failed(1, 2, int64(time.Millisecond), int64(time.Second))
	assert.True(t, c.detached(keyOf(0), 3), "avoided, it is probed through senders")
	h0.detach.Store(false)
	h1.detach.Store(true)
	assert.True(t, c.detached(keyOf(0), 3), "its first server avoided, its takes go to the server given up on")
	assert.False(t, c.detached(keyOf(0), int64(2*time.Second)), "its first server no longer avoided")
}

// TestFailedOverToHungServer (found by the final review of this change):
// routed, a key whose first server refuses connections fails over to a
// server that hangs, seen through callers who give up first; that server
// is judged too (both avoided: the client goes offline and the fallback
// decides). Only the first server's mark was read, the calls to the hung
// one were canceled with their callers, and the key was denied for ever.
func TestFailedOverToHungServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	c := clockedClient(t, Config{Servers: []string{dead, hungServer(t)}, Fallback: FallbackOpen,
		RequestTimeout: 100 * time.Millisecond, ProbeTimeout: -1, LeaseMinTokens: 1 << 30}, nil)
	var key string
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k%d", i); func() bool { top, _ := c.http.route(hashString(k), 0); return top == 0 }() {
			key = k
		}
	}
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		return c.Allow(ctx, key).Source == SourceFallback
	}, 5*time.Second, time.Millisecond, "no server answers: the fallback decides")
	t.Logf("stats %+v", c.Stats())
	assert.False(t, c.Stats().Online)
}

// TestRefusedProbeEndsOutage (found by the final review of this change): a
// probe made while the client took the servers for down, refused (401), is
// an answer: the refusal, not the fallback, decides after it. The client
// stayed offline, and once the refusal's hold ended the fallback (open)
// allowed a decision for a client the server refuses.
func TestRefusedProbeEndsOutage(t *testing.T) {
	var status atomic.Int64
	status.Store(http.StatusServiceUnavailable)
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		s := int(status.Load())
		return s, protocol.Problem{Title: http.StatusText(s), Status: s, Code: protocol.CodeUnauthorized}
	})
	clk := newTestClock()
	clk.move(time.Millisecond)
	c := clockedClient(t, Config{Servers: []string{url}, Fallback: FallbackOpen,
		RequestTimeout: 100 * time.Millisecond, MaxRetryWait: 10 * time.Second, ProbeTimeout: -1}, clk)
	// The server fails, and each probe fails, until the backoff is longer
	// than a refusal's hold.
	for c.directBackoff.Load() <= int64(2*refusalHold) {
		clk.move(time.Duration(c.directBackoff.Load()))
		require.Equal(t, SourceFallback, c.Allow(context.Background(), "a").Source, "offline")
	}
	status.Store(http.StatusUnauthorized)
	clk.move(time.Duration(c.directBackoff.Load())) // the backoff is over: the next decision probes
	require.Equal(t, SourceRefused, c.Allow(context.Background(), "b").Source, "the probe is refused")
	clk.move(refusalHold + time.Millisecond) // the hold ends: the next decision asks again
	d := c.Allow(context.Background(), "c")
	t.Logf("after the hold: %+v; stats %+v", d, c.Stats())
	assert.Equal(t, SourceRefused, d.Source)
	assert.True(t, c.Stats().Online, "the server answers, refusing")
}

// TestCanceledDecisionSpendsNoProbe (found by review): a decision whose
// context has ended, made while the client is offline and its backoff has
// just run out, makes no call; it used to spend the one probe of the
// period and count as a direct take all the same, so the next live
// decision went to the fallback (here denied) while the servers answered.
func TestCanceledDecisionSpendsNoProbe(t *testing.T) {
	url, calls := lyingServer(t, allowAnswer)
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{url}, Fallback: FallbackClosed}, clk)
	// After an outage whose backoff has just ended: the next decision probes.
	c.online.Store(false)
	c.directBackoff.Store(int64(time.Second))
	c.directRetryAt.Store(clk.nanos())

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	d := c.Allow(gone, "b:canceled")
	require.False(t, d.Allowed)
	assert.Zero(t, calls.Load(), "no call for the canceled decision")
	assert.Zero(t, c.Stats().DirectDecisions, "nothing was sent as a direct take")

	d = c.Allow(context.Background(), "b:live")
	assert.Equal(t, SourceDirect, d.Source, "the live decision probes the servers, which answer: %+v", d)
	assert.True(t, d.Allowed)
}
