package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
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

// TestSlowServerImpatientCallers: a server slower (60 ms) than its callers
// wait (20 ms) answers every call: it is no outage, and the fallback never
// decides, with one caller at a time and with eight. The old client
// canceled each call as its caller left, so it never saw an answer, and
// after RequestTimeout took the server for dead: the fallback decided
// beside it (28 of 40 decisions with one caller, in a run before the fix).
func TestSlowServerImpatientCallers(t *testing.T) {
	for _, callers := range []int{1, 8} {
		t.Run(fmt.Sprintf("callers=%d", callers), func(t *testing.T) {
			srv := leasetest.Start(t, rules, leasetest.Options{})
			slow := slowProxy(t, srv.URL(), 60*time.Millisecond)
			c := newClient(t, client.Config{Servers: []string{slow}, Fallback: client.FallbackOpen, RequestTimeout: 250 * time.Millisecond})
			var fell atomic.Int64
			var wg sync.WaitGroup
			for g := range callers {
				wg.Go(func() {
					// 40 decisions of 20 ms: three RequestTimeouts. Each
					// key is new, so that none is leased.
					for i := range 40 {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
						d := c.Allow(ctx, fmt.Sprintf("fast:%d-%d", g, i))
						cancel()
						if d.Source == client.SourceFallback {
							fell.Add(1)
						}
					}
				})
			}
			wg.Wait()
			st := c.Stats()
			assert.Zero(t, fell.Load(), "decisions made by the fallback while the server answers")
			assert.Zero(t, st.FallbackDecisions)
			assert.Zero(t, st.ServerErrors)
			assert.True(t, st.Online)
			d := c.Allow(context.Background(), "fast:patient")
			assert.True(t, d.Allowed)
			assert.Equal(t, client.SourceDirect, d.Source, "decided by the server")
		})
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

// heldProxy forwards to target, holding each call that hold says to hold
// until the test ends; arrived receives a value when a held call has
// reached it.
func heldProxy(t *testing.T, target string, hold func(*http.Request) bool) (proxy string, arrived <-chan struct{}) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	release := make(chan struct{})
	in := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold(r) {
			in <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			http.Error(w, "held", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // first: srv.Close waits for the handlers
	return srv.URL, in
}

// holdKey holds the direct takes of key (found in the body) and nothing
// else.
func holdKey(key string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		if r.Body == nil || r.Method != http.MethodPost {
			return false
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return false
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		return bytes.Contains(body, []byte(`"`+key+`"`))
	}
}

// TestDirectDecisionCallerGone: a decision alone in its call makes the
// call itself; when its context ends first, it returns at once, and the
// client counts no failure: it stays online, logs and reports no server
// error, and the next decision goes to the server. With one server (the
// retrying call) and with two (a take routed by key).
func TestDirectDecisionCallerGone(t *testing.T) {
	for _, servers := range []int{1, 2} {
		t.Run(fmt.Sprintf("servers=%d", servers), func(t *testing.T) {
			srv := leasetest.Start(t, rules, leasetest.Options{})
			var urls []string
			var arrived <-chan struct{}
			for range servers {
				u, in := heldProxy(t, srv.URL(), holdKey("tiny:held"))
				urls = append(urls, u)
				if arrived == nil {
					arrived = in
				} else {
					arrived = mergeSignals(arrived, in)
				}
			}
			logs := &recordingHandler{}
			var serverErrors atomic.Int64
			c := newClient(t, client.Config{
				Servers: urls, Fallback: client.FallbackOpen, Logger: slog.New(logs),
				OnServerError: func(error) { serverErrors.Add(1) },
			})
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				<-arrived
				cancel()
			}()
			d := c.Allow(ctx, "tiny:held")
			assert.False(t, d.Allowed)
			assert.Equal(t, client.SourceDirect, d.Source)
			assert.Positive(t, d.RetryAfter)

			st := c.Stats()
			assert.Zero(t, st.ServerErrors)
			assert.Zero(t, st.FallbackDecisions)
			assert.True(t, st.Online)
			assert.Zero(t, serverErrors.Load(), "OnServerError is not called")
			assert.Zero(t, logs.count(slog.LevelWarn, ""), "no warning")
			d = c.Allow(context.Background(), "tiny:next")
			assert.True(t, d.Allowed)
			assert.Equal(t, client.SourceDirect, d.Source, "decided by a server, not the fallback")
		})
	}
}

// TestDirectDecisionClose: Close ends a direct call in flight; its
// decision returns SourceClosed.
func TestDirectDecisionClose(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	u, arrived := heldProxy(t, srv.URL(), holdKey("tiny:held"))
	c, err := client.New(client.Config{Servers: []string{u}})
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() {
		<-arrived
		closed <- c.Close(context.Background())
	}()
	d := c.Allow(context.Background(), "tiny:held")
	assert.False(t, d.Allowed)
	assert.Equal(t, client.SourceClosed, d.Source)
	require.NoError(t, <-closed)
}

// mergeSignals returns a channel that receives every value of a and b.
func mergeSignals(a, b <-chan struct{}) <-chan struct{} {
	out := make(chan struct{}, 16)
	for _, in := range []<-chan struct{}{a, b} {
		go func() {
			for v := range in {
				out <- v
			}
		}()
	}
	return out
}

// TestDirectDecisionCallersGoneHungServer: a server that takes calls and
// never answers, seen only by decisions whose contexts end first: the calls
// made after the first caller gave up are not canceled with their callers,
// and fail after RequestTimeout; the client counts that as an outage, goes
// offline, and the fallback decides.
func TestDirectDecisionCallersGoneHungServer(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	u, _ := heldProxy(t, srv.URL(), func(*http.Request) bool { return true })
	c := newClient(t, client.Config{Servers: []string{u}, Fallback: client.FallbackOpen, RequestTimeout: 200 * time.Millisecond, ProbeTimeout: -1})
	decide := func() client.Decision {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		return c.Allow(ctx, "tiny:hung")
	}
	d := decide()
	assert.False(t, d.Allowed)
	assert.True(t, c.Stats().Online, "one caller gone is no outage")
	require.Eventually(t, func() bool { decide(); return !c.Stats().Online }, 5*time.Second, time.Millisecond, "offline once nothing answered for RequestTimeout")
	d = decide()
	assert.True(t, d.Allowed)
	assert.Equal(t, client.SourceFallback, d.Source)
}

// TestHungServerDetectedAfterRequestTimeout (found by this change's
// review): a server that hangs, seen only by callers who give up first,
// is taken for dead about RequestTimeout after the first call made
// through a sender (see takeDirect); waiting for that call's own end took
// the HTTP client's retries (434 ms for a RequestTimeout of 200 ms, in a
// run before the fix).
func TestHungServerDetectedAfterRequestTimeout(t *testing.T) {
	const rt = 200 * time.Millisecond
	c := hungClient(t, rt, 200*time.Millisecond)
	start := time.Now()
	for c.Stats().Online && time.Since(start) < 5*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		c.Allow(ctx, "tiny:hung")
		cancel()
	}
	took := time.Since(start)
	t.Logf("offline after %v (RequestTimeout %v)", took, rt)
	assert.Less(t, took, rt+rt/2, "offline about RequestTimeout after the first call went unanswered")
}

// TestPatientBehindDetachedSenders (found by this change's review): a
// decision queued behind calls that its impatient predecessors left to
// senders, at a server that hangs, is not sent to that server once a call
// has found it dead: it is decided as no server answers, after about one
// failed call (803 ms for a RequestTimeout of 200 ms when it was sent, in
// a run before the fix).
func TestPatientBehindDetachedSenders(t *testing.T) {
	const rt = 200 * time.Millisecond
	c := hungClient(t, rt, 20*time.Millisecond)
	impatient := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		c.Allow(ctx, key)
	}
	impatient("tiny:a") // its call canceled: the calls after it go through senders
	var wg sync.WaitGroup
	for _, k := range []string{"tiny:b", "tiny:c", "tiny:d", "tiny:e"} {
		wg.Go(func() { impatient(k) })
	}
	wg.Wait()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := c.Allow(ctx, "tiny:patient")
	took := time.Since(start)
	t.Logf("patient decision: %s allowed=%v after %v", d.Source, d.Allowed, took)
	assert.Equal(t, client.SourceFallback, d.Source)
	assert.Less(t, took, 3*rt, "a patient decision waits for about one failed call, not two")
}

// hungClient returns a client (fallback open) of a server whose every call
// hangs until the test ends.
func hungClient(t *testing.T, requestTimeout, maxRetryWait time.Duration) *client.Client {
	t.Helper()
	srv := leasetest.Start(t, rules, leasetest.Options{})
	u, _ := heldProxy(t, srv.URL(), func(*http.Request) bool { return true })
	return newClient(t, client.Config{Servers: []string{u}, Fallback: client.FallbackOpen,
		RequestTimeout: requestTimeout, MaxRetryWait: maxRetryWait, ProbeTimeout: -1})
}

// TestDirectCanceledNotSent: a decision whose context ended before it was
// made sends no take (its tokens would be spent at the server for a request
// that does not happen), and is not allowed. Before, the call sometimes
// went out before the context's AfterFunc canceled it
// (TestTransportRefusedClosesBody failed so in 2 runs of 200 under load).
func TestDirectCanceledNotSent(t *testing.T) {
	c := transportClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2000 {
		d := c.Allow(ctx, fmt.Sprintf("b:canceled-%d", i))
		require.False(t, d.Allowed, "decision %d", i)
	}
	st := c.Stats()
	assert.Zero(t, st.ServerCalls, "calls sent for decisions whose context had ended")
	assert.Zero(t, st.Allowed)
}
