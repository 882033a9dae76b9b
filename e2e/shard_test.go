package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterShardDown: two rateleased daemons on a three-node Redis
// Cluster, and an SDK client of both. One master is killed; the cluster
// runs with cluster-require-full-coverage no, so the other two keep
// serving their slots (as every cluster does until it declares the node
// failed, cluster-node-timeout). The keys of the live nodes are decided as
// before — leased or taken directly, never by the fallback — and the
// client stays online; the dead node's keys are decided by the fallback.
// A lease call or check that mixes keys fails the dead node's entries
// alone, with store_unavailable; a check of a dead node's key is 503.
//
// Before, a store failure for one key failed the whole call: every lease
// call and coalesced take that carried a dead node's key was a 503, and the
// client sent every key to the fallback.
func TestClusterShardDown(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process scenario on a Redis Cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, redisURL := servingCluster(t)
	rdb := cl.Client(t)
	nodeOf := func(key string) int {
		h, _, _ := leases.RedisKeys(key)
		return keySlot(h) * len(cl.Nodes) / 16384
	}
	h, _, _ := leases.RedisKeys("hot:0")
	slot, err := rdb.ClusterKeySlot(ctx, h).Result()
	require.NoError(t, err)
	require.EqualValues(t, slot, keySlot(h), "keySlot agrees with Redis")
	const dead = 2
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
default: deny
rules:
  - {name: users, match: "*", limit: 2000, period: 1s, burst: 2000, lease_ttl: 1s}
`), 0o600))
	addrs := cl.Addrs()
	var urls []string
	for range 2 {
		d := e2eproc.StartDaemon(t, bins.rateleased, "-rules", path, "-redis", redisURL, "-redis-cluster")
		urls = append(urls, d.URL())
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("rateleased %s output:\n%s", d.Addr(), tail(d.Output(), 3000))
			}
		})
	}
	c, err := client.New(client.Config{Servers: urls})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	// Two hot keys, one on a live node and one on the dead node: leased.
	var hot [2]string
	for i := 0; hot[0] == "" || hot[1] == ""; i++ {
		k := fmt.Sprintf("hot:%d", i)
		switch nodeOf(k) {
		case 0:
			hot[0] = k
		case dead:
			hot[1] = k
		}
	}
	// bySource counts decisions by key class (hot or cold, live or dead
	// node) and source.
	type class struct {
		cold bool
		dead bool
	}
	bySource := map[class]map[client.Source]int{}
	slowest := map[bool]time.Duration{} // the longest decision, by dead node
	decide := func(cold bool, key string) {
		t0 := time.Now()
		d := c.Allow(ctx, key)
		if el := time.Since(t0); el > slowest[nodeOf(key) == dead] {
			slowest[nodeOf(key) == dead] = el
		}
		cls := class{cold: cold, dead: nodeOf(key) == dead}
		if bySource[cls] == nil {
			bySource[cls] = map[client.Source]int{}
		}
		bySource[cls][d.Source]++
	}
	run := func(d time.Duration, tag string) {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
			<-tick.C
			decide(false, hot[0])
			decide(false, hot[1])
			if i%5 == 0 {
				// A key decided once: taken directly.
				decide(true, fmt.Sprintf("cold:%s:%d", tag, i))
			}
		}
	}
	run(time.Second, "before")
	for _, k := range hot {
		require.Eventually(t, func() bool { return c.Allow(ctx, k).Source == client.SourceLease }, 5*time.Second, 2*time.Millisecond, "%s is leased", k)
	}
	clear(bySource)

	cl.Nodes[dead].Kill(t)
	clear(slowest)
	run(2*time.Second, "after")
	t.Logf("decisions after node %d died, by (cold, dead node) and source: %v; the longest decision of a live node's key %v, of the dead node's %v",
		dead, bySource, slowest[false], slowest[true])
	for cls, m := range bySource {
		if !cls.dead {
			assert.Zero(t, m[client.SourceFallback], "a live node's keys (cold %v) are never decided by the fallback: %v", cls.cold, m)
			assert.Positive(t, m[client.SourceLease]+m[client.SourceDirect], "a live node's keys (cold %v) are decided by the servers: %v", cls.cold, m)
		}
	}
	assert.Positive(t, bySource[class{cold: true, dead: true}][client.SourceFallback], "the dead node's keys are decided by the fallback")
	st := c.Stats()
	assert.True(t, st.Online, "the servers answer: the client is online")
	assert.Zero(t, st.ServerErrors, "every call was answered: a key's store failure is an answer (a 503 with every entry's result included)")

	// The wire: a lease call with a key of each fails the dead one alone;
	// a check of the dead one is 503 with Retry-After.
	body := fmt.Sprintf(`{"client_id":"probe","leases":[{"key":%q,"want":1},{"key":%q,"want":1}]}`, hot[0]+":probe", hot[1]+":probe")
	if nodeOf(hot[0]+":probe") == dead || nodeOf(hot[1]+":probe") != dead {
		body = fmt.Sprintf(`{"client_id":"probe","leases":[{"key":%q,"want":1},{"key":%q,"want":1}]}`, hot[0], hot[1])
	}
	resp, err := http.Post(urls[0]+protocol.PathLeases, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	var lr protocol.LeaseResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&lr))
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, lr.Leases, 2)
	assert.Nil(t, lr.Leases[0].Error)
	assert.EqualValues(t, 1, lr.Leases[0].Granted)
	require.NotNil(t, lr.Leases[1].Error)
	assert.Equal(t, protocol.CodeStoreUnavailable, lr.Leases[1].Error.Code)
	assert.NotContains(t, lr.Leases[1].Error.Detail, addrs[dead], "the cause is the server's log's, not the caller's")

	resp, err = http.Post(urls[1]+protocol.PathCheck, "application/json", strings.NewReader(fmt.Sprintf(`{"keys":[%q]}`, hot[1])))
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	resp, err = http.Post(urls[1]+protocol.PathCheck, "application/json", strings.NewReader(fmt.Sprintf(`{"keys":[%q,%q]}`, hot[0], hot[1])))
	require.NoError(t, err)
	var pr protocol.Problem
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&pr))
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a check with a dead node's key among others")
	assert.Equal(t, protocol.CodeStoreUnavailable, pr.Code)

	// A second master stalls (SIGSTOP) rather than dies: a lease call
	// with a key of the last live node and one of the stalled node is
	// answered for the first after the read timeout, the second failing
	// alone. With go-redis's redirections (rateleased's before it set
	// MaxRedirects −1) the stalled node's script was sent again, and the
	// call failed whole when the store timeout passed.
	var live, stalled string
	for i := 0; live == "" || stalled == ""; i++ {
		switch k := fmt.Sprintf("stall:%d", i); nodeOf(k) {
		case 0:
			live = cmp.Or(live, k)
		case 1:
			stalled = cmp.Or(stalled, k)
		}
	}
	cl.Nodes[1].Pause(t)
	t0 := time.Now()
	resp, err = http.Post(urls[0]+protocol.PathLeases, "application/json", strings.NewReader(
		fmt.Sprintf(`{"client_id":"probe","leases":[{"key":%q,"want":1},{"key":%q,"want":1}]}`, live, stalled)))
	require.NoError(t, err)
	lr = protocol.LeaseResponse{}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&lr))
	_ = resp.Body.Close()
	t.Logf("a lease call with a master stalled took %v", time.Since(t0))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, lr.Leases, 2)
	assert.Nil(t, lr.Leases[0].Error, "the live node's key is answered")
	require.NotNil(t, lr.Leases[1].Error)
	assert.Equal(t, protocol.CodeStoreUnavailable, lr.Leases[1].Error.Code)
}

// keySlot returns the Redis Cluster slot of key: CRC16 (XMODEM) of its hash
// tag (the part between the first '{' and the next '}', when not empty) or
// of the whole key, modulo 16384. Computed here because asking the cluster
// (CLUSTER KEYSLOT) may ask the node the test killed.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// servingCluster starts a three-node Redis Cluster that serves on with a
// node down (cluster-require-full-coverage no; by default it stops serving
// every key once it declares the node failed, after cluster-node-timeout),
// and returns it with the -redis URL of rateleased for it.
func servingCluster(t *testing.T) (*redistest.Cluster, string) {
	t.Helper()
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes {
		require.NoError(t, n.Client(t).ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err())
	}
	addrs := cl.Addrs()
	return cl, "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
}
