package client

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/protocol"
)

// leaseGate is a front to a lease server that holds every lease call
// asking for tokens until the test decides how to answer them (open);
// every other call (direct takes, returns) passes at once.
type leaseGate struct {
	url     string
	arrived chan struct{} // a lease call asking for tokens is held
	takes   atomic.Int64  // direct takes passed
	pass    gateAnswer    // forwards to the lease server

	opened chan struct{} // closed by open: answer is set
	answer gateAnswer
	once   sync.Once
}

// gateAnswer answers a call: w, the call and its body.
type gateAnswer func(w http.ResponseWriter, r *http.Request, body []byte)

func newLeaseGate(t *testing.T, target string) *leaseGate {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	g := &leaseGate{arrived: make(chan struct{}, 16), opened: make(chan struct{})}
	g.pass = func(w http.ResponseWriter, r *http.Request, body []byte) {
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req protocol.LeaseRequest
		_ = json.Unmarshal(body, &req)
		g.takes.Add(int64(len(req.Takes)))
		wants := false
		for _, e := range req.Leases {
			wants = wants || e.Want > 0
		}
		if !wants {
			g.pass(w, r, body)
			return
		}
		select {
		case g.arrived <- struct{}{}:
		default:
		}
		select {
		case <-g.opened:
			g.answer(w, r, body)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { g.open(g.pass) }) // nothing stays held
	g.url = srv.URL
	return g
}

// open answers every lease call held, and every later one, with a.
func (g *leaseGate) open(a gateAnswer) {
	g.once.Do(func() {
		g.answer = a
		close(g.opened)
	})
}

// entryAnswer answers every lease entry of the call with res, Key and
// Slot filled in.
func entryAnswer(res protocol.LeaseResult) gateAnswer {
	return func(w http.ResponseWriter, _ *http.Request, body []byte) {
		var req protocol.LeaseRequest
		_ = json.Unmarshal(body, &req)
		out := protocol.LeaseResponse{}
		for _, e := range req.Leases {
			r := res
			r.Key, r.Slot = e.Key, e.Slot
			out.Leases = append(out.Leases, r)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}
}

// TestPromotedKeyWaitsForItsFirstLease: once a key is promoted, its
// decisions wait for the first lease in flight instead of each taking
// directly (a call and Redis work apiece), and are served from it. When no
// lease comes — refused, none granted, the call failed, or slower than
// RequestTimeout — they go on as they would have: directly, or by the
// fallback once no server answers; never denied for want of the lease.
// The client's clock is driven, so the RequestTimeout bound is reached by
// moving it, not by waiting.
func TestPromotedKeyWaitsForItsFirstLease(t *testing.T) {
	const waiters = 3
	for _, tc := range []struct {
		name    string
		answer  func(g *leaseGate) gateAnswer // nil: no answer within RequestTimeout
		sources []Source                      // the sources the waiters may get
		direct  bool                          // they are decided by direct takes
	}{
		{"granted: served from the lease", func(g *leaseGate) gateAnswer { return g.pass }, []Source{SourceLease}, false},
		{"refused: directly", func(*leaseGate) gateAnswer {
			return entryAnswer(protocol.LeaseResult{Error: &protocol.Problem{Code: protocol.CodeTooManyLeases, Status: http.StatusTooManyRequests, Title: "Too many open leases on the key"}})
		}, []Source{SourceDirect}, true},
		{"none granted: directly", func(*leaseGate) gateAnswer {
			return entryAnswer(protocol.LeaseResult{TTLMillis: 2000, RetryAfterMillis: 500})
		}, []Source{SourceDirect}, true},
		{"the call failed: directly or by the fallback", func(*leaseGate) gateAnswer {
			return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				http.Error(w, "down", http.StatusServiceUnavailable)
			}
		}, []Source{SourceDirect, SourceFallback}, false},
		{"slower than RequestTimeout: directly", nil, []Source{SourceDirect}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := leasetest.Start(t, `
rules:
  - {name: s, match: "s:*", limit: 100000, period: 1s, lease_ttl: 2s}
`, leasetest.Options{})
			g := newLeaseGate(t, srv.URL())
			clk := newTestClock()
			c := clockedClient(t, Config{
				Servers: []string{g.url}, LeaseMinTokens: 1, Fallback: FallbackOpen,
				// One attempt, no retry: the failed call fails at once.
				MaxRetryWait: time.Millisecond,
			}, clk)
			ctx := context.Background()

			// The first decision is direct and promotes the key; the loop
			// asks for its first lease, which the gate holds.
			d := c.Allow(ctx, "s:k")
			require.True(t, d.Allowed)
			require.Equal(t, SourceDirect, d.Source)
			<-g.arrived
			takes := g.takes.Load()

			// Decisions now wait for that lease: each holds a timer of
			// RequestTimeout on the client's clock, and none takes.
			var wg sync.WaitGroup
			got := make([]Decision, waiters)
			for i := range got {
				wg.Go(func() { got[i] = c.Allow(ctx, "s:k") })
			}
			require.Eventually(t, func() bool { return clk.waiting() == waiters }, 5*time.Second, time.Millisecond)
			assert.Equal(t, takes, g.takes.Load(), "no direct take while the lease is in flight")

			if tc.answer != nil {
				g.open(tc.answer(g))
			} else {
				clk.move(c.cfg.RequestTimeout)
			}
			wg.Wait()
			for _, d := range got {
				assert.True(t, d.Allowed, "never denied for want of the lease: %s", d.Source)
				assert.Contains(t, tc.sources, d.Source)
			}
			if tc.direct {
				assert.Equal(t, takes+waiters, g.takes.Load(), "each decided by a direct take")
			}
			g.open(g.pass) // a call still held goes, so the client closes at once
		})
	}
}
