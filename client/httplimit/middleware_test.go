package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The periods are long, so the buckets do not refill measurably during a
// test: remaining counts are exact.
const testRules = `
default: allow
rules:
  - name: hello
    match: "hello:*"
    limit: 5
    period: 1h
  - name: two
    match: "two:*"
    limits:
      - {limit: 3, period: 1h}
      - {limit: 10, period: 24h}
  - name: slow
    match: "slow:*"
    limit: 1
    period: 1h
  - name: paced
    match: "paced:*"
    limit: 10
    period: 1s
    burst: 1
  - name: second
    match: "second:*"
    limit: 1
    period: 1s
    burst: 1
`

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = w.Write([]byte("ok"))
})

func newHandler(t *testing.T, cfg httplimit.Config) (*httplimit.Middleware, http.Handler) {
	t.Helper()
	if len(cfg.Keys) == 0 {
		cfg.Keys = []httplimit.Key{{Template: "hello:{header:X-API-Key}"}}
	}
	m, err := httplimit.New(cfg)
	require.NoError(t, err)
	return m, m.Handler(okHandler)
}

func get(h http.Handler, apiKey string) *httptest.ResponseRecorder {
	return getCtx(context.Background(), h, apiKey)
}

func getCtx(ctx context.Context, h http.Handler, apiKey string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/hello", nil)
	r.RemoteAddr = "198.51.100.1:1234"
	r.Header.Set("X-API-Key", apiKey)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

type field = inboundtest.Field

// parseField parses a RateLimit-Policy or RateLimit field.
func parseField(t *testing.T, h http.Header, name string) []field {
	return inboundtest.ParseFields(t, name, h.Values(name))
}

func TestGlobalRemainingAcrossProcesses(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	_, a := newHandler(t, httplimit.Config{Client: inboundtest.DirectClient(t, srv)})
	_, b := newHandler(t, httplimit.Config{Client: inboundtest.DirectClient(t, srv)})
	for i, h := range []http.Handler{a, b, a, b, a} {
		rec := get(h, "alice")
		require.Equal(t, http.StatusOK, rec.Code, "request %d", i+1)
		pol := parseField(t, rec.Header(), httplimit.HeaderRateLimitPolicy)
		require.Len(t, pol, 1)
		assert.Equal(t, field{Name: "5-per-1h", Params: map[string]int64{"q": 5, "w": 3600}}, pol[0])
		st := parseField(t, rec.Header(), httplimit.HeaderRateLimit)
		require.Len(t, st, 1)
		assert.Equal(t, "5-per-1h", st[0].Name)
		assert.Equal(t, int64(4-i), st[0].Params["r"], "request %d: the fleet's remaining, not this process's", i+1)
		assert.InDelta(t, (i+1)*720, st[0].Params["t"], 2, "seconds until the bucket is full")
		assert.Empty(t, rec.Header().Get("Retry-After"))
	}
	// Another caller has a bucket of its own.
	assert.Equal(t, http.StatusOK, get(b, "bob").Code)

	for _, h := range []http.Handler{b, a} {
		rec := get(h, "alice")
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
		retry, err := strconv.Atoi(rec.Header().Get("Retry-After"))
		require.NoError(t, err)
		assert.InDelta(t, 720, retry, 2, "one token's refill, whole seconds")
		st := parseField(t, rec.Header(), httplimit.HeaderRateLimit)
		require.Len(t, st, 1)
		assert.Equal(t, int64(0), st[0].Params["r"])
		assert.InDelta(t, 3600, st[0].Params["t"], 2)
		assert.Len(t, parseField(t, rec.Header(), httplimit.HeaderRateLimitPolicy), 1)

		assert.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		assert.Regexp(t, `quota-exceeded$`, p.Type)
		assert.Equal(t, 429, p.Status)
		assert.NotEmpty(t, p.Detail)
	}
}

func TestTwoLimitsTwoItems(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	_, h := newHandler(t, httplimit.Config{Client: inboundtest.DirectClient(t, srv), Keys: []httplimit.Key{{Template: "two:{header:X-API-Key}"}}})
	for i := range 3 {
		rec := get(h, "k")
		require.Equal(t, http.StatusOK, rec.Code)
		pol := parseField(t, rec.Header(), httplimit.HeaderRateLimitPolicy)
		assert.Equal(t, []field{
			{Name: "3-per-1h", Params: map[string]int64{"q": 3, "w": 3600}},
			{Name: "10-per-24h", Params: map[string]int64{"q": 10, "w": 86400}},
		}, pol)
		st := parseField(t, rec.Header(), httplimit.HeaderRateLimit)
		require.Len(t, st, 2)
		assert.Equal(t, "3-per-1h", st[0].Name)
		assert.Equal(t, int64(2-i), st[0].Params["r"])
		assert.Equal(t, "10-per-24h", st[1].Name)
		assert.Equal(t, int64(9-i), st[1].Params["r"])
	}
	rec := get(h, "k")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Len(t, parseField(t, rec.Header(), httplimit.HeaderRateLimit), 2)
}

func TestShadow(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	var mu sync.Mutex
	var outcomes []httplimit.Outcome
	m, h := newHandler(t, httplimit.Config{
		Client: inboundtest.DirectClient(t, srv),
		Keys:   []httplimit.Key{{Template: "slow:{header:X-API-Key}"}},
		Shadow: true,
		OnDecision: func(r *http.Request, res httplimit.Result) {
			mu.Lock()
			outcomes = append(outcomes, res.Outcome)
			mu.Unlock()
		},
	})
	for range 3 {
		assert.Equal(t, http.StatusOK, get(h, "k").Code)
	}
	assert.Equal(t, []httplimit.Outcome{httplimit.OutcomeAllowed, httplimit.OutcomeShadow, httplimit.OutcomeShadow}, outcomes)
	st := m.Stats()
	assert.Equal(t, int64(1), st.Allowed)
	assert.Equal(t, int64(2), st.Shadow)
	assert.Zero(t, st.Denied)
}

func TestHeaderModesAndDenyHandler(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	c := inboundtest.DirectClient(t, srv)
	var seen httplimit.Result
	_, h := newHandler(t, httplimit.Config{
		Client:  c,
		Keys:    []httplimit.Key{{Template: "slow:{header:X-API-Key}"}},
		Headers: httplimit.HeadersDenied,
		DenyHandler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen, _ = httplimit.ResultFrom(r.Context())
			w.WriteHeader(http.StatusServiceUnavailable)
		}),
	})
	rec := get(h, "a")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Empty(t, rec.Header().Values(httplimit.HeaderRateLimit))
	assert.Empty(t, rec.Header().Values(httplimit.HeaderRateLimitPolicy))
	rec = get(h, "a")
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code, "the app's deny handler")
	assert.NotEmpty(t, rec.Header().Get("Retry-After"))
	assert.Len(t, parseField(t, rec.Header(), httplimit.HeaderRateLimit), 1)
	assert.Equal(t, httplimit.OutcomeDenied, seen.Outcome)
	assert.Equal(t, []string{"slow:a"}, seen.Keys)

	_, none := newHandler(t, httplimit.Config{Client: c, Keys: []httplimit.Key{{Template: "slow:{header:X-API-Key}"}}, Headers: httplimit.HeadersNone})
	rec = get(none, "a")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.NotEmpty(t, rec.Header().Get("Retry-After"))
	assert.Empty(t, rec.Header().Values(httplimit.HeaderRateLimit))
}

func TestMissingPartIsNotALimit(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	m, h := newHandler(t, httplimit.Config{Client: inboundtest.DirectClient(t, srv), Keys: []httplimit.Key{{Template: "hello:{user}"}}})
	rec := get(h, "k")
	assert.Equal(t, http.StatusUnauthorized, rec.Code)
	assert.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	assert.Equal(t, int64(1), m.Stats().Unidentified)

	_, h = newHandler(t, httplimit.Config{Client: inboundtest.DirectClient(t, srv)})
	rec = get(h, "")
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Contains(t, rec.Body.String(), "X-API-Key")
}

func TestQueueAdmitsAfterWaiting(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	var res []httplimit.Result
	var mu sync.Mutex
	_, h := newHandler(t, httplimit.Config{
		Client:  inboundtest.DirectClient(t, srv),
		Keys:    []httplimit.Key{{Template: "paced:{header:X-API-Key}"}}, // a token per 100 ms
		MaxWait: 5 * time.Second,
		OnDecision: func(r *http.Request, rs httplimit.Result) {
			mu.Lock()
			res = append(res, rs)
			mu.Unlock()
		},
	})
	require.Equal(t, http.StatusOK, get(h, "k").Code)
	rec := get(h, "k")
	require.Equal(t, http.StatusOK, rec.Code, "held, then admitted")
	require.Len(t, res, 2)
	assert.Equal(t, httplimit.OutcomeWaited, res[1].Outcome)
	assert.True(t, res[1].WouldDeny())
	assert.Greater(t, res[1].Waited, 10*time.Millisecond)
	assert.Less(t, res[1].Waited, 2*time.Second)
	assert.Len(t, parseField(t, rec.Header(), httplimit.HeaderRateLimitPolicy), 1)
	assert.Empty(t, rec.Header().Values(httplimit.HeaderRateLimit), "no fresh state came with the tokens")
}

func TestQueueRefusesBeyondMaxWait(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	_, h := newHandler(t, httplimit.Config{
		Client:  inboundtest.DirectClient(t, srv),
		Keys:    []httplimit.Key{{Template: "paced:{header:X-API-Key}"}},
		MaxWait: 20 * time.Millisecond, // a token takes 100 ms
	})
	require.Equal(t, http.StatusOK, get(h, "k").Code)
	start := time.Now()
	rec := get(h, "k")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Less(t, time.Since(start), time.Second, "refused at once: waiting could not help")
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
}

// TestQueueTimesOut: two requests wait for one token; one gets it, the
// other is answered 429 once its MaxWait cannot be met, with the
// RateLimit-Policy field but not the RateLimit one: the first decision's
// state is stale after the wait (it was sent, saying what remained a wait
// ago, found by review).
func TestQueueTimesOut(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	var mu sync.Mutex
	var res []httplimit.Result
	_, h := newHandler(t, httplimit.Config{
		Client:  inboundtest.DirectClient(t, srv),
		Keys:    []httplimit.Key{{Template: "second:{header:X-API-Key}"}}, // a token per second
		MaxWait: 1500 * time.Millisecond,
		OnDecision: func(r *http.Request, rs httplimit.Result) {
			mu.Lock()
			res = append(res, rs)
			mu.Unlock()
		},
	})
	require.Equal(t, http.StatusOK, get(h, "k").Code)
	codes := make([]int, 2)
	recs := make([]*httptest.ResponseRecorder, 2)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() { recs[i] = get(h, "k"); codes[i] = recs[i].Code })
	}
	wg.Wait()
	assert.ElementsMatch(t, []int{http.StatusOK, http.StatusTooManyRequests}, codes)
	for _, rec := range recs {
		if rec.Code == http.StatusTooManyRequests {
			assert.NotEmpty(t, rec.Header().Get(httplimit.HeaderRateLimitPolicy))
			assert.Empty(t, rec.Header().Get(httplimit.HeaderRateLimit), "the first decision's state, a wait old")
			assert.NotEmpty(t, rec.Header().Get("Retry-After"))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, res, 3)
	var denied httplimit.Result
	for _, r := range res[1:] {
		if r.Outcome == httplimit.OutcomeDenied {
			denied = r
		}
	}
	assert.ErrorIs(t, denied.Err, client.ErrRateLimited)
	assert.Greater(t, denied.Waited, 500*time.Millisecond, "it was held before the 429")
}

func TestQueueFullAndCancel(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	c := inboundtest.DirectClient(t, srv)
	var mu sync.Mutex
	var res []httplimit.Result
	m, h := newHandler(t, httplimit.Config{
		Client:   c,
		Keys:     []httplimit.Key{{Template: "slow:{header:X-API-Key}"}}, // refills in an hour
		MaxWait:  2 * time.Hour,
		MaxQueue: 1,
		OnDecision: func(r *http.Request, rs httplimit.Result) {
			mu.Lock()
			res = append(res, rs)
			mu.Unlock()
		},
	})
	require.Equal(t, http.StatusOK, get(h, "k").Code)
	spent := c.Stats().Allowed

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- getCtx(ctx, h, "k").Code }()
	require.Eventually(t, func() bool { return m.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)

	rec := get(h, "k")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "the queue is full")
	assert.Contains(t, rec.Body.String(), "waiting")

	cancel()
	assert.Equal(t, http.StatusTooManyRequests, <-done)
	assert.Equal(t, spent, c.Stats().Allowed, "a request cancelled while queued spent nothing")
	assert.Zero(t, m.Stats().Queued)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, res, 3)
	assert.True(t, res[1].QueueFull)
	assert.True(t, errors.Is(res[2].Err, context.Canceled), "%v", res[2].Err)
	assert.Equal(t, int64(1), m.Stats().QueueFull)
}

// TestQueueShapedKeyWaitsMaxWait: under a shaping rule (leaky_bucket) a
// request whose slot is 300 ms away waits for it under the middleware's
// MaxWait (2 s), whatever the client's own Config.MaxWait (100 ms here,
// 1 s by default). It was answered 429 at once: WaitN bounded the slot by
// the client's MaxWait, which httplimit never mentioned (found by review:
// a slot 2 s away, MaxWait 10 s, a 429 after 13 µs).
func TestQueueShapedKeyWaitsMaxWait(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: shape, match: "lb:*", algorithm: leaky_bucket, limit: 1, period: 300ms, burst: 5}
`, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1 << 20, MaxWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	var seen httplimit.Result
	_, h := newHandler(t, httplimit.Config{Client: c, Keys: []httplimit.Key{{Template: "lb:{header:X-API-Key}"}}, MaxWait: 2 * time.Second,
		OnDecision: func(_ *http.Request, r httplimit.Result) { seen = r }})
	require.Equal(t, http.StatusOK, get(h, "k").Code)
	rec := get(h, "k")
	assert.Equal(t, http.StatusOK, rec.Code, "the slot %v away was not waited for under MaxWait 2 s (err %v)", seen.Decision.RetryAfter, seen.Err)
	assert.Equal(t, httplimit.OutcomeWaited, seen.Outcome)
	assert.Greater(t, seen.Waited, 100*time.Millisecond)
}

// TestWrongMethodIs405: with a {route} key, a request whose path the
// wrapped mux serves for other methods only gets the mux's 405 with Allow.
// It got 404 "no route matches the request" (found by review).
func TestWrongMethodIs405(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	m, err := httplimit.New(httplimit.Config{Client: inboundtest.DirectClient(t, srv), Keys: []httplimit.Key{{Template: "hello:{route}"}}})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("GET /hello", okHandler)
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, "/hello", http.StatusMethodNotAllowed},
		{http.MethodGet, "/nowhere", http.StatusNotFound},
		{http.MethodGet, "/hello", http.StatusOK},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		r.RemoteAddr = "198.51.100.1:1234"
		rec := httptest.NewRecorder()
		m.Handler(mux).ServeHTTP(rec, r)
		assert.Equal(t, tc.status, rec.Code, "%s %s", tc.method, tc.path)
		if tc.status == http.StatusMethodNotAllowed {
			assert.Contains(t, rec.Header().Get("Allow"), http.MethodGet)
		}
	}
}

// TestLeasedKeyHeaders: a key leased by its process still answers with the
// rule's limits and the fleet-wide state of the lease's answer.
func TestLeasedKeyHeaders(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: big, match: "big:*", limit: 100000, period: 1m}
`, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1})
	require.NoError(t, err)
	defer c.Close(context.Background())
	var last client.Decision
	_, h := newHandler(t, httplimit.Config{
		Client:     c,
		Keys:       []httplimit.Key{{Template: "big:{header:X-API-Key}"}},
		OnDecision: func(r *http.Request, res httplimit.Result) { last = res.Decision },
	})
	require.Eventually(t, func() bool {
		require.Equal(t, http.StatusOK, get(h, "k").Code)
		return last.Source == client.SourceLease
	}, 10*time.Second, time.Millisecond)
	rec := get(h, "k")
	st := parseField(t, rec.Header(), httplimit.HeaderRateLimit)
	require.Len(t, st, 1)
	assert.Equal(t, "100000-per-1m", st[0].Name)
	assert.Less(t, st[0].Params["r"], int64(100000))
	assert.Greater(t, st[0].Params["r"], int64(90000))
}

// TestRefusedIsNotRateLimited: a key the lease servers refuse this service
// (outside its token's key patterns) is a misconfiguration: the middleware
// answers 503, never a 429 that would send the caller to retry.
func TestRefusedIsNotRateLimited(t *testing.T) {
	c := inboundtest.RestrictedClient(t, testRules, "hello:*")
	var seen httplimit.Result
	m, err := httplimit.New(httplimit.Config{
		Client:     c,
		Keys:       []httplimit.Key{{Template: "two:{header:X-API-Key}"}},
		OnDecision: func(_ *http.Request, r httplimit.Result) { seen = r },
	})
	require.NoError(t, err)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	req.Header.Set("X-API-Key", "alice")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Empty(t, rec.Header().Get("Retry-After"))
	require.Error(t, seen.Err)
	assert.ErrorIs(t, seen.Err, client.ErrForbidden)
}
