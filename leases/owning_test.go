package leases

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
)

// testClock is a clock the test moves (storetest.Clock cannot be used here:
// storetest imports this package).
type testClock struct{ us atomic.Int64 }

func newTestClock(start time.Time) *testClock {
	c := &testClock{}
	c.us.Store(start.UnixMicro())
	return c
}

func (c *testClock) Now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *testClock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// owningStores returns the stores an OwningStore is tested over: memory and
// a real Redis, each on the test's clock.
func owningStores(t *testing.T, clk *testClock) map[string]Store {
	t.Helper()
	mem := NewMemoryStore(MemoryOptions{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	rdb := redistest.Start(t).Client(t)
	red := NewRedisStore(rdb, RedisOptions{Now: clk.Now, NoEviction: true})
	return map[string]Store{"memory": mem, "redis": red}
}

// newOwning returns an OwningStore over inner named server, on clk, whose
// loop the test steps.
func newOwning(t *testing.T, inner Store, clk *testClock, server string) *OwningStore {
	t.Helper()
	s, err := NewOwningStore(inner, OwningOptions{Server: server, MinTakes: 4, manual: true, now: func() int64 { return clk.Now().UnixMicro() }})
	require.NoError(t, err)
	return s
}

var ownBucket = Bucket{Algorithm: TokenBucket, Limit: 100, Period: time.Second, Burst: 10, LeaseTTL: 2 * time.Second}

// take takes one token of key through s.
func take(t *testing.T, s Store, key string, b Bucket) TakeOutcome {
	t.Helper()
	out, err := s.Take(context.Background(), []TakeOp{{Key: key, Bucket: b, Cost: 1}})
	require.NoError(t, err)
	return out[0]
}

// TestOwningExact: an owned bucket decides exactly what one token bucket
// fed the same takes at the same times decides — before, during and after
// the ownership — and hands back the level it holds when released.
func TestOwningExact(t *testing.T) {
	for name := range map[string]bool{"memory": true, "redis": true} {
		t.Run(name, func(t *testing.T) {
			clk := newTestClock(time.Unix(1_700_000_000, 0))
			inner := owningStores(t, clk)[name]
			s := newOwning(t, inner, clk, "a")
			ref := newTBState(&ownBucket, clk.Now().UnixMicro())
			check := func(i int) {
				t.Helper()
				now := clk.Now().UnixMicro()
				want := ref.take(&ownBucket, 1, 0, 0, now)
				got := take(t, s, "k", ownBucket)
				require.Equal(t, want.Taken, got.Taken, "take %d", i)
				if !got.Taken {
					assert.Equal(t, want.RetryAfter, got.RetryAfter, "take %d", i)
				}
				assert.Equal(t, want.Remaining, got.Remaining, "take %d", i)
			}
			i := 0
			// Four takes make the key a candidate; the step owns it.
			for ; i < 4; i++ {
				check(i)
				clk.Advance(time.Millisecond)
			}
			s.step(context.Background())
			require.Equal(t, 1, s.Stats().Owned)
			// Decided from memory: 30 takes every 7 ms against 100/s burst
			// 10 deny some; every answer is the exact bucket's.
			local := s.Stats().LocalTakes
			for ; i < 34; i++ {
				check(i)
				clk.Advance(7 * time.Millisecond)
			}
			assert.Equal(t, local+30, s.Stats().LocalTakes)
			// At half its TTL, used: renewed, still owned.
			clk.Advance(time.Second)
			check(i)
			i++
			s.step(context.Background())
			require.Equal(t, 1, s.Stats().Owned)
			assert.Zero(t, s.Stats().Released)
			// Unused for the next half TTL: released; the store's level
			// is the exact bucket's.
			clk.Advance(time.Second)
			s.step(context.Background())
			require.Zero(t, s.Stats().Owned)
			require.EqualValues(t, 1, s.Stats().Released)
			st, err := inner.State(context.Background(), "k", ownBucket)
			require.NoError(t, err)
			ref.advance(&ownBucket, clk.Now().UnixMicro())
			assert.InDelta(t, ref.level, st.Level, 1e-9, "the level handed back")
			// And the store decides on from there, exactly.
			for range 12 {
				check(i)
				i++
			}
		})
	}
}

// TestOwningContested: while one server owns a key, another server's take
// is refused by the store (at most 100 ms of retry); at its renewal the
// owner learns it, hands the bucket back, and the other's takes are
// decided by the store again. The owner does not take it back at once.
func TestOwningContested(t *testing.T) {
	for name := range map[string]bool{"memory": true, "redis": true} {
		t.Run(name, func(t *testing.T) {
			clk := newTestClock(time.Unix(1_700_000_000, 0))
			inner := owningStores(t, clk)[name]
			a, b := newOwning(t, inner, clk, "a"), newOwning(t, inner, clk, "b")
			for range 4 {
				take(t, a, "k", ownBucket)
			}
			a.step(context.Background())
			require.Equal(t, 1, a.Stats().Owned)

			clk.Advance(500 * time.Millisecond) // 50 tokens of refill, capped at 10
			o := take(t, b, "k", ownBucket)
			assert.False(t, o.Taken, "refused while another server owns it")
			assert.Positive(t, o.RetryAfter)
			assert.LessOrEqual(t, o.RetryAfter, 100*time.Millisecond)
			assert.True(t, take(t, a, "k", ownBucket).Taken, "the owner decides on")

			clk.Advance(500 * time.Millisecond)
			a.step(context.Background()) // the renewal learns it was contested
			assert.EqualValues(t, 1, a.Stats().Contested)
			a.step(context.Background()) // and hands it back
			require.Zero(t, a.Stats().Owned)
			assert.True(t, take(t, b, "k", ownBucket).Taken, "the store decides again")

			for range 8 {
				take(t, a, "k", ownBucket)
			}
			a.step(context.Background())
			assert.Zero(t, a.Stats().Owned, "not owned again for a while")
		})
	}
}

// TestOwningDeadOwner: an owner that stops renewing decides nothing past
// its deadline, and the store empties the bucket at the deadline: a dead
// owner never brings back tokens it may have admitted.
func TestOwningDeadOwner(t *testing.T) {
	for name := range map[string]bool{"memory": true, "redis": true} {
		t.Run(name, func(t *testing.T) {
			clk := newTestClock(time.Unix(1_700_000_000, 0))
			inner := owningStores(t, clk)[name]
			a := newOwning(t, inner, clk, "a")
			for range 4 {
				take(t, a, "k", ownBucket)
			}
			a.step(context.Background())
			require.Equal(t, 1, a.Stats().Owned)
			// a is gone (no more steps). 2 s later its ownership has
			// ended; 30 ms after that the bucket holds 3 tokens.
			clk.Advance(2*time.Second + 30*time.Millisecond)
			for i := range 3 {
				assert.True(t, take(t, inner, "k", ownBucket).Taken, "take %d", i)
			}
			assert.False(t, take(t, inner, "k", ownBucket).Taken, "a fourth: the bucket was empty at the deadline")
			// Had a decided on, it would not have past its deadline.
			o := take(t, a, "k", ownBucket)
			assert.False(t, o.Taken)
			assert.EqualValues(t, 1, a.Stats().Lost)
		})
	}
}

// TestOwningLeaseReleases: a client asking this server for a lease on an
// owned key gets it from the store once the owner has handed the bucket
// back.
func TestOwningLeaseReleases(t *testing.T) {
	clk := newTestClock(time.Unix(1_700_000_000, 0))
	inner := owningStores(t, clk)["redis"]
	a := newOwning(t, inner, clk, "a")
	for range 4 {
		take(t, a, "k", ownBucket)
	}
	a.step(context.Background())
	require.Equal(t, 1, a.Stats().Owned)
	clk.Advance(100 * time.Millisecond)

	type result struct {
		outs []LeaseOutcome
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		outs, err := a.Lease(context.Background(), Owner{Client: "c", Process: "p"}, []LeaseOp{{Key: "k", Bucket: ownBucket, Want: 5, NewLeaseID: NewLeaseID()}})
		ch <- result{outs, err}
	}()
	var r result
	require.Eventually(t, func() bool {
		a.step(context.Background())
		select {
		case r = <-ch:
			return true
		default:
			return false
		}
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, r.err)
	assert.EqualValues(t, 5, r.outs[0].Granted, "granted by the store, from the level handed back")
	assert.Zero(t, a.Stats().Owned)
}

// TestOwningRuleChange: a take under another bucket (the rule changed)
// hands the bucket back and is decided by the store.
func TestOwningRuleChange(t *testing.T) {
	clk := newTestClock(time.Unix(1_700_000_000, 0))
	inner := owningStores(t, clk)["memory"]
	a := newOwning(t, inner, clk, "a")
	for range 4 {
		take(t, a, "k", ownBucket)
	}
	a.step(context.Background())
	require.Equal(t, 1, a.Stats().Owned)
	wider := ownBucket
	wider.Burst = 20
	ch := make(chan TakeOutcome, 1)
	go func() { ch <- take(t, a, "k", wider) }()
	var o TakeOutcome
	require.Eventually(t, func() bool {
		a.step(context.Background())
		select {
		case o = <-ch:
			return true
		default:
			return false
		}
	}, 5*time.Second, time.Millisecond)
	assert.True(t, o.Taken)
	assert.Zero(t, a.Stats().Owned)
	assert.EqualValues(t, 1, a.Stats().Released)
}

// TestOwningClose: Close hands back what the store owns.
func TestOwningClose(t *testing.T) {
	clk := newTestClock(time.Unix(1_700_000_000, 0))
	rdb := redistest.Start(t).Client(t)
	inner := NewRedisStore(rdb, RedisOptions{Now: clk.Now, NoEviction: true})
	a := newOwning(t, inner, clk, "a")
	for range 4 {
		take(t, a, "k", ownBucket)
	}
	a.step(context.Background())
	require.Equal(t, 1, a.Stats().Owned)
	require.NoError(t, a.Close())
	b := newOwning(t, NewRedisStore(rdb, RedisOptions{Now: clk.Now, NoEviction: true}), clk, "b")
	assert.True(t, take(t, b, "k", ownBucket).Taken, "released: the store decides, for anyone")
}
