package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// Tokens and their hashes for the test clients.
const (
	alphaToken = "alpha-token"
	betaToken  = "beta-token"
)

// sha returns the hex SHA-256 of token, as a rules file's token_sha256.
func sha(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// rulesYAML are the rules of most tests: per-user 100/s, burst 100; tiny
// 1/h, burst 1, for denials.
const rulesYAML = `
default: allow
rules:
  - name: per-user
    match: "user:*"
    limit: 100
    period: 1s
    burst: 100
    lease_ttl: 2s
  - name: tiny
    match: "tiny:*"
    limit: 1
    period: 1h
`

// authRulesYAML adds two clients: alpha may use user:* and tiny:*, beta
// user:* only.
func authRulesYAML() string {
	return rulesYAML + `
clients:
  - name: alpha
    token_sha256: "` + sha(alphaToken) + `"
    keys: ["user:*", "tiny:*"]
  - name: beta
    token_sha256: "` + sha(betaToken) + `"
    keys: ["user:*"]
`
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fixture is a Server served by Run on a 127.0.0.1 listener.
type fixture struct {
	t      *testing.T
	srv    *Server
	url    string       // "http://127.0.0.1:port"
	client *http.Client // with a transport of its own
	store  leases.Store
	reg    *prometheus.Registry
	path   string // rules file, when any
	logs   *syncBuffer

	ctx    context.Context    // Run's context
	cancel context.CancelFunc // begins Run's shutdown
	done   chan struct{}      // closed when Run has returned
	err    error              // Run's result, once done is closed
}

// newFixture starts a server with the given rules file content (none when
// empty) over store (a fresh memory store when nil). opts.Store,
// opts.RulesPath, opts.Logger and opts.Registry are filled in. The server
// is shut down at the end of the test, which fails if Run then fails,
// unless the test canceled Run itself.
// frozenStore returns a memory store whose clock stands still: its buckets
// do not refill, so a test can assert their levels exactly, however long
// its requests take on a loaded machine.
func frozenStore(t *testing.T) leases.Store {
	t.Helper()
	at := time.UnixMilli(1_700_000_000_000)
	ms := leases.NewMemoryStore(leases.MemoryOptions{Now: func() time.Time { return at }})
	t.Cleanup(func() { _ = ms.Close() })
	return ms
}

func newFixture(t *testing.T, rules string, store leases.Store, opts Options) *fixture {
	t.Helper()
	if store == nil {
		ms := leases.NewMemoryStore(leases.MemoryOptions{})
		t.Cleanup(func() { _ = ms.Close() })
		store = ms
	}
	f := &fixture{t: t, store: store, reg: prometheus.NewRegistry(), logs: &syncBuffer{}, done: make(chan struct{})}
	if rules != "" {
		f.path = writeTemp(t, rules)
	}
	opts.Store = store
	opts.RulesPath = f.path
	opts.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.Registry = f.reg
	srv, err := New(opts)
	require.NoError(t, err)
	f.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = srv.Close()
		t.Fatal(err)
	}
	f.url = "http://" + ln.Addr().String()
	f.client = &http.Client{Transport: &http.Transport{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(f.done)
		f.err = srv.Run(f.ctx, ln)
	}()
	t.Cleanup(func() {
		f.client.CloseIdleConnections()
		canceledByTest := f.ctx.Err() != nil
		if err := f.stop(); err != nil && !canceledByTest {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("server logs:\n%s", f.logs.String())
		}
	})
	return f
}

// stop cancels Run's context and returns Run's result once it has
// returned.
func (f *fixture) stop() error {
	f.cancel()
	select {
	case <-f.done:
		return f.err
	case <-time.After(10 * time.Second):
		f.t.Fatal("Run did not return within 10s of its context's cancellation")
		return nil
	}
}

// writeRules replaces the rules file atomically.
func (f *fixture) writeRules(content string) {
	f.t.Helper()
	replaceFile(f.t, f.path, content)
}

// response is a buffered HTTP response.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request to the fixture's server.
func (f *fixture) do(method, path, token, contentType string, body io.Reader) response {
	f.t.Helper()
	return doURL(f.t, f.client, method, f.url+path, token, contentType, body)
}

func doURL(t *testing.T, c *http.Client, method, url, token, contentType string, body io.Reader) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// postJSON posts v (a string is sent as is) as application/json.
func (f *fixture) postJSON(path, token string, v any) response {
	f.t.Helper()
	var body []byte
	switch v := v.(type) {
	case string:
		body = []byte(v)
	case []byte:
		body = v
	default:
		var err error
		body, err = json.Marshal(v)
		require.NoError(f.t, err)
	}
	return f.do(http.MethodPost, path, token, "application/json", bytes.NewReader(body))
}

// lease posts a lease request and requires a 200.
func (f *fixture) lease(token, clientID string, entries ...protocol.LeaseEntry) []protocol.LeaseResult {
	f.t.Helper()
	r := f.postJSON(protocol.PathLeases, token, protocol.LeaseRequest{ClientID: clientID, Leases: entries})
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	var lr protocol.LeaseResponse
	require.NoError(f.t, json.Unmarshal(r.body, &lr))
	require.Len(f.t, lr.Leases, len(entries))
	return lr.Leases
}

// problem decodes a problem response, checking its content type and that
// its status matches the HTTP status.
func (r response) problem(t *testing.T) protocol.Problem {
	t.Helper()
	require.Equal(t, protocol.ContentTypeProblem, r.header.Get("Content-Type"), "body: %s", r.body)
	var p protocol.Problem
	require.NoError(t, json.Unmarshal(r.body, &p), "body: %s", r.body)
	require.Equal(t, r.status, p.Status, "problem status")
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Detail)
	return p
}

// perUser is the bucket of the per-user rule, for store.State.
var perUser = leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100, LeaseTTL: 2 * time.Second}

// state returns the store's state of key under the per-user rule.
func (f *fixture) state(key string) leases.BucketState {
	f.t.Helper()
	st, err := f.store.State(context.Background(), key, perUser)
	require.NoError(f.t, err)
	return st
}

// metric returns the value of the sample line that starts with name in the
// /metrics exposition, or fails.
func (f *fixture) metric(name string) string {
	f.t.Helper()
	r := f.do(http.MethodGet, protocol.PathMetrics, "", "", nil)
	require.Equal(f.t, http.StatusOK, r.status)
	for line := range strings.SplitSeq(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	f.t.Fatalf("metric %s not in /metrics:\n%s", name, r.body)
	return ""
}

// writeTemp writes content to a new file in t.TempDir and returns its path.
// Every test that needs a rules file writes it with writeTemp.
func writeTemp(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// replaceFile replaces the file at path with content atomically, by rename,
// as the server's documentation asks.
func replaceFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}
