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
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// gate is a front to a lease server that holds the calls its hold
// function picks until the test decides how to answer them (open); every
// other call passes at once.
type gate struct {
	url     string
	arrived chan struct{} // a call is held
	takes   atomic.Int64  // direct takes that reached the gate
	pass    gateAnswer    // forwards to the lease server

	opened chan struct{} // closed by open: answer is set
	answer gateAnswer
	once   sync.Once
}

// gateAnswer answers a call: w, the call and its body.
type gateAnswer func(w http.ResponseWriter, r *http.Request, body []byte)

func newGate(t *testing.T, target string, hold func(*protocol.LeaseRequest) bool) *gate {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	g := &gate{arrived: make(chan struct{}, 16), opened: make(chan struct{})}
	g.pass = func(w http.ResponseWriter, r *http.Request, body []byte) {
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req protocol.LeaseRequest
		_ = json.Unmarshal(body, &req)
		g.takes.Add(int64(len(req.Takes)))
		if !hold(&req) {
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

// newLeaseGate holds every lease call asking for tokens; direct takes and
// returns pass.
func newLeaseGate(t *testing.T, target string) *gate {
	return newGate(t, target, func(req *protocol.LeaseRequest) bool {
		for _, e := range req.Leases {
			if e.Want > 0 {
				return true
			}
		}
		return false
	})
}

// open answers every lease call held, and every later one, with a.
func (g *gate) open(a gateAnswer) {
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
		answer  func(g *gate) gateAnswer // nil: no answer within RequestTimeout
		sources []Source                 // the sources the waiters may get
		direct  bool                     // they are decided by direct takes
	}{
		{"granted: served from the lease", func(g *gate) gateAnswer { return g.pass }, []Source{SourceLease}, false},
		{"refused: directly", func(*gate) gateAnswer {
			return entryAnswer(protocol.LeaseResult{Error: &protocol.Problem{Code: protocol.CodeTooManyLeases, Status: http.StatusTooManyRequests, Title: "Too many open leases on the key"}})
		}, []Source{SourceDirect}, true},
		{"none granted: directly", func(*gate) gateAnswer {
			return entryAnswer(protocol.LeaseResult{TTLMillis: 2000, RetryAfterMillis: 500})
		}, []Source{SourceDirect}, true},
		{"the call failed: directly or by the fallback", func(*gate) gateAnswer {
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

// TestColdKeyWaitsForItsFirstAnswer: while a cold key's first direct take
// is in flight, the key's other decisions wait for its answer instead of
// each sending a take; they count as demand, as far as the bucket had
// room for them: enough of them promote the key at that answer, and they
// are served from its first lease; too few, or more than the bucket could
// admit, and each then takes directly, as before.
func TestColdKeyWaitsForItsFirstAnswer(t *testing.T) {
	const rules = `
rules:
  - {name: s, match: "s:*", limit: 40, period: 1h, burst: 40, lease_ttl: 2s}
`
	for _, tc := range []struct {
		name     string
		waiters  int
		drained  int64 // tokens another client took first
		leased   bool  // the waiters are served from the key's first lease
		takes    int64 // direct takes in all, at least
		admitted int   // of the waiters
	}{
		// LeaseMinTokens 8: four tokens (half) at twice the pace promote.
		{"three waiters and the first: promoted, served from the lease", 3, 0, true, 1, 3},
		{"two waiters and the first: too few, each takes", 2, 0, false, 3, 2},
		// The first take leaves 2: the five waiters count as 2.
		{"room for two only: not promoted", 5, 37, false, 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := leases.NewMemoryStore(leases.MemoryOptions{})
			t.Cleanup(func() { _ = store.Close() })
			srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
			ctx := context.Background()
			if tc.drained > 0 {
				b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 40, Period: time.Hour, Burst: 40, LeaseTTL: 2 * time.Second}
				res, err := store.Take(ctx, []leases.TakeOp{{Key: "s:k", Bucket: b, Cost: tc.drained}})
				require.NoError(t, err)
				require.True(t, res[0].Taken)
			}
			var first atomic.Bool
			g := newGate(t, srv.URL(), func(req *protocol.LeaseRequest) bool {
				return len(req.Takes) > 0 && first.CompareAndSwap(false, true)
			})
			clk := newTestClock()
			c := clockedClient(t, Config{Servers: []string{g.url}, LeaseMinTokens: 8}, clk)

			// The first decision's take is held at the gate.
			var wg sync.WaitGroup
			var d0 Decision
			wg.Go(func() { d0 = c.Allow(ctx, "s:k") })
			<-g.arrived
			// The others wait for its answer: each holds a timer of
			// RequestTimeout on the client's clock, and none takes.
			got := make([]Decision, tc.waiters)
			for i := range got {
				wg.Go(func() { got[i] = c.Allow(ctx, "s:k") })
			}
			require.Eventually(t, func() bool { return clk.waiting() == tc.waiters }, 5*time.Second, time.Millisecond)
			assert.Equal(t, int64(1), g.takes.Load())

			g.open(g.pass)
			wg.Wait()
			require.True(t, d0.Allowed)
			assert.Equal(t, SourceDirect, d0.Source)
			admitted := 0
			for _, d := range got {
				assert.Equal(t, tc.leased, d.Source == SourceLease, "%s", d.Source)
				if d.Allowed {
					admitted++
				}
			}
			assert.Equal(t, tc.admitted, admitted)
			if tc.leased {
				assert.Equal(t, tc.takes, g.takes.Load(), "only the first took")
			} else {
				assert.GreaterOrEqual(t, g.takes.Load(), tc.takes, "the waiters took, after the answer")
			}
		})
	}
}

// TestYoungKeyOnly: a key's decisions wait for a take in flight only while
// the key may still be promoted by its first admissions (see young): not
// once its answer showed a bucket too small to lease.
func TestYoungKeyOnly(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: s, match: "s:*", limit: 20, period: 1h, burst: 20, lease_ttl: 2s}
`, leasetest.Options{})
	var calls atomic.Int64
	g := newGate(t, srv.URL(), func(req *protocol.LeaseRequest) bool {
		return len(req.Takes) > 0 && calls.Add(1) > 1 // all but the first
	})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{g.url}, LeaseMinTokens: 8}, clk)
	ctx := context.Background()
	require.True(t, c.Allow(ctx, "s:k").Allowed, "the first answer: a bucket of 20, a quarter of it under 8")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { assert.True(t, c.Allow(ctx, "s:k").Allowed) })
	}
	require.Eventually(t, func() bool { return g.takes.Load() == 3 }, 5*time.Second, time.Millisecond, "each decision sent its take")
	assert.Zero(t, clk.waiting(), "none waited")
	g.open(g.pass)
	wg.Wait()
}

// TestRanOutWaitsOnlyWhenRoomy: a key whose lease ran out before its
// renewal came is denied until the renewal is in, unless its bucket was
// roomy (at least twice the lease left at the latest answer): its tokens
// are there, only the renewal was late, and the decision waits for it;
// also when the settle loop has already closed the spent-out lease to ask
// for the next (under load the loop can get there before the decision: a
// flake of this test, which the second case makes certain); the wait ends
// at the renewal's answer, a refusal included.
func TestRanOutWaitsOnlyWhenRoomy(t *testing.T) {
	const rules = `
rules:
  - {name: s, match: "s:*", limit: 1, period: 1h, burst: 1000, lease_ttl: 2s}
`
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1, Period: time.Hour, Burst: 1000, LeaseTTL: 2 * time.Second}
	for _, tc := range []struct {
		name    string
		drained int64 // taken by another client first
		cleared bool  // the loop closes the spent-out lease before the decision
		refused bool  // the renewal grants nothing
		waits   bool
	}{
		{"roomy: waits for the renewal", 0, false, false, true},
		{"roomy, spent-out lease closed by the loop: waits for the renewal", 0, true, false, true},
		{"roomy, renewal refused: waits for its answer only", 0, true, true, true},
		{"tight: denied at once", 900, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := leases.NewMemoryStore(leases.MemoryOptions{})
			t.Cleanup(func() { _ = store.Close() })
			ctx := context.Background()
			if tc.drained > 0 {
				res, err := store.Take(ctx, []leases.TakeOp{{Key: "s:k", Bucket: b, Cost: tc.drained}})
				require.NoError(t, err)
				require.True(t, res[0].Taken)
			}
			srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
			var hold atomic.Bool
			g := newGate(t, srv.URL(), func(req *protocol.LeaseRequest) bool {
				return len(req.Leases) > 0 && hold.Load()
			})
			clk := newTestClock()
			c := clockedClient(t, Config{Servers: []string{g.url}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
			require.True(t, c.Allow(ctx, "s:k").Allowed)
			ks := c.state("s:k")
			require.Eventually(t, func() bool { return ks.active.Load() != nil }, 5*time.Second, time.Millisecond)
			l := ks.active.Load()

			// The renewal is held; the lease is spent out before any tick.
			hold.Store(true)
			for l.left() > 0 {
				require.True(t, c.Allow(ctx, "s:k").Allowed)
			}
			if tc.cleared {
				// A tick: the loop finds the lease spent out, closes it
				// and asks for the next, which the gate holds.
				clk.advance(t, 0)
				<-g.arrived
				require.Nil(t, ks.active.Load(), "the spent-out lease is closed")
			}
			var d Decision
			done := make(chan struct{})
			go func() { d = c.Allow(ctx, "s:k"); close(done) }()
			if tc.waits {
				require.Eventually(t, func() bool { return clk.waiting() == 1 }, 5*time.Second, time.Millisecond, "waiting for the renewal")
				if !tc.cleared {
					<-g.arrived
				}
				if tc.refused {
					g.open(entryAnswer(protocol.LeaseResult{TTLMillis: 2000, RetryAfterMillis: 500}))
				} else {
					g.open(g.pass)
				}
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("the decision still waits after the renewal's answer")
				}
				if tc.refused {
					assert.False(t, d.Allowed, "nothing granted: denied at the answer")
					assert.Equal(t, SourceRetryAfter, d.Source)
					assert.Equal(t, 500*time.Millisecond, d.RetryAfter, "for as long as the server said")
					return
				}
				assert.True(t, d.Allowed)
				assert.Equal(t, SourceLease, d.Source)
				assert.NotSame(t, l, ks.active.Load(), "served from the renewal")
			} else {
				<-done
				assert.False(t, d.Allowed)
				assert.Equal(t, SourceLease, d.Source)
				assert.Zero(t, clk.waiting(), "no wait")
				g.open(g.pass) // the renewal held goes, so the client closes at once
			}
		})
	}
}

// roomyRules makes "s:k" a roomy key: a bucket of 1,000 that its lease
// of about 50 leaves at least twice as full.
const roomyRules = `
rules:
  - {name: s, match: "s:*", limit: 1, period: 1h, burst: 1000, lease_ttl: 2s}
`

// roomyLeased returns a client of the server at url on clk, with "s:k"
// promoted (LeaseMinTokens 1) and holding its first lease l, roomy.
func roomyLeased(t *testing.T, url string, clk *testClock) (*Client, *lease) {
	t.Helper()
	c := clockedClient(t, Config{Servers: []string{url}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	require.True(t, c.Allow(context.Background(), "s:k").Allowed)
	ks := c.state("s:k")
	require.Eventually(t, func() bool { return ks.active.Load() != nil }, 5*time.Second, time.Millisecond)
	l := ks.active.Load()
	require.True(t, c.ranOutRoomy(ks, l, clk.nanos()), "the key is roomy")
	return c, l
}

// TestRoomyPartialLeaseNoPointlessWait (found by review): a roomy key
// whose live lease holds fewer tokens than a decision wants (10 left,
// AllowN(15)) has no renewal coming before its usual point: the decision
// waited for one for the whole RequestTimeout (on this clock, for ever;
// on the real clock 1.0 s), then was denied. It is denied at once now.
func TestRoomyPartialLeaseNoPointlessWait(t *testing.T) {
	srv := leasetest.Start(t, roomyRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	clk := newTestClock()
	c, l := roomyLeased(t, srv.URL(), clk)
	ctx := context.Background()
	for l.left() > 10 {
		require.True(t, c.Allow(ctx, "s:k").Allowed)
	}
	left := l.left()
	done := make(chan Decision, 1)
	go func() { done <- c.AllowN(ctx, left+5, "s:k") }()
	select {
	case d := <-done:
		assert.False(t, d.Allowed)
		assert.Equal(t, SourceLease, d.Source)
	case <-time.After(3 * time.Second):
		clk.move(time.Second) // RequestTimeout: the wait's bound
		d := <-done
		t.Fatalf("AllowN(%d) with %d left in a live lease waited for a renewal no one asks for; after RequestTimeout: %+v", left+5, left, d)
	}
}

// TestRoomyExpiredLeaseWaitsForRenewal (found by review): a roomy key's
// spent-out lease passes its deadline before the settle loop's next scan
// (a paused process). The decision that wakes the loop waits for the
// renewal: the loop's closing of the expired lease, which wakes the key's
// waiters, used to end the wait, and the decision was denied while the
// renewal it woke the loop for was granted a moment later.
func TestRoomyExpiredLeaseWaitsForRenewal(t *testing.T) {
	srv := leasetest.Start(t, roomyRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	var hold atomic.Bool
	g := newGate(t, srv.URL(), func(req *protocol.LeaseRequest) bool {
		return len(req.Leases) > 0 && hold.Load()
	})
	clk := newTestClock()
	c, l := roomyLeased(t, g.url, clk)
	ctx := context.Background()

	hold.Store(true)
	for l.left() > 0 {
		require.True(t, c.Allow(ctx, "s:k").Allowed)
	}
	// The process "pauses" past the lease's deadline: no tick ran.
	clk.move(time.Duration(l.deadline-clk.nanos()) + time.Millisecond)

	var d Decision
	done := make(chan struct{})
	go func() { d = c.Allow(ctx, "s:k"); close(done) }()
	select {
	case <-g.arrived: // the loop asks for the renewal, which the gate holds
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal asked for")
	}
	select {
	case <-done:
		t.Errorf("the decision returned before the renewal was answered: %+v", d)
	case <-time.After(200 * time.Millisecond):
	}
	g.open(g.pass)
	<-done
	assert.True(t, d.Allowed, "served by the renewal it waited for: %+v", d)
	assert.Equal(t, SourceLease, d.Source)
}
