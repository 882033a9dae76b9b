package httplimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRefusedWhileQueuedIs503: a request held in the queue (MaxWait)
// whose wait ends in a refusal of the lease servers (a key this service
// may not use: a misconfiguration) gets the documented 503, never a 429
// that sends the caller to retry. Its first decision was a local denial
// (the other key's limit, spent), which asks no server; the refusal came
// with the wait, and was answered 429 (found by review).
func TestRefusedWhileQueuedIs503(t *testing.T) {
	c := inboundtest.RestrictedClient(t, testRules, "second:*", "ok|*")

	keys := []httplimit.Key{{Template: "second:{header:X-API-Key}"}, {Template: "{header:X-Scope}|x"}}
	plain, err := httplimit.New(httplimit.Config{Client: c, Keys: keys})
	require.NoError(t, err)
	var seen httplimit.Result
	queued, err := httplimit.New(httplimit.Config{Client: c, Keys: keys, MaxWait: 5 * time.Second,
		OnDecision: func(_ *http.Request, r httplimit.Result) { seen = r }})
	require.NoError(t, err)

	req := func(h http.Handler, scope string) int {
		return get(&scoped{h, scope}, "k").Code
	}
	require.Equal(t, http.StatusOK, req(plain.Handler(okHandler), "ok"))
	require.Equal(t, http.StatusTooManyRequests, req(plain.Handler(okHandler), "ok"), "the limit (1/s) is spent")

	code := req(queued.Handler(okHandler), "bad")
	assert.ErrorIs(t, seen.Err, client.ErrForbidden, "the wait ended in a refusal")
	assert.Equal(t, httplimit.OutcomeRefused, seen.Outcome)
	assert.Equal(t, http.StatusServiceUnavailable, code, "a refusal (misconfiguration) answered as a rate limit")
	assert.Equal(t, int64(1), queued.Stats().Refused)
}

type scoped struct {
	h     http.Handler
	scope string
}

func (s *scoped) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Header.Set("X-Scope", s.scope)
	s.h.ServeHTTP(w, r)
}

// TestShadowRefusalNotShadowDenial: in Shadow mode a key the lease servers
// refuse (a misconfiguration, Decision.Err set) is admitted, as every
// request is, but reported as OutcomeRefused and counted in Stats.Refused.
// It was reported as OutcomeShadow ("would have denied") and counted in
// Stats.Shadow: the operator rolling a limit out read a misconfiguration
// as a limit too tight (found by review).
func TestShadowRefusalNotShadowDenial(t *testing.T) {
	c := inboundtest.RestrictedClient(t, testRules, "hello:*")
	var seen httplimit.Result
	m, err := httplimit.New(httplimit.Config{
		Client:     c,
		Keys:       []httplimit.Key{{Template: "two:{header:X-API-Key}"}},
		Shadow:     true,
		OnDecision: func(_ *http.Request, r httplimit.Result) { seen = r },
	})
	require.NoError(t, err)
	rec := get(m.Handler(okHandler), "alice")
	assert.Equal(t, http.StatusOK, rec.Code, "shadow admits")
	require.Error(t, seen.Decision.Err, "the servers refused the key")
	assert.Equal(t, httplimit.OutcomeRefused, seen.Outcome)
	assert.ErrorIs(t, seen.Err, client.ErrServerRefused)
	assert.False(t, seen.WouldDeny(), "a refusal is no limit's denial")
	assert.Equal(t, httplimit.Stats{Refused: 1}, m.Stats())
}

// TestClosedClientIs503: after Client.Close (a shutdown in the wrong
// order: the client closed while http.Server.Shutdown drains requests)
// a request is answered 503 "shutting down", as one that was waiting
// when the client closed is, and as grpclimit answers Unavailable. It was
// answered 429 with Retry-After: 1 and "the rate limit is exhausted",
// though no limit decided it (found by review).
func TestClosedClientIs503(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	c := inboundtest.DirectClient(t, srv)
	m, h := newHandler(t, httplimit.Config{Client: c})
	require.Equal(t, http.StatusOK, get(h, "k").Code)
	require.NoError(t, c.Close(context.Background()))
	rec := get(h, "k")
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Empty(t, rec.Header().Get("Retry-After"))
	assert.Contains(t, rec.Body.String(), "shutting down")
	assert.Equal(t, int64(1), m.Stats().Denied)
}

// TestImpossibleCostIs503: a Cost hook that asks more tokens than any
// decision can take (above protocol.MaxCount) is a misconfiguration: 503,
// OutcomeRefused. Its decision was denied without an error, and the
// request answered 429 with Retry-After: 1, though no retry could succeed
// (found by review).
func TestImpossibleCostIs503(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	var seen httplimit.Result
	_, h := newHandler(t, httplimit.Config{Client: inboundtest.DirectClient(t, srv),
		Cost:       func(*http.Request) int64 { return protocol.MaxCount + 1 },
		OnDecision: func(_ *http.Request, r httplimit.Result) { seen = r }})
	rec := get(h, "k")
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Equal(t, httplimit.OutcomeRefused, seen.Outcome)
	assert.ErrorIs(t, seen.Err, client.ErrInvalidRequest)
}
