package leases_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStoresAgreeWindows is TestStoresAgree for the window algorithms:
// random sequences of leases, settles, replacements, takes and refunds on a
// driven clock against both stores, which must give identical answers and
// states. The clock steps cross windows, log buckets and lease deadlines
// often, so every path is reached: rolls, expiries closed in order, pruned
// buckets, the caps, and retry_after walks longer than the walk limit.
func TestStoresAgreeWindows(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var crowd []string
	for c := range 12 {
		for p := range 8 {
			crowd = append(crowd, fmt.Sprintf("c%d/p%d", c, p))
		}
	}
	for _, alg := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog} {
		wb := func(limit int64, period, ttl time.Duration) leases.Bucket {
			return leases.Bucket{Algorithm: alg, Limit: limit, Period: period, Burst: limit, LeaseTTL: ttl}
		}
		cases := []agreeCase{{
			name:    "mixed",
			buckets: []leases.Bucket{wb(13, time.Second, 300*time.Millisecond), wb(50, 100*time.Millisecond, 2*time.Second), wb(3, 7*time.Millisecond, 20*time.Millisecond)},
			keys:    []string{"a", "b", "c", "d}"},
			owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
			steps:   2500, maxStep: 5 * time.Millisecond, abandon: 8, takes: 6, maxCost: 5,
		}, {
			name:    "caps",
			buckets: []leases.Bucket{wb(40, 200*time.Millisecond, 50*time.Millisecond), wb(20, 3*time.Second, 200*time.Millisecond)},
			keys:    []string{"u", "v"},
			owners:  []string{"a/1", "a/2", "a/3", "b/1", "b/2", "c/1"},
			steps:   2500, maxStep: 15 * time.Millisecond, abandon: 2, takes: 5, maxCost: 8,
			limits: leases.LeaseLimits{MaxLeasesPerKey: 6, MaxProcessesPerClient: 2},
		}, {
			name:    "crowded",
			buckets: []leases.Bucket{wb(500, 64*time.Millisecond, 40*time.Millisecond)},
			keys:    []string{"crowd"},
			owners:  crowd,
			steps:   2500, maxStep: time.Millisecond, abandon: 3, takes: 4, maxCost: 100,
		}, {
			name:    "floors",
			buckets: []leases.Bucket{wb(13, time.Second, 300*time.Millisecond), wb(40, 200*time.Millisecond, 50*time.Millisecond), wb(3, 7*time.Millisecond, 20*time.Millisecond)},
			keys:    []string{"a", "b", "c", "d}"},
			owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
			steps:   2500, maxStep: 5 * time.Millisecond, abandon: 6, takes: 5, maxCost: 5,
			floors: true,
		}}
		for _, c := range cases {
			c.seed, c.offset = [2]uint64{3, 4}, 123_456*time.Microsecond
			t.Run(string(alg)+"/"+c.name, func(t *testing.T) { agree(t, rdb, c) })
		}
	}
}

// TestRedisMemoryWindows measures what a key costs Redis under each window
// algorithm (MEMORY USAGE summed over its keys, with the key names of a
// per-user limit): decided by direct takes, with one lease open, and, for
// the log, with takes spread over a whole window (every log bucket in
// use). The package documentation reports these figures.
func TestRedisMemoryWindows(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	s := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	usage := func(key string, a leases.Algorithm) int64 {
		var sum int64
		h, z, x := leases.AlgorithmRedisKeys(key, a)
		for _, k := range []string{h, z, x} {
			n, err := rdb.MemoryUsage(ctx, k, 0).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			require.NoError(t, err)
			sum += n
		}
		return sum
	}
	owner := leases.Owner{Client: "checkout", Process: "7f3a9c2e"}
	for _, a := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog} {
		b := leases.Bucket{Algorithm: a, Limit: 1000, Period: time.Minute, Burst: 1000, LeaseTTL: 2 * time.Second}
		_, err := s.Take(ctx, []leases.TakeOp{{Key: "user:241531", Bucket: b, Cost: 1}})
		require.NoError(t, err)
		_, err = s.Lease(ctx, owner, []leases.LeaseOp{{Key: "user:241532", Bucket: b, Want: 2, NewLeaseID: leases.NewLeaseID()}})
		require.NoError(t, err)
		take, lease := usage("user:241531", a), usage("user:241532", a)
		t.Logf("%s: a key of direct takes %d B, a key with one lease open %d B", a, take, lease)
		assert.Less(t, take, int64(256), a)
		assert.Less(t, lease, int64(400), a)
		if a == leases.SlidingWindowLog {
			// One take per log bucket for a whole window: the most
			// buckets a key holds (W/q + 1 = 65).
			for range 70 {
				_, err := s.Take(ctx, []leases.TakeOp{{Key: "user:241533", Bucket: b, Cost: 1}})
				require.NoError(t, err)
				clock.Advance(b.Period / 64)
			}
			full := usage("user:241533", a)
			t.Logf("%s: a key with all its log buckets in use %d B", a, full)
			assert.Less(t, full, int64(4096), a)
		}
	}
}

// TestStoresAgreeRuleChanges is the random walk of TestStoresAgree over
// every algorithm at once, with rule changes (a key's next ops under
// another bucket: another algorithm, period, limit, burst or lease TTL,
// while its leases of the old rule are open) and a clock that sometimes
// goes back (Redis TIME after a failover to a replica whose clock is
// behind): both stores must give identical answers throughout.
func TestStoresAgreeRuleChanges(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	b := func(alg leases.Algorithm, limit int64, period time.Duration, burst int64, ttl time.Duration) leases.Bucket {
		return leases.Bucket{Algorithm: alg, Limit: limit, Period: period, Burst: burst, LeaseTTL: ttl}
	}
	all := []leases.Bucket{
		b(leases.TokenBucket, 13, time.Second, 13, 300*time.Millisecond),
		b(leases.TokenBucket, 50, 100*time.Millisecond, 20, 50*time.Millisecond),
		b(leases.FixedWindow, 13, time.Second, 13, 300*time.Millisecond),
		b(leases.FixedWindow, 50, 100*time.Millisecond, 50, 2*time.Second),
		b(leases.SlidingWindowCounter, 13, time.Second, 13, 300*time.Millisecond),
		b(leases.SlidingWindowCounter, 3, 7*time.Millisecond, 3, 20*time.Millisecond),
		b(leases.SlidingWindowLog, 13, time.Second, 13, 300*time.Millisecond),
		b(leases.SlidingWindowLog, 40, 200*time.Millisecond, 40, 50*time.Millisecond),
		b(leases.LeakyBucket, 7, time.Second, 13, 300*time.Millisecond),
		b(leases.LeakyBucket, 1000, time.Minute, 50, 2*time.Second),
	}
	cases := []agreeCase{{
		name:    "reloads",
		buckets: all,
		keys:    []string{"a", "b", "c"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2"},
		steps:   4000, maxStep: 5 * time.Millisecond, abandon: 6, takes: 5, maxCost: 5,
		reload: 8,
	}, {
		name:    "reloads and a clock that goes back",
		buckets: all,
		keys:    []string{"a", "b"},
		owners:  []string{"x/1", "y/1", "x/2"},
		steps:   4000, maxStep: 5 * time.Millisecond, abandon: 6, takes: 5, maxCost: 5,
		reload: 20, back: 4, floors: true, defers: 5,
	}}
	for _, c := range cases {
		c.seed, c.offset = [2]uint64{5, 6}, 654_321*time.Microsecond
		t.Run(c.name, func(t *testing.T) { agree(t, rdb, c) })
	}
	// More rules, shorter periods, changed more often: a take denied in a
	// later window of a window algorithm, which Redis does not write,
	// followed by a reload to a longer period (the memory store counted
	// from the window the denial rolled to; see
	// TestRuleChangeDeniedTakeKeepsWindow).
	more := []leases.Bucket{
		all[0], all[1], b(leases.TokenBucket, 3, 7*time.Millisecond, 5, 20*time.Millisecond),
		all[2], all[3], b(leases.FixedWindow, 5, 3*time.Millisecond, 5, time.Second),
		all[4], all[5], b(leases.SlidingWindowCounter, 40, 200*time.Millisecond, 40, time.Second),
		all[6], all[7], b(leases.SlidingWindowLog, 7, 64*time.Millisecond, 7, 2*time.Second),
		all[8], all[9], b(leases.LeakyBucket, 909_091, time.Second, 30, time.Millisecond),
	}
	t.Run("many rules", func(t *testing.T) {
		agree(t, rdb, agreeCase{
			name: "many rules", buckets: more, keys: []string{"a", "b}"}, owners: []string{"x/1", "y/1", "x/2", "z/1"},
			steps: 1500, maxStep: 5 * time.Millisecond, abandon: 5, takes: 4, maxCost: 6, reload: 5, defers: 4,
			seed: [2]uint64{5, 99}, offset: 5 * 7777 * time.Microsecond,
		})
	})
}
