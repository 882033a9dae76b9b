package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
	"github.com/ratelease/ratelease/server"
)

// logSink collects the daemon's JSON log lines.
type logSink struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan map[string]any
}

func newLogSink() *logSink { return &logSink{lines: make(chan map[string]any, 1000)} }

// Write takes one slog record per call, as slog handlers write them.
func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.buf.Write(p)
	s.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			select {
			case s.lines <- rec:
			default:
			}
		}
	}
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor returns the first log record with message msg.
func (s *logSink) waitFor(t *testing.T, msg string) map[string]any {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case rec := <-s.lines:
			if rec["msg"] == msg {
				return rec
			}
		case <-timeout:
			t.Fatalf("no log %q within 10s; logs:\n%s", msg, s.String())
		}
	}
}

// daemon is run() in a goroutine.
type daemon struct {
	logs   *logSink
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	addr   string
	start  map[string]any // the "rateleased listening" record
}

func startDaemon(t *testing.T, env map[string]string, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{logs: newLogSink(), cancel: cancel, done: make(chan struct{})}
	args = append([]string{"-listen", "127.0.0.1:0", "-log-format", "json"}, args...)
	go func() {
		defer close(d.done)
		d.err = run(ctx, args, func(k string) string { return env[k] }, d.logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			t.Error("run did not return")
		}
	})
	d.start = d.logs.waitFor(t, "rateleased listening")
	d.addr, _ = d.start["addr"].(string)
	require.NotEmpty(t, d.addr)
	require.NotEqual(t, "127.0.0.1:0", d.addr, "the real port is logged")
	return d
}

// stop cancels run's context and returns its error.
func (d *daemon) stop(t *testing.T) error {
	t.Helper()
	d.cancel()
	select {
	case <-d.done:
		return d.err
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
		return nil
	}
}

func post(t *testing.T, url, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	r := send(t, req)
	return r.StatusCode, r.body
}

func TestRunServesAndStops(t *testing.T) {
	d := startDaemon(t, nil, "-rules", "../../../examples/rules.yaml")
	assert.Equal(t, "memory", d.start["store"])
	assert.EqualValues(t, 6, d.start["rules"])
	assert.EqualValues(t, 0, d.start["clients"])

	status, body := post(t, "http://"+d.addr+protocol.PathLeases, "",
		`{"client_id":"checkout-1","leases":[{"key":"user:42","want":10},{"key":"api:createURL","want":5000}]}`)
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	var lr protocol.LeaseResponse
	require.NoError(t, json.Unmarshal(body, &lr))
	assert.EqualValues(t, 10, lr.Leases[0].Granted)
	assert.Equal(t, "per-user", lr.Leases[0].Rule)
	assert.EqualValues(t, 1000, lr.Leases[1].Granted, "capped at the bucket")

	require.NoError(t, d.stop(t))
	assert.Contains(t, d.logs.String(), `"msg":"shut down"`)
}

func TestRunWithAuth(t *testing.T) {
	d := startDaemon(t, map[string]string{"RATELEASED_RULES": "../../../examples/rules-auth.yaml"})
	assert.EqualValues(t, 1, d.start["clients"])
	url := "http://" + d.addr + protocol.PathLeases
	body := `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`

	status, _ := post(t, url, "", body)
	assert.Equal(t, http.StatusUnauthorized, status)
	status, resp := post(t, url, "dev-token-change-me", body)
	assert.Equal(t, http.StatusOK, status, "body: %s", resp)
	require.NoError(t, d.stop(t))
}

func TestRunWithRedis(t *testing.T) {
	rs := redistest.Start(t)
	d := startDaemon(t, map[string]string{"RATELEASED_REDIS": rs.URL()}, "-rules", "../../../examples/rules.yaml")
	assert.Equal(t, "redis", d.start["store"])
	assert.Equal(t, rs.Addr(), d.start["redis"])

	status, body := post(t, "http://"+d.addr+protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":7}]}`)
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	keys, err := rs.Client(t).Keys(context.Background(), "rl:{user:1}*").Result()
	require.NoError(t, err)
	assert.NotEmpty(t, keys, "the bucket lives in Redis")
	require.NoError(t, d.stop(t))
}

// redisDownBound is the documented time within which a call is answered
// 503 while Redis does not answer (README, "When things fail"), and
// redisDownSlack what a loaded CI machine may add to it.
const (
	redisDownBound = time.Second
	redisDownSlack = 250 * time.Millisecond
)

// TestRunRedisDownFailsFast: with Redis stopped (connections refused), the
// daemon answers 503 within the documented bound.
func TestRunRedisDownFailsFast(t *testing.T) {
	rs := redistest.Start(t)
	d := startDaemon(t, map[string]string{"RATELEASED_REDIS": rs.URL()}, "-rules", "../../../examples/rules.yaml")
	url := "http://" + d.addr + protocol.PathLeases
	body := `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`
	status, resp := post(t, url, "", body)
	require.Equal(t, http.StatusOK, status, "body: %s", resp)

	rs.Stop(t)
	for range 3 { // the first call finds the pooled connection dead; the others dial
		start := time.Now()
		status, resp = post(t, url, "", body)
		elapsed := time.Since(start)
		require.Equal(t, http.StatusServiceUnavailable, status, "body: %s", resp)
		assert.Contains(t, string(resp), string(protocol.CodeStoreUnavailable))
		assert.LessOrEqual(t, elapsed, redisDownBound+redisDownSlack, "503 within the documented bound")
		t.Logf("503 after %v", elapsed.Round(time.Millisecond))
	}
	require.NoError(t, d.stop(t))
}

// TestRunRedisHangs: with the redis-server process stopped by SIGSTOP, so
// that connections open but nothing answers, every POST /v1/leases and POST
// /v1/check is answered 503 with Retry-After within the documented bound,
// /readyz fails, and once the process continues the server serves again by
// itself.
func TestRunRedisHangs(t *testing.T) {
	rs := redistest.Start(t)
	pid := redisPID(t, rs)
	d := startDaemon(t, map[string]string{"RATELEASED_REDIS": rs.URL()}, "-rules", "../../../examples/rules.yaml")
	base := "http://" + d.addr
	lease := `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`
	check := `{"keys":["user:2"]}`
	status, resp := post(t, base+protocol.PathLeases, "", lease)
	require.Equal(t, http.StatusOK, status, "body: %s", resp)

	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // before redistest kills it
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))

	for i := range 3 {
		for _, c := range []struct{ path, body string }{{protocol.PathLeases, lease}, {protocol.PathCheck, check}} {
			start := time.Now()
			r := postResponse(t, base+c.path, c.body)
			elapsed := time.Since(start)
			t.Logf("call %d, %s: %d after %v", i, c.path, r.StatusCode, elapsed.Round(time.Millisecond))
			require.Equal(t, http.StatusServiceUnavailable, r.StatusCode, "%s: body: %s", c.path, r.body)
			assert.Equal(t, "1", r.Header.Get("Retry-After"), c.path)
			assert.Contains(t, string(r.body), string(protocol.CodeStoreUnavailable), c.path)
			assert.LessOrEqual(t, elapsed, redisDownBound+redisDownSlack, "%s: 503 within the documented bound", c.path)
		}
	}
	start := time.Now()
	ready := get(t, base+protocol.PathReadyz)
	t.Logf("/readyz: %d after %v", ready.StatusCode, time.Since(start).Round(time.Millisecond))
	assert.Equal(t, http.StatusServiceUnavailable, ready.StatusCode, "body: %s", ready.body)

	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	require.Eventually(t, func() bool {
		return postResponse(t, base+protocol.PathLeases, lease).StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "the server serves again once Redis answers")
	assert.Equal(t, http.StatusOK, get(t, base+protocol.PathReadyz).StatusCode)
	require.NoError(t, d.stop(t))
}

// redisPID returns the process id of the redis-server of rs, as INFO
// server reports it.
func redisPID(t *testing.T, rs *redistest.Server) int {
	t.Helper()
	info := rs.Client(t).InfoMap(context.Background(), "server")
	require.NoError(t, info.Err())
	pid, err := strconv.Atoi(info.Item("Server", "process_id"))
	require.NoError(t, err, "INFO server process_id")
	require.Positive(t, pid)
	return pid
}

// httpResponse is a buffered HTTP response.
type httpResponse struct {
	*http.Response
	body []byte
}

// postResponse posts body as JSON to url, on a connection of its own.
func postResponse(t *testing.T, url, body string) httpResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return send(t, req)
}

// get sends GET url on a connection of its own.
func get(t *testing.T, url string) httpResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return send(t, req)
}

func send(t *testing.T, req *http.Request) httpResponse {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return httpResponse{Response: resp, body: b}
}

func TestFailFast(t *testing.T) {
	opts, err := redis.ParseURL("redis://127.0.0.1:6379/0")
	require.NoError(t, err)
	clientFailFast(opts).apply()
	assert.Equal(t, failFastTimeout, opts.DialTimeout)
	assert.Equal(t, failFastTimeout, opts.ReadTimeout)
	assert.Equal(t, failFastTimeout, opts.WriteTimeout)
	assert.Equal(t, failFastTimeout, opts.PoolTimeout)
	assert.Equal(t, failFastMaxBackoff, opts.MaxRetryBackoff)
	assert.Equal(t, -1, opts.MaxRetries, "a store script is never retried: it may have run")
	assert.Equal(t, 1, opts.DialerRetries)
	assert.True(t, opts.ContextTimeoutEnabled)

	// The URL's values win, a disabled timeout (0: -1 once parsed) included;
	// the context deadline is honoured whatever the URL says.
	opts, err = redis.ParseURL("redis://127.0.0.1:6379/0?dial_timeout=3s&read_timeout=0&write_timeout=2&max_retries=-1&pool_timeout=4s&max_retry_backoff=1s")
	require.NoError(t, err)
	clientFailFast(opts).apply()
	assert.Equal(t, 3*time.Second, opts.DialTimeout)
	assert.Equal(t, time.Duration(-1), opts.ReadTimeout)
	assert.Equal(t, 2*time.Second, opts.WriteTimeout)
	assert.Equal(t, 4*time.Second, opts.PoolTimeout)
	assert.Equal(t, time.Second, opts.MaxRetryBackoff)
	assert.Equal(t, -1, opts.MaxRetries)
	assert.True(t, opts.ContextTimeoutEnabled)

	copts, err := redis.ParseClusterURL("redis://127.0.0.1:7000?addr=127.0.0.1:7001&read_timeout=1s&max_retries=4&dialer_retries=3")
	require.NoError(t, err)
	clusterFailFast(copts).apply()
	assert.Equal(t, failFastTimeout, copts.DialTimeout)
	assert.Equal(t, time.Second, copts.ReadTimeout)
	assert.Equal(t, failFastTimeout, copts.WriteTimeout)
	assert.Equal(t, failFastTimeout, copts.PoolTimeout)
	assert.Equal(t, failFastMaxBackoff, copts.MaxRetryBackoff)
	assert.Equal(t, 4, copts.MaxRetries)
	assert.Equal(t, 3, copts.DialerRetries)
	assert.Equal(t, -1, copts.MaxRedirects, "a cluster command that timed out is not sent again: it may have run")
	assert.True(t, copts.ContextTimeoutEnabled)

	copts, err = redis.ParseClusterURL("redis://127.0.0.1:7000?addr=127.0.0.1:7001&max_redirects=2")
	require.NoError(t, err)
	clusterFailFast(copts).apply()
	assert.Equal(t, 2, copts.MaxRedirects, "the URL's max_redirects wins")
}

func TestExitCode(t *testing.T) {
	assert.Equal(t, 0, exitCode(nil))
	noEnv := func(string) string { return "" }
	for _, tt := range []struct {
		name string
		args []string
		want int
	}{
		{"help", []string{"-h"}, 0},
		{"unknown flag", []string{"-nope"}, 2},
		{"bad flag value", []string{"-drain-delay", "-1s"}, 2},
		{"missing rules file", []string{"-listen", "127.0.0.1:0", "-rules", filepath.Join(t.TempDir(), "nope.yaml")}, 1},
		{"exposed address", []string{"-listen", "0.0.0.0:0"}, 1},
	} {
		err := run(context.Background(), tt.args, noEnv, io.Discard)
		assert.Equal(t, tt.want, exitCode(err), "%s: %v", tt.name, err)
	}
}

func TestRunBadRulesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
rules:
  - name: per-user
    match: "user:*"
    limit: 100
    period: 1s
    burst: -4
`), 0o600))
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-rules", path, "-listen", "127.0.0.1:0"}, func(string) string { return "" }, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `rule "per-user"`)
	assert.Contains(t, err.Error(), "burst")
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, stderr.String(), "level=ERROR")
	assert.Contains(t, stderr.String(), "burst", "the error is logged")
	assert.False(t, errors.Is(err, errUsage))
}

func TestRunRefusesExposedAddress(t *testing.T) {
	var stderr bytes.Buffer
	// New refuses before anything is bound.
	err := run(context.Background(), []string{"-listen", "0.0.0.0:0"}, func(string) string { return "" }, &stderr)
	require.ErrorIs(t, err, server.ErrInsecureListen)
	assert.Contains(t, err.Error(), "-insecure")
	assert.Contains(t, stderr.String(), "level=ERROR")
}

func TestRunListenError(t *testing.T) {
	d := startDaemon(t, nil)
	// The same port again.
	err := run(context.Background(), []string{"-listen", d.addr}, func(string) string { return "" }, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "listen on "+d.addr)
}

func TestParseFlags(t *testing.T) {
	defaults := config{listen: "127.0.0.1:8080", ownKeys: true, logLevel: slog.LevelInfo, logFormat: "text", shutdownTimeout: server.DefaultShutdownTimeout, storeTimeout: server.DefaultStoreTimeout, maxKeys: server.DefaultMaxKeysPerClient, adminName: server.AdminPrincipal}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    config
		wantErr string // substring; the error wraps errUsage
	}{
		{name: "defaults", want: defaults},
		{
			name: "environment",
			env: map[string]string{
				"RATELEASED_LISTEN": "127.0.0.1:9999", "RATELEASED_RULES": "r.yaml",
				"RATELEASED_REDIS": "redis://h:1/0", "RATELEASED_REDIS_CLUSTER": "true",
				"RATELEASED_INSECURE": "1", "RATELEASED_LOG_LEVEL": "debug",
				"RATELEASED_LOG_FORMAT": "json", "RATELEASED_SHUTDOWN_TIMEOUT": "3s",
				"RATELEASED_DRAIN_DELAY": "5s", "RATELEASED_STORE_TIMEOUT": "300ms",
				"RATELEASED_MAX_KEYS_PER_CLIENT": "500", "RATELEASED_ADMIN_NAME": "ops-root",
				"RATELEASED_OWN_KEYS": "false", "RATELEASED_DEBUG_ADDR": "127.0.0.1:6060",
			},
			want: config{listen: "127.0.0.1:9999", rules: "r.yaml", redisURL: "redis://h:1/0", redisCluster: true,
				insecure: true, logLevel: slog.LevelDebug, logFormat: "json", drainDelay: 5 * time.Second, shutdownTimeout: 3 * time.Second,
				storeTimeout: 300 * time.Millisecond, maxKeys: 500, adminName: "ops-root", debugAddr: "127.0.0.1:6060"},
		},
		{
			name: "flags override the environment",
			args: []string{"-listen", "127.0.0.1:1", "-insecure=false", "-own-keys", "-log-level", "WARN", "-shutdown-timeout", "1s", "-drain-delay", "0", "-store-timeout", "2s", "-max-keys-per-client", "-1", "-admin-name", "root"},
			env: map[string]string{"RATELEASED_LISTEN": "127.0.0.1:9999", "RATELEASED_INSECURE": "true", "RATELEASED_OWN_KEYS": "0", "RATELEASED_LOG_LEVEL": "debug", "RATELEASED_DRAIN_DELAY": "5s", "RATELEASED_STORE_TIMEOUT": "1s",
				"RATELEASED_MAX_KEYS_PER_CLIENT": "7", "RATELEASED_ADMIN_NAME": "ops-root"},
			want: config{listen: "127.0.0.1:1", ownKeys: true, logLevel: slog.LevelWarn, logFormat: "text", shutdownTimeout: time.Second, storeTimeout: 2 * time.Second, maxKeys: -1, adminName: "root"},
		},
		{name: "drain delay", args: []string{"-drain-delay", "15s"}, want: func() config { c := defaults; c.drainDelay = 15 * time.Second; return c }()},
		{name: "bad boolean in env", env: map[string]string{"RATELEASED_INSECURE": "yes please"}, wantErr: "RATELEASED_INSECURE"},
		{name: "bad own-keys in env", env: map[string]string{"RATELEASED_OWN_KEYS": "maybe"}, wantErr: "RATELEASED_OWN_KEYS"},
		{name: "bad duration in env", env: map[string]string{"RATELEASED_SHUTDOWN_TIMEOUT": "soon"}, wantErr: "RATELEASED_SHUTDOWN_TIMEOUT"},
		{name: "bad log level", args: []string{"-log-level", "loud"}, wantErr: "-log-level"},
		{name: "bad log format", args: []string{"-log-format", "xml"}, wantErr: "-log-format"},
		{name: "zero shutdown timeout", args: []string{"-shutdown-timeout", "0s"}, wantErr: "-shutdown-timeout"},
		{name: "negative drain delay", args: []string{"-drain-delay", "-1s"}, wantErr: "-drain-delay"},
		{name: "zero store timeout", args: []string{"-store-timeout", "0"}, wantErr: "-store-timeout"},
		{name: "zero max keys", args: []string{"-max-keys-per-client", "0"}, wantErr: "-max-keys-per-client"},
		{name: "bad max keys in env", env: map[string]string{"RATELEASED_MAX_KEYS_PER_CLIENT": "lots"}, wantErr: "RATELEASED_MAX_KEYS_PER_CLIENT"},
		{name: "bad store timeout in env", env: map[string]string{"RATELEASED_STORE_TIMEOUT": "fast"}, wantErr: "RATELEASED_STORE_TIMEOUT"},
		{name: "bad drain delay in env", env: map[string]string{"RATELEASED_DRAIN_DELAY": "later"}, wantErr: "RATELEASED_DRAIN_DELAY"},
		{name: "cluster without URL", args: []string{"-redis-cluster"}, wantErr: "-redis-cluster"},
		{name: "unknown flag", args: []string{"-nope"}, wantErr: "nope"},
		{name: "positional argument", args: []string{"serve"}, wantErr: `"serve"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			cfg, err := parseFlags(tt.args, func(k string) string { return tt.env[k] }, &out)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, errUsage)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.NotEmpty(t, out.String(), "the problem is printed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, cfg)
		})
	}

	var out bytes.Buffer
	_, err := parseFlags([]string{"-h"}, func(string) string { return "" }, &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, out.String(), "RATELEASED_REDIS")
	assert.Contains(t, out.String(), "RATELEASED_DRAIN_DELAY")
	assert.Contains(t, out.String(), "RATELEASED_STORE_TIMEOUT")
	assert.Contains(t, out.String(), "RATELEASED_MAX_KEYS_PER_CLIENT")
}

func TestRunBadRedisURL(t *testing.T) {
	err := run(context.Background(), []string{"-redis", "http://nope"}, func(string) string { return "" }, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-redis")
}

// TestUsageHidesRedisPassword: the usage text, printed on -h and on every
// flag error, never shows the password of the RATELEASED_REDIS URL (flag
// prints a flag's default, which the environment supplies), and the
// variable still applies.
func TestUsageHidesRedisPassword(t *testing.T) {
	const secret = "s3cret-pw"
	env := map[string]string{"RATELEASED_REDIS": "redis://ops:" + secret + "@127.0.0.1:1/0"}
	for _, args := range [][]string{{"-h"}, {"-nope"}, {"-drain-delay", "soon"}, {"-max-keys-per-client", "many"}} {
		r := runCLI(t, env, args...)
		assert.Contains(t, r.stderr, "RATELEASED_REDIS", "%v: the usage is printed", args)
		assert.Empty(t, linesWith(r.stderr+r.stdout, secret), "%v: the password is printed", args)
	}
	cfg, err := parseFlags(nil, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, env["RATELEASED_REDIS"], cfg.redisURL, "the environment applies")
	cfg, err = parseFlags([]string{"-redis", "redis://127.0.0.1:2/0"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "redis://127.0.0.1:2/0", cfg.redisURL, "the flag wins")
}

// linesWith returns the lines of out that hold s.
func linesWith(out, s string) []string {
	var lines []string
	for l := range strings.Lines(out) {
		if strings.Contains(l, s) {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

// TestRunBadRedisURLHidesPassword: a -redis URL that does not parse is
// refused with an error that names the flag and what is wrong, but never
// the URL's password, whatever part of it is malformed: neither in the
// error nor in the log.
func TestRunBadRedisURLHidesPassword(t *testing.T) {
	const secret = "s3cret"
	tests := []struct {
		name, url string
		cluster   bool
		want      string // in the error
	}{
		{"bad port", "redis://ops:" + secret + "@127.0.0.1:notaport/0", false, `invalid port ":notaport"`},
		{"bad port, cluster", "redis://ops:" + secret + "@127.0.0.1:notaport?addr=127.0.0.1:2", true, `invalid port ":notaport"`},
		{"bad escape in the password", "redis://ops:" + secret + "%zz@127.0.0.1:6379/0", false, "password"},
		{"# in the password", "redis://ops:" + secret + "#1@127.0.0.1:6379/0", false, "password"},
		{"/ in the password", "redis://ops:12/" + secret + "@127.0.0.1:6379/0", false, "password"},
		{"unknown option", "redis://ops:" + secret + "@127.0.0.1:6379/0?bogus=1", false, "unexpected option: bogus"},
		{"bad database", "redis://ops:" + secret + "@127.0.0.1:6379/first", false, `invalid database number: "first"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"-listen", "127.0.0.1:0", "-redis", tt.url}
			if tt.cluster {
				args = append(args, "-redis-cluster")
			}
			var stderr bytes.Buffer
			err := run(context.Background(), args, func(string) string { return "" }, &stderr)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "-redis")
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), secret)
			assert.Empty(t, linesWith(stderr.String(), secret), "the password is printed")
		})
	}
}

// TestBadFlagValueExits2: a flag value (or environment variable) that can
// be judged without the network or a file is a usage error, exit 2,
// reported before anything starts and naming the flag, as main.go
// documents for a bad flag: a -redis URL that does not parse, an
// -admin-name that is no valid name, a -listen or -debug-addr that is no
// host:port, and a -debug-addr whose IP is not loopback.
func TestBadFlagValueExits2(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // in the error and in stderr
	}{
		{"redis URL", []string{"-redis", "http://nope"}, nil, "-redis"},
		{"redis URL, cluster", []string{"-redis", "redis://127.0.0.1:notaport", "-redis-cluster"}, nil, "-redis"},
		{"redis URL in env", nil, map[string]string{"RATELEASED_REDIS": "redis://127.0.0.1:6379/first"}, "-redis"},
		{"admin name", []string{"-admin-name", "bad name!"}, nil, "-admin-name"},
		{"admin name in env", nil, map[string]string{"RATELEASED_ADMIN_NAME": "root/ops"}, "-admin-name"},
		{"listen without port", []string{"-listen", "127.0.0.1"}, nil, "-listen"},
		{"listen garbage in env", nil, map[string]string{"RATELEASED_LISTEN": "nope"}, "-listen"},
		{"debug addr without port", []string{"-debug-addr", "localhost"}, nil, "-debug-addr"},
		{"debug addr on every interface", []string{"-debug-addr", ":6060"}, nil, "-debug-addr"},
		{"debug addr not loopback", []string{"-debug-addr", "0.0.0.0:6060"}, nil, "-debug-addr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(t, tt.env, tt.args...)
			require.Error(t, r.err)
			assert.Equal(t, 2, exitCode(r.err), "%v", r.err)
			assert.Contains(t, r.err.Error(), tt.want)
			assert.Contains(t, r.stderr, tt.want)
			assert.NotContains(t, r.stderr, "level=", "refused before anything starts or logs")
		})
	}
}
