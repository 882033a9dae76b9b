package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// routeRules: keys never leased (the client's LeaseMinTokens is above a
// quarter of the bucket), so that every decision is a direct take.
const routeRules = `
rules:
  - {name: r, match: "r:*", limit: 100000, period: 1s}
`

// takeRecorder is the HTTP transport of a client under test: it records,
// per server (host), the takes the server answered, by first key, and the
// calls carrying takes that failed there.
type takeRecorder struct {
	base *http.Transport

	mu       sync.Mutex
	answered map[string]map[string]int // host -> first key -> takes answered
	failed   map[string]int            // host -> failed calls
}

func newTakeRecorder(t *testing.T) *takeRecorder {
	r := &takeRecorder{base: http.DefaultTransport.(*http.Transport).Clone(), answered: map[string]map[string]int{}, failed: map[string]int{}}
	t.Cleanup(r.base.CloseIdleConnections)
	return r
}

func (r *takeRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := r.base.RoundTrip(out)
	var lr protocol.LeaseRequest
	if req.URL.Path != protocol.PathLeases || json.Unmarshal(body, &lr) != nil || len(lr.Takes) == 0 {
		return resp, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	host := req.URL.Host
	if err != nil || resp.StatusCode != http.StatusOK {
		r.failed[host]++
		return resp, err
	}
	if r.answered[host] == nil {
		r.answered[host] = map[string]int{}
	}
	for _, tk := range lr.Takes {
		r.answered[host][tk.Keys[0]]++
	}
	return resp, err
}

func (r *takeRecorder) CloseIdleConnections() { r.base.CloseIdleConnections() }

// hosts returns, per server, the takes of key it answered.
func (r *takeRecorder) hosts(key string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for h, keys := range r.answered {
		if n := keys[key]; n > 0 {
			out[h] = n
		}
	}
	return out
}

// host returns the one server that answered key's takes.
func (r *takeRecorder) host(t *testing.T, key string) string {
	t.Helper()
	hs := r.hosts(key)
	require.Len(t, hs, 1, "key %q: answered by %v", key, hs)
	for h := range hs {
		return h
	}
	return ""
}

// answers returns the takes server host answered.
func (r *takeRecorder) answers(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.answered[host] {
		n += c
	}
	return n
}

// failures returns the calls carrying takes that failed at host.
func (r *takeRecorder) failures(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed[host]
}

// startServers starts n lease servers sharing one store.
func startServers(t *testing.T, n int) []*leasetest.Server {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() }) // after the servers stop
	srvs := make([]*leasetest.Server, n)
	for i := range srvs {
		srvs[i] = leasetest.Start(t, routeRules, leasetest.Options{Store: store})
	}
	return srvs
}

func urlsOf(srvs ...*leasetest.Server) []string {
	out := make([]string, len(srvs))
	for i, s := range srvs {
		out[i] = s.URL()
	}
	return out
}

// routedClient starts a client whose calls rec records (clk nil: the
// monotonic clock). Its keys are never leased.
func routedClient(t *testing.T, rec *takeRecorder, clk clock, cfg Config) *Client {
	t.Helper()
	cfg.HTTPClient = &http.Client{Transport: rec}
	cfg.LeaseMinTokens = 1 << 40
	return clockedClient(t, cfg, clk)
}

// routedSetup starts three servers and a client of them all, with cfg.
func routedSetup(t *testing.T, cfg Config) ([]*leasetest.Server, *takeRecorder, *Client) {
	t.Helper()
	srvs := startServers(t, 3)
	rec := newTakeRecorder(t)
	cfg.Servers = urlsOf(srvs...)
	return srvs, rec, routedClient(t, rec, nil, cfg)
}

// allowAll decides each key n times, from workers goroutines at once, so
// that the takes coalesce into calls grouped by server; every decision must
// be a direct take, allowed.
func allowAll(t *testing.T, c *Client, keys []string, n, workers int) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []Decision
	next := make(chan string)
	for range workers {
		wg.Go(func() {
			for k := range next {
				if d := c.Allow(context.Background(), k); !d.Allowed || d.Source != SourceDirect {
					mu.Lock()
					bad = append(bad, d)
					mu.Unlock()
				}
			}
		})
	}
	for range n {
		for _, k := range keys {
			next <- k
		}
	}
	close(next)
	wg.Wait()
	require.Empty(t, bad, "every decision a direct take, allowed")
}

func routeKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("r:%s:%d", prefix, i)
	}
	return keys
}

// TestRoutingOneServerPerKey: among three servers, every direct take of a
// key goes to the same one, however the takes coalesce.
func TestRoutingOneServerPerKey(t *testing.T) {
	srvs, rec, c := routedSetup(t, Config{})
	keys := routeKeys("same", 5)
	allowAll(t, c, keys, 20, 8)
	for _, k := range keys {
		h := rec.host(t, k)
		assert.Equal(t, 20, rec.hosts(k)[h], "key %q: every take at %s", k, h)
	}
	for _, s := range srvs {
		assert.Zero(t, rec.failures(s.Addr()))
	}
	assert.True(t, c.Stats().Online)
}

// TestRoutingSpreadsKeys: different keys spread over the servers, about
// evenly.
func TestRoutingSpreadsKeys(t *testing.T) {
	srvs, rec, c := routedSetup(t, Config{})
	keys := routeKeys("spread", 300)
	allowAll(t, c, keys, 1, 16)
	per := map[string]int{}
	for _, k := range keys {
		per[rec.host(t, k)]++
	}
	t.Logf("keys per server: %v", per)
	for _, s := range srvs {
		assert.GreaterOrEqual(t, per[s.Addr()], 60, "server %s", s.Addr())
	}
}

// TestRoutingIgnoresServerOrder: two clients that list the servers in
// other orders send each key to the same server.
func TestRoutingIgnoresServerOrder(t *testing.T) {
	srvs := startServers(t, 3)
	recA, recB := newTakeRecorder(t), newTakeRecorder(t)
	a := routedClient(t, recA, nil, Config{Servers: urlsOf(srvs[0], srvs[1], srvs[2])})
	var other []string
	for _, u := range urlsOf(srvs[2], srvs[0], srvs[1]) {
		other = append(other, u+"/") // the same server: the slash is trimmed
	}
	b := routedClient(t, recB, nil, Config{Servers: other})
	keys := routeKeys("order", 100)
	allowAll(t, a, keys, 1, 8)
	allowAll(t, b, keys, 1, 8)
	for _, k := range keys {
		assert.Equal(t, recA.host(t, k), recB.host(t, k), "key %q", k)
	}
}

// TestRoutingFailover: when a key's server is stopped, its takes go to the
// next server in the key's rendezvous order (the one a client without the
// stopped server prefers); the stopped server is avoided for its backoff,
// even once back, so that its keys do not each try it first; after the
// backoff, one take probes it, and its keys return to it. The client's
// clock is driven: the backoff ends when the test says.
func TestRoutingFailover(t *testing.T) {
	srvs := startServers(t, 3)
	rec := newTakeRecorder(t)
	clk := newTestClock()
	c := routedClient(t, rec, clk, Config{Servers: urlsOf(srvs...), MaxRetryWait: time.Second})
	ctx := context.Background()
	down := srvs[0]
	others := urlsOf(srvs[1], srvs[2])

	// The keys whose server is down's, and where each goes without it.
	keys := routeKeys("failover", 60)
	allowAll(t, c, keys, 1, 1)
	var mine []string
	for _, k := range keys {
		if rec.host(t, k) == down.Addr() {
			mine = append(mine, k)
		}
	}
	require.GreaterOrEqual(t, len(mine), 5, "keys of the server to stop")
	refRec := newTakeRecorder(t)
	ref := routedClient(t, refRec, nil, Config{Servers: others})
	allowAll(t, ref, mine, 1, 1)
	next := map[string]string{}
	for _, k := range mine {
		next[k] = refRec.host(t, k)
	}

	down.Stop()
	before := rec.answers(down.Addr())
	for _, k := range mine {
		d := c.Allow(ctx, k)
		require.True(t, d.Allowed, "key %q: %v", k, d.Source)
		require.Equal(t, SourceDirect, d.Source, "a server answered: no fallback")
	}
	for _, k := range mine {
		assert.Equal(t, 1, rec.hosts(k)[next[k]], "key %q: failed over to the next server of its order", k)
	}
	assert.Equal(t, 1, rec.failures(down.Addr()), "the stopped server is tried once, then avoided")
	assert.Zero(t, c.Stats().ServerErrors, "another server answered every take")
	assert.True(t, c.Stats().Online)

	// Back, but within its backoff: still avoided.
	down.Restart()
	allowAll(t, c, mine, 1, 1)
	assert.Equal(t, before, rec.answers(down.Addr()), "avoided during its backoff")
	for _, k := range mine {
		assert.Equal(t, 2, rec.hosts(k)[next[k]], "key %q", k)
	}

	// After the backoff, the first take probes it; its keys return.
	clk.move(time.Second)
	allowAll(t, c, mine, 1, 1)
	assert.Equal(t, before+len(mine), rec.answers(down.Addr()), "every key back at its server")
	assert.Equal(t, 1, rec.failures(down.Addr()))
}

// TestRoutingEveryServerDown: when no server answers, the routed takes
// fail as the unrouted calls do: each server twice (two rounds), one
// server error, then the fallback decides.
func TestRoutingEveryServerDown(t *testing.T) {
	srvs, rec, c := routedSetup(t, Config{Fallback: FallbackOpen})
	for _, s := range srvs {
		s.Stop()
	}
	d := c.Allow(context.Background(), "r:down")
	assert.True(t, d.Allowed)
	assert.Equal(t, SourceFallback, d.Source)
	st := c.Stats()
	assert.EqualValues(t, 6, st.ServerCalls, "every server, in two rounds")
	assert.EqualValues(t, 1, st.ServerErrors)
	assert.False(t, st.Online)
	for _, s := range srvs {
		assert.Equal(t, 2, rec.failures(s.Addr()), "server %s", s.Addr())
	}
}

// TestRoutingOff: with NoKeyRouting, direct takes go to one server at a
// time, as lease calls do.
func TestRoutingOff(t *testing.T) {
	srvs, rec, c := routedSetup(t, Config{NoKeyRouting: true})
	allowAll(t, c, routeKeys("off", 50), 1, 4)
	assert.Equal(t, 50, rec.answers(srvs[0].Addr()), "every take at the first server")
}

// TestRendezvousRemovalMovesOnlyItsKeys: the property failover and
// clients with other server lists rely on — removing a server moves only
// the keys it was first for, and each to its second.
func TestRendezvousRemovalMovesOnlyItsKeys(t *testing.T) {
	seeds := []uint64{mix64(hashString("http://a:1")), mix64(hashString("http://b:1")), mix64(hashString("http://c:1"))}
	order := func(kh uint64, seeds []uint64) []uint64 {
		s := slices.Clone(seeds)
		slices.SortFunc(s, func(x, y uint64) int {
			wx, wy := rendezvous(kh, x), rendezvous(kh, y)
			if wx > wy {
				return -1
			}
			if wx < wy {
				return 1
			}
			return 0
		})
		return s
	}
	for i := range 1000 {
		kh := hashString(fmt.Sprintf("user:%d", i))
		full := order(kh, seeds)
		for drop := range seeds {
			rest := slices.Delete(slices.Clone(seeds), drop, drop+1)
			want := slices.DeleteFunc(slices.Clone(full), func(s uint64) bool { return s == seeds[drop] })
			require.Equal(t, want, order(kh, rest))
		}
	}
}

// TestRoutedHungServerCallersGone (found by this change's review): routed
// by key over a server that hangs and one that answers, with callers that
// give up first, the hung server is avoided after about RequestTimeout and
// its key fails over, without a decision of the fallback: when the callers
// alternate between a key of each (with one client-wide mark of calls
// given up on, each answer of the healthy server cleared it, every take
// to the hung server was made in its caller's goroutine and canceled with
// it, and that key was denied for ever), and when they ask for the hung
// server's key only (nothing was answered meanwhile, but a server is left:
// the client stays online).
func TestRoutedHungServerCallersGone(t *testing.T) {
	for _, alternate := range []bool{true, false} {
		t.Run(fmt.Sprintf("alternate=%v", alternate), func(t *testing.T) { routedHungServer(t, alternate) })
	}
}

func routedHungServer(t *testing.T, alternate bool) {
	hung := hungServer(t)
	ok, _ := lyingServer(t, allowAnswer)
	const rt = 100 * time.Millisecond
	c := clockedClient(t, Config{Servers: []string{hung, ok}, Fallback: FallbackOpen,
		RequestTimeout: rt, ProbeTimeout: -1, LeaseMinTokens: 1 << 30}, nil)
	first := func(key string) int {
		kh := hashString(key)
		if rendezvous(kh, c.http.seeds[0]) > rendezvous(kh, c.http.seeds[1]) {
			return 0
		}
		return 1
	}
	var kh, ka string
	for i := 0; kh == "" || ka == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if first(k) == 0 && kh == "" {
			kh = k
		} else if first(k) == 1 && ka == "" {
			ka = k
		}
	}
	decide := func(key string) Decision {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		return c.Allow(ctx, key)
	}
	start := time.Now()
	allowedH := 0
	for time.Since(start) < 10*rt {
		if decide(kh).Allowed {
			allowedH++
		}
		if alternate {
			decide(ka)
		}
	}
	t.Logf("over %v: %d decisions of the hung server's key allowed; stats %+v", 10*rt, allowedH, c.Stats())
	assert.NotZero(t, c.http.health[0].until.Load(), "the hung server is avoided")
	assert.Positive(t, allowedH, "its key fails over to the healthy server")
	assert.Zero(t, c.Stats().FallbackDecisions)
	assert.True(t, c.Stats().Online)
}

// TestRoutedHungServerLoadedPeer (found by the second review of this
// change): routed over a server that hangs and one that answers slowly
// (50 ms), with callers who give up first (20 ms) on the hung server's
// key: the hung server is avoided and the key fails over, and the client
// stays online. A routed call through a sender also set the client-wide
// mark, which the slow server's answers did not clear in time: the client
// went offline, and the fallback decided (1,778 decisions in one run).
func TestRoutedHungServerLoadedPeer(t *testing.T) {
	hung := hungServer(t)
	ok, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		time.Sleep(50 * time.Millisecond) // healthy, loaded
		return allowAnswer(req)
	})
	const rt = 100 * time.Millisecond
	c := clockedClient(t, Config{Servers: []string{hung, ok}, Fallback: FallbackOpen,
		RequestTimeout: rt, ProbeTimeout: -1, LeaseMinTokens: 1 << 30}, nil)
	var kh string
	for i := 0; kh == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if h := hashString(k); rendezvous(h, c.http.seeds[0]) > rendezvous(h, c.http.seeds[1]) {
			kh = k
		}
	}
	fell := 0
	start := time.Now()
	for time.Since(start) < 10*rt {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		if c.Allow(ctx, kh).Source == SourceFallback {
			fell++
		}
		cancel()
	}
	d := c.Allow(context.Background(), kh)
	t.Logf("%d decisions by the fallback; a patient one %+v; stats %+v", fell, d, c.Stats())
	assert.Zero(t, fell, "decided by the fallback while a server answers every take it gets")
	assert.Equal(t, SourceDirect, d.Source)
	assert.NotZero(t, c.http.health[0].until.Load(), "the hung server is avoided")
}

// hungServer starts a server that holds every call until its caller gives
// up or the test ends, then fails it; it returns its URL.
func hungServer(t *testing.T) string {
	t.Helper()
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "held", http.StatusServiceUnavailable)
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) })
	return hung.URL
}
