package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// TestRuleDBCluster: the rule database works on a real three-node Redis
// Cluster through cluster clients (one per server, as each lease server
// process has its own). Its keys share the hash tag {rl:db}, so they live
// in one slot (one node) and its scripts and MULTI blocks run there. A
// rule and an override put through one server apply on another server on
// the same cluster whose version check is an hour away: the change
// reaches it by pub/sub, which Redis Cluster broadcasts to every node.
// Reads, the listing, the change log and deletes work there too; a change
// that publishes nothing reaches a server by the version check.
func TestRuleDBCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	rdb := cl.Client(t)
	db := NewRuleDB(rdb, RuleDBOptions{})
	var slots []int64
	for _, k := range []string{"version", "setversion", "rules", "clients", "overrides", "settings", "log", "changes"} {
		slot, err := rdb.ClusterKeySlot(ctx, db.key(k)).Result()
		require.NoError(t, err)
		slots = append(slots, slot)
	}
	for _, s := range slots {
		require.Equal(t, slots[0], s, "every key of the rule database is in one slot")
	}
	// The buckets are spread over the nodes, not in the database's slot.
	bucketSlot, err := rdb.ClusterKeySlot(ctx, "rl:{user:241531}").Result()
	require.NoError(t, err)
	require.NotEqual(t, slots[0], bucketSlot)

	a := newDBFixtureOn(t, cl.Client(t), Options{})
	b := newDBFixtureOn(t, cl.Client(t), Options{DBCheckInterval: time.Hour})

	r := a.admin(http.MethodPut, protocol.PathAdminRules+"/per-user", "", protocol.AdminRule{Match: "user:*", Limit: 100, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	took := within(t, time.Second, "rule on b by pub/sub", func() bool { return b.ruleLimit("", "per-user") == 100 })
	t.Logf("rule put on a applied on b after %v", took)
	got := b.admin(http.MethodGet, protocol.PathAdminRules+"/per-user", "", nil)
	require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	assert.Equal(t, r.header.Get("ETag"), got.header.Get("ETag"))

	// b caches the key's absence of override first: the change must reach
	// its cache.
	assert.Equal(t, "per-user", b.check("", "user:241531").Keys[0].Rule)
	r = a.admin(http.MethodPut, protocol.PathAdminOverrides+"/user:241531", "", protocol.AdminOverride{Limit: 2, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	took = within(t, time.Second, "override on b by pub/sub", func() bool {
		return b.check("", "user:241531").Keys[0].Rule == leases.OverrideRuleName
	})
	t.Logf("override put on a applied on b after %v", took)
	// Its bucket, on another node, is shared: b took one of 2, a takes the
	// other, then none is left on either.
	assert.True(t, a.check("", "user:241531").Allowed)
	assert.False(t, b.check("", "user:241531").Allowed)
	assert.Equal(t, "per-user", b.check("", "user:1").Keys[0].Rule, "other keys keep their rule")

	got = b.admin(http.MethodGet, protocol.PathAdminOverrides+"/user:241531", "", nil)
	require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	var o protocol.AdminOverride
	require.NoError(t, json.Unmarshal(got.body, &o))
	assert.EqualValues(t, 2, o.Limit)
	seen, _, _ := b.listOverrides("user:", 10)
	assert.Equal(t, map[string]int{"user:241531": 1}, seen)

	r = a.admin(http.MethodDelete, protocol.PathAdminOverrides+"/user:241531", "", nil)
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	within(t, time.Second, "override deleted on b", func() bool {
		return b.check("", "user:241531").Keys[0].Rule == "per-user"
	})
	r = a.admin(http.MethodDelete, protocol.PathAdminRules+"/per-user", "", nil)
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	within(t, time.Second, "rule deleted on b", func() bool { return b.ruleLimit("", "per-user") == 0 })

	r = b.admin(http.MethodGet, protocol.PathAdminChanges, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var ch protocol.AdminChanges
	require.NoError(t, json.Unmarshal(r.body, &ch))
	var ops []string
	for _, c := range ch.Changes {
		ops = append(ops, c.Op+" "+c.Kind+" "+c.Name)
	}
	assert.Equal(t, []string{"delete rule per-user", "delete override user:241531", "put override user:241531", "put rule per-user"}, ops)
	assert.EqualValues(t, 4, ch.Version)

	// A stale ETag is refused on the cluster as on one node.
	r = a.admin(http.MethodPut, protocol.PathAdminRules+"/r", "", protocol.AdminRule{Match: "r:*", Limit: 1, Period: "1s"}, "If-Match", `"1"`)
	assert.Equal(t, http.StatusPreconditionFailed, r.status, "body: %s", r.body)

	// The safety net: a change written by a script that publishes on a
	// channel nobody listens to reaches a server by its version check.
	c := newDBFixtureOn(t, cl.Client(t), Options{DBCheckInterval: 100 * time.Millisecond})
	silentWrite(t, rdb, db, "quiet", `{"match":"q:*","limit":7,"period":"1s"}`)
	within(t, time.Second, "silent change on c", func() bool { return c.ruleLimit("", "quiet") == 7 })
	assert.Zero(t, b.ruleLimit("", "quiet"), "b, which checks hourly, heard nothing")
}

// silentWrite puts rule name with the rule database's write script, but
// publishes on a channel nobody listens on.
func silentWrite(t *testing.T, rdb redis.UniversalClient, db *RuleDB, name, doc string) {
	t.Helper()
	_, err := writeScript.Run(context.Background(), rdb,
		[]string{db.key("version"), db.hashOf(KindRule), db.key("log"), db.key("setversion")},
		name, "put", doc, "", currentSetVersion(t, rdb, db), db.logCap, "nobody-listens", time.Now().UnixMilli(), "test", KindRule,
	).Result()
	require.NoError(t, err)
}

// currentSetVersion returns the rule set's version as the write script
// expects it.
func currentSetVersion(t *testing.T, rdb redis.UniversalClient, db *RuleDB) string {
	t.Helper()
	v, err := rdb.Get(context.Background(), db.key("setversion")).Result()
	if errors.Is(err, redis.Nil) {
		return "0"
	}
	require.NoError(t, err)
	return strings.TrimSpace(v)
}
