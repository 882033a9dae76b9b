package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/protocol"
)

// TestLeaseAt: the one attempt of a routed take, straight through
// net/http, answers as lease's go-retryablehttp attempts do: a take result,
// a refusal (ErrServerRefused, naming its server), or a failure of the
// server (not a refusal).
func TestLeaseAt(t *testing.T) {
	const answer = `{"leases":[],"takes":[{"allowed":true,"retry_after_ms":0,"keys":[{"key":"user:1","allowed":true,"retry_after_ms":0,"remaining":4,"limit":2,"period_ms":1000,"burst":5}]}]}`
	problem := func(code protocol.Code) string {
		b, err := protocol.AppendProblem(nil, protocol.NewProblem(code, "no"))
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name        string
		status      int
		ctype, body string
		slow        bool
		refused     error // matched with errors.Is; nil: not a refusal
		failed      bool  // a failure of the server
	}{
		{name: "answer", status: http.StatusOK, ctype: "application/json", body: answer},
		{name: "unauthorized", status: http.StatusUnauthorized, ctype: protocol.ContentTypeProblem, body: problem(protocol.CodeUnauthorized), refused: ErrUnauthorized},
		{name: "forbidden", status: http.StatusForbidden, ctype: protocol.ContentTypeProblem, body: problem(protocol.CodeForbidden), refused: ErrForbidden},
		// rateleased's own 429s answer the entries of a call without
		// takes: one to takes, problem body or not, comes from something
		// in between.
		{name: "429 problem to takes", status: http.StatusTooManyRequests, ctype: protocol.ContentTypeProblem, body: problem(protocol.CodeTooManyKeys), failed: true},
		{name: "429 from a proxy", status: http.StatusTooManyRequests, ctype: "text/plain", body: "slow down", failed: true},
		{name: "unavailable", status: http.StatusServiceUnavailable, ctype: protocol.ContentTypeProblem, body: problem(protocol.CodeStoreUnavailable), failed: true},
		{name: "garbage", status: http.StatusOK, ctype: "application/json", body: `{"leases":`, failed: true},
		{name: "too slow", status: http.StatusOK, ctype: "application/json", body: answer, slow: true, failed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if tt.slow {
					<-release
				}
				w.Header().Set("Content-Type", tt.ctype)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(release) }) // before srv.Close, which waits for the handler
			cfg, err := (&Config{Servers: []string{srv.URL}, RequestTimeout: 100 * time.Millisecond}).withDefaults()
			require.NoError(t, err)
			h := newCaller(&cfg)
			req := &protocol.LeaseRequest{ClientID: "c", Takes: []protocol.CheckRequest{{Keys: []string{"user:1"}}}}
			resp, err := h.leaseAt(context.Background(), 0, req)
			assert.EqualValues(t, 1, h.calls.Load(), "the call is counted")
			assert.Zero(t, h.failures.Load(), "the caller counts the failures of routed takes")
			switch {
			case tt.refused != nil:
				require.ErrorIs(t, err, ErrServerRefused)
				require.ErrorIs(t, err, tt.refused)
				re, ok := errors.AsType[*RefusedError](err)
				require.True(t, ok)
				assert.Equal(t, srv.Listener.Addr().String(), re.Server)
			case tt.failed:
				require.Error(t, err)
				assert.NotErrorIs(t, err, ErrServerRefused)
				assert.Contains(t, err.Error(), srv.Listener.Addr().String(), "the error names the server")
			default:
				require.NoError(t, err)
				require.Len(t, resp.Takes, 1)
				assert.True(t, resp.Takes[0].Allowed)
			}
		})
	}
}

func TestDefaultHTTPClientKeepsConnectionsForTheDirectCalls(t *testing.T) {
	tr, ok := defaultHTTPClient().Transport.(*http.Transport)
	require.True(t, ok)
	assert.GreaterOrEqual(t, tr.MaxIdleConnsPerHost, maxDirectCalls+2)
	assert.GreaterOrEqual(t, tr.MaxIdleConnsPerHost, runtime.GOMAXPROCS(0)+1, "no fewer than go-cleanhttp's")
}
