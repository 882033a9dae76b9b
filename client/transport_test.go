package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const transportRules = `
default: allow
rules:
  - {name: tiny, match: "t:*", limit: 10, period: 1s, burst: 5, lease_ttl: 1s}
  - {name: big, match: "b:*", limit: 1000, period: 1s, lease_ttl: 2s}
`

// upstream is an httptest server that counts the requests it gets and
// answers each with respond(n), n counting from 1.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func startUpstream(t *testing.T, respond func(w http.ResponseWriter, n int64)) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := u.hits.Add(1)
		if respond == nil {
			_, _ = io.WriteString(w, "ok")
			return
		}
		respond(w, n)
	}))
	t.Cleanup(u.Close) // also closes the idle connections of u.Client()
	return u
}

// keyed returns a keys function that names the same keys for every request.
func keyed(keys ...string) func(*http.Request) []string {
	return func(*http.Request) []string { return keys }
}

// transportClient starts a lease server with transportRules and returns a
// client of it. The cold start may take its time: a slow first lease under
// -race must not turn into a fallback denial.
func transportClient(t *testing.T) *client.Client {
	t.Helper()
	srv := leasetest.Start(t, transportRules, leasetest.Options{})
	return newClient(t, client.Config{Servers: []string{srv.URL()}, InitialBatch: 100, ColdStartTimeout: 2 * time.Second})
}

// get sends a GET to url and returns the status, or the error.
func get(t *testing.T, hc *http.Client, url string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, nil
}

// TestTransportSpendsBeforeSending: requests the budget admits reach the
// upstream; the others fail with a *RateLimitedError and are not sent.
func TestTransportSpendsBeforeSending(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	up := startUpstream(t, nil)
	var hooked atomic.Int64
	hc := &http.Client{Transport: c.Transport(up.Client().Transport, keyed("t:send"), client.TransportOptions{
		OnDenied: func(*http.Request, *client.RateLimitedError) { hooked.Add(1) },
	})}

	admitted, denied := 0, 0
	var last error
	for range 20 {
		status, err := get(t, hc, up.URL)
		if err != nil {
			denied++
			last = err
			continue
		}
		require.Equal(t, http.StatusOK, status)
		admitted++
	}
	assert.GreaterOrEqual(t, admitted, 5, "burst 5")
	assert.LessOrEqual(t, admitted, 7, "burst 5, plus what 10/s refills in the meantime")
	assert.EqualValues(t, admitted, up.hits.Load(), "only admitted requests reach the upstream")
	assert.EqualValues(t, denied, hooked.Load(), "OnDenied sees every denial")

	require.Error(t, last)
	assert.ErrorIs(t, last, client.ErrRateLimited)
	var ue *url.Error
	assert.ErrorAs(t, last, &ue, "http.Client wraps the transport's error")
	var rl *client.RateLimitedError
	require.ErrorAs(t, last, &rl)
	assert.Positive(t, rl.RetryAfter)
	assert.LessOrEqual(t, rl.RetryAfter, time.Second)
	assert.Equal(t, []string{"t:send"}, rl.Keys)
	assert.Contains(t, []client.Source{client.SourceRetryAfter, client.SourceLease}, rl.Source)
}

// TestTransportUpstreamRetryAfter: an upstream 429 or 503 with Retry-After
// denies the request's keys locally until then (capped), unless turned off.
func TestTransportUpstreamRetryAfter(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	tests := []struct {
		name       string
		status     int
		retryAfter string
		opts       client.TransportOptions
		// wantDeny is the local denial expected after the first response;
		// 0 for none.
		wantDeny time.Duration
	}{
		{name: "429 seconds", status: 429, retryAfter: "1", wantDeny: time.Second},
		{name: "503 seconds", status: 503, retryAfter: "2", wantDeny: 2 * time.Second},
		{name: "429 HTTP date", status: 429, retryAfter: time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat), wantDeny: 5 * time.Second},
		{name: "429 date in the past", status: 429, retryAfter: "Fri, 31 Dec 1999 23:59:59 GMT"},
		{name: "429 without Retry-After", status: 429},
		{name: "429 unparsable", status: 429, retryAfter: "soon"},
		{name: "429 negative", status: 429, retryAfter: "-1"},
		// FuzzParseRetryAfter: overflowing digits then garbage were the
		// longest wait.
		{name: "429 huge digits then garbage", status: 429, retryAfter: "18700000000000000000A"},
		{name: "200 with Retry-After", status: 200, retryAfter: "1"},
		{name: "500 with Retry-After", status: 500, retryAfter: "1"},
		{name: "turned off", status: 429, retryAfter: "1", opts: client.TransportOptions{IgnoreUpstreamRetryAfter: true}},
		{name: "capped", status: 429, retryAfter: "3600", opts: client.TransportOptions{MaxUpstreamRetryAfter: 100 * time.Millisecond}, wantDeny: 100 * time.Millisecond},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t, func(w http.ResponseWriter, n int64) {
				if n == 1 {
					if tt.retryAfter != "" {
						w.Header().Set("Retry-After", tt.retryAfter)
					}
					w.WriteHeader(tt.status)
				}
			})
			var hooked time.Duration
			opts := tt.opts
			opts.OnUpstreamRetryAfter = func(resp *http.Response, d time.Duration) {
				assert.Equal(t, tt.status, resp.StatusCode)
				hooked = d
			}
			key := "b:retry-after-" + string(rune('a'+i))
			hc := &http.Client{Transport: c.Transport(up.Client().Transport, keyed(key), opts)}

			status, err := get(t, hc, up.URL)
			require.NoError(t, err)
			assert.Equal(t, tt.status, status, "the upstream's response is returned unchanged")

			status, err = get(t, hc, up.URL)
			if tt.wantDeny == 0 {
				require.NoError(t, err)
				assert.Equal(t, http.StatusOK, status)
				assert.EqualValues(t, 2, up.hits.Load())
				assert.Zero(t, hooked)
				return
			}
			require.ErrorIs(t, err, client.ErrRateLimited)
			assert.EqualValues(t, 1, up.hits.Load(), "denied locally, without reaching the upstream")
			var rl *client.RateLimitedError
			require.ErrorAs(t, err, &rl)
			assert.Equal(t, client.SourceRetryAfter, rl.Source)
			assert.Positive(t, rl.RetryAfter)
			assert.LessOrEqual(t, rl.RetryAfter, tt.wantDeny)
			assert.InDelta(t, tt.wantDeny, hooked, float64(time.Second), "the hook gets the denial")
			if tt.wantDeny <= 100*time.Millisecond {
				require.Eventually(t, func() bool {
					status, err := get(t, hc, up.URL)
					return err == nil && status == http.StatusOK
				}, 2*time.Second, 10*time.Millisecond, "the key is allowed again when the capped denial ends")
			}
		})
	}
}

// TestTransportWait: with Wait, requests wait for the budget instead of
// failing, and a context too short for the wait fails without sending.
func TestTransportWait(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	up := startUpstream(t, nil)
	var hooked atomic.Int64
	hc := &http.Client{Transport: c.Transport(up.Client().Transport, keyed("t:wait"), client.TransportOptions{
		Wait:     true,
		OnDenied: func(*http.Request, *client.RateLimitedError) { hooked.Add(1) },
	})}
	start := time.Now()
	for range 7 {
		status, err := get(t, hc, up.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
	}
	// Burst 5, then 10/s: the 6th and 7th wait about 100 ms each.
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.EqualValues(t, 7, up.hits.Load())
	assert.Zero(t, hooked.Load())

	c.DenyFor(time.Minute, "t:wait")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	_, err = hc.Do(req)
	require.ErrorIs(t, err, client.ErrRateLimited, "the deadline comes before the budget allows")
	var rl *client.RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.Greater(t, rl.RetryAfter, 50*time.Second)
	assert.EqualValues(t, 7, up.hits.Load(), "not sent")
	assert.EqualValues(t, 1, hooked.Load())
}

// TestTransportPassThrough: no keys, no spending.
func TestTransportPassThrough(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	up := startUpstream(t, nil)
	tests := []struct {
		name string
		keys func(*http.Request) []string
	}{
		{"nil keys func", nil},
		{"keys func returns nil", func(*http.Request) []string { return nil }},
		{"keys func returns no key", func(*http.Request) []string { return []string{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := up.hits.Load()
			hc := &http.Client{Transport: c.Transport(up.Client().Transport, tt.keys)}
			c.DenyFor(time.Minute, "t:pass") // denies nothing the request uses
			status, err := get(t, hc, up.URL)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, status)
			assert.Equal(t, before+1, up.hits.Load())
		})
	}
	st := c.Stats()
	assert.Zero(t, st.Allowed, "nothing spent")
	assert.Zero(t, st.ServerCalls, "no lease asked for")
}

// recordingBody is a request body that records whether it was closed.
type recordingBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *recordingBody) Close() error { b.closed.Store(true); return nil }

// TestTransportRefusedClosesBody: a request that is not sent has its body
// closed, is not modified, and fails with the documented error.
func TestTransportRefusedClosesBody(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	closed := transportClient(t)
	require.NoError(t, closed.Close(context.Background()))
	up := startUpstream(t, nil)
	c.DenyFor(time.Minute, "t:refused")

	tests := []struct {
		name         string
		c            *client.Client
		keys         []string
		opts         client.TransportOptions
		timeout      time.Duration // <0: canceled before the request
		rateLimited  bool
		wantSentinel error
	}{
		{name: "denied", c: c, keys: []string{"t:refused"}, rateLimited: true},
		{name: "denied while waiting", c: c, keys: []string{"t:refused"}, opts: client.TransportOptions{Wait: true}, timeout: 20 * time.Millisecond, rateLimited: true},
		{name: "one of two keys denied", c: c, keys: []string{"b:ok", "t:refused"}, rateLimited: true},
		{name: "invalid key", c: c, keys: []string{"bad\nkey"}},
		{name: "invalid key while waiting", c: c, keys: []string{""}, opts: client.TransportOptions{Wait: true}},
		{name: "context canceled", c: c, keys: []string{"b:canceled"}, timeout: -1, wantSentinel: context.Canceled},
		{name: "context canceled while waiting", c: c, keys: []string{"b:canceled"}, opts: client.TransportOptions{Wait: true}, timeout: -1, wantSentinel: context.Canceled},
		{name: "closed client", c: closed, keys: []string{"b:closed"}, wantSentinel: client.ErrClosed},
		{name: "closed client while waiting", c: closed, keys: []string{"b:closed"}, opts: client.TransportOptions{Wait: true}, wantSentinel: client.ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			switch {
			case tt.timeout > 0:
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			case tt.timeout < 0:
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			body := &recordingBody{Reader: strings.NewReader("payload")}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL+"/charge?x=1", body)
			require.NoError(t, err)
			req.Header.Set("X-Test", "1")
			wantHeader, wantURL := req.Header.Clone(), req.URL.String()

			tr := tt.c.Transport(up.Client().Transport, keyed(tt.keys...), tt.opts)
			resp, err := tr.RoundTrip(req)
			require.Error(t, err)
			assert.Nil(t, resp)
			assert.True(t, body.closed.Load(), "RoundTrip closes the body of a request it does not send")
			assert.Zero(t, up.hits.Load(), "not sent")
			assert.Equal(t, tt.rateLimited, errors.Is(err, client.ErrRateLimited), "%v", err)
			if tt.wantSentinel != nil {
				assert.ErrorIs(t, err, tt.wantSentinel)
			}
			assert.Equal(t, wantHeader, req.Header, "the request is not modified")
			assert.Equal(t, wantURL, req.URL.String(), "the request is not modified")
		})
	}
	// A refused request spends nothing: b:ok's token came back.
	assert.Zero(t, c.Stats().Allowed)
}

// retryable returns c.RetryableClient with short waits, releasing its
// connections at the end of the test.
func retryable(t *testing.T, c *client.Client, key string, opts ...client.TransportOptions) (*retryablehttp.Client, *atomic.Int64) {
	t.Helper()
	rc := c.RetryableClient(keyed(key), opts...)
	rc.RetryWaitMin = time.Millisecond
	rc.RetryWaitMax = 20 * time.Millisecond
	var attempts atomic.Int64
	rc.RequestLogHook = func(retryablehttp.Logger, *http.Request, int) { attempts.Add(1) }
	t.Cleanup(rc.HTTPClient.CloseIdleConnections)
	return rc, &attempts
}

// TestRetryableClientSpendsEveryAttempt: two 500s then a 200 cost three
// tokens.
func TestRetryableClientSpendsEveryAttempt(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	up := startUpstream(t, func(w http.ResponseWriter, n int64) {
		if n <= 2 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	rc, attempts := retryable(t, c, "b:attempts")
	before := c.Stats().Allowed
	resp, err := rc.Get(up.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.EqualValues(t, 3, up.hits.Load())
	assert.EqualValues(t, 3, attempts.Load())
	assert.EqualValues(t, 3, c.Stats().Allowed-before, "every attempt spent one token")
}

// TestRetryableClientStopsOnBudgetDenial: retries spend until the budget
// denies; then Do stops at once with the *RateLimitedError.
func TestRetryableClientStopsOnBudgetDenial(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	up := startUpstream(t, func(w http.ResponseWriter, _ int64) { w.WriteHeader(http.StatusBadGateway) })
	rc, attempts := retryable(t, c, "t:retries")
	rc.RetryMax = 50
	resp, err := rc.Get(up.URL)
	assert.Nil(t, resp)
	require.ErrorIs(t, err, client.ErrRateLimited)
	var rl *client.RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.Positive(t, rl.RetryAfter)
	hits := up.hits.Load()
	assert.GreaterOrEqual(t, hits, int64(5), "burst 5")
	assert.Less(t, hits, int64(50), "the budget, not RetryMax, stopped the retries")
	assert.Equal(t, hits+1, attempts.Load(), "the denied attempt was the last one")
}

// TestRetryableClientUpstreamRetryAfter: an upstream 429 whose Retry-After
// exceeds RetryWaitMax denies the retry locally, and Do stops; with Wait,
// the retry waits for the local denial to end and goes through.
func TestRetryableClientUpstreamRetryAfter(t *testing.T) {
	noLeaks(t)
	c := transportClient(t)
	tooMany := func(w http.ResponseWriter, n int64) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}

	t.Run("fail fast", func(t *testing.T) {
		up := startUpstream(t, tooMany)
		rc, _ := retryable(t, c, "b:ra-fast")
		start := time.Now()
		_, err := rc.Get(up.URL)
		require.ErrorIs(t, err, client.ErrRateLimited)
		assert.EqualValues(t, 1, up.hits.Load(), "the retry was denied locally")
		assert.Less(t, time.Since(start), 900*time.Millisecond, "no wait for the full Retry-After")
	})

	t.Run("wait", func(t *testing.T) {
		up := startUpstream(t, tooMany)
		rc, attempts := retryable(t, c, "b:ra-wait", client.TransportOptions{Wait: true, MaxUpstreamRetryAfter: 100 * time.Millisecond})
		start := time.Now()
		resp, err := rc.Get(up.URL)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.EqualValues(t, 2, up.hits.Load())
		assert.EqualValues(t, 2, attempts.Load())
		assert.GreaterOrEqual(t, time.Since(start), 80*time.Millisecond, "the retry waited for the local denial")
	})
}

func TestRetryAfterBackoff(t *testing.T) {
	const (
		lo = 10 * time.Millisecond
		hi = time.Second
	)
	resp := func(status int, retryAfter string) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}}
		if retryAfter != "" {
			r.Header.Set("Retry-After", retryAfter)
		}
		return r
	}
	tests := []struct {
		name    string
		max     time.Duration
		attempt int
		resp    *http.Response
		want    time.Duration
		delta   time.Duration
	}{
		{name: "no response: exponential", max: hi, attempt: 2, want: 40 * time.Millisecond},
		{name: "exponential is capped", max: hi, attempt: 20, want: hi},
		{name: "500: exponential", max: hi, attempt: 1, resp: resp(500, "5"), want: 20 * time.Millisecond},
		{name: "429 without header: exponential", max: hi, attempt: 0, resp: resp(429, ""), want: lo},
		{name: "429 unparsable: exponential", max: hi, attempt: 0, resp: resp(429, "later"), want: lo},
		{name: "429 seconds within max", max: 30 * time.Second, resp: resp(429, "2"), want: 2 * time.Second},
		{name: "429 seconds capped", max: hi, resp: resp(429, "120"), want: hi},
		{name: "503 seconds", max: 30 * time.Second, resp: resp(503, "3"), want: 3 * time.Second},
		{name: "429 zero", max: hi, resp: resp(429, "0"), want: 0},
		{name: "429 huge", max: hi, resp: resp(429, "99999999999999999999999"), want: hi},
		{name: "429 HTTP date", max: 30 * time.Second, resp: resp(429, time.Now().Add(10*time.Second).UTC().Format(http.TimeFormat)), want: 10 * time.Second, delta: 1100 * time.Millisecond},
		{name: "429 HTTP date capped", max: hi, resp: resp(429, time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)), want: hi},
		{name: "429 date in the past", max: hi, resp: resp(429, "Fri, 31 Dec 1999 23:59:59 GMT"), want: 0},
		{name: "max zero", max: 0, resp: resp(429, "5"), want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := client.RetryAfterBackoff(lo, tt.max, tt.attempt, tt.resp)
			assert.InDelta(t, tt.want, got, float64(tt.delta), "got %v", got)
			assert.LessOrEqual(t, got, max(tt.max, 0), "never beyond max")
		})
	}
}

func TestRetryPolicy(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	rl := &client.RateLimitedError{Keys: []string{"k"}, RetryAfter: time.Second, Source: client.SourceRetryAfter}
	tests := []struct {
		name      string
		ctx       context.Context
		status    int // 0: no response
		err       error
		wantRetry bool
		wantErr   error
	}{
		{name: "budget denial", err: rl, wantErr: client.ErrRateLimited},
		{name: "budget denial wrapped by http.Client", err: &url.Error{Op: "Get", URL: "http://x", Err: rl}, wantErr: client.ErrRateLimited},
		{name: "closed client", err: &url.Error{Op: "Get", URL: "http://x", Err: client.ErrClosed}, wantErr: client.ErrClosed},
		{name: "connection error", err: errors.New("connection refused"), wantRetry: true},
		{name: "500", status: 500, wantRetry: true},
		{name: "501", status: 501},
		{name: "429", status: 429, wantRetry: true},
		{name: "200", status: 200},
		{name: "context ended", ctx: canceled, status: 500, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			var resp *http.Response
			if tt.status != 0 {
				resp = &http.Response{StatusCode: tt.status, Status: http.StatusText(tt.status), Header: http.Header{}}
			}
			retry, err := client.RetryPolicy(ctx, resp, tt.err)
			assert.Equal(t, tt.wantRetry, retry)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			} else {
				assert.NoError(t, err)
			}
		})
	}
}

// TestRetryableClientStopsOnInvalidKey: a keys func that names an invalid
// key is the caller's mistake (ErrInvalidRequest), which no retry fixes.
// RetryPolicy stopped only on ErrRateLimited, ErrClosed and
// ErrServerRefused, and go-retryablehttp's DefaultRetryPolicy retried the
// rest: Do made RetryMax+1 attempts with backoff before it failed (5
// attempts, found by review).
func TestRetryableClientStopsOnInvalidKey(t *testing.T) {
	c := transportClient(t)
	up := startUpstream(t, nil)
	var calls atomic.Int64
	rc := c.RetryableClient(func(*http.Request) []string {
		calls.Add(1)
		return []string{"bad\nkey"}
	})
	rc.RetryWaitMin = 10 * time.Millisecond
	rc.RetryWaitMax = 50 * time.Millisecond
	t.Cleanup(rc.HTTPClient.CloseIdleConnections)
	_, err := rc.Get(up.URL)
	require.Error(t, err)
	assert.ErrorIs(t, err, client.ErrInvalidRequest)
	assert.NotErrorIs(t, err, client.ErrRateLimited)
	assert.Zero(t, up.hits.Load())
	assert.EqualValues(t, 1, calls.Load(), "an invalid key is not retried (RetryMax %d)", rc.RetryMax)
}

// TestTransportCanceledRequestSpendsNothingLeased: a request whose context
// has ended before RoundTrip is not sent, and spends nothing, on a leased
// key too. A leased key's spend does not read the context: the token was
// spent, and the base RoundTripper then failed at once with
// context.Canceled (found by review: Allowed 20 -> 21).
func TestTransportCanceledRequestSpendsNothingLeased(t *testing.T) {
	c := transportClient(t)
	up := startUpstream(t, nil)
	const key = "b:canceled"
	tr := c.Transport(up.Client().Transport, keyed(key))
	require.Eventually(t, func() bool {
		for range 20 {
			c.Allow(context.Background(), key)
		}
		return c.Stats().TokensHeld > 0
	}, 5*time.Second, 5*time.Millisecond, "the key leases")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader("x"))
	require.NoError(t, err)
	before := c.Stats()
	resp, err := tr.RoundTrip(req)
	after := c.Stats()
	require.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, resp)
	assert.Zero(t, up.hits.Load(), "not sent")
	assert.Equal(t, before.Allowed, after.Allowed, "a request that was never sent spends nothing")
	assert.Equal(t, before.TokensHeld, after.TokensHeld)
}

// TestRetryAfterBackoffInvalidHeader: a 429 whose Retry-After is not valid
// delay-seconds nor a date gets the exponential backoff from min, as the
// docs say, and as the transport, which denies no key for it, reads it.
// The fallback, go-retryablehttp's DefaultBackoff, parsed the header again
// more laxly: "+30" waited 30 s and "-0" not at all (found by review).
func TestRetryAfterBackoffInvalidHeader(t *testing.T) {
	const lo = 10 * time.Millisecond
	for _, v := range []string{"+30", "-0", "30s", "soon"} {
		resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {v}}}
		assert.Equal(t, lo, client.RetryAfterBackoff(lo, time.Minute, 0, resp), "Retry-After %q", v)
	}
	valid := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"3"}}}
	assert.Equal(t, 3*time.Second, client.RetryAfterBackoff(lo, time.Minute, 0, valid))
}

// TestLimiterDecideInvalidSaysWhy: Limiter.Decide on an invalid Limiter,
// or for n out of range, carries an Err matching ErrInvalidRequest. It was
// a bare SourceDenied, which says the server refused the key, and
// examples/budget reported "the lease server refused" (found by review).
func TestLimiterDecideInvalidSaysWhy(t *testing.T) {
	c := transportClient(t)
	l := c.Limiter("bad\nkey")
	require.ErrorIs(t, l.Err(), client.ErrInvalidRequest)
	d := l.Decide(context.Background(), 1)
	assert.False(t, d.Allowed)
	assert.ErrorIs(t, d.Err, client.ErrInvalidRequest, "invalid Limiter")
	for _, n := range []int64{0, -1, 1 << 40} {
		d = c.Limiter("b:ok").Decide(context.Background(), n)
		assert.False(t, d.Allowed)
		assert.ErrorIs(t, d.Err, client.ErrInvalidRequest, "n = %d", n)
	}
}
