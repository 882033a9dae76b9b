package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
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

func (s *slowStore) Lease(ctx context.Context, owner leases.Owner, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Lease(ctx, owner, ops)
}

func TestGracefulShutdown(t *testing.T) {
	store := newSlowStore(t)
	f := newFixture(t, rulesYAML, store, Options{ShutdownTimeout: 5 * time.Second})
	addr := strings.TrimPrefix(f.url, "http://")

	type result struct {
		resp response
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.url+protocol.PathLeases,
			strings.NewReader(`{"client_id":"c","leases":[{"key":"user:1","want":5}]}`))
		resp, err := f.client.Do(req)
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

	f.cancel() // shutdown begins with the request in flight
	// Without DrainDelay, the listener closes at once: new connections are
	// refused while the request in flight goes on.
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, time.Second, 5*time.Millisecond, "new connections are refused")
	select {
	case <-f.done:
		t.Fatalf("Run returned before the in-flight request finished: %v", f.err)
	case <-time.After(150 * time.Millisecond):
	}

	store.Release()
	got := <-inflight
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.resp.status, "body: %s", got.resp.body)
	var lr protocol.LeaseResponse
	require.NoError(t, json.Unmarshal(got.resp.body, &lr))
	assert.EqualValues(t, 5, lr.Leases[0].Granted)

	select {
	case <-f.done:
		require.NoError(t, f.err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the in-flight request finished")
	}
	assert.Contains(t, f.logs.String(), "shut down")
	assert.NotContains(t, f.logs.String(), "drain delay")
}

// TestDrainDelay: after Run's context is canceled, the server goes on
// serving for DrainDelay with /readyz failing, as a load balancer sees it
// over new connections, then stops.
func TestDrainDelay(t *testing.T) {
	const delay = 600 * time.Millisecond
	f := newFixture(t, rulesYAML, nil, Options{DrainDelay: delay})
	// Every request on a new connection, as a load balancer's health check.
	lb := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(path string) response { return doURL(t, lb, http.MethodGet, f.url+path, "", "", nil) }
	require.Equal(t, http.StatusOK, get(protocol.PathReadyz).status)

	canceled := time.Now()
	f.cancel()
	r := get(protocol.PathReadyz)
	for r.status == http.StatusOK && time.Since(canceled) < delay/2 {
		time.Sleep(5 * time.Millisecond)
		r = get(protocol.PathReadyz)
	}
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	assert.Equal(t, protocol.CodeShuttingDown, r.problem(t).Code) // application/problem+json
	assert.Equal(t, "1", r.header.Get("Retry-After"))

	// The rest of the API still serves during the delay.
	assert.Equal(t, http.StatusOK, get(protocol.PathHealthz).status)
	lease := doURL(t, lb, http.MethodPost, f.url+protocol.PathLeases, "", "application/json",
		strings.NewReader(`{"client_id":"c","leases":[{"key":"user:1","want":1}]}`))
	assert.Equal(t, http.StatusOK, lease.status, "body: %s", lease.body)
	require.Less(t, time.Since(canceled), delay, "the checks ran within the delay")

	select {
	case <-f.done:
		require.NoError(t, f.err)
	case <-time.After(delay + 5*time.Second):
		t.Fatal("Run did not return after the drain delay")
	}
	assert.GreaterOrEqual(t, time.Since(canceled), delay, "Run served for the whole delay")
	_, err := lb.Get(f.url + protocol.PathHealthz)
	require.Error(t, err, "after the delay, new connections are refused")
	assert.Contains(t, f.logs.String(), "drain delay")
}

func TestShutdownTimeout(t *testing.T) {
	store := newSlowStore(t)
	f := newFixture(t, rulesYAML, store, Options{ShutdownTimeout: 100 * time.Millisecond, StoreTimeout: time.Minute})
	errc := make(chan error, 1)
	go func() {
		resp, err := f.client.Post(f.url+protocol.PathLeases, "application/json",
			strings.NewReader(`{"client_id":"c","leases":[{"key":"user:1","want":5}]}`))
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-store.entered
	f.cancel()
	select {
	case <-f.done:
		require.Error(t, f.err)
		assert.ErrorIs(t, f.err, context.DeadlineExceeded)
		assert.Contains(t, f.err.Error(), "ShutdownTimeout")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not give up after ShutdownTimeout")
	}
	store.Release()
	<-errc // the connection was closed under it; any outcome is fine
}

// TestStoreTimeout: a store that does not answer within StoreTimeout gives
// 503 store_unavailable, soon, rather than holding the caller.
func TestStoreTimeout(t *testing.T) {
	store := newSlowStore(t)
	f := newFixture(t, rulesYAML, store, Options{StoreTimeout: 50 * time.Millisecond})
	start := time.Now()
	r := f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":5}]}`)
	elapsed := time.Since(start)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	assert.Equal(t, protocol.CodeStoreUnavailable, r.problem(t).Code)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.GreaterOrEqual(t, elapsed, 50*time.Millisecond)
	assert.Less(t, elapsed, time.Second, "answered after StoreTimeout, not when the store answered")
	assert.Contains(t, f.logs.String(), "store unavailable")
}

func TestRunServesH2C(t *testing.T) {
	f := newFixture(t, "", nil, Options{})

	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols, TLSClientConfig: &tls.Config{}}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Post(f.url+protocol.PathLeases, "application/json",
		strings.NewReader(`{"client_id":"c","leases":[{"key":"k","want":5}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2, resp.ProtoMajor, "served over h2c")

	resp1, err := f.client.Get(f.url + protocol.PathHealthz)
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
