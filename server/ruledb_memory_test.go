package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// overrideCount is how many overrides TestRuleDBOverrideMemory loads:
// 1,000,000, or RATELEASE_OVERRIDES when set (for a quick run).
func overrideCount(t *testing.T) int {
	if v := os.Getenv("RATELEASE_OVERRIDES"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	if testing.Short() {
		return 100_000
	}
	return 1_000_000
}

// usedMemory returns Redis's used_memory.
func usedMemory(t *testing.T, info string) int64 {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no used_memory in INFO memory")
	return 0
}

// TestRuleDBOverrideMemory loads 1,000,000 overrides into the rule
// database as the admin API stores them (one field of the overrides hash
// each, "<version>|<JSON limits>"), with pipelined HSETs, and measures
// Redis's memory for them: used_memory before and after, and MEMORY USAGE
// of the hash. The README's figure comes from this test:
//
//	go test ./server -run TestRuleDBOverrideMemory -v
//
// Then a server in database mode applies one of them, and its cached key
// makes no further Redis call.
func TestRuleDBOverrideMemory(t *testing.T) {
	n := overrideCount(t)
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	ctx := context.Background()
	db := NewRuleDB(rdb, RuleDBOptions{})
	before, err := rdb.Info(ctx, "memory").Result()
	require.NoError(t, err)

	start := time.Now()
	const perCommand, perPipeline = 1000, 50
	args := make([]any, 0, 2*perCommand)
	pipe := rdb.Pipeline()
	for i := 0; i < n; {
		args = args[:0]
		for j := 0; j < perCommand && i < n; j++ {
			// A version of 7 digits, as a database with millions of
			// changes has, and a typical plan: 5 per second, burst 10.
			args = append(args, "user:"+strconv.Itoa(100000+i), strconv.Itoa(1000000+i)+`|{"limit":5,"period":"1s","burst":10}`)
			i++
		}
		pipe.HSet(ctx, db.OverridesKey(), args...)
		if pipe.Len() == perPipeline || i == n {
			_, err := pipe.Exec(ctx)
			require.NoError(t, err)
		}
	}
	load := time.Since(start)
	after, err := rdb.Info(ctx, "memory").Result()
	require.NoError(t, err)
	require.EqualValues(t, n, rdb.HLen(ctx, db.OverridesKey()).Val())
	used := usedMemory(t, after) - usedMemory(t, before)
	usage, err := rdb.MemoryUsage(ctx, db.OverridesKey(), 0).Result()
	require.NoError(t, err)
	perOverride := float64(used) / float64(n)
	t.Logf("%d overrides loaded in %v: used_memory +%.1f MiB (%.0f bytes per override); MEMORY USAGE %s = %.1f MiB (%.0f bytes per override)",
		n, load.Round(time.Millisecond), float64(used)/(1<<20), perOverride, db.OverridesKey(), float64(usage)/(1<<20), float64(usage)/float64(n))
	assert.Less(t, perOverride, 120.0, "the README promises under 120 bytes per override")

	// A server applies them, and its cached keys cost no Redis call.
	f := newFixture(t, "", leases.NewRedisStore(rdb, leases.RedisOptions{}), Options{RuleDB: db, AdminTokenSHA256: sha(adminToken)})
	key := "user:" + strconv.Itoa(100000+n-1)
	res := f.check("", key)
	require.Equal(t, leases.OverrideRuleName, res.Keys[0].Rule)
	require.EqualValues(t, 5, res.Keys[0].Limit)
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	for range 9 {
		f.check("", key)
	}
	assert.False(t, f.check("", key).Allowed, "burst 10 spent")
	stats, err := rdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	assert.NotContains(t, stats, "cmdstat_hmget")
	r := f.admin(http.MethodGet, protocol.PathAdminOverrides+"/"+key, "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, fmt.Sprintf(`"%d"`, 1000000+n-1), r.header.Get("ETag"))
}
