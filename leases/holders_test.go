package leases_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crowdBucket is a bucket large enough that n holders each get their token.
var crowdBucket = leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1_000_000, Period: time.Second, Burst: 1_000_000, LeaseTTL: time.Hour}

// crowd opens one lease of one token on key for each of n clients.
func crowd(t testing.TB, s leases.Store, key string, n int) {
	ctx := context.Background()
	for i := range n {
		out, err := s.Lease(ctx, leases.Owner{Client: fmt.Sprint("c", i), Process: "p"}, []leases.LeaseOp{{Key: key, Bucket: crowdBucket, Want: 1, NewLeaseID: leases.NewLeaseID()}})
		require.NoError(t, err)
		require.EqualValues(t, 1, out[0].Granted)
	}
}

// commandStats returns the calls of every Redis command so far.
func commandStats(t testing.TB, rdb *redis.Client) map[string]int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				calls[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return calls
}

// TestRedisWorkFlatWithHolders is the fourth finding of the invariant
// review: a call used to read every lease of its key (HGETALL), 10.9 ms per
// call at 2,700 holders, blocking Redis for every other key. Now the
// commands a call runs, and the elements each touches, do not depend on
// the holders: the same operations on a key with 5,000 holders run exactly
// the commands they run with 20, and none that reads a whole hash or set.
// (BenchmarkRedisLeaseHolders measures the time.)
func TestRedisWorkFlatWithHolders(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	ctx := context.Background()
	work := func(key string) map[string]int64 {
		before := commandStats(t, rdb)
		a := leases.Owner{Client: "c0", Process: "p"}
		// A renewal by a holder, a newcomer's grant, its return, a take.
		out, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: key, Bucket: crowdBucket, Want: 1, NewLeaseID: leases.NewLeaseID()}})
		require.NoError(t, err)
		require.EqualValues(t, 1, out[0].Granted)
		n := leases.Owner{Client: "new", Process: "p"}
		out, err = s.Lease(ctx, n, []leases.LeaseOp{{Key: key, Bucket: crowdBucket, Want: 1, NewLeaseID: leases.NewLeaseID()}})
		require.NoError(t, err)
		require.EqualValues(t, 1, out[0].Granted)
		_, err = s.Lease(ctx, n, []leases.LeaseOp{{Key: key, Bucket: crowdBucket, LeaseID: out[0].LeaseID, Used: 1}})
		require.NoError(t, err)
		_, err = s.Take(ctx, []leases.TakeOp{{Key: key, Bucket: crowdBucket, Cost: 1}})
		require.NoError(t, err)
		after := commandStats(t, rdb)
		diff := map[string]int64{}
		for k, v := range after {
			if d := v - before[k]; d > 0 && k != "info" {
				diff[k] = d
			}
		}
		return diff
	}
	crowd(t, s, "few", 20) // beyond the 16 a bucket's hash indexes inline
	crowd(t, s, "many", 5000)
	few, many := work("few"), work("many")
	t.Logf("commands for 4 operations: 20 holders %v; 5,000 holders %v", few, many)
	assert.Equal(t, few, many, "the same commands whatever the holders")
	for _, full := range []string{"hgetall", "hkeys", "hvals", "zrange", "zcard", "smembers", "keys", "scan", "hscan"} {
		assert.Zero(t, many[full], "no %s on the call path", full)
	}
}

// BenchmarkRedisLeaseHolders: one lease renewal (settle and grant in one
// step) on a key that n other clients hold leases on. The time per call
// must not grow with n.
func BenchmarkRedisLeaseHolders(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	ctx := context.Background()
	for _, n := range []int{1, 100, 5000} {
		key := fmt.Sprint("holders:", n)
		crowd(b, s, key, n-1)
		b.Run(fmt.Sprint("holders=", n), func(b *testing.B) {
			o := leases.Owner{Client: "bench", Process: "p"}
			op := []leases.LeaseOp{{Key: key, Bucket: crowdBucket, Want: 1, NewLeaseID: leases.NewLeaseID()}}
			for b.Loop() {
				out, err := s.Lease(ctx, o, op)
				if err != nil || out[0].Granted != 1 {
					b.Fatal(err, out)
				}
				op[0].LeaseID, op[0].Used, op[0].NewLeaseID = out[0].LeaseID, 1, leases.NewLeaseID()
			}
		})
	}
}

// BenchmarkRedisOtherKeyWhileCrowded: the latency of a take on a quiet key
// while another goroutine renews leases as fast as it can on a key with 0
// or 5,000 holders. The quiet key's p99 must not depend on the crowd.
func BenchmarkRedisOtherKeyWhileCrowded(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	ctx := context.Background()
	for _, n := range []int{0, 5000} {
		key := fmt.Sprint("busy:", n)
		crowd(b, s, key, n)
		b.Run(fmt.Sprint("crowd=", n), func(b *testing.B) {
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Go(func() {
				o := leases.Owner{Client: "hammer", Process: "p"}
				op := []leases.LeaseOp{{Key: key, Bucket: crowdBucket, Want: 1, NewLeaseID: leases.NewLeaseID()}}
				for !stop.Load() {
					out, err := s.Lease(ctx, o, op)
					if err != nil {
						return
					}
					op[0].LeaseID, op[0].Used, op[0].NewLeaseID = out[0].LeaseID, 1, leases.NewLeaseID()
				}
			})
			quiet := []leases.TakeOp{{Key: "quiet", Bucket: crowdBucket, Cost: 1}}
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				if _, err := s.Take(ctx, quiet); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			stop.Store(true)
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// TestRedisMemoryPerBucket measures what a bucket costs Redis (MEMORY USAGE
// of its keys, with the key names of a per-user limit): a bucket touched
// by direct takes only (made by a plain store, and through an
// OwningStore, as rateleased makes them by default), one with a lease
// open, and one shared by two clients. BENCHMARKS.md reports the same measurement (e2e/compare).
func TestRedisMemoryPerBucket(t *testing.T) {
	srv := redistest.Start(t)
	m, err := storetest.MeasureRedisMemory(context.Background(), srv.Client(t), "user:")
	require.NoError(t, err)
	t.Logf("%+v", m)
	// The seed measured 240 B for a bucket with a lease (its two keys);
	// one hash measured 232 B, and 264 B once x also kept where its TTL
	// runs to (a PEXPIRE less per renewal, see token_bucket.lua's save):
	// a size class of Redis's allocator up, for the leased buckets only.
	assert.LessOrEqual(t, m.Take, int64(120), "a bucket of direct takes is one small key")
	// Through an OwningStore the string also names the server that took
	// (" t <taken> <mixed> server-<16 hex digits>").
	assert.LessOrEqual(t, m.ServerTake, int64(160), "a bucket of direct takes through rateleased's -own-keys")
	assert.Greater(t, m.ServerTake, m.Take)
	assert.LessOrEqual(t, m.Lease, int64(264), "a leased bucket: one hash")
	assert.Positive(t, m.BulkTake)
}

// TestRedisTakeCommands: a direct take on a bucket with no lease runs what
// a per-request limiter runs (EVALSHA, TIME, GET, SET with its TTL), a
// denied one writes nothing, and the check for a lost bucket hash
// (ZRANGE) runs on a new bucket only when Redis may evict. A take refused
// because a lease server owns the bucket writes only the contested mark,
// once (SET), and nothing after.
func TestRedisTakeCommands(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 2, LeaseTTL: time.Second}
	// Connect and load the script first: those commands are not a take's.
	_, err := leases.NewRedisStore(rdb, leases.RedisOptions{}).Take(ctx, []leases.TakeOp{{Key: "warm", Bucket: b, Cost: 1}})
	require.NoError(t, err)
	// u:3 is owned by a lease server for a minute.
	long := b
	long.LeaseTTL = time.Minute
	owned, err := leases.NewRedisStore(rdb, leases.RedisOptions{}).Own(ctx, []leases.OwnOp{{Key: "u:3", Bucket: long, Server: "s1"}})
	require.NoError(t, err)
	require.True(t, owned[0].Acquired)
	for _, tc := range []struct {
		name       string
		noEviction bool
		key        string
		cost       int64
		want       map[string]int64
	}{
		{"new bucket, Redis may evict", false, "u:1", 1, map[string]int64{"evalsha": 1, "time": 1, "get": 1, "zrange": 1, "set": 1}},
		{"new bucket, noeviction", true, "u:2", 1, map[string]int64{"evalsha": 1, "time": 1, "get": 1, "set": 1}},
		{"existing bucket", true, "u:2", 1, map[string]int64{"evalsha": 1, "time": 1, "get": 1, "set": 1}},
		{"denied", true, "u:2", 1, map[string]int64{"evalsha": 1, "time": 1, "get": 1}},
		{"owned, first refusal", true, "u:3", 1, map[string]int64{"evalsha": 1, "time": 1, "get": 1, "set": 1}},
		{"owned, contested already", true, "u:3", 1, map[string]int64{"evalsha": 1, "time": 1, "get": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := leases.NewRedisStore(rdb, leases.RedisOptions{NoEviction: tc.noEviction})
			before := commandStats(t, rdb)
			_, err := s.Take(ctx, []leases.TakeOp{{Key: tc.key, Bucket: b, Cost: tc.cost}})
			require.NoError(t, err)
			after := commandStats(t, rdb)
			got := map[string]int64{}
			for k, v := range after {
				if d := v - before[k]; d > 0 && k != "info" {
					got[k] = d
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
	out, err := leases.NewRedisStore(rdb, leases.RedisOptions{}).Take(ctx, []leases.TakeOp{{Key: "u:3", Bucket: b, Cost: 1}})
	require.NoError(t, err)
	assert.False(t, out[0].Taken, "u:3 is owned: its takes are refused")
	assert.Equal(t, 100*time.Millisecond, out[0].RetryAfter)
}
