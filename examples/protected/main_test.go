package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// syncBuffer is a bytes.Buffer safe for the program's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the program against srv and returns its base URL.
func start(t *testing.T, srv *leasetest.Server, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	addr := make(chan string, 1)
	done := make(chan error, 1)
	args = append([]string{"-listen", "127.0.0.1:0", "-servers", srv.URL()}, args...)
	go func() { done <- run(ctx, args, out, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		t.Logf("program output:\n%s", out.String())
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	return ""
}

type resp struct {
	code   int
	header http.Header
	body   string
}

func get(t *testing.T, url string, headers ...string) resp {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return resp{res.StatusCode, res.Header, string(b)}
}

// remaining parses the RateLimit field (one item: the hello rule's limit)
// with a structured-field parser and returns r and t.
func remaining(t *testing.T, h http.Header) (r, reset int64) {
	t.Helper()
	pol, err := httpsfv.UnmarshalList(h.Values("RateLimit-Policy"))
	require.NoError(t, err)
	require.Len(t, pol, 1)
	p := pol[0].(httpsfv.Item)
	assert.Equal(t, "5-per-10s", p.Value)
	q, _ := p.Params.Get("q")
	w, _ := p.Params.Get("w")
	assert.Equal(t, int64(5), q)
	assert.Equal(t, int64(10), w)

	st, err := httpsfv.UnmarshalList(h.Values("RateLimit"))
	require.NoError(t, err)
	require.Len(t, st, 1)
	it := st[0].(httpsfv.Item)
	assert.Equal(t, "5-per-10s", it.Value)
	rv, _ := it.Params.Get("r")
	tv, _ := it.Params.Get("t")
	return rv.(int64), tv.(int64)
}

// TestTwoProcesses runs two copies of the API behind one lease server with
// examples/rules.yaml: a caller's five requests spread over both are its
// whole burst, each answer carrying the caller's fleet-wide remaining; the
// sixth gets 429. Other callers, by API key or by IP, are not affected.
func TestTwoProcesses(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
	rules, err := os.ReadFile("../rules.yaml")
	require.NoError(t, err)
	srv := leasetest.Start(t, string(rules), leasetest.Options{})
	a, b := start(t, srv), start(t, srv)

	for i, base := range []string{a, b, a, b, a} {
		res := get(t, base+"/hello", "X-API-Key", "alice")
		require.Equal(t, http.StatusOK, res.code, "request %d: %s", i+1, res.body)
		assert.Equal(t, "hello, alice\n", res.body)
		r, _ := remaining(t, res.header)
		// At most one token (2 s) can have come back during the test.
		assert.InDelta(t, 4-i, r, 1, "request %d", i+1)
	}
	res := get(t, b+"/hello", "X-API-Key", "alice")
	require.Equal(t, http.StatusTooManyRequests, res.code)
	retry, err := strconv.Atoi(res.header.Get("Retry-After"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, retry, 1)
	assert.LessOrEqual(t, retry, 2)
	r, reset := remaining(t, res.header)
	assert.Zero(t, r)
	assert.InDelta(t, 10, reset, 1)
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.body), &p))
	assert.Regexp(t, "quota-exceeded$", p.Type)
	assert.Equal(t, 429, p.Status)

	// Bob has his own bucket; so has a caller without a key (by IP).
	assert.Equal(t, http.StatusOK, get(t, a+"/hello", "X-API-Key", "bob").code)
	res = get(t, a+"/hello")
	assert.Equal(t, http.StatusOK, res.code)
	assert.Equal(t, "hello, 127.0.0.1", res.body[:len("hello, 127.0.0.1")])
	// Not limited: health checks; unknown routes get the mux's 404.
	for range 10 {
		assert.Equal(t, http.StatusOK, get(t, a+"/healthz").code)
	}
	assert.Equal(t, http.StatusNotFound, get(t, a+"/nowhere").code)
}

// TestTrustedProxies: X-Forwarded-For tells callers apart only when the
// proxy is trusted.
func TestTrustedProxies(t *testing.T) {
	rules, err := os.ReadFile("../rules.yaml")
	require.NoError(t, err)
	srv := leasetest.Start(t, string(rules), leasetest.Options{})
	untrusting := start(t, srv)
	trusting := start(t, srv, "-trusted-proxies", "127.0.0.1/32")

	// Untrusted: a forged X-Forwarded-For does not give a fresh bucket.
	for i := range 6 {
		res := get(t, untrusting+"/hello", "X-Forwarded-For", "198.51.100."+strconv.Itoa(i))
		if i < 5 {
			require.Equal(t, http.StatusOK, res.code, "request %d", i+1)
		} else {
			assert.Equal(t, http.StatusTooManyRequests, res.code, "127.0.0.1 is out, whatever it claims")
		}
	}
	// Trusted: each forwarded address is a caller of its own.
	for i := range 6 {
		res := get(t, trusting+"/hello", "X-Forwarded-For", "198.51.100."+strconv.Itoa(i))
		assert.Equal(t, http.StatusOK, res.code, "request %d", i+1)
	}
}

func TestFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want error
	}{
		{"help", []string{"-h"}, flag.ErrHelp},
		{"unknown flag", []string{"-nope"}, nil},
		{"bad proxy", []string{"-trusted-proxies", "10.0.0.0/99"}, nil},
		{"extra argument", []string{"extra"}, nil},
		{"bad server", []string{"-servers", "ftp://x"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := run(ctx, tt.args, io.Discard, nil)
			require.Error(t, err)
			if tt.want != nil {
				assert.ErrorIs(t, err, tt.want)
			}
		})
	}
}

// TestUsageHidesToken: the usage text, on -h and after a bad flag, never
// prints RATELEASE_TOKEN, as rateleased and ratelease do not: it was
// -token's default, and flag prints a flag's default (a crash log, a
// terminal shared on a call). The variable still applies when -token is
// not given, and -token wins over it.
func TestUsageHidesToken(t *testing.T) {
	const secret = "s3cret-service-token"
	t.Setenv("RATELEASE_TOKEN", secret)
	for _, args := range [][]string{{"-h"}, {"-nope"}} {
		var out bytes.Buffer
		_, err := parseFlags(args, &out)
		require.Error(t, err, "%v", args)
		assert.Contains(t, out.String(), "-token", "%v: the usage text", args)
		assert.NotContains(t, out.String(), secret, "%v", args)
	}
	var out bytes.Buffer
	cfg, err := parseFlags(nil, &out)
	require.NoError(t, err)
	assert.Equal(t, secret, cfg.token, "from the environment")
	cfg, err = parseFlags([]string{"-token", "given"}, &out)
	require.NoError(t, err)
	assert.Equal(t, "given", cfg.token, "the flag wins")
}
