package leases_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
			t.Run(string(alg)+"/"+c.name, func(t *testing.T) { agreeWindows(t, rdb, c) })
		}
	}
}

func agreeWindows(t *testing.T, rdb redis.UniversalClient, c agreeCase) {
	ctx := context.Background()
	require.NoError(t, rdb.FlushDB(ctx).Err())
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 123_456_000, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	rng := rand.New(rand.NewPCG(3, 4))
	type held struct {
		id string
		g  int64
	}
	open := map[string]held{}
	var settled, expired, denied, refused, takes, refunds int
	for step := range c.steps {
		clock.Advance(time.Duration(rng.Int64N(int64(c.maxStep))))
		ki := rng.IntN(len(c.keys))
		key, b := c.keys[ki], c.buckets[ki%len(c.buckets)]
		owner := own(c.owners[rng.IntN(len(c.owners))])
		switch r := rng.IntN(c.takes); {
		case r == 0:
			op := []leases.TakeOp{{Key: key, Bucket: b, Cost: rng.Int64N(c.maxCost + 1)}}
			op[0].Floor = c.randomFloor(rng, b)
			mo, err := mem.Take(ctx, op)
			require.NoError(t, err)
			ro, err := red.Take(ctx, op)
			require.NoError(t, err)
			require.Equal(t, mo, ro, "step %d take %+v", step, op[0])
			takes++
			if !mo[0].Taken {
				denied++
			}
			expired += mo[0].Expired
		case r == 1:
			op := []leases.TakeOp{{Key: key, Bucket: b, Cost: rng.Int64N(3)}}
			require.NoError(t, mem.Refund(ctx, op))
			require.NoError(t, red.Refund(ctx, op))
			refunds++
		default:
			slot := rng.IntN(2)
			hk := fmt.Sprint(owner, "|", key, "|", slot)
			h := open[hk]
			op := leases.LeaseOp{Key: key, Bucket: b, Want: rng.Int64N(b.Limit + 2), NewLeaseID: leases.NewLeaseID(), Slot: slot, Limits: c.limits}
			op.Floor = c.randomFloor(rng, b)
			if h.id != "" && (c.abandon == 0 || rng.IntN(c.abandon) != 0) {
				op.LeaseID = h.id
				op.Used = rng.Int64N(h.g + 2) // sometimes one too many
			}
			mo, err := mem.Lease(ctx, owner, []leases.LeaseOp{op})
			require.NoError(t, err)
			ro, err := red.Lease(ctx, owner, []leases.LeaseOp{op})
			require.NoError(t, err)
			require.Equal(t, mo, ro, "step %d lease %+v", step, op)
			o := mo[0]
			expired += o.Expired
			switch {
			case o.Err == nil:
				open[hk] = held{o.LeaseID, o.Granted}
				if o.Settled {
					settled++
				}
				if op.Want > 0 && o.Granted == 0 {
					denied++
				}
				if o.Granted > 0 {
					require.LessOrEqual(t, o.TTL, b.LeaseTTL)
					require.Positive(t, o.TTL)
				}
			case errors.Is(o.Err, leases.ErrUnknownLease):
				delete(open, hk)
			case errors.Is(o.Err, leases.ErrTooManyLeases):
				refused++
			}
		}
		ms, err := mem.State(ctx, key, b)
		require.NoError(t, err)
		rs, err := red.State(ctx, key, b)
		require.NoError(t, err)
		requireSameState(t, ms, rs, step)
		require.LessOrEqual(t, ms.Level, float64(b.Limit), "step %d", step)
	}
	t.Logf("%s: %d settles, %d expired or replaced, %d denials, %d refused by a cap, %d takes, %d refunds",
		c.name, settled, expired, denied, refused, takes, refunds)
	require.Positive(t, settled)
	require.Positive(t, expired)
	require.Positive(t, denied)
	if c.limits != (leases.LeaseLimits{}) {
		require.Positive(t, refused)
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
