package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

// TestRunDatabaseModeOnCluster: two daemons given a Redis Cluster
// (-redis with the seed nodes, -redis-cluster) and no rules file run in
// database mode on it: a rule put through one's admin API applies on the
// other within a second, and both share its buckets.
func TestRunDatabaseModeOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	const token = "cluster-admin"
	sum := sha256.Sum256([]byte(token))
	env := map[string]string{
		"RATELEASED_REDIS":              "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr="),
		"RATELEASED_REDIS_CLUSTER":      "true",
		"RATELEASED_ADMIN_TOKEN_SHA256": hex.EncodeToString(sum[:]),
	}
	d1, d2 := startDaemon(t, env), startDaemon(t, env)
	for _, d := range []*daemon{d1, d2} {
		assert.Equal(t, "database", d.start["rules_source"])
		assert.Equal(t, true, d.start["redis_cluster"])
		assert.Equal(t, true, d.start["admin_api"])
	}

	req, err := http.NewRequest(http.MethodPut, "http://"+d1.addr+protocol.PathAdminRules+"/api",
		strings.NewReader(`{"match":"api:*","limit":2,"period":"1m"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	r := send(t, req)
	require.Equal(t, http.StatusOK, r.StatusCode, "body: %s", r.body)

	limitOn := func(d *daemon) int64 {
		res := get(t, "http://"+d.addr+protocol.PathRules)
		require.Equal(t, http.StatusOK, res.StatusCode, "body: %s", res.body)
		var rr protocol.RulesResponse
		require.NoError(t, json.Unmarshal(res.body, &rr))
		for _, rl := range rr.Rules {
			if rl.Name == "api" {
				return rl.Limit
			}
		}
		return 0
	}
	start := time.Now()
	for limitOn(d2) != 2 {
		// Within a second is asserted where the processes run alone
		// (e2e, server); here the point is that database mode works on a
		// cluster, and this package's tests share the cores with others.
		require.Less(t, time.Since(start), 5*time.Second, "the rule reaches d2")
		time.Sleep(5 * time.Millisecond) // polling an observed state, not synchronising
	}
	t.Logf("rule put on d1 applied on d2 after %v", time.Since(start))

	// 2 per minute, whichever daemon decides.
	check := `{"keys":["api:x"]}`
	for i, want := range []bool{true, true, false} {
		d := []*daemon{d1, d2, d1}[i]
		status, body := post(t, "http://"+d.addr+protocol.PathCheck, "", check)
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		var cr protocol.CheckResponse
		require.NoError(t, json.Unmarshal(body, &cr))
		assert.Equal(t, want, cr.Allowed, "check %d", i)
	}
	require.NoError(t, d1.stop(t))
	require.NoError(t, d2.stop(t))
}
