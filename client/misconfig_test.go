package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// authRules are rules with one client whose token is token.
func authRules(token string) string {
	sum := sha256.Sum256([]byte(token))
	return fmt.Sprintf(`
rules:
  - {name: u, match: "user:*", limit: 1000, period: 1s}
clients:
  - {name: svc, token_sha256: %q, keys: ["user:*"]}
`, hex.EncodeToString(sum[:]))
}

// recordingHandler is a slog.Handler that keeps every record.
type recordingHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// count returns the records at level whose message contains msg.
func (h *recordingHandler) count(level slog.Level, msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// problemServer answers every request with status and a problem body.
func problemServer(t *testing.T, status int, code protocol.Code) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", protocol.ContentTypeProblem)
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"code":%q,"status":%d,"detail":"refused by the test"}`, code, status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// closedAddr returns a loopback URL on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr
}

// TestNewProbe: New fails at once when a server refuses the client's token
// (401) or the client (403), and starts when the token is right, or when no
// server answers at all (an outage is not a misconfiguration).
func TestNewProbe(t *testing.T) {
	const token = "probe-token"
	srv := leasetest.Start(t, authRules(token), leasetest.Options{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(hang.CloseClientConnections) // before Close, which waits for the handler

	tests := []struct {
		name    string
		cfg     client.Config
		wantErr error // nil: New succeeds
	}{
		{"right token", client.Config{Servers: []string{srv.URL()}, Token: token}, nil},
		{"wrong token", client.Config{Servers: []string{srv.URL()}, Token: "wrong"}, client.ErrUnauthorized},
		{"no token", client.Config{Servers: []string{srv.URL()}}, client.ErrUnauthorized},
		{"down, then a server that refuses", client.Config{Servers: []string{closedAddr(t), srv.URL()}, Token: "wrong"}, client.ErrUnauthorized},
		{"403 from the server", client.Config{Servers: []string{problemServer(t, http.StatusForbidden, protocol.CodeForbidden)}}, client.ErrForbidden},
		{"no server listens", client.Config{Servers: []string{closedAddr(t)}}, nil},
		{"no server answers in time", client.Config{Servers: []string{hang.URL}, ProbeTimeout: 200 * time.Millisecond}, nil},
		{"probe skipped", client.Config{Servers: []string{srv.URL()}, Token: "wrong", ProbeTimeout: -1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			c, err := client.New(tt.cfg)
			elapsed := time.Since(start)
			assert.Less(t, elapsed, 3*time.Second, "New is bounded by ProbeTimeout")
			if tt.wantErr == nil {
				require.NoError(t, err)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_ = c.Close(ctx)
				return
			}
			require.Error(t, err)
			assert.Nil(t, c)
			assert.ErrorIs(t, err, tt.wantErr)
			assert.ErrorIs(t, err, client.ErrServerRefused)
			assert.NotErrorIs(t, err, client.ErrRateLimited)
			var re *client.RefusedError
			require.ErrorAs(t, err, &re)
			assert.NotEmpty(t, re.Detail, "the server's explanation is kept")
		})
	}
}

// TestRefusedIsNotRateLimited: a server that starts refusing the client's
// token (a rules reload) makes every decision say unauthorized, never rate
// limited; Wait returns at once with the cause; Stats counts the refusals;
// it is logged once at ERROR, not once per request; and when the server
// accepts the token again, decisions are allowed again.
func TestRefusedIsNotRateLimited(t *testing.T) {
	const token = "reload-token"
	srv := leasetest.Start(t, authRules(token), leasetest.Options{})
	logs := &recordingHandler{}
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, Token: token, Fallback: client.FallbackOpen, Logger: slog.New(logs)})
	ctx := context.Background()
	require.True(t, c.Allow(ctx, "user:1").Allowed)

	srv.SetRules(authRules("another-token"))
	var d client.Decision
	require.Eventually(t, func() bool {
		d = c.Allow(ctx, "user:1")
		return d.Source == client.SourceRefused
	}, 5*time.Second, 5*time.Millisecond)
	assert.False(t, d.Allowed)
	require.ErrorIs(t, d.Err, client.ErrUnauthorized)
	assert.Contains(t, d.Err.Error(), "unauthorized")
	assert.Equal(t, "refused", d.Source.String())

	for range 50 {
		d = c.Allow(ctx, "user:2")
		assert.Equal(t, client.SourceRefused, d.Source)
		assert.ErrorIs(t, d.Err, client.ErrUnauthorized)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err := c.Wait(wctx, "user:1")
	assert.Less(t, time.Since(start), time.Second, "Wait does not wait on a refusal")
	require.ErrorIs(t, err, client.ErrUnauthorized)
	assert.ErrorIs(t, err, client.ErrServerRefused)
	assert.NotErrorIs(t, err, client.ErrRateLimited)

	st := c.Stats()
	assert.Positive(t, st.Refusals)
	assert.True(t, st.Online, "a server answered")
	assert.Zero(t, st.FallbackDecisions, "the fallback is not for a refusal")
	assert.Equal(t, 1, logs.count(slog.LevelError, "refused the client"), "logged once")

	srv.SetRules(authRules(token))
	require.Eventually(t, func() bool { return c.Allow(ctx, "user:1").Allowed }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.count(slog.LevelInfo, "accepts the client again"))
}

// TestTransportRefused: a request through Transport whose client the server
// refuses fails with the cause, not a rate limit, and is not sent.
func TestTransportRefused(t *testing.T) {
	srv := leasetest.Start(t, authRules("t-token"), leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}, Token: "wrong", ProbeTimeout: -1})
	up := startUpstream(t, nil)
	hc := &http.Client{Transport: c.Transport(nil, keyed("user:t"))}
	resp, err := hc.Get(up.URL)
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, client.ErrUnauthorized)
	assert.NotErrorIs(t, err, client.ErrRateLimited)
	assert.Zero(t, up.hits.Load(), "nothing sent")
}
