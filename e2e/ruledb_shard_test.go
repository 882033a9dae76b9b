package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRuleDBNodeDown (found by the second review of the shard-down
// change): rateleased in database mode (no -rules: the rules and the
// per-key overrides in Redis) on a three-node cluster that serves on with
// a node down (cluster-require-full-coverage no), the node down being the
// one that holds the rule database's slot ({rl:db}). A key whose override
// (or lack of one) the server has cached is decided as before; a key it
// has not looked up yet fails alone, as a dead node's key does. Every call
// with an uncached key failed whole (the lookup, one HMGET in that slot,
// failed the call), and a client sent every key to the fallback.
func TestRuleDBNodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process scenario on a Redis Cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, redisURL := servingCluster(t)
	nodeOf := func(h string) int { return keySlot(h) * len(cl.Nodes) / 16384 }
	dbNode := nodeOf("{rl:db}:overrides")
	const token = "e2e-admin-token"
	sum := sha256.Sum256([]byte(token))
	d := e2eproc.StartDaemon(t, bins.rateleased, "-redis", redisURL, "-redis-cluster", "-admin-token-sha256", hex.EncodeToString(sum[:]))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rateleased output:\n%s", tail(d.Output(), 3000))
		}
	})
	post := func(path string, body any) (int, []byte) {
		t.Helper()
		data, err := json.Marshal(body)
		require.NoError(t, err)
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		method := http.MethodPost
		if strings.HasPrefix(path, protocol.PathAdminRules) {
			method = http.MethodPut
		}
		req, err := http.NewRequestWithContext(c, method, d.URL()+path, bytes.NewReader(data))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	status, body := post(protocol.PathAdminRules+"/users", protocol.AdminRule{Match: "user:*", Limit: 1000, Period: "1m"})
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	// Keys whose buckets are on live nodes: one the server looks up before
	// the node dies, and two it never saw.
	var live []string
	for i := 0; len(live) < 3; i++ {
		k := fmt.Sprintf("user:%d", i)
		if h, _, _ := leases.RedisKeys(k); nodeOf(h) != dbNode {
			live = append(live, k)
		}
	}
	warm, fresh, fresh2 := live[0], live[1], live[2]
	require.Eventually(t, func() bool {
		status, _ := post(protocol.PathCheck, protocol.CheckRequest{Keys: []string{warm}})
		return status == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond, "the rule applies")

	cl.Nodes[dbNode].Kill(t)

	status, body = post(protocol.PathCheck, protocol.CheckRequest{Keys: []string{warm}})
	assert.Equal(t, http.StatusOK, status, "a cached key is decided: %s", body)
	status, body = post(protocol.PathLeases, protocol.LeaseRequest{ClientID: "p", Leases: []protocol.LeaseEntry{{Key: warm, Want: 1}, {Key: fresh, Want: 1}}})
	require.Equal(t, http.StatusOK, status, "a call that mixes a cached key and one never looked up: %s", body)
	var lr protocol.LeaseResponse
	require.NoError(t, json.Unmarshal(body, &lr))
	require.Len(t, lr.Leases, 2)
	assert.Nil(t, lr.Leases[0].Error)
	assert.EqualValues(t, 1, lr.Leases[0].Granted)
	require.NotNil(t, lr.Leases[1].Error)
	assert.Equal(t, protocol.CodeStoreUnavailable, lr.Leases[1].Error.Code)
	status, body = post(protocol.PathLeases, protocol.LeaseRequest{ClientID: "p", Leases: []protocol.LeaseEntry{{Key: fresh2, Want: 1}}})
	assert.Equal(t, http.StatusServiceUnavailable, status)
	var p protocol.Problem
	require.NoError(t, json.Unmarshal(body, &p))
	assert.Equal(t, protocol.CodeStoreUnavailable, p.Code)
	assert.Len(t, p.Leases, 1, "the entry's result: the key failed alone, the store serves others")
}
