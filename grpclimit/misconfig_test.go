package grpclimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/grpclimit"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRefusedWhileWaitingIsUnavailable: a call held by MaxWait whose wait
// ends in a refusal of the lease servers (a key this service may not use)
// fails Unavailable, as the docs promise for a refused key ("never
// ResourceExhausted"). Its first decision was a local denial, which asks
// no server; it failed ResourceExhausted with a retry-after (found by
// review; httplimit's TestRefusedWhileQueuedIs503).
func TestRefusedWhileWaitingIsUnavailable(t *testing.T) {
	c := inboundtest.RestrictedClient(t, testRules+`
  - {name: second, match: "second:*", limit: 1, period: 1s, burst: 1}
`, "second:*", "ok|*")
	keys := []grpclimit.Key{{Template: "second:{md:x-api-key}"}, {Template: "{md:x-scope}|x"}}
	plain := serve(t, newLimiter(t, grpclimit.Config{Client: c, Keys: keys}))
	var mu sync.Mutex
	var seen grpclimit.Result
	queued := serve(t, newLimiter(t, grpclimit.Config{Client: c, Keys: keys, MaxWait: 5 * time.Second,
		OnDecision: func(_ context.Context, _ string, r grpclimit.Result) { mu.Lock(); seen = r; mu.Unlock() }}))

	_, err := check(t, plain, "k", "x-scope", "ok")
	require.NoError(t, err)
	_, err = check(t, plain, "k", "x-scope", "ok")
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "the limit (1/s) is spent")

	_, err = check(t, queued, "k", "x-scope", "bad")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("waiting call with a refused key: %v; result err %v", err, seen.Err)
	assert.ErrorIs(t, seen.Err, client.ErrForbidden, "the wait ended in a refusal")
	assert.Equal(t, codes.Unavailable, status.Code(err), "a refusal answered as a rate limit")
	assert.Equal(t, grpclimit.OutcomeRefused, seen.Outcome)
}
