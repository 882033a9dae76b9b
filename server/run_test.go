package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// slowStore blocks Lease calls until release is closed (or their context
// ends), after signaling entered.
type slowStore struct {
	leases.Store
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newSlowStore(t *testing.T) *slowStore {
	ms := leases.NewMemoryStore(leases.MemoryOptions{})
	s := &slowStore{Store: ms, entered: make(chan struct{}, 16), release: make(chan struct{})}
	t.Cleanup(func() {
		s.Release()
		_ = ms.Close()
	})
	return s
}

func (s *slowStore) Release() { s.once.Do(func() { close(s.release) }) }

func (s *slowStore) Lease(ctx context.Context, owner string, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Lease(ctx, owner, ops)
}

// running is a Server served by Run on a 127.0.0.1 listener.
type running struct {
	srv    *Server
	url    string
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // Run's result, once done is closed
	logs   *syncBuffer
}

func startRun(t *testing.T, opts Options) *running {
	t.Helper()
	logs := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(opts)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan struct{}), logs: logs}
	go func() {
		defer close(r.done)
		r.err = srv.Run(ctx, ln)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	return r
}

func TestGracefulShutdown(t *testing.T) {
	store := newSlowStore(t)
	rules := writeTemp(t, rulesYAML)
	r := startRun(t, Options{Store: store, RulesPath: rules, ShutdownTimeout: 5 * time.Second})
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	type result struct {
		resp response
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, r.url+protocol.PathLeases,
			strings.NewReader(`{"client_id":"c","leases":[{"key":"user:1","want":5}]}`))
		resp, err := client.Do(req)
		if err != nil {
			inflight <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		inflight <- result{resp: response{status: resp.StatusCode, body: b}, err: err}
	}()
	select {
	case <-store.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached the store")
	}

	r.cancel() // shutdown begins with the request in flight
	select {
	case <-r.done:
		t.Fatalf("Run returned before the in-flight request finished: %v", r.err)
	case <-time.After(150 * time.Millisecond):
	}
	assert.Eventually(t, func() bool { return r.srv.draining.Load() }, time.Second, 5*time.Millisecond)

	store.Release()
	got := <-inflight
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.resp.status, "body: %s", got.resp.body)
	var lr protocol.LeaseResponse
	require.NoError(t, json.Unmarshal(got.resp.body, &lr))
	assert.EqualValues(t, 5, lr.Leases[0].Granted)

	select {
	case <-r.done:
		require.NoError(t, r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the in-flight request finished")
	}
	assert.Contains(t, r.logs.String(), "shut down")

	// New connections are refused.
	_, err := client.Get(r.url + protocol.PathHealthz)
	require.Error(t, err)
}

func TestShutdownTimeout(t *testing.T) {
	store := newSlowStore(t)
	rules := writeTemp(t, rulesYAML)
	r := startRun(t, Options{Store: store, RulesPath: rules, ShutdownTimeout: 100 * time.Millisecond, StoreTimeout: time.Minute})
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	errc := make(chan error, 1)
	go func() {
		resp, err := client.Post(r.url+protocol.PathLeases, "application/json",
			strings.NewReader(`{"client_id":"c","leases":[{"key":"user:1","want":5}]}`))
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-store.entered
	r.cancel()
	select {
	case <-r.done:
		require.Error(t, r.err)
		assert.ErrorIs(t, r.err, context.DeadlineExceeded)
		assert.Contains(t, r.err.Error(), "ShutdownTimeout")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not give up after ShutdownTimeout")
	}
	store.Release()
	<-errc // the connection was closed under it; any outcome is fine
}

func TestRunServesH2C(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() })
	r := startRun(t, Options{Store: store})

	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols, TLSClientConfig: &tls.Config{}}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Post(r.url+protocol.PathLeases, "application/json",
		strings.NewReader(`{"client_id":"c","leases":[{"key":"k","want":5}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2, resp.ProtoMajor, "served over h2c")

	resp1, err := http.Get(r.url + protocol.PathHealthz)
	require.NoError(t, err)
	resp1.Body.Close()
	assert.Equal(t, 1, resp1.ProtoMajor, "and HTTP/1.1")
}

func TestRunRefusesExposedListener(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() })
	srv, err := New(Options{Store: store})
	require.NoError(t, err)
	// A listener that claims a non-loopback address; nothing is bound there.
	ln := &fakeListener{addr: &net.TCPAddr{IP: net.IPv4zero, Port: 8080}}
	err = srv.Run(context.Background(), ln)
	require.ErrorIs(t, err, ErrInsecureListen)
	assert.True(t, ln.closed)

	err = srv.Run(context.Background(), &fakeListener{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}})
	require.Error(t, err, "Run twice")
}

func TestRunReturnsServeError(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() })
	srv, err := New(Options{Store: store})
	require.NoError(t, err)
	ln := &fakeListener{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, acceptErr: errors.New("accept failed")}
	err = srv.Run(context.Background(), ln)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "accept failed")
}

type fakeListener struct {
	addr      net.Addr
	acceptErr error
	mu        sync.Mutex
	closed    bool
}

func (l *fakeListener) Accept() (net.Conn, error) {
	if l.acceptErr != nil {
		return nil, l.acceptErr
	}
	return nil, net.ErrClosed
}

func (l *fakeListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return nil
}

func (l *fakeListener) Addr() net.Addr { return l.addr }
