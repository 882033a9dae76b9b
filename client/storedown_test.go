package client

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storeDownAnswer answers as rateleased does when its store fails for the
// keys that start with "down:" alone (a Redis Cluster node down): their
// takes and entries fail with store_unavailable, the others are answered
// as allowAnswer does, and a call without takes all of whose entries
// failed is a 503 whose problem carries every entry's result.
func storeDownAnswer(req *protocol.LeaseRequest) (int, any) {
	down := func(k string) bool { return strings.HasPrefix(k, "down:") }
	_, v := allowAnswer(req)
	out := v.(protocol.LeaseResponse)
	failed := func() *protocol.Problem {
		return protocol.NewProblem(protocol.CodeStoreUnavailable, "the store did not answer for this key alone")
	}
	for i, tk := range req.Takes {
		if slices.ContainsFunc(tk.Keys, down) {
			out.Takes[i] = protocol.CheckResponse{Error: failed()}
		}
	}
	for i, e := range req.Leases {
		if down(e.Key) {
			out.Leases[i] = protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Error: failed()}
		}
	}
	if len(req.Takes) == 0 && len(out.Leases) > 0 && !slices.ContainsFunc(out.Leases, func(r protocol.LeaseResult) bool { return r.Error == nil }) {
		p := failed()
		p.Leases = out.Leases
		return http.StatusServiceUnavailable, p
	}
	return http.StatusOK, out
}

// TestKeyStoreDownHeld: a server answers that its store failed for a key
// alone. The client stays online; that key is decided by the fallback,
// and so are its next decisions for storeDownHold, without a call; then it
// is asked again. The other keys are taken as usual. A lease call all of
// whose entries failed so (a 503 that carries every entry's result) is an
// answer, not a failed call: no server error, no retry at another server,
// and the key's lease wait ends at once.
func TestKeyStoreDownHeld(t *testing.T) {
	url, calls := lyingServer(t, storeDownAnswer)
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{url, url}, Fallback: FallbackClosed, LeaseMinTokens: 1 << 40}, clk)
	ctx := context.Background()

	d := c.Allow(ctx, "down:a")
	assert.Equal(t, SourceFallback, d.Source, "decided as when no server answers")
	assert.False(t, d.Allowed, "FallbackClosed")
	require.EqualValues(t, 1, calls.Load())
	for range 5 {
		assert.Equal(t, SourceFallback, c.Allow(ctx, "down:a").Source)
	}
	assert.EqualValues(t, 1, calls.Load(), "held: no call for the key")

	d = c.Allow(ctx, "up:a")
	assert.Equal(t, SourceDirect, d.Source, "another key is taken as usual")
	assert.True(t, d.Allowed)
	assert.EqualValues(t, 2, calls.Load())
	st := c.Stats()
	assert.True(t, st.Online)
	assert.Zero(t, st.ServerErrors)

	clk.move(storeDownHold)
	assert.Equal(t, SourceFallback, c.Allow(ctx, "down:a").Source)
	assert.EqualValues(t, 3, calls.Load(), "asked again after the hold")

	// A take of several keys that fails so holds none of them: which key
	// failed is not known.
	assert.Equal(t, SourceFallback, c.Allow(ctx, "up:b", "down:b").Source)
	assert.EqualValues(t, 4, calls.Load())
	assert.Equal(t, SourceDirect, c.Allow(ctx, "up:b").Source)
	assert.EqualValues(t, 5, calls.Load())
}

// TestLeasedKeyStoreDownHeld: a leased key whose renewal the server
// answers with store_unavailable for it alone, in a 503 that carries the
// entry's result. The answer is an answer: no server error is counted and
// no other server is asked (go-retryablehttp retried it at every server,
// and the decision waiting for the renewal waited out RequestTimeout), and
// the key's spent lease is denied until its deadline, not topped up by the
// fallback.
func TestLeasedKeyStoreDownHeld(t *testing.T) {
	var failing atomic.Bool
	url, calls := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		if !failing.Load() {
			return allowAnswer(req)
		}
		for i := range req.Leases {
			req.Leases[i].Key = "down:" + req.Leases[i].Key
		}
		status, v := storeDownAnswer(req)
		var results []protocol.LeaseResult
		switch v := v.(type) {
		case *protocol.Problem:
			results = v.Leases
		case protocol.LeaseResponse:
			results = v.Leases
		}
		for i := range results {
			results[i].Key = strings.TrimPrefix(results[i].Key, "down:")
		}
		return status, v
	})
	c := leasedClient(t, Config{Servers: []string{url, url}, LeaseMinTokens: 1, Fallback: FallbackClosed}, "hot")
	ctx := context.Background()
	failing.Store(true)
	before := calls.Load()
	var d Decision
	for n := 0; ; n++ {
		require.Less(t, n, 1_000_000, "the lease never ran out")
		if d = c.Allow(ctx, "hot"); !d.Allowed {
			break
		}
	}
	require.Eventually(t, func() bool {
		c.Allow(ctx, "hot") // spent out: the loop asks for the next lease
		return storeDown(c.state("hot"), c.nanos())
	}, 5*time.Second, time.Millisecond, "the renewal's store_unavailable holds the key")
	d = c.Allow(ctx, "hot")
	assert.False(t, d.Allowed)
	assert.Equal(t, SourceLease, d.Source, "a spent lease is denied until its deadline, not topped up by the fallback")
	assert.Greater(t, d.RetryAfter, 10*time.Millisecond, "until the lease's deadline")
	st := c.Stats()
	assert.Zero(t, st.ServerErrors, "a 503 that carries every entry's result is an answer")
	assert.True(t, st.Online)
	assert.EqualValues(t, 1, calls.Load()-before, "one lease call, not retried at the other server")
}
