package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sRules is the rules file of the tests on a driven clock: "s:*", 1,000 a
// second, a lease TTL of 2 s.
const sRules = `
rules:
  - {name: s, match: "s:*", limit: 1000, period: 1s, lease_ttl: 2s}
`

// sBucket is the bucket of an "s:" key of sRules.
var sBucket = leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000, LeaseTTL: 2 * time.Second}

// sState returns the state in store of key, an "s:" key of sRules.
func sState(t *testing.T, store *leases.MemoryStore, key string) leases.BucketState {
	t.Helper()
	st, err := store.State(context.Background(), key, sBucket)
	require.NoError(t, err)
	return st
}

// testClock is a clock the test drives: time moves only by advance, and
// the settle loop ticks only when advance hands it a tick (the channel is
// unbuffered, so advance returns once the loop has taken it).
type testClock struct {
	ns   atomic.Int64
	tick chan time.Time

	mu     sync.Mutex
	timers []testTimer // pending after()s, fired by move
}

type testTimer struct {
	at int64
	ch chan time.Time
}

func newTestClock() *testClock { return &testClock{tick: make(chan time.Time)} }

// after fires once the clock is moved to d from now.
func (k *testClock) after(d time.Duration) (<-chan time.Time, func()) {
	ch := make(chan time.Time, 1)
	k.mu.Lock()
	defer k.mu.Unlock()
	at := k.ns.Load() + int64(d)
	if d <= 0 {
		ch <- time.Time{}
	} else {
		k.timers = append(k.timers, testTimer{at, ch})
	}
	return ch, func() {}
}

// move moves the clock by d without a tick and fires the timers due.
func (k *testClock) move(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.ns.Add(int64(d))
	kept := k.timers[:0]
	for _, tm := range k.timers {
		if tm.at <= now {
			tm.ch <- time.Time{}
		} else {
			kept = append(kept, tm)
		}
	}
	k.timers = kept
}

// waiting returns the number of timers not yet fired.
func (k *testClock) waiting() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.timers)
}

func (k *testClock) nanos() int64 { return k.ns.Load() }

func (k *testClock) ticker(time.Duration) (<-chan time.Time, func()) { return k.tick, func() {} }

// clockedClient starts a client on clk (nil: the monotonic clock), without
// New's probe, closed at the end of the test.
func clockedClient(t *testing.T, cfg Config, clk clock) *Client {
	t.Helper()
	c, err := newClient(cfg, clk)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// advance moves the clock by d and gives the loop one tick.
func (k *testClock) advance(t *testing.T, d time.Duration) {
	t.Helper()
	k.move(d)
	select {
	case k.tick <- time.Time{}:
	case <-time.After(5 * time.Second):
		t.Fatal("the settle loop took no tick")
	}
}

// leaseOnClock makes c's first decision on key, direct, which promotes it
// (Config.LeaseMinTokens 1), and waits for the key's first lease, asked for
// by the loop at once. It returns the key and its lease.
func leaseOnClock(t *testing.T, c *Client, key string) (*keyState, *lease) {
	t.Helper()
	require.Equal(t, SourceDirect, c.Allow(context.Background(), key).Source)
	require.Eventually(t, func() bool { return c.Stats().KeysHeld == 1 }, 5*time.Second, time.Millisecond)
	ks := c.state(key)
	l := ks.active.Load()
	require.NotNil(t, l)
	return ks, l
}

// TestLoopOnChosenTimes drives the settle loop's clock: a key promoted to
// leases gets its lease, which, spent from by nobody, is kept until its
// renewal point (half its TTL), returned then, not renewed; the key costs
// no call afterwards, and asked again it is decided directly, then from
// its new lease. The server runs on real time; only the
// client's is driven.
func TestLoopOnChosenTimes(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: store})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ctx := context.Background()
	outstanding := func() int64 { return sState(t, store, "s:k").Outstanding }

	// The first decision is direct and promotes the key; the loop, woken,
	// asks for its lease.
	d := c.Allow(ctx, "s:k")
	require.True(t, d.Allowed)
	require.Equal(t, SourceDirect, d.Source)
	require.Eventually(t, func() bool { return c.Stats().KeysHeld == 1 }, 5*time.Second, time.Millisecond)
	require.Positive(t, outstanding())

	// Nobody spends from it. Until half its TTL (1 s after it was sent) it
	// is kept...
	clk.advance(t, 999*time.Millisecond)
	clk.advance(t, 0) // a second tick: whatever the first started is applied
	assert.Equal(t, 1, c.Stats().KeysHeld, "kept until its renewal point")
	assert.Positive(t, outstanding())

	// ...and at its renewal point it is returned, not renewed: the key
	// holds nothing, here or at the server.
	clk.advance(t, time.Millisecond)
	require.Eventually(t, func() bool { return c.Stats().KeysHeld == 0 && outstanding() == 0 }, 5*time.Second, time.Millisecond, "returned, not renewed")
	// The server has it back; the client goes back to direct decisions
	// once it has applied the answer, at a tick after it.
	// The loop applies the answer when it arrives and demotes the key at
	// its next tick: tick until it has.
	ks := c.state("s:k")
	for until := time.Now().Add(5 * time.Second); ks.leasing.Load(); {
		require.True(t, time.Now().Before(until), "back to direct decisions")
		clk.advance(t, time.Millisecond)
	}

	// Idle, the key costs no call, however long.
	calls := c.Stats().ServerCalls
	for range 20 {
		clk.advance(t, time.Second)
	}
	assert.Equal(t, calls, c.Stats().ServerCalls, "an idle key costs no call")

	// Asked again, the key is decided directly and promoted again; until its
	// new lease is in, its decisions wait for it (or are decided directly),
	// never denied for want of the lease it returned.
	d = c.Allow(ctx, "s:k")
	require.True(t, d.Allowed)
	require.Equal(t, SourceDirect, d.Source)
	for range 5 {
		d := c.Allow(ctx, "s:k")
		assert.True(t, d.Allowed, "%v", d.Source)
	}
}

// TestStrictFromLateRenewalPoint: a roomy key's lease is spent with one
// clock read in eight spends until its late renewal point (three quarters
// of its TTL), past half its TTL too, and with one per spend from then on.
func TestStrictFromLateRenewalPoint(t *testing.T) {
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ctx := context.Background()

	ks, l := leaseOnClock(t, c, "s:k")
	for range 10 {
		d := c.Allow(ctx, "s:k")
		require.True(t, d.Allowed)
		require.Equal(t, SourceLease, d.Source)
	}
	clk.advance(t, 1200*time.Millisecond)
	clk.advance(t, 0)
	require.Same(t, l, ks.active.Load(), "a roomy key's lease is not renewed before its late renewal point")
	assert.False(t, l.strict.Load(), "past half its TTL, before its late renewal point: one spend in eight reads the clock")

	clk.advance(t, 300*time.Millisecond)
	clk.advance(t, 0) // the loop is done with the tick before
	assert.True(t, l.strict.Load(), "from its late renewal point every spend reads the clock")
}

// TestDecisionWaitsRequestTimeoutInAll: the waits of one decision for
// others' answers and leases share one Config.RequestTimeout. A decision
// that waited 0.9 s for a young key's answer, which promoted the key,
// waits 0.1 s at most for the key's first lease (held at the proxy), then
// takes directly.
func TestDecisionWaitsRequestTimeoutInAll(t *testing.T) {
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	releaseTake, done := make(chan struct{}), make(chan struct{})
	takeArrived, leaseArrived := make(chan struct{}, 1), make(chan struct{}, 1)
	var takes atomic.Int64
	proxy := bodyProxy(t, srv.URL(), func(r *http.Request, body []byte) bool {
		switch {
		case bytes.Contains(body, []byte(`"leases":[{`)):
			// The key's first lease: held until the test ends.
			leaseArrived <- struct{}{}
			select {
			case <-done:
			case <-r.Context().Done():
			}
			return false
		case bytes.Contains(body, []byte(`"takes":[{`)) && takes.Add(1) == 1:
			// The first direct take: held until the test releases it.
			takeArrived <- struct{}{}
			select {
			case <-releaseTake:
			case <-done:
				return false
			}
		}
		return true
	})

	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{proxy}, LeaseMinTokens: 1, RequestTimeout: time.Second, ProbeTimeout: -1}, clk)
	// First of the cleanups: the held lease call then fails at once, and
	// neither the client's Close nor the proxy's waits for it.
	t.Cleanup(func() { close(done) })
	ctx := context.Background()
	first := make(chan Decision, 1)
	go func() { first <- c.Allow(ctx, "s:k") }()
	<-takeArrived
	ks := c.state("s:k")
	second := make(chan Decision, 1)
	go func() { second <- c.Allow(ctx, "s:k") }()
	require.Eventually(t, func() bool { return ks.waiting.Load() == 1 }, 5*time.Second, time.Millisecond, "the second decision waits for the first's answer")

	clk.move(900 * time.Millisecond)
	close(releaseTake)
	d := <-first
	require.True(t, d.Allowed)
	require.Equal(t, SourceDirect, d.Source)
	<-leaseArrived // the answer promoted the key: the loop asks for its lease
	require.Eventually(t, func() bool { return clk.waiting() == 2 }, 5*time.Second, time.Millisecond, "the second decision waits for the lease")

	clk.move(100 * time.Millisecond)
	select {
	case d := <-second:
		assert.True(t, d.Allowed)
		assert.Equal(t, SourceDirect, d.Source, "decided by a direct take once its wait ran out")
	case <-time.After(5 * time.Second):
		t.Fatal("the decision still waits after Config.RequestTimeout in all")
	}
}

// TestMultiKeyDecisionHoldsNothingWhileWaiting: a decision over several
// keys that waits for one of them (here a young key's answer in flight)
// holds no token of the keys before it meanwhile: the token it took from
// the first key's lease is given back during the wait, so the other
// decisions of the process may spend it, and taken again after.
func TestMultiKeyDecisionHoldsNothingWhileWaiting(t *testing.T) {
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	proxy, held := holdTakesOf(t, srv.URL(), "s:b")
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{proxy}, LeaseMinTokens: 1, RequestTimeout: time.Second, ProbeTimeout: -1}, clk)
	ctx := context.Background()

	// s:a is leased.
	require.True(t, c.Allow(ctx, "s:a").Allowed)
	a := c.state("s:a")
	require.Eventually(t, func() bool { return a.active.Load() != nil }, 5*time.Second, time.Millisecond, "s:a leased")
	l := a.active.Load()
	left := l.left()

	// A decision over s:a and s:b, young, takes s:a's token, then waits
	// for the answer of s:b's take in flight.
	d := whileYoungWaits(t, c, held, "s:b", []string{"s:a", "s:b"}, func() {
		assert.Equal(t, left, l.left(), "while it waits, it holds no token of s:a")
	})
	require.True(t, d.Allowed)
	assert.Equal(t, left-1, l.left(), "decided, it took s:a's token again")
}

// bodyProxy forwards to target the requests that pass reads their body
// (it may block them meanwhile) and answers the others 503.
func bodyProxy(t *testing.T, target string, pass func(r *http.Request, body []byte) bool) string {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !pass(r, body) {
			http.Error(w, "held", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	return proxy.URL
}

// TestMultiKeyDecisionKeepsShapedSlot: a decision over several keys that
// took a shaping rule's slot before it waits for another key holds it (a
// slot cannot be given back: let go, it would be lost, and the decision,
// made again after the wait, denied for want of the next slot).
func TestMultiKeyDecisionKeepsShapedSlot(t *testing.T) {
	const rules = `
rules:
  - {name: shape, match: "lb:*", algorithm: leaky_bucket, limit: 100, period: 1s, burst: 40, lease_ttl: 1s}
  - {name: s, match: "s:*", limit: 1000, period: 1s, lease_ttl: 2s}
`
	srv := leasetest.Start(t, rules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	proxy, held := holdTakesOf(t, srv.URL(), "s:b")
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{proxy}, LeaseMinTokens: 1, InitialBatch: 10, RequestTimeout: time.Second, ProbeTimeout: -1}, clk)

	l := leaseShaped(t, c, clk, "lb:a")
	clk.move(time.Duration(l.shape.due(clk.nanos()))) // its next slot is now
	d := whileYoungWaits(t, c, held, "s:b", []string{"lb:a", "s:b"}, func() {})
	assert.True(t, d.Allowed, "the slot it took is still its own: %+v", d)
}

// heldTakes is a proxy's hold on a key's direct takes (see holdTakesOf).
type heldTakes struct {
	arrived <-chan struct{} // a value when a held take reached the proxy
	release func()          // lets the held takes through
}

// holdTakesOf starts a bodyProxy to target that holds the direct takes of
// key until released (or the test ends).
func holdTakesOf(t *testing.T, target, key string) (string, heldTakes) {
	t.Helper()
	ch := make(chan struct{})
	arrived := make(chan struct{}, 1)
	proxy := bodyProxy(t, target, func(r *http.Request, body []byte) bool {
		if bytes.Contains(body, []byte(`"takes":[{`)) && bytes.Contains(body, []byte(`"`+key+`"`)) {
			arrived <- struct{}{}
			select {
			case <-ch:
			case <-r.Context().Done():
				return false
			}
		}
		return true
	})
	var once sync.Once
	release := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release) // before the proxy's Close, which waits for its handlers
	return proxy, heldTakes{arrived: arrived, release: release}
}

// whileYoungWaits decides young, a key never seen, whose take h holds,
// then keys, which wait for young's answer; during that wait it calls
// during, then releases the take and returns the decision over keys.
func whileYoungWaits(t *testing.T, c *Client, h heldTakes, young string, keys []string, during func()) Decision {
	t.Helper()
	ctx := context.Background()
	first := make(chan Decision, 1)
	go func() { first <- c.Allow(ctx, young) }()
	<-h.arrived
	ks := c.state(young)
	both := make(chan Decision, 1)
	go func() { both <- c.Allow(ctx, keys...) }()
	require.Eventually(t, func() bool { return ks.waiting.Load() == 1 }, 5*time.Second, time.Millisecond, "the decision waits for %s's answer", young)
	during()
	h.release()
	require.True(t, (<-first).Allowed)
	return <-both
}

// TestDenialsPromote: at a key whose bucket others hold, this process's
// denials count as demand (on a bucket big enough to lease): the key moves
// to leases, to be served its share in turn rather than find the bucket
// taken at every retry, and its first lease asks for two ticks of the
// bucket's refill only, so that a deferred grant comes soon.
func TestDenialsPromote(t *testing.T) {
	const rules = `
rules:
  - {name: s, match: "s:*", limit: 100, period: 1s, burst: 100, lease_ttl: 2s}
`
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, rules, leasetest.Options{Store: store})
	wants := make(chan string, 16)
	proxy := bodyProxy(t, srv.URL(), func(r *http.Request, body []byte) bool {
		if bytes.Contains(body, []byte(`"leases":[{`)) {
			if m := regexp.MustCompile(`"want":(\d+)`).FindSubmatch(body); m != nil {
				select {
				case wants <- string(m[1]):
				default:
				}
			}
		}
		return true
	})
	ctx := context.Background()
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100, LeaseTTL: 2 * time.Second}
	// Another process took the whole bucket.
	res, err := store.Take(ctx, []leases.TakeOp{{Key: "s:k", Bucket: b, Cost: 100}})
	require.NoError(t, err)
	require.True(t, res[0].Taken)

	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{proxy}}, clk)
	ks := c.state("s:k")
	d := c.Allow(ctx, "s:k")
	require.False(t, d.Allowed)
	require.Equal(t, SourceDirect, d.Source, "denied by the server")
	for range 8 {
		d := c.Allow(ctx, "s:k")
		require.False(t, d.Allowed)
	}
	require.True(t, ks.leasing.Load(), "its denials promoted it")

	// The loop takes the key over at its next tick, while it is denied,
	// and asks for its first lease once the denial has run out: two ticks
	// of refill, 2 tokens at 100/s, not a batch sized to its demand.
	clk.advance(t, 0)
	clk.advance(t, time.Duration(ks.denyUntil.Load()-clk.nanos()))
	clk.advance(t, 0)
	select {
	case w := <-wants:
		assert.Equal(t, "2", w)
	case <-time.After(5 * time.Second):
		t.Fatal("no lease asked for")
	}
}

// TestOnlineAfterLeaseCallsStop: lease calls that failed, and then stopped
// because no key wanted a lease any more, leave the client online once the
// loop holds no key: a failure of calls nobody makes any longer says
// nothing of the servers. The old client cleared Stats.Online at the
// failed lease call and set it again only at an answered one, so it
// reported the servers down for as long as no key was leased again (here
// for a minute of the loop's ticks), while every direct take was answered.
func TestOnlineAfterLeaseCallsStop(t *testing.T) {
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	target, err := url.Parse(srv.URL())
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	var failLeases atomic.Bool
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if failLeases.Load() && bytes.Contains(body, []byte(`"lease_id"`)) {
			http.Error(w, "lease calls fail", http.StatusServiceUnavailable)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{proxy.URL}, LeaseMinTokens: 1, InitialBatch: 50, MaxRetryWait: 100 * time.Millisecond}, clk)
	leaseOnClock(t, c, "s:k")

	// Unused, the lease is returned at its renewal point, and the return
	// fails (its retries included: the call is over): offline while the
	// return waits to be sent again.
	failLeases.Store(true)
	clk.advance(t, time.Second)
	require.Eventually(t, func() bool { return c.Stats().ServerErrors > 0 }, 5*time.Second, time.Millisecond)
	clk.advance(t, 0) // the failure is applied
	require.False(t, c.Stats().Online, "lease calls go unanswered")

	// The lease calls answer again, too late: the lease reaches its
	// deadline before the return is sent again, and nothing is left to
	// return. The client has no lease to ask for or return, and its
	// direct takes are answered: once the loop has dropped the key, it is
	// online.
	failLeases.Store(false)
	clk.advance(t, 1100*time.Millisecond)
	ks := c.state("s:k")
	for i := 0; !c.Stats().Online; i++ {
		require.Less(t, i, 600, "still offline after a minute of ticks; the key leasing: %v, held: %d", ks.leasing.Load(), c.Stats().KeysHeld)
		clk.advance(t, 100*time.Millisecond)
	}
	require.Equal(t, int64(1), c.Stats().ServerErrors)
	assert.Zero(t, c.Stats().KeysHeld)
}
