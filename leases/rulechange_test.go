package leases_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
)

// What a rule change (a reload) does to the leases open under the old
// rule: they stay counted until they end. The findings of the invariant
// review that every store must keep are cases of the conformance suite
// (storetest.RunRuleChange: an algorithm switched and back, a shorter and
// a longer window, a carry kept by a denied take), which every store runs
// against the bound. This file keeps what needs Redis's internals (the
// keys' TTLs) and compares the two stores answer by answer.

// ruleChangeStores returns a memory store (no background sweep) and a
// Redis store on one driven clock, and the Redis store's client.
func ruleChangeStores(t *testing.T) (*leases.MemoryStore, *leases.RedisStore, *storetest.Clock, *redis.Client) {
	t.Helper()
	clock := storetest.NewClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	rdb := redistest.Start(t).Client(t)
	red := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now, NoEviction: true})
	return mem, red, clock, rdb
}

// named returns the two stores by name, for the tests that run one
// operation on each and compare.
func named(mem *leases.MemoryStore, red *leases.RedisStore) map[string]leases.Store {
	return map[string]leases.Store{"memory": mem, "redis": red}
}

// TestRuleChangeStoresAgree runs the suite's rule-change cases on a memory
// store and on a Redis store and requires the same answers from both, call
// by call: every outcome and snapshot, not only the grants and takes the
// suite checks against the bound. (The final review of the rule-change fix
// found Redis admitting a take of 100 that the memory store denied:
// CarrySurvivesDeniedTake in the suite.)
func TestRuleChangeStoresAgree(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	stores := []struct {
		name    string
		factory storetest.Factory
	}{
		{"memory", func(t *testing.T, now func() time.Time) leases.Store {
			return leases.NewMemoryStore(leases.MemoryOptions{Now: now, SweepInterval: -1})
		}},
		{"redis", freshRedisStore(rdb)},
	}
	answers := map[string]map[string]*recorder{} // store → case → its answers
	for _, s := range stores {
		cases := map[string]*recorder{}
		answers[s.name] = cases
		t.Run(s.name, func(t *testing.T) {
			prefix := t.Name() + "/"
			storetest.RunRuleChange(t, func(t *testing.T, now func() time.Time) leases.Store {
				r := &recorder{Store: s.factory(t, now)}
				cases[strings.TrimPrefix(t.Name(), prefix)] = r
				return r
			})
		})
	}
	mem, red := answers["memory"], answers["redis"]
	require.NotEmpty(t, mem)
	require.Len(t, red, len(mem))
	for name, m := range mem {
		require.Contains(t, red, name)
		require.NotEmpty(t, m.answers, name)
		assert.Equal(t, m.answers, red[name].answers, "%s: the stores answer alike", name)
	}
}

// recorder is a store that keeps every answer of the store it wraps, for
// one case run on one goroutine. It names the leases it opens itself (L1,
// L2, ...), so that two stores run through the same case answer with the
// same lease IDs, and it keeps a snapshot's time as Unix microseconds.
type recorder struct {
	leases.Store
	ids     int
	answers []any
}

func (r *recorder) Lease(ctx context.Context, owner leases.Owner, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	ops = slices.Clone(ops)
	for i := range ops {
		r.ids++
		ops[i].NewLeaseID = fmt.Sprint("L", r.ids)
	}
	out, err := r.Store.Lease(ctx, owner, ops)
	r.answers = append(r.answers, out, err)
	return out, err
}

func (r *recorder) Take(ctx context.Context, ops []leases.TakeOp) ([]leases.TakeOutcome, error) {
	out, err := r.Store.Take(ctx, ops)
	r.answers = append(r.answers, out, err)
	return out, err
}

func (r *recorder) Refund(ctx context.Context, ops []leases.TakeOp) error {
	err := r.Store.Refund(ctx, ops)
	r.answers = append(r.answers, err)
	return err
}

func (r *recorder) State(ctx context.Context, key string, b leases.Bucket) (leases.BucketState, error) {
	st, err := r.Store.State(ctx, key, b)
	at := st
	at.Now = time.Time{}
	r.answers = append(r.answers, at, st.Now.UnixMicro(), err)
	return st, err
}

// TestRuleChangeShorterWindowKeysOutliveLease: fixed_window (and the
// counter) 100 per minute; a client holds a lease of all 100 (deadline
// 30 s, inside its window), and a reload shortens the period to one
// second (storetest's ShorterWindowCountsOpenLeases). At the next call,
// 1.5 s after the grant, the Redis keys were given the TTL of the
// one-second window, not of the lease's deadline 28.5 s away: they lapsed
// while the lease was open. They now live until the latest carried lease
// ends.
func TestRuleChangeShorterWindowKeysOutliveLease(t *testing.T) {
	for _, alg := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			_, red, clock, rdb := ruleChangeStores(t)
			ctx := context.Background()
			// Start at a minute boundary, so the lease's window is [0, 60 s).
			clock.Advance(time.Duration(60_000_000-clock.Now().UnixMicro()%60_000_000) * time.Microsecond)
			minute := leases.Bucket{Algorithm: alg, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: 30 * time.Second}
			second := minute
			second.Period = time.Second
			out, err := red.Lease(ctx, leases.Owner{Client: "a", Process: "1"}, []leases.LeaseOp{{Key: "k", Bucket: minute, Want: 100, NewLeaseID: "L1"}})
			require.NoError(t, err)
			require.EqualValues(t, 100, out[0].Granted)
			clock.Advance(1500 * time.Millisecond) // the reload happened meanwhile
			_, err = red.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: second, Cost: 100}})
			require.NoError(t, err)
			// The store's clock is driven here; the TTL is in ms of real time.
			h, _, _ := leases.AlgorithmRedisKeys("k", alg)
			pttl, err := rdb.PTTL(ctx, h).Result()
			require.NoError(t, err)
			assert.Greater(t, pttl, 28*time.Second, "the key's TTL (%v) outlives the open lease (28.5 s)", pttl)
		})
	}
}

// TestRuleChangeShorterWindowWithoutRollKeepsKeys (found by the session's
// final review): a reload shortens the period, and the first call under
// the new rule comes in the new rule's first window, which starts where the
// old one did (no roll): the keys' TTL was set for the new window, though
// the old lease stays open 29 s more. The keys now live as long as the
// latest lease granted or carried (field x).
func TestRuleChangeShorterWindowWithoutRollKeepsKeys(t *testing.T) {
	mem, red, clock, rdb := ruleChangeStores(t)
	ctx := context.Background()
	clock.Advance(time.Duration(60_000_000-clock.Now().UnixMicro()%60_000_000) * time.Microsecond)
	minute := leases.Bucket{Algorithm: leases.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: 30 * time.Second}
	second := minute
	second.Period = time.Second
	a := leases.Owner{Client: "a", Process: "1"}
	for name, s := range named(mem, red) {
		out, err := s.Lease(ctx, a, []leases.LeaseOp{{Key: "k", Bucket: minute, Want: 100, NewLeaseID: "L1"}})
		require.NoError(t, err)
		require.EqualValues(t, 100, out[0].Granted, name)
	}
	clock.Advance(500 * time.Millisecond) // reload; a call in [0, 1 s)
	for _, s := range []leases.Store{mem, red} {
		_, err := s.Lease(ctx, leases.Owner{Client: "b", Process: "1"}, []leases.LeaseOp{{Key: "k", Bucket: second, Want: 1, NewLeaseID: "L2"}})
		require.NoError(t, err)
	}
	h, _, _ := leases.AlgorithmRedisKeys("k", leases.FixedWindow)
	pttl, err := rdb.PTTL(ctx, h).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 29*time.Second, "redis: key TTL %v while the lease is open for 29.5 s more", pttl)
	clock.Advance(2 * time.Second) // the Redis key lapsed (driven clock: lapse it for real)
	if pttl < 29*time.Second {
		time.Sleep(pttl + 50*time.Millisecond)
	}
	got := map[string]bool{}
	for name, s := range named(mem, red) {
		out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: second, Cost: 100}})
		require.NoError(t, err)
		got[name] = out[0].Taken
	}
	assert.Equal(t, got["memory"], got["redis"], "stores answer alike")
	assert.False(t, got["redis"], "a 1 s window admits 100 beside an open lease of 100")
}

// TestRuleChangeDeniedTakeKeepsWindow (found by the invariant review's
// walk with rule changes, TestStoresAgreeRuleChanges): a take denied in a
// later window, closing no lease, writes nothing in Redis, whose next call
// rolls again from the window it stored; the memory store kept the roll.
// Under the same rule the two are the same, but not after a reload to a
// longer period whose aligned window starts before the stored one, where a
// window stays: the memory store counted from the empty window the denial
// had rolled to (13 free of 13), Redis from the window of the tokens spent
// 2 ms before (11 free). The memory store now keeps the window as Redis
// does.
func TestRuleChangeDeniedTakeKeepsWindow(t *testing.T) {
	for _, alg := range []leases.Algorithm{leases.FixedWindow, leases.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			mem, red, clock, _ := ruleChangeStores(t)
			ctx := context.Background()
			// 100 ms into a second: the 7 ms windows below lie in it.
			clock.Advance(time.Duration(1_100_000-clock.Now().UnixMicro()%1_000_000) * time.Microsecond)
			short := leases.Bucket{Algorithm: alg, Limit: 3, Period: 7 * time.Millisecond, Burst: 3, LeaseTTL: time.Second}
			long := leases.Bucket{Algorithm: alg, Limit: 13, Period: time.Second, Burst: 13, LeaseTTL: time.Second}
			take := func(b leases.Bucket, cost int64) map[string]leases.TakeOutcome {
				got := map[string]leases.TakeOutcome{}
				for name, s := range named(mem, red) {
					out, err := s.Take(ctx, []leases.TakeOp{{Key: "k", Bucket: b, Cost: cost}})
					require.NoError(t, err)
					got[name] = out[0]
				}
				require.Equal(t, got["memory"], got["redis"], "the stores answer alike")
				return got
			}
			require.True(t, take(short, 2)["memory"].Taken)
			clock.Advance(16 * time.Millisecond) // two windows later
			require.False(t, take(short, 4)["memory"].Taken, "more than the limit: denied, nothing changed")
			clock.Advance(time.Millisecond) // the rule is 13 per second now
			free := map[string]int64{}
			for name, s := range named(mem, red) {
				st, err := s.State(ctx, "k", long)
				require.NoError(t, err)
				free[name] = st.Free
			}
			assert.Equal(t, free["redis"], free["memory"], "the stores count alike")
			t.Logf("free under the new rule: %v", free)
		})
	}
}
