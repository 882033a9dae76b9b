package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
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
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// noLeaks checks, after every cleanup of the test, that no goroutine the
// test started is left.
func noLeaks(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
}

const faultRules = `
rules:
  - {name: f, match: "f:*", limit: 100, period: 1s, lease_ttl: 600ms}
`

// countSources calls Allow for d at about 1,000 calls per second and counts
// the allowed decisions by source.
func countSources(c *client.Client, key string, d time.Duration) map[client.Source]int {
	got := map[client.Source]int{}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if dec := c.Allow(context.Background(), key); dec.Allowed {
			got[dec.Source]++
		}
		time.Sleep(time.Millisecond)
	}
	return got
}

// TestServerStoppedMidRun: open leases keep serving while the server is
// down, then the fallback (at the safe rate), then leases again when the
// server is back.
func TestServerStoppedMidRun(t *testing.T) {
	noLeaks(t)
	srv := leasetest.Start(t, faultRules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, InitialBatch: 100, RequestTimeout: 200 * time.Millisecond, MaxRetryWait: 50 * time.Millisecond, LeaseMinTokens: 1})
	ctx := context.Background()
	leaseKey(t, c, "f:1")

	srv.Stop()
	// The open lease serves first (its tokens are ours until its deadline).
	d := c.Allow(ctx, "f:1")
	require.True(t, d.Allowed)
	assert.Equal(t, client.SourceLease, d.Source)

	// Then, after the lease's deadline, the fallback at the safe rate
	// (100/s for the only client on the key).
	got := countSources(c, "f:1", 1500*time.Millisecond)
	t.Logf("server down: %v", got)
	assert.Positive(t, got[client.SourceFallback], "the fallback decided once the lease ended")
	assert.LessOrEqual(t, got[client.SourceFallback], 100*3/2+10, "the fallback held the safe rate")
	assert.False(t, c.Stats().Online)

	srv.Restart()
	require.Eventually(t, func() bool {
		d := c.Allow(ctx, "f:1")
		return d.Allowed && d.Source == client.SourceLease
	}, 3*time.Second, 5*time.Millisecond, "leases resume when the server is back")
	assert.True(t, c.Stats().Online)
}

// TestFailover: the first server is dead; the client uses the second.
// (Unrouted, so that the dead server is the one asked first; the routed
// takes' failover is TestRoutingFailover's.)
func TestFailover(t *testing.T) {
	noLeaks(t)
	srv := leasetest.Start(t, faultRules, leasetest.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	c := newClient(t, client.Config{Servers: []string{dead, srv.URL()}, NoKeyRouting: true})
	d := c.Allow(context.Background(), "f:2")
	assert.True(t, d.Allowed)
	assert.Equal(t, client.SourceDirect, d.Source)
	assert.EqualValues(t, 2, c.Stats().ServerCalls, "one failed attempt, then the other server")
	assert.EqualValues(t, 0, c.Stats().ServerErrors)
}

// TestBadServers: a server that answers garbage, 500s, lies or hangs
// leads to the fallback, never a panic or a leaked goroutine.
func TestBadServers(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"garbage JSON", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"leases": [{"key": 5`))
		}},
		{"HTTP 500", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "boom", http.StatusInternalServerError)
		}},
		{"503 with a long Retry-After", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "3600")
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}},
		{"grants more than asked", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"leases":[{"key":"f:3","lease_id":"x","granted":1000000000,"ttl_ms":1000}]}`))
		}},
		{"answers another key", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"leases":[{"key":"f:other","lease_id":"x","granted":1,"ttl_ms":1000}]}`))
		}},
		{"wrong number of results", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"leases":[]}`))
		}},
		{"hangs", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(300 * time.Millisecond):
			}
		}},
		{"HTML", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`<html>proxy error</html>`))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noLeaks(t)
			var calls atomic.Int64
			bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				tt.handler(w, r)
			}))
			t.Cleanup(bad.Close)
			var errs atomic.Int64
			c := newClient(t, client.Config{
				Servers:          []string{bad.URL},
				Fallback:         client.FallbackOpen,
				ColdStartTimeout: 20 * time.Millisecond,
				RequestTimeout:   100 * time.Millisecond,
				MaxRetryWait:     20 * time.Millisecond,
				OnServerError:    func(error) { errs.Add(1) },
			})
			start := time.Now()
			d := c.Allow(context.Background(), "f:3")
			assert.Less(t, time.Since(start), time.Second, "Allow does not wait for a bad server")
			assert.True(t, d.Allowed)
			assert.Equal(t, client.SourceFallback, d.Source)
			require.Eventually(t, func() bool { return errs.Load() > 0 }, 3*time.Second, 5*time.Millisecond)
			assert.False(t, c.Stats().Online)
			assert.Positive(t, calls.Load())
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			require.NoError(t, c.Close(ctx))
		})
	}
}

// TestPartialCallFailure: a tick with more than protocol.MaxEntries entries
// is sent in chunks; when a later chunk fails, the answers of the earlier
// ones are still installed (their leases are live on the server).
func TestPartialCallFailure(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	target, err := url.Parse(srv.URL())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	// The proxy passes the first full chunk and every smaller call, and
	// fails whatever follows a full chunk: the second chunk of its call.
	var mu sync.Mutex
	fullSeen, passedEntries, failedCalls := false, 0, 0
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req protocol.LeaseRequest
		_ = json.Unmarshal(body, &req)
		mu.Lock()
		pass := !fullSeen
		if len(req.Leases) == protocol.MaxEntries {
			fullSeen = true
		}
		if pass {
			passedEntries += len(req.Leases)
		} else {
			failedCalls++
		}
		mu.Unlock()
		if !pass {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	const n = 1500
	c := newClient(t, client.Config{Servers: []string{front.URL}, Fallback: client.FallbackClosed, ColdStartTimeout: 3 * time.Second})
	var wg sync.WaitGroup
	var leased atomic.Int64
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if d := c.Allow(context.Background(), fmt.Sprint("user:chunk", i)); d.Allowed && d.Source == client.SourceLease {
				leased.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d of %d keys leased; %d entries passed; %d calls failed; full chunk: %v", leased.Load(), n, passedEntries, failedCalls, fullSeen)
	if !fullSeen {
		t.Skip("no tick gathered more than one chunk of keys this time")
	}
	require.Positive(t, failedCalls)
	assert.EqualValues(t, passedEntries, leased.Load(), "every entry the server answered was installed")
}
