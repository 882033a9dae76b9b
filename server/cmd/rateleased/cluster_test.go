package main

import (
	"context"
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
	"github.com/ratelease/ratelease/server"
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

// TestRunDatabaseModeRedisDownAtStart: in database mode a daemon started
// while Redis is down starts, as in file mode, and serves 503
// store_unavailable to every call, authenticated or not (never the
// placeholder of no rules, every key unlimited and no authentication),
// with /readyz failing, until it has read the rule database; once Redis
// is back it serves the database's rules and clients by itself. It exited
// 1 at once, after logging that it served 503 until Redis answered.
func TestRunDatabaseModeRedisDownAtStart(t *testing.T) {
	rs := redistest.StartWith(t, redistest.Options{Persist: true})
	db := server.NewRuleDB(rs.Client(t), server.RuleDBOptions{})
	ctx := context.Background()
	const token = "svc-token"
	sum := sha256.Sum256([]byte(token))
	_, err := db.PutRule(ctx, "test", protocol.AdminRule{Name: "api", Match: "api:*", Limit: 3, Period: "1m"}, "", nil)
	require.NoError(t, err)
	_, err = db.PutClient(ctx, "test", protocol.AdminClient{Name: "svc", TokenSHA256: hex.EncodeToString(sum[:]), Keys: []string{"*"}}, "", nil)
	require.NoError(t, err)
	rs.Stop(t)

	d := startDaemon(t, map[string]string{"RATELEASED_REDIS": rs.URL()})
	assert.Equal(t, "database", d.start["rules_source"])
	assert.Equal(t, true, d.start["rules_pending"], "no rule set read yet")
	assert.NotContains(t, d.start, "default", "the placeholder's default allow is in force nowhere")
	base := "http://" + d.addr
	check := `{"keys":["api:x"]}`
	for _, tok := range []string{"", token} {
		status, body := post(t, base+protocol.PathCheck, tok, check)
		assert.Equal(t, http.StatusServiceUnavailable, status, "token %q: body: %s", tok, body)
		assert.Contains(t, string(body), string(protocol.CodeStoreUnavailable))
	}
	assert.Equal(t, http.StatusServiceUnavailable, get(t, base+protocol.PathRules).StatusCode)
	assert.Equal(t, http.StatusServiceUnavailable, get(t, base+protocol.PathReadyz).StatusCode)

	rs.Restart(t)
	allowed := func() bool {
		status, body := post(t, base+protocol.PathCheck, token, check)
		if status != http.StatusOK {
			return false
		}
		var cr protocol.CheckResponse
		require.NoError(t, json.Unmarshal(body, &cr))
		return cr.Allowed
	}
	require.Eventually(t, allowed, 10*time.Second, 20*time.Millisecond, "the rules are read once Redis is back")
	assert.True(t, allowed())
	assert.True(t, allowed())
	assert.False(t, allowed(), "the database's rule: 3 a minute")
	status, _ := post(t, base+protocol.PathCheck, "", check)
	assert.Equal(t, http.StatusUnauthorized, status, "the database's client")
	assert.Equal(t, http.StatusOK, get(t, base+protocol.PathReadyz).StatusCode)
	require.NoError(t, d.stop(t))
}
