package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

// Beginnings of the messages of checkRedisConfig.
const (
	msgEviction      = "redis maxmemory-policy can evict bucket keys"
	msgNoPersistence = "redis persists nothing"
	msgNotChecked    = "could not check redis maxmemory-policy and persistence"
)

// logRecords parses JSON log lines.
func logRecords(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), "%s", sc.Text())
		recs = append(recs, rec)
	}
	return recs
}

// withPrefix returns the records whose message starts with prefix.
func withPrefix(recs []map[string]any, prefix string) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		if msg, _ := r["msg"].(string); strings.HasPrefix(msg, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// configSet runs CONFIG SET on rs, as redistest starts redis-server with
// fixed arguments (noeviction, no persistence, or RDB with Persist).
func configSet(t *testing.T, rs *redistest.Server, param, value string) {
	t.Helper()
	require.NoError(t, rs.Client(t).ConfigSet(context.Background(), param, value).Err())
}

// TestCheckRedisConfig runs the start-up configuration check against real
// redis-server processes: it warns about an evicting policy and about no
// persistence, names the node, logs at INFO when CONFIG is refused, and
// never more.
func TestCheckRedisConfig(t *testing.T) {
	tests := []struct {
		name          string
		persist       bool // RDB save points (redistest.Options.Persist)
		setup         func(t *testing.T, rs *redistest.Server)
		user          string // connect as this ACL user (password "pw")
		policy        string // the WARN's maxmemory_policy; empty: no eviction warning
		noPersistence bool   // the persistence WARN is expected
		notChecked    bool   // the INFO about a refused CONFIG is expected
	}{
		{name: "noeviction with RDB: silent", persist: true},
		{name: "noeviction without persistence", noPersistence: true},
		{
			name: "allkeys-lru with RDB", persist: true, policy: "allkeys-lru",
			setup: func(t *testing.T, rs *redistest.Server) { configSet(t, rs, "maxmemory-policy", "allkeys-lru") },
		},
		{
			name: "volatile-ttl with AOF", policy: "volatile-ttl",
			setup: func(t *testing.T, rs *redistest.Server) {
				configSet(t, rs, "maxmemory-policy", "volatile-ttl")
				configSet(t, rs, "appendonly", "yes")
			},
		},
		{
			name: "volatile-lru without persistence", policy: "volatile-lru", noPersistence: true,
			setup: func(t *testing.T, rs *redistest.Server) { configSet(t, rs, "maxmemory-policy", "volatile-lru") },
		},
		{
			// As a managed Redis that disables CONFIG: an ACL user without
			// the CONFIG command.
			name: "CONFIG refused", user: "noconfig", notChecked: true,
			setup: func(t *testing.T, rs *redistest.Server) {
				configSet(t, rs, "maxmemory-policy", "allkeys-lru")
				require.NoError(t, rs.Client(t).Do(context.Background(),
					"ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config").Err())
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := redistest.StartWith(t, redistest.Options{Persist: tt.persist})
			if tt.setup != nil {
				tt.setup(t, rs)
			}
			opts := &redis.Options{Addr: rs.Addr()}
			if tt.user != "" {
				opts.Username, opts.Password = tt.user, "pw"
			}
			rdb := redis.NewClient(opts)
			t.Cleanup(func() { _ = rdb.Close() })
			require.NoError(t, rdb.Ping(context.Background()).Err())

			var buf bytes.Buffer
			noEviction := checkRedisConfig(context.Background(), rdb, slog.New(slog.NewJSONHandler(&buf, nil)))
			assert.Equal(t, tt.policy == "" && !tt.notChecked, noEviction, "noeviction seen: the store may skip its partial-loss check")
			recs := logRecords(t, buf.String())
			t.Logf("logs:\n%s", buf.String())

			eviction := withPrefix(recs, msgEviction)
			if tt.policy == "" {
				assert.Empty(t, eviction)
			} else if assert.Len(t, eviction, 1) {
				assert.Equal(t, "WARN", eviction[0]["level"])
				assert.Equal(t, tt.policy, eviction[0]["maxmemory_policy"])
				assert.Equal(t, rs.Addr(), eviction[0]["redis"])
				assert.Contains(t, eviction[0]["msg"], "one extra burst")
			}
			persistence := withPrefix(recs, msgNoPersistence)
			if !tt.noPersistence {
				assert.Empty(t, persistence)
			} else if assert.Len(t, persistence, 1) {
				assert.Equal(t, "WARN", persistence[0]["level"])
				assert.Equal(t, rs.Addr(), persistence[0]["redis"])
				assert.Contains(t, persistence[0]["msg"], "one extra burst")
			}
			notChecked := withPrefix(recs, msgNotChecked)
			if !tt.notChecked {
				assert.Empty(t, notChecked)
			} else if assert.Len(t, notChecked, 1) {
				assert.Equal(t, "INFO", notChecked[0]["level"])
				assert.Contains(t, notChecked[0]["err"], "NOPERM")
			}
			assert.Len(t, recs, len(eviction)+len(persistence)+len(notChecked), "nothing else is logged")
		})
	}
}

// TestCheckRedisConfigCluster: on a cluster every master is checked, and
// each warning names its node.
func TestCheckRedisConfigCluster(t *testing.T) {
	c := redistest.StartCluster(t, 2)
	configSet(t, c.Nodes[1], "maxmemory-policy", "allkeys-random")
	var buf bytes.Buffer
	assert.False(t, checkRedisConfig(context.Background(), c.Client(t), slog.New(slog.NewJSONHandler(&buf, nil))), "one master evicts")
	recs := logRecords(t, buf.String())
	t.Logf("logs:\n%s", buf.String())

	eviction := withPrefix(recs, msgEviction)
	require.Len(t, eviction, 1)
	assert.Equal(t, c.Nodes[1].Addr(), eviction[0]["redis"])
	assert.Equal(t, "allkeys-random", eviction[0]["maxmemory_policy"])
	persistence := withPrefix(recs, msgNoPersistence)
	require.Len(t, persistence, 2, "redistest's nodes persist nothing")
	assert.ElementsMatch(t, c.Addrs(), []any{persistence[0]["redis"], persistence[1]["redis"]})
}

// TestRunWarnsAboutRedisConfig: the daemon runs the check at start, and
// starts all the same.
func TestRunWarnsAboutRedisConfig(t *testing.T) {
	rs := redistest.Start(t)
	configSet(t, rs, "maxmemory-policy", "allkeys-lru")
	d := startDaemon(t, map[string]string{"RATELEASED_REDIS": rs.URL()})
	recs := logRecords(t, d.logs.String())
	eviction := withPrefix(recs, msgEviction)
	require.Len(t, eviction, 1, "logs:\n%s", d.logs.String())
	assert.Equal(t, "allkeys-lru", eviction[0]["maxmemory_policy"])
	assert.Len(t, withPrefix(recs, msgNoPersistence), 1)
	require.NoError(t, d.stop(t))
}

// TestRunRedisRefusesAtStart: a Redis that answers but refuses the
// daemon (a wrong password, a -redis-cluster URL naming a Redis that is
// no cluster) is a misconfiguration, logged at ERROR as such and naming
// what to fix, not as a Redis that "does not answer yet"; the daemon
// serves 503 until Redis accepts it, as while Redis is down.
func TestRunRedisRefusesAtStart(t *testing.T) {
	rs := redistest.Start(t)
	require.NoError(t, rs.Client(t).Do(context.Background(), "ACL", "SETUSER", "ops", "on", ">right-pw", "~*", "&*", "+@all").Err())
	tests := []struct {
		name string
		args []string
		want string // in the record's err
	}{
		{"wrong password", []string{"-redis", "redis://ops:wrong-pw@" + rs.Addr() + "/0"}, "WRONGPASS"},
		{"not a cluster", []string{"-redis", rs.URL(), "-redis-cluster"}, "cluster support disabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startDaemon(t, nil, append([]string{"-rules", "../../../examples/rules.yaml"}, tt.args...)...)
			recs := logRecords(t, d.logs.String())
			var refused map[string]any
			for _, r := range recs {
				if strings.Contains(fmt.Sprint(r["err"]), tt.want) {
					refused = r
					break
				}
			}
			require.NotNil(t, refused, "logs:\n%s", d.logs.String())
			assert.Equal(t, "ERROR", refused["level"], "%v", refused)
			assert.NotContains(t, refused["msg"], "does not answer", "%v", refused)
			assert.Contains(t, refused["msg"], "-redis", "%v", refused)
			assert.NotContains(t, d.logs.String(), "wrong-pw")

			status, body := post(t, "http://"+d.addr+protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`)
			assert.Equal(t, http.StatusServiceUnavailable, status, "body: %s", body)
			require.NoError(t, d.stop(t))
		})
	}
}
