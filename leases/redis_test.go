package leases_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestRedisStoreConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) leases.Store {
		require.NoError(t, rdb.FlushDB(context.Background()).Err())
		return leases.NewRedisStore(rdb, leases.RedisOptions{Now: now})
	}, redisSuiteOptions(rdb, 500))
}

// TestStoresAgree runs one random sequence of operations against both
// stores on the same clock and requires identical answers: the Lua script
// and the Go code are the same algorithm, down to the floating point.
func TestStoresAgree(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now})
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	rng := rand.New(rand.NewPCG(1, 2))
	buckets := []leases.Bucket{
		{Algorithm: leases.TokenBucket, Limit: 7, Period: time.Second, Burst: 13, LeaseTTL: 300 * time.Millisecond},
		{Algorithm: leases.TokenBucket, Limit: 1000, Period: time.Minute, Burst: 50, LeaseTTL: 2 * time.Second},
		{Algorithm: leases.TokenBucket, Limit: 3, Period: 7 * time.Millisecond, Burst: 3, LeaseTTL: 20 * time.Millisecond},
	}
	keys := []string{"a", "b", "c", "d}"}
	owners := []string{"x/1", "y/1", "z/1"}
	type held struct {
		id string
		g  int64
	}
	open := map[string]held{} // owner|key -> lease, as the memory store saw it
	for step := range 3000 {
		clock.Advance(time.Duration(rng.IntN(5000)) * time.Microsecond)
		ki := rng.IntN(len(keys))
		key, b := keys[ki], buckets[ki%len(buckets)]
		owner := owners[rng.IntN(len(owners))]
		switch rng.IntN(10) {
		case 0:
			op := []leases.TakeOp{{Key: key, Bucket: b, Cost: rng.Int64N(5)}}
			mo, err := mem.Take(ctx, op)
			require.NoError(t, err)
			ro, err := red.Take(ctx, op)
			require.NoError(t, err)
			require.Equal(t, mo, ro, "step %d take", step)
		case 1:
			op := []leases.TakeOp{{Key: key, Bucket: b, Cost: rng.Int64N(3)}}
			require.NoError(t, mem.Refund(ctx, op))
			require.NoError(t, red.Refund(ctx, op))
		default:
			slot := rng.IntN(2)
			hk := fmt.Sprint(owner, "|", key, "|", slot)
			h := open[hk]
			op := leases.LeaseOp{Key: key, Bucket: b, Want: rng.Int64N(b.Burst + 2), NewLeaseID: leases.NewLeaseID(), Slot: slot}
			if h.id != "" && rng.IntN(8) != 0 {
				op.LeaseID = h.id
				op.Used = rng.Int64N(h.g + 2) // sometimes one too many
			}
			mo, err := mem.Lease(ctx, own(owner), []leases.LeaseOp{op})
			require.NoError(t, err)
			ro, err := red.Lease(ctx, own(owner), []leases.LeaseOp{op})
			require.NoError(t, err)
			require.Equal(t, mo, ro, "step %d lease %+v", step, op)
			if mo[0].Err == nil {
				open[hk] = held{mo[0].LeaseID, mo[0].Granted}
			} else if mo[0].Err == leases.ErrUnknownLease {
				delete(open, hk)
			}
		}
		ms, err := mem.State(ctx, key, b)
		require.NoError(t, err)
		rs, err := red.State(ctx, key, b)
		require.NoError(t, err)
		require.Equal(t, ms.Level, rs.Level, "step %d level", step)
		require.Equal(t, ms.Outstanding, rs.Outstanding, "step %d outstanding", step)
		require.Equal(t, ms.Leases, rs.Leases, "step %d leases", step)
	}
}

// TestRedisStoreRealTime uses Redis TIME, as production does.
func TestRedisStoreRealTime(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: 100 * time.Millisecond}

	out, err := s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: "rt", Bucket: b, Want: 10, NewLeaseID: "l1"}})
	require.NoError(t, err)
	require.EqualValues(t, 10, out[0].Granted)
	st, err := s.State(ctx, "rt", b)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), st.Now, 5*time.Second, "the store's clock is Redis TIME")
	require.EqualValues(t, 10, st.Outstanding)

	// The bucket hash and the expiry index carry one hash tag and a TTL:
	// the bucket is gone once its lease ended and it would be full again
	// (lease TTL + burst/rate + 1 s of slack).
	for _, k := range []string{"rl:{rt}", "rl:{rt}:z"} {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, k)
		require.LessOrEqual(t, ttl, 100*time.Millisecond+time.Second+time.Second+50*time.Millisecond, k)
	}

	// The lease expires by Redis time, without credit.
	require.Eventually(t, func() bool {
		st, err := s.State(ctx, "rt", b)
		return err == nil && st.Outstanding == 0 && st.Leases == 0
	}, 2*time.Second, 10*time.Millisecond)

	// The keys vanish: refill time (1 s) + lease TTL + 1 s slack.
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, "rl:{rt}", "rl:{rt}:z").Result()
		return err == nil && n == 0
	}, 4*time.Second, 50*time.Millisecond)
}

// TestRedisStoreScriptFlush: after SCRIPT FLUSH (or a Redis restart) the
// store reloads its script by itself.
func TestRedisStoreScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
	op := []leases.LeaseOp{{Key: "k1", Bucket: b, Want: 1, NewLeaseID: "x"}, {Key: "k2", Bucket: b, Want: 1, NewLeaseID: "y"}}
	_, err := s.Lease(ctx, own("a/1"), op)
	require.NoError(t, err)
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	out, err := s.Lease(ctx, own("b/1"), op)
	require.NoError(t, err)
	require.EqualValues(t, 1, out[0].Granted)
	require.EqualValues(t, 1, out[1].Granted)
	st, err := s.State(ctx, "k1", b)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Outstanding, "each op ran exactly once")
}

// TestRedisStoreUnavailable: a dead Redis fails the call with
// ErrStoreUnavailable, and the store recovers when Redis is back.
func TestRedisStoreUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
	op := []leases.LeaseOp{{Key: "k", Bucket: b, Want: 1, NewLeaseID: "x"}}
	require.NoError(t, s.Ping(ctx))

	srv.Stop(t)
	_, err := s.Lease(ctx, own("a/1"), op)
	require.ErrorIs(t, err, leases.ErrStoreUnavailable)
	require.ErrorIs(t, s.Ping(ctx), leases.ErrStoreUnavailable)
	_, err = s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 1}})
	require.ErrorIs(t, err, leases.ErrStoreUnavailable)

	srv.Restart(t)
	require.Eventually(t, func() bool { return s.Ping(ctx) == nil }, 5*time.Second, 20*time.Millisecond)
	out, err := s.Lease(ctx, own("a/1"), op)
	require.NoError(t, err)
	require.EqualValues(t, 1, out[0].Granted)
}

// TestRedisClusterConformance runs the suite on a real three-node Redis
// Cluster: every script touches one slot (the keys of a bucket share a hash
// tag), and a call for many keys is pipelined per node.
func TestRedisClusterConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) leases.Store {
		require.NoError(t, rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
			return c.FlushDB(ctx).Err()
		}))
		return leases.NewRedisStore(rdb, leases.RedisOptions{Now: now})
	}, redisSuiteOptions(rdb, 300))
}

// redisSuiteOptions returns the suite's options for a Redis store over rdb:
// the parts of a bucket are its Redis keys, dropped as an eviction would,
// and its retention is the least TTL of the keys that exist.
func redisSuiteOptions(rdb redis.UniversalClient, ticks int) storetest.Options {
	parts := map[string]func(string) string{
		"bucket hash":  func(k string) string { h, _, _ := leases.RedisKeys(k); return h },
		"expiry index": func(k string) string { _, z, _ := leases.RedisKeys(k); return z },
		"share clocks": func(k string) string { _, _, s := leases.RedisKeys(k); return s },
	}
	names := []string{"bucket hash", "expiry index", "share clocks"}
	return storetest.Options{
		ConcurrentTicks: ticks,
		Parts:           names,
		Drop: func(t *testing.T, key, part string) {
			n, err := rdb.Del(context.Background(), parts[part](key)).Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "the %s of %q exists", part, key)
		},
		Retention: func(t *testing.T, key string) time.Duration {
			least := time.Duration(-1)
			for _, name := range names {
				d, err := rdb.PTTL(context.Background(), parts[name](key)).Result()
				require.NoError(t, err)
				if d == -2*time.Nanosecond {
					continue // no such key
				}
				require.Positive(t, d, "%s of %q has a TTL", name, key)
				if least < 0 || d < least {
					least = d
				}
			}
			return least
		},
	}
}
