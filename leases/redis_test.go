package leases_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRedisStoreConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.Run(t, freshRedisStore(rdb), redisSuiteOptions(rdb, 500))
}

func TestRedisStoreWindows(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.RunWindows(t, freshRedisStore(rdb), storetest.WindowOptions{ConcurrentTicks: 600, Retention: windowRetention(rdb)})
}

// TestRedisStoreSnapshot runs the snapshot suite (every algorithm)
// against Redis.
func TestRedisStoreSnapshot(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.RunSnapshot(t, freshRedisStore(rdb))
}

// TestRedisClusterWindows runs the window suite, and the snapshot suite of
// every algorithm, on a real three-node Redis Cluster.
func TestRedisClusterWindows(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	factory := freshRedisStore(rdb)
	storetest.RunWindows(t, factory, storetest.WindowOptions{ConcurrentTicks: 400, Retention: windowRetention(rdb)})
	t.Run("Snapshot", func(t *testing.T) { storetest.RunSnapshot(t, factory) })
}

// freshRedisStore returns a storetest.Factory of Redis stores over rdb,
// each on an emptied Redis (every master, on a cluster).
func freshRedisStore(rdb redis.UniversalClient) storetest.Factory {
	return func(t *testing.T, now func() time.Time) leases.Store {
		ctx := context.Background()
		if c, ok := rdb.(*redis.ClusterClient); ok {
			require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.FlushDB(ctx).Err()
			}))
		} else {
			require.NoError(t, rdb.FlushDB(ctx).Err())
		}
		return leases.NewRedisStore(rdb, leases.RedisOptions{Now: now})
	}
}

// windowRetention returns the least TTL of the Redis keys of key under a
// that exist, or −1 when none does.
func windowRetention(rdb redis.UniversalClient) func(t *testing.T, key string, a leases.Algorithm) time.Duration {
	return func(t *testing.T, key string, a leases.Algorithm) time.Duration {
		h, z, x := leases.AlgorithmRedisKeys(key, a)
		least := time.Duration(-1)
		for _, k := range []string{h, z, x} {
			d, err := rdb.PTTL(context.Background(), k).Result()
			require.NoError(t, err)
			if d == -2*time.Nanosecond {
				continue // no such key
			}
			require.Positive(t, d, "%s has a TTL", k)
			if least < 0 || d < least {
				least = d
			}
		}
		return least
	}
}

// agreeCase is one differential scenario of TestStoresAgree.
type agreeCase struct {
	name    string
	buckets []leases.Bucket
	keys    []string
	owners  []string
	steps   int
	maxStep time.Duration // clock advance per step: uniform in [0, maxStep)
	abandon int           // one lease in abandon is renewed without its ID (0: never)
	takes   int           // one op in takes is a Take (and one more a Refund)
	maxCost int64
	limits  leases.LeaseLimits
	// floors gives half the leases and takes a random priority floor
	// (LeaseOp.Floor, TakeOp.Floor), 0 to the capacity; without it every
	// floor is 0 and the random sequence is the one it always was.
	floors bool
	// owns makes one op in owns an OwnOp (acquire, renewal or release, by
	// one of two servers, with random levels, bad ones included); 0: none,
	// and the random sequence is the one it always was.
	owns int
	// defers gives one lease op in defers a random LeaseOp.MaxDelay, 0 to
	// the lease TTL, so that grants are deferred and levels go into debt;
	// 0: none, and the random sequence is the one it always was.
	defers int
	// seed seeds the random sequence; zero means {1, 2}.
	seed [2]uint64
	// offset puts the clock's start this long after 2026-03-01 00:00 UTC:
	// the windows' cases start off the second, so that their windows and
	// log buckets do not line up with the whole seconds of the steps.
	offset time.Duration
	// reload runs one op in reload under a bucket drawn from all of
	// buckets rather than the key's own (a rule change: another period,
	// limit, burst, lease TTL or algorithm), and then the key's next ops
	// under that one until the next change; 0: never, and the random
	// sequence is the one it always was. The invariant checks after each
	// step are left out (a rule that shrank leaves more counted than the
	// new one holds); the two stores must still agree.
	reload int
	// back moves the clock back instead of forward at one step in back,
	// by up to maxStep (Redis TIME after a failover to a replica whose
	// clock is behind, or RedisOptions.Now); 0: never. The invariant checks
	// are left out too (a queue handed out before the clock went back is
	// longer, on the clock, than the burst); the stores must agree.
	back int
}

// randomOwn returns an OwnOp on key: an acquire or renewal (OwnOp.Renew a
// third of the time) two times in three, else a release claiming a random
// level, some of them out of range or NaN; its ID and Lost from a few IDs,
// so that renewals, releases and acquisitions meet ownerships of the same
// IDs and of others.
func randomOwn(rng *rand.Rand, key string, b leases.Bucket) leases.OwnOp {
	ids := []string{"", "a1", "b2", "c3"}
	op := leases.OwnOp{Key: key, Bucket: b, Server: fmt.Sprint("s", rng.IntN(2)), ID: ids[rng.IntN(len(ids))]}
	for _, id := range ids[1:] {
		if rng.IntN(4) == 0 {
			op.Lost = append(op.Lost, id) // an ownership begun by it is begun afresh
		}
	}
	if rng.IntN(3) == 0 {
		op.Renew = true // never begins an ownership
	}
	if rng.IntN(3) == 0 {
		op.Release = true
		op.Level = rng.Float64()*float64(b.Burst+2) - 1
		if rng.IntN(10) == 0 {
			op.Level = math.NaN()
		}
	}
	return op
}

// randomFloor returns a priority floor for an op on b: 0 unless c.floors,
// then 0 half the time and otherwise 1 to the capacity.
func (c *agreeCase) randomFloor(rng *rand.Rand, b leases.Bucket) int64 {
	if !c.floors || rng.IntN(2) == 0 {
		return 0
	}
	return 1 + rng.Int64N(b.Burst)
}

// requireSameState requires the two stores' snapshots of one key to be
// equal in every field: the clock as an instant, the rest exactly.
func requireSameState(t *testing.T, ms, rs leases.BucketState, step int) {
	t.Helper()
	require.True(t, ms.Now.Equal(rs.Now), "step %d: now %v and %v", step, ms.Now, rs.Now)
	ms.Now, rs.Now = time.Time{}, time.Time{}
	require.Equal(t, ms, rs, "step %d state", step)
}

// TestStoresAgree runs random sequences of operations against both stores
// on the same clock and requires identical answers: the Lua script and the
// Go code are the same algorithm, down to the floating point. The cases
// reach every path: settles, replacements, unsettled expiries closed in
// order between calls, waiters, several processes per client, the caps, and
// retry_after walks longer than the walk limit.
func TestStoresAgree(t *testing.T) {
	tb := func(limit int64, period time.Duration, burst int64, ttl time.Duration) leases.Bucket {
		return leases.Bucket{Algorithm: leases.TokenBucket, Limit: limit, Period: period, Burst: burst, LeaseTTL: ttl}
	}
	var crowd []string
	for c := range 15 {
		for p := range 10 {
			crowd = append(crowd, fmt.Sprintf("c%d/p%d", c, p))
		}
	}
	cases := []agreeCase{{
		name:    "mixed",
		buckets: []leases.Bucket{tb(7, time.Second, 13, 300*time.Millisecond), tb(1000, time.Minute, 50, 2*time.Second), tb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b", "c", "d}"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
		steps:   3000, maxStep: 5 * time.Millisecond, abandon: 8, takes: 10, maxCost: 5,
	}, {
		name:    "unsettled",
		buckets: []leases.Bucket{tb(100, time.Second, 20, 50*time.Millisecond), tb(10, time.Second, 20, 200*time.Millisecond)},
		keys:    []string{"u", "v"},
		owners:  []string{"a/1", "a/2", "a/3", "b/1", "b/2", "c/1"},
		steps:   3000, maxStep: 15 * time.Millisecond, abandon: 2, takes: 8, maxCost: 8,
		limits: leases.LeaseLimits{MaxLeasesPerKey: 6, MaxProcessesPerClient: 2},
	}, {
		name:    "crowded",
		buckets: []leases.Bucket{tb(1000, time.Second, 100, 40*time.Millisecond)},
		keys:    []string{"crowd"},
		owners:  crowd,
		steps:   3000, maxStep: time.Millisecond, abandon: 3, takes: 6, maxCost: 100,
	}, {
		name:    "floors",
		buckets: []leases.Bucket{tb(7, time.Second, 13, 300*time.Millisecond), tb(100, time.Second, 20, 50*time.Millisecond), tb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b", "c", "d}"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
		steps:   3000, maxStep: 5 * time.Millisecond, abandon: 6, takes: 4, maxCost: 5,
		floors: true,
	}, {
		// Ownership by lease servers among leases, takes and refunds:
		// acquires refused for open leases, takes and grants refused on
		// owned buckets, renewals, releases, expiries.
		name:    "owned",
		buckets: []leases.Bucket{tb(7, time.Second, 13, 300*time.Millisecond), tb(100, time.Second, 20, 50*time.Millisecond), tb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b", "c", "d}"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
		steps:   4000, maxStep: 5 * time.Millisecond, abandon: 6, takes: 3, maxCost: 5,
		floors: true, owns: 3, defers: 2,
	}, {
		// Deferred grants (LeaseOp.MaxDelay): levels in debt under
		// leases, takes, refunds, expiries and settles. The clock moves
		// by up to 8 ms a step, well ahead of real time even under -race:
		// Redis expires the keys (the share clocks' set among them, whose
		// TTL is renewed only when a new owner comes) in real time, and
		// with steps of 3 ms a slow run outran the driven clock and lost
		// the share clocks that the memory store kept.
		name:    "deferred",
		buckets: []leases.Bucket{tb(7, time.Second, 13, 300*time.Millisecond), tb(1000, time.Second, 100, 40*time.Millisecond), tb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b", "c", "d}"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
		steps:   4000, maxStep: 8 * time.Millisecond, abandon: 6, takes: 6, maxCost: 5,
		defers: 1,
	}}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { agree(t, rdb, c) })
	}
}

// agree is the walk of TestStoresAgree, TestStoresAgreeLeaky and
// TestStoresAgreeWindows: c's random operations against both stores on one
// driven clock, identical answers and states required after every step,
// and the algorithm's invariant on the level (see checkLevel); at the end,
// each case must have reached the paths it is for.
func agree(t *testing.T, rdb redis.UniversalClient, c agreeCase) {
	ctx := context.Background()
	require.NoError(t, rdb.FlushDB(ctx).Err())
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(c.offset))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	if c.seed == [2]uint64{} {
		c.seed = [2]uint64{1, 2}
	}
	rng := rand.New(rand.NewPCG(c.seed[0], c.seed[1]))
	type held struct {
		id string
		g  int64
	}
	open := map[string]held{} // owner|key|slot -> lease, as the memory store saw it
	var settled, expired, waiters, refused, takes, denied, refunds, acquired, afresh, contested, released, deferred, debts int
	ruleOf := map[string]int{} // key → the bucket its rule is now, while reloads change it
	var reloads, backs int
	for step := range c.steps {
		d := time.Duration(rng.Int64N(int64(c.maxStep)))
		if c.back > 0 && rng.IntN(c.back) == 0 {
			d = -d
			backs++
		}
		clock.Advance(d)
		ki := rng.IntN(len(c.keys))
		key, b := c.keys[ki], c.buckets[ki%len(c.buckets)]
		if c.reload > 0 {
			bi, ok := ruleOf[key]
			if !ok || rng.IntN(c.reload) == 0 {
				bi = rng.IntN(len(c.buckets))
				ruleOf[key] = bi
				reloads++
			}
			b = c.buckets[bi]
		}
		if c.reload > 0 || c.back > 0 {
			// Redis expires keys on its own clock, not on the driven
			// one, which runs several times faster: the share clocks,
			// whose TTL only a new owner renews, lapsed mid-walk (in
			// real time) while the memory store kept them. The walk is
			// about the answers on one clock.
			_, _, shares := leases.RedisKeys(key)
			require.NoError(t, rdb.Persist(ctx, shares).Err())
		}
		owner := own(c.owners[rng.IntN(len(c.owners))])
		switch r := rng.IntN(c.takes); {
		case c.owns > 0 && rng.IntN(c.owns) == 0:
			op := []leases.OwnOp{randomOwn(rng, key, b)}
			st, err := mem.State(ctx, key, b)
			require.NoError(t, err)
			if op[0].Release && st.Owner == op[0].Server {
				released++
			}
			mo, err := mem.Own(ctx, op)
			require.NoError(t, err)
			ro, err := red.Own(ctx, op)
			require.NoError(t, err)
			require.Equal(t, mo, ro, "step %d own %+v", step, op[0])
			if mo[0].Acquired {
				acquired++
				if st.Owner == op[0].Server {
					afresh++ // begun afresh: its ownership's ID among Lost
				}
			}
			if mo[0].Contested {
				contested++
			}
		case r == 0:
			op := []leases.TakeOp{{Key: key, Bucket: b, Cost: rng.Int64N(c.maxCost + 1)}}
			op[0].Floor = c.randomFloor(rng, b)
			if c.owns > 0 {
				// Takes through either server, or none: a bucket taken
				// through both lately is not owned (noteTaker).
				op[0].Server = []string{"", "s1", "s2"}[rng.IntN(3)]
			}
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
		case r == 1 && c.takes > 2:
			op := []leases.TakeOp{{Key: key, Bucket: b, Cost: rng.Int64N(3)}}
			require.NoError(t, mem.Refund(ctx, op))
			require.NoError(t, red.Refund(ctx, op))
			refunds++
		default:
			slot := rng.IntN(2)
			hk := fmt.Sprint(owner, "|", key, "|", slot)
			h := open[hk]
			op := leases.LeaseOp{Key: key, Bucket: b, Want: rng.Int64N(b.Burst + 2), NewLeaseID: leases.NewLeaseID(), Slot: slot, Limits: c.limits}
			op.Floor = c.randomFloor(rng, b)
			if c.defers > 0 && rng.IntN(c.defers) == 0 {
				op.MaxDelay = time.Duration(rng.Int64N(int64(b.LeaseTTL) + 1))
			}
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
					waiters++
				}
				if o.Delay > 0 && b.Algorithm == leases.TokenBucket {
					deferred++
				}
				if o.Granted > 0 {
					// A leaky bucket's lease lasts a lease TTL at least,
					// and until its slice ends; any other, a TTL at most.
					if b.Algorithm == leases.LeakyBucket {
						require.GreaterOrEqual(t, o.TTL, b.LeaseTTL, "step %d", step)
					} else {
						require.Positive(t, o.TTL, "step %d", step)
						require.LessOrEqual(t, o.TTL, b.LeaseTTL, "step %d", step)
					}
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
		if ms.Level < 0 {
			debts++
		}
		if c.reload == 0 && c.back == 0 {
			checkLevel(t, ms, b, step)
		}
	}
	if c.reload > 0 || c.back > 0 {
		t.Logf("%s: %d rule changes, %d steps back in time", c.name, reloads, backs)
		require.Positive(t, reloads+backs)
	}
	t.Logf("%s: %d settles, %d leases expired or replaced unsettled, %d denials to waiters, %d refused by a cap, %d takes (%d denied), %d refunds, %d ownerships acquired (%d afresh), %d contested, %d released, %d grants deferred, %d steps in debt",
		c.name, settled, expired, waiters, refused, takes, denied, refunds, acquired, afresh, contested, released, deferred, debts)
	// Each case must reach the paths it is for.
	require.Positive(t, settled)
	require.Positive(t, expired)
	require.Positive(t, waiters)
	if c.limits != (leases.LeaseLimits{}) {
		require.Positive(t, refused)
	}
	if c.defers > 0 {
		require.Positive(t, deferred)
		require.Positive(t, debts)
	}
	if c.owns > 0 {
		require.Positive(t, acquired)
		require.Positive(t, afresh)
		require.Positive(t, contested)
		require.Positive(t, released)
	}
}

// checkLevel requires the invariant of b's algorithm on the state st of
// one of its keys: a token bucket's level and outstanding tokens together
// never above the burst, a leaky bucket's queue never above the burst, a
// window's count never above the limit.
func checkLevel(t *testing.T, st leases.BucketState, b leases.Bucket, step int) {
	t.Helper()
	switch b.Algorithm {
	case leases.TokenBucket:
		require.LessOrEqual(t, st.Level+float64(st.Outstanding), float64(b.Burst)+1e-9, "step %d: L + O ≤ burst", step)
	case leases.LeakyBucket:
		require.LessOrEqual(t, st.Level, float64(b.Burst)+1e-9, "step %d: the queue holds at most burst", step)
	default:
		require.LessOrEqual(t, st.Level, float64(b.Limit), "step %d: a window's count at most its limit", step)
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

	// The bucket is one hash (its one lease is indexed inline) with a TTL:
	// it is gone once its lease ended and it would be full again (lease TTL
	// + burst/rate + 1 s of slack), and half again (see
	// TestRedisStoreHashTTLSlack).
	n, err := rdb.Exists(ctx, "rl:{rt}:z", "rl:{rt}:s").Result()
	require.NoError(t, err)
	require.Zero(t, n, "one lease needs no expiry index key and no share clocks")
	for _, k := range []string{"rl:{rt}"} {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, k)
		require.LessOrEqual(t, ttl, 3*(100*time.Millisecond+time.Second+time.Second)/2+50*time.Millisecond, k)
	}

	// The lease expires by Redis time, without credit.
	require.Eventually(t, func() bool {
		st, err := s.State(ctx, "rt", b)
		return err == nil && st.Outstanding == 0 && st.Leases == 0
	}, 2*time.Second, 10*time.Millisecond)

	// The keys vanish: refill time (1 s) + lease TTL + 1 s slack, and
	// half again.
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, "rl:{rt}").Result()
		return err == nil && n == 0
	}, 4*time.Second, 50*time.Millisecond)
}

// TestRedisStoreHashTTLSlack: a bucket hash's TTL is set with half again
// of slack, and the Redis time it runs to is kept in the hash (after x),
// so that a renewal whose need the TTL still covers costs no PEXPIRE; once
// it no longer covers it, the next write sets it again. The TTL runs on
// Redis's clock, whatever the store's clock is. (One holder: a shared
// bucket's share clocks have a TTL of their own.)
func TestRedisStoreHashTTLSlack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Now())
	s := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	// Lease TTL 1 s, 1 s to fill: the need is 1 + 1 + 1 s = 3 s, the TTL
	// set 4.5 s.
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
	const h = "rl:{slack}"
	pexpires := func() int64 {
		t.Helper()
		v, err := rdb.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(v, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_pexpire:calls="); ok {
				n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		return 0
	}
	pttl := func() time.Duration {
		t.Helper()
		d, err := rdb.PTTL(ctx, h).Result()
		require.NoError(t, err)
		return d
	}
	kept := func() int64 {
		t.Helper()
		x, err := rdb.HGet(ctx, h, "x").Result()
		require.NoError(t, err)
		_, e, ok := strings.Cut(x, " ")
		require.True(t, ok, "x is %q", x)
		v, err := strconv.ParseInt(e, 10, 64)
		require.NoError(t, err)
		tc, err := rdb.HGet(ctx, h, "t").Int64()
		require.NoError(t, err)
		return tc/1000 + v
	}
	lease := func(owner, id, settle string, used int64) {
		t.Helper()
		out, err := s.Lease(ctx, own(owner), []leases.LeaseOp{{Key: "slack", Bucket: b, Want: 2, LeaseID: settle, Used: used, NewLeaseID: id}})
		require.NoError(t, err)
		require.EqualValues(t, 2, out[0].Granted)
	}

	lease("a/1", "l1", "", 0)
	first := pttl()
	require.Greater(t, first, 4400*time.Millisecond, "need and half again")
	require.LessOrEqual(t, first, 4500*time.Millisecond)
	e := kept()
	tm, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	require.InDelta(t, tm.UnixMilli()+4500, e, 100, "e: the Redis time (ms) the TTL runs to")

	// A renewal 200 ms later (store clock) needs 3 s from then: covered.
	before := pexpires()
	clock.Advance(200 * time.Millisecond)
	lease("a/1", "l2", "l1", 2)
	assert.Equal(t, before, pexpires(), "no PEXPIRE while the TTL covers the need")
	assert.LessOrEqual(t, pttl(), first, "the TTL is left running")
	assert.Equal(t, e, kept())

	// As if Redis time had run on: the TTL no longer covers the need.
	x, err := rdb.HGet(ctx, h, "x").Result()
	require.NoError(t, err)
	off, _, _ := strings.Cut(x, " ")
	tc, err := rdb.HGet(ctx, h, "t").Int64()
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, h, "x", off+" "+strconv.FormatInt(e-2000-tc/1000, 10)).Err())
	lease("a/1", "l3", "l2", 2)
	assert.Equal(t, before+1, pexpires(), "set again")
	assert.Greater(t, pttl(), 4400*time.Millisecond)
	assert.Greater(t, kept(), e-100)

	// Once no lease is open the bucket is a string, written with its TTL
	// (the need, no slack), and x goes with the hash.
	clock.Advance(200 * time.Millisecond)
	_, err = s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: "slack", Bucket: b, LeaseID: "l3", Used: 2}})
	require.NoError(t, err)
	typ, err := rdb.Type(ctx, h).Result()
	require.NoError(t, err)
	require.Equal(t, "string", typ)
	assert.LessOrEqual(t, pttl(), 2*time.Second+50*time.Millisecond, "refill to full + 1 s")
}

// TestRedisStoreIndexExpiresWithHash: with more leases than the hash holds
// inline, the expiry index (Z) gets the hash's TTL, slack included, so
// that it never expires first (the next call would take it for evicted
// and rebuild it from the hash).
func TestRedisStoreIndexExpiresWithHash(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100, LeaseTTL: time.Second}
	for i := range 20 {
		out, err := s.Lease(ctx, own(fmt.Sprintf("c%d/1", i)), []leases.LeaseOp{{Key: "zx", Bucket: b, Want: 1, NewLeaseID: leases.NewLeaseID()}})
		require.NoError(t, err)
		require.EqualValues(t, 1, out[0].Granted)
	}
	h, z, _ := leases.RedisKeys("zx")
	th, err := rdb.PTTL(ctx, h).Result()
	require.NoError(t, err)
	tz, err := rdb.PTTL(ctx, z).Result()
	require.NoError(t, err)
	require.Positive(t, tz, "the index exists, with a TTL")
	assert.InDelta(t, float64(th), float64(tz), float64(50*time.Millisecond), "H %v, Z %v", th, tz)
}

// TestRedisStoreScriptFlush: after SCRIPT FLUSH (or a Redis restart) the
// store reloads its script by itself, for a call of one op (a command of
// its own) as for a pipeline.
func TestRedisStoreScriptFlush(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("ops=%d", n), func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			ctx := context.Background()
			s := leases.NewRedisStore(rdb, leases.RedisOptions{})
			b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
			op := []leases.LeaseOp{{Key: "k1", Bucket: b, Want: 1, NewLeaseID: "x"}, {Key: "k2", Bucket: b, Want: 1, NewLeaseID: "y"}}[:n]
			_, err := s.Lease(ctx, own("a/1"), op)
			require.NoError(t, err)
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			out, err := s.Lease(ctx, own("b/1"), op)
			require.NoError(t, err)
			for i := range out {
				require.EqualValues(t, 1, out[i].Granted)
			}
			st, err := s.State(ctx, "k1", b)
			require.NoError(t, err)
			require.EqualValues(t, 2, st.Outstanding, "each op ran exactly once")

			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			taken, err := s.Take(ctx, []leases.TakeOp{{Key: "k3", Bucket: b, Cost: 1}})
			require.NoError(t, err)
			require.True(t, taken[0].Taken)
			require.EqualValues(t, 9, taken[0].Remaining, "the take ran exactly once")
		})
	}
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

// TestStoresAgreeLongWalk: a denial whose retry_after would have to walk
// more leases than the walk limit (64) bounds the rest by the latest
// expiry, in both stores alike. 100 clients each hold 1 token of a
// 100-token bucket, their leases ending 1 ms apart; a take of 100 must wait
// for all of them. The exact wait is the first expiry + 100 ms (the refill
// from empty); the bound, after walking 64, is the last expiry + 36 ms.
func TestStoresAgreeLongWalk(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1000, Period: time.Second, Burst: 100, LeaseTTL: time.Second}
	for i := range 100 {
		op := []leases.LeaseOp{{Key: "k", Bucket: b, Want: 1, NewLeaseID: leases.NewLeaseID()}}
		mo, err := mem.Lease(ctx, own(fmt.Sprintf("c%d/1", i)), op)
		require.NoError(t, err)
		ro, err := red.Lease(ctx, own(fmt.Sprintf("c%d/1", i)), op)
		require.NoError(t, err)
		require.Equal(t, mo, ro)
		require.EqualValues(t, 1, mo[0].Granted, "client %d", i)
		clock.Advance(time.Millisecond)
	}
	// Now = first grant + 100 ms; the leases end at +1000 ms … +1099 ms.
	op := []leases.TakeOp{{Key: "k", Bucket: b, Cost: 100}}
	mo, err := mem.Take(ctx, op)
	require.NoError(t, err)
	ro, err := red.Take(ctx, op)
	require.NoError(t, err)
	require.Equal(t, mo, ro)
	require.False(t, mo[0].Taken)
	assert.Equal(t, (1099-100+36)*time.Millisecond, mo[0].RetryAfter, "the bound: last expiry + the refill of the 36 tokens the walk did not see freed")
	assert.GreaterOrEqual(t, mo[0].RetryAfter, (1000-100+100)*time.Millisecond, "never shorter than the exact wait")
}

// TestStoresAgreeLeaky is TestStoresAgree for the leaky bucket: random
// leases, settles, replacements, expiries, takes and refunds against both
// stores on one clock, with identical answers required, intervals that are
// not whole microseconds included.
func TestStoresAgreeLeaky(t *testing.T) {
	lb := func(limit int64, period time.Duration, burst int64, ttl time.Duration) leases.Bucket {
		return leases.Bucket{Algorithm: leases.LeakyBucket, Limit: limit, Period: period, Burst: burst, LeaseTTL: ttl}
	}
	var crowd []string
	for c := range 6 {
		for p := range 5 {
			crowd = append(crowd, fmt.Sprintf("c%d/p%d", c, p))
		}
	}
	cases := []agreeCase{{
		name:    "mixed",
		buckets: []leases.Bucket{lb(7, time.Second, 13, 300*time.Millisecond), lb(1000, time.Minute, 50, 2*time.Second), lb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b", "c", "d}"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
		steps:   3000, maxStep: 50 * time.Millisecond, abandon: 8, takes: 5, maxCost: 4,
	}, {
		name:    "capped",
		buckets: []leases.Bucket{lb(100, time.Second, 20, 50*time.Millisecond), lb(30, time.Second, 20, 200*time.Millisecond)},
		keys:    []string{"u", "v"},
		owners:  []string{"a/1", "a/2", "a/3", "b/1", "b/2", "c/1"},
		steps:   3000, maxStep: 40 * time.Millisecond, abandon: 2, takes: 4, maxCost: 8,
		limits: leases.LeaseLimits{MaxLeasesPerKey: 6, MaxProcessesPerClient: 2},
	}, {
		name:    "crowded",
		buckets: []leases.Bucket{lb(1000, time.Second, 100, 40*time.Millisecond)},
		keys:    []string{"crowd"},
		owners:  crowd,
		steps:   3000, maxStep: 2 * time.Millisecond, abandon: 3, takes: 6, maxCost: 100,
	}, {
		name:    "floors",
		buckets: []leases.Bucket{lb(7, time.Second, 13, 300*time.Millisecond), lb(100, time.Second, 20, 50*time.Millisecond), lb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b", "c", "d}"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2", "y/2"},
		steps:   3000, maxStep: 30 * time.Millisecond, abandon: 6, takes: 4, maxCost: 4,
		floors: true,
	}, {
		// Intervals of a few µs that are not whole: TAT's fraction of a
		// µs is kept apart from its whole µs (lbTime), in both stores.
		name:    "fast",
		buckets: []leases.Bucket{lb(909_091, time.Second, 100, 2*time.Millisecond), lb(99_010, time.Second, 30, time.Millisecond)},
		keys:    []string{"f", "g"},
		owners:  []string{"x/1", "y/1", "z/1", "x/2"},
		steps:   3000, maxStep: 20 * time.Microsecond, abandon: 6, takes: 3, maxCost: 5,
	}, {
		// A clock that goes back a step in three (Redis TIME after a
		// failover to a replica whose clock is behind).
		name:    "clock back",
		buckets: []leases.Bucket{lb(7, time.Second, 13, 300*time.Millisecond), lb(3, 7*time.Millisecond, 3, 20*time.Millisecond)},
		keys:    []string{"a", "b"},
		owners:  []string{"x/1", "y/1", "x/2"},
		steps:   3000, maxStep: 20 * time.Millisecond, abandon: 6, takes: 4, maxCost: 4,
		back: 3,
	}}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { agree(t, rdb, c) })
	}
}

// TestRedisStoreLeaky runs the leaky bucket's suite against Redis.
func TestRedisStoreLeaky(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.RunLeaky(t, freshRedisStore(rdb), leakyRedisOptions(rdb, 500))
}

// TestRedisClusterLeaky runs the leaky bucket's suite on a real three-node
// Redis Cluster.
func TestRedisClusterLeaky(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	storetest.RunLeaky(t, freshRedisStore(rdb), leakyRedisOptions(rdb, 300))
}

// leakyRedisOptions: the retention of a leaky bucket is the least TTL of
// its keys that exist.
func leakyRedisOptions(rdb redis.UniversalClient, ticks int) storetest.Options {
	return storetest.Options{
		ConcurrentTicks: ticks,
		Retention: func(t *testing.T, key string) time.Duration {
			h, z, _ := leases.AlgorithmRedisKeys(key, leases.LeakyBucket)
			least := time.Duration(-1)
			for _, k := range []string{h, z} {
				d, err := rdb.PTTL(context.Background(), k).Result()
				require.NoError(t, err)
				if d == -2*time.Nanosecond {
					continue
				}
				require.Positive(t, d, "%s has a TTL", k)
				if least < 0 || d < least {
					least = d
				}
			}
			return least
		},
	}
}

// TestRedisLeakyKeysGo: a leaky bucket's Redis keys carry its tag and one
// hash tag, and are deleted once the queue is empty and no lease is open.
func TestRedisLeakyKeysGo(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	s := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	b := leases.Bucket{Algorithm: leases.LeakyBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: 100 * time.Millisecond}
	h, z, _ := leases.AlgorithmRedisKeys("user:1", leases.LeakyBucket)
	require.Equal(t, "rl:{user:1}:lb", h)
	out, err := s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: "user:1", Bucket: b, Want: 3, NewLeaseID: "l1"}})
	require.NoError(t, err)
	require.EqualValues(t, 3, out[0].Granted)
	n, err := rdb.Exists(ctx, h, z).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	ttl, err := rdb.PTTL(ctx, h).Result()
	require.NoError(t, err)
	require.InDelta(t, float64(300*time.Millisecond+time.Second), float64(ttl), float64(50*time.Millisecond), "the slice's end + 1 s")
	clock.Advance(300 * time.Millisecond)
	_, err = s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: "user:1", Bucket: b, LeaseID: "l1", Used: 3}})
	require.NoError(t, err)
	n, err = rdb.Exists(ctx, h, z).Result()
	require.NoError(t, err)
	require.Zero(t, n, "an empty queue without leases is no state")
}

// TestRedisLeakyExactTAT: the leaky bucket's hash keeps TAT rounded to the
// nearest float64 in a, as a script from before the exact TAT wrote it and
// reads it, and TAT exact in q ("<whole µs> <fraction>"); q is read only
// while a is still its rounding, so a TAT that such a script wrote alone
// is taken from a.
func TestRedisLeakyExactTAT(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	s := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	b := leases.Bucket{Algorithm: leases.LeakyBucket, Limit: 909_091, Period: time.Second, Burst: 100, LeaseTTL: time.Second}
	h, _, _ := leases.AlgorithmRedisKeys("k", leases.LeakyBucket)
	now := clock.Now().UnixMicro()
	level := func() float64 {
		st, err := s.State(ctx, "k", b)
		require.NoError(t, err)
		return st.Level
	}
	for range 10 {
		out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 1}})
		require.NoError(t, err)
		require.True(t, out[0].Taken)
	}
	tInt := 1e6 / 909_091.0
	q, err := rdb.HGet(ctx, h, "q").Result()
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(now+10), strings.Fields(q)[0], "ten slots of 1.0999989 µs: TAT is 10.99999 µs on")
	a, err := rdb.HGet(ctx, h, "a").Float64()
	require.NoError(t, err)
	assert.InDelta(t, float64(now)+10*tInt, a, 0.125, "a holds TAT to the nearest float64")
	assert.InDelta(t, 10, level(), 1e-6, "ten slots queued, exactly")

	// A script from before q writes a alone: q no longer matches, and a
	// is TAT.
	require.NoError(t, rdb.HSet(ctx, h, "a", fmt.Sprint(now+50)).Err())
	assert.InDelta(t, 50/tInt, level(), 1e-6, "TAT from a")
	out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 1}})
	require.NoError(t, err)
	require.True(t, out[0].Taken)
	assert.InDelta(t, 50/tInt+1, level(), 1e-6, "the next slot after a's TAT")
}

// TestStoresAgreeLongestFill: the slowest buckets validation accepts (a
// burst that takes leases.MaxFillTime to refill, a queue as long to drain)
// keep their waits and deadlines exact in both stores, with identical
// answers: a hundred years of µs fit a float64 exactly beside the clock.
func TestStoresAgreeLongestFill(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	day := 24 * time.Hour
	burst := int64(leases.MaxFillTime / day)
	for _, alg := range []leases.Algorithm{leases.TokenBucket, leases.LeakyBucket} {
		t.Run(string(alg), func(t *testing.T) {
			require.NoError(t, rdb.FlushDB(ctx).Err())
			clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
			mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
			t.Cleanup(func() { _ = mem.Close() })
			red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
			b := leases.Bucket{Algorithm: alg, Limit: 1, Period: day, Burst: burst, LeaseTTL: time.Hour}
			take := func(cost int64) leases.TakeOutcome {
				op := []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost}}
				mo, err := mem.Take(ctx, op)
				require.NoError(t, err)
				ro, err := red.Take(ctx, op)
				require.NoError(t, err)
				require.Equal(t, mo, ro, "take %d", cost)
				return mo[0]
			}
			lease := func(key string, want int64) leases.LeaseOutcome {
				op := []leases.LeaseOp{{Key: key, Bucket: b, Want: want, NewLeaseID: "l1", MaxDelay: time.Hour}}
				mo, err := mem.Lease(ctx, own("a/1"), op)
				require.NoError(t, err)
				ro, err := red.Lease(ctx, own("a/1"), op)
				require.NoError(t, err)
				require.Equal(t, mo, ro, "lease %d of %s", want, key)
				require.NoError(t, mo[0].Err)
				return mo[0]
			}
			require.True(t, take(burst).Taken, "the whole capacity at once")
			o := take(burst)
			require.False(t, o.Taken)
			assert.Equal(t, leases.MaxFillTime, o.RetryAfter, "the whole capacity again")
			assert.Equal(t, day, take(1).RetryAfter, "one more token, or slot: a day")
			l := lease("k", burst)
			assert.Zero(t, l.Granted, "no deferral of a hundred years")
			assert.Equal(t, day, l.RetryAfter)
			l = lease("fresh", burst)
			require.EqualValues(t, burst, l.Granted)
			if alg == leases.LeakyBucket {
				assert.Equal(t, leases.MaxFillTime, l.TTL, "the lease lives until its slice ends")
			}
			for _, key := range []string{"k", "fresh"} {
				ms, err := mem.State(ctx, key, b)
				require.NoError(t, err)
				rs, err := red.State(ctx, key, b)
				require.NoError(t, err)
				requireSameState(t, ms, rs, 0)
				if key == "k" {
					assert.Equal(t, leases.MaxFillTime, ms.Full, "whole again in a hundred years")
				}
			}
		})
	}
}

// TestStoresAgreeLeakyClockBack (found by the invariant review's walk
// with a clock that goes back): a leaky bucket whose queue is empty and
// holds no lease is the same as none in both stores, also once the clock
// went back (Redis TIME after a failover to a replica whose clock is
// behind). Redis deleted it; the memory store kept its TAT, and after the
// clock went back 1 ms found a queue of 0.007 slots (12 free of 13) where
// Redis found none (13). So did a key whose first call was a take of
// nothing, which Redis does not write.
func TestStoresAgreeLeakyClockBack(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	b := leases.Bucket{Algorithm: leases.LeakyBucket, Limit: 7, Period: time.Second, Burst: 13, LeaseTTL: time.Second}
	stores := named(mem, red)
	both := func(what string, op func(s leases.Store) any) {
		got := map[string]any{}
		for name, s := range stores {
			got[name] = op(s)
		}
		require.Equal(t, got["memory"], got["redis"], what)
	}
	leaseOp := func(want int64, id string, used int64, newID string) func(s leases.Store) any {
		return func(s leases.Store) any {
			out, err := s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: "k", Bucket: b, Want: want, LeaseID: id, Used: used, NewLeaseID: newID}})
			require.NoError(t, err)
			return out
		}
	}
	state := func(s leases.Store) any {
		st, err := s.State(ctx, "k", b)
		require.NoError(t, err)
		st.Now = time.Time{}
		return st
	}
	for _, c := range []struct {
		name  string
		empty func()
	}{
		{"a slice given back whole", func() {
			both("lease", leaseOp(1, "", 0, "L1"))
			both("settle with none used", leaseOp(0, "L1", 0, ""))
		}},
		{"a take of nothing", func() {
			both("take", func(s leases.Store) any {
				out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 0}})
				require.NoError(t, err)
				return out
			})
		}},
		{"a queue that drained", func() {
			both("take", func(s leases.Store) any {
				out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: 2}})
				require.NoError(t, err)
				return out
			})
			clock.Advance(time.Second)
			both("a lease call that asks for nothing", leaseOp(0, "", 0, ""))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.empty()
			both("the queue is empty", state)
			clock.Advance(-time.Millisecond)
			both("and stays empty when the clock goes back", state)
			clock.Advance(time.Second)
		})
	}
}
