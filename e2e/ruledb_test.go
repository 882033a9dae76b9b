package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

// TestRuleDBTwoDaemons: two real rateleased processes in database mode
// share one Redis; a rule and an override put through one's admin API
// apply on the other within a second (pub/sub, with the periodic version
// check as a safety net).
func TestRuleDBTwoDaemons(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const token = "e2e-admin-token"
	sum := sha256.Sum256([]byte(token))
	rs := redistest.Start(t)
	args := []string{"-redis", rs.URL(), "-admin-token-sha256", hex.EncodeToString(sum[:])}
	a := e2eproc.StartDaemon(t, bins.rateleased, args...)
	b := e2eproc.StartDaemon(t, bins.rateleased, args...)

	do := func(method, url string, body any) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			data, err := json.Marshal(body)
			require.NoError(t, err)
			rd = bytes.NewReader(data)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, url, rd)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, data
	}
	limitOn := func(d *e2eproc.Daemon, key string) (string, int64) {
		status, body := do(http.MethodPost, d.URL()+protocol.PathCheck, protocol.CheckRequest{Keys: []string{key}})
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		var cr protocol.CheckResponse
		require.NoError(t, json.Unmarshal(body, &cr))
		return cr.Keys[0].Rule, cr.Keys[0].Limit
	}
	// poll polls cond until it holds, failing after a second.
	poll := func(what string, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			require.Less(t, time.Since(start), time.Second, "%s: not within a second", what)
			time.Sleep(5 * time.Millisecond) // polling an observed state
		}
		return time.Since(start)
	}

	status, body := do(http.MethodPut, a.URL()+protocol.PathAdminRules+"/per-user", protocol.AdminRule{Match: "user:*", Limit: 1000, Period: "1m"})
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	took := poll("rule on b", func() bool { r, l := limitOn(b, "user:7"); return r == "per-user" && l == 1000 })
	t.Logf("rule put on a in force on b after %v", took)

	status, body = do(http.MethodPut, a.URL()+protocol.PathAdminRules+"/per-user", protocol.AdminRule{Match: "user:*", Limit: 500, Period: "1m"})
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	took = poll("changed rule on b", func() bool { _, l := limitOn(b, "user:7"); return l == 500 })
	t.Logf("rule changed on a in force on b after %v", took)

	status, body = do(http.MethodPut, b.URL()+protocol.PathAdminOverrides+"/user:241531", protocol.AdminOverride{Limit: 5, Period: "1s"})
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	took = poll("override on a", func() bool { r, l := limitOn(a, "user:241531"); return r == "override" && l == 5 })
	t.Logf("override put on b in force on a after %v", took)
	r, l := limitOn(a, "user:7")
	require.Equal(t, "per-user", r)
	require.EqualValues(t, 500, l, "the override is for its key only")
}
