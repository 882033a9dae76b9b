package leases_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newEngine(t *testing.T, rs leases.RuleSet) (*leases.Engine, *storetest.Clock, *leases.MemoryStore) {
	t.Helper()
	p, err := leases.NewPolicy(rs)
	require.NoError(t, err)
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now})
	return leases.NewEngine(leases.EngineOptions{Store: store, Policy: p}), clock, store
}

var engineRules = leases.RuleSet{Default: leases.DefaultAllow, Rules: []leases.Rule{
	{Name: "per-user", Match: "user:*", Limit: 100, Period: time.Second, LeaseTTL: 2 * time.Second},
	{Name: "search", Match: "api:search", Limit: 10, Period: time.Second},
}}

func TestEngineLease(t *testing.T) {
	e, _, _ := newEngine(t, engineRules)
	ctx := context.Background()
	res, rep, err := e.Lease(ctx, own("svc/a"), []leases.LeaseAsk{{Key: "user:42", Want: 50}, {Key: "other", Want: 7}})
	require.NoError(t, err)
	require.Len(t, res, 2)
	u := res[0]
	assert.NoError(t, u.Err)
	assert.Equal(t, "user:42", u.Key)
	assert.EqualValues(t, 50, u.Granted)
	assert.Len(t, u.LeaseID, 16)
	assert.Equal(t, 2*time.Second, u.TTL)
	require.NotNil(t, u.Rule)
	assert.Equal(t, "per-user", u.Rule.Name)
	require.Len(t, u.Limits, 1)
	assert.Equal(t, leases.LimitStatus{Limit: leases.Limit{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 100}, Remaining: 50, Reset: 500 * time.Millisecond}, u.Limits[0])
	assert.EqualValues(t, 50, u.Remaining)
	assert.InDelta(t, 100.0, u.SafeRate, 1e-9)

	o := res[1]
	assert.True(t, o.Unlimited, "no rule and default allow: unlimited")
	assert.EqualValues(t, 7, o.Granted)
	assert.Empty(t, o.LeaseID)
	assert.Equal(t, leases.Report{Grants: 2}, rep)

	// A second client: fair share and safe rate split between two holders.
	res, _, err = e.Lease(ctx, own("svc/b"), []leases.LeaseAsk{{Key: "user:42", Want: 100}})
	require.NoError(t, err)
	assert.EqualValues(t, 50, res[0].Granted)
	assert.InDelta(t, 50.0, res[0].SafeRate, 1e-9)

	// Settle, with the per-entry errors.
	res, rep, err = e.Lease(ctx, own("svc/a"), []leases.LeaseAsk{
		{Key: "user:42", Want: 0, LeaseID: u.LeaseID, Used: 50},
		{Key: "user:42x", Want: 1, LeaseID: "nope", Used: 0},
	})
	require.NoError(t, err)
	assert.NoError(t, res[0].Err)
	assert.Zero(t, res[0].Granted)
	assert.ErrorIs(t, res[1].Err, leases.ErrUnknownLease)
	assert.Equal(t, leases.Report{Settles: 1}, rep)
}

func TestEngineDenyDefault(t *testing.T) {
	e, _, _ := newEngine(t, leases.RuleSet{Default: leases.DefaultDeny, Rules: []leases.Rule{{Name: "u", Match: "user:*", Limit: 1, Period: time.Second}}})
	res, _, err := e.Lease(context.Background(), own("a/1"), []leases.LeaseAsk{{Key: "svc:x", Want: 1}, {Key: "user:1", Want: 1}})
	require.NoError(t, err)
	assert.ErrorIs(t, res[0].Err, leases.ErrNoRule)
	assert.NoError(t, res[1].Err)
	assert.EqualValues(t, 1, res[1].Granted)

	_, _, err = e.Check(context.Background(), []string{"user:2", "svc:x"}, 1)
	require.ErrorIs(t, err, leases.ErrNoRule)
}

func TestEngineCheckAllOrNothing(t *testing.T) {
	e, clock, store := newEngine(t, engineRules)
	ctx := context.Background()
	search, _ := e.Policy().Match("api:search")
	user, _ := e.Policy().Match("user:1")

	for i := range 10 {
		resp, rep, err := e.Check(ctx, []string{"user:1", "api:search", "free"}, 1)
		require.NoError(t, err)
		require.True(t, resp.Allowed, "call %d", i)
		assert.Equal(t, leases.Report{Grants: 1}, rep)
	}
	// api:search is empty now: the call is denied and user:1 gets its
	// token back.
	resp, rep, err := e.Check(ctx, []string{"user:1", "api:search"}, 1)
	require.NoError(t, err)
	assert.False(t, resp.Allowed)
	assert.Equal(t, 100*time.Millisecond, resp.RetryAfter)
	assert.True(t, resp.Keys[0].Allowed)
	assert.False(t, resp.Keys[1].Allowed)
	assert.Equal(t, leases.Report{Denials: 1}, rep)
	st, err := store.State(ctx, "user:1", user.Buckets()[0])
	require.NoError(t, err)
	assert.InDelta(t, 90, st.Level, 1e-9, "the denied call took nothing")
	st, err = store.State(ctx, "api:search", search.Buckets()[0])
	require.NoError(t, err)
	assert.InDelta(t, 0, st.Level, 1e-9)

	clock.Advance(100 * time.Millisecond)
	resp, _, err = e.Check(ctx, []string{"user:1", "api:search"}, 1)
	require.NoError(t, err)
	assert.True(t, resp.Allowed)

	_, _, err = e.Check(ctx, []string{"api:search"}, 11)
	require.ErrorIs(t, err, leases.ErrCostExceedsBurst)
}

type failingStore struct{ leases.Store }

func (failingStore) Lease(context.Context, leases.Owner, []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	return nil, fmt.Errorf("dial: %w", leases.ErrStoreUnavailable)
}

func TestEngineStoreFailure(t *testing.T) {
	var calls []string
	e := leases.NewEngine(leases.EngineOptions{
		Store: failingStore{leases.NewMemoryStore(leases.MemoryOptions{})},
		Policy: func() *leases.Policy {
			p, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{{Name: "u", Match: "*", Limit: 1, Period: time.Second}}})
			require.NoError(t, err)
			return p
		}(),
		OnStoreCall: func(op string, _ time.Duration, err error) { calls = append(calls, fmt.Sprint(op, " ", err != nil)) },
	})
	_, _, err := e.Lease(context.Background(), own("a/1"), []leases.LeaseAsk{{Key: "k", Want: 1}})
	assert.True(t, errors.Is(err, leases.ErrStoreUnavailable))
	assert.Equal(t, []string{"lease true"}, calls)
}

// opErrStore fails the operation on key bad with err, an error the Store
// interface does not document per operation, and runs the others.
type opErrStore struct {
	leases.Store
	bad string
	err error
}

func (s opErrStore) Lease(ctx context.Context, owner leases.Owner, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	outs, err := s.Store.Lease(ctx, owner, ops)
	if err != nil {
		return nil, err
	}
	for i := range ops {
		if ops[i].Key == s.bad {
			outs[i] = leases.LeaseOutcome{Err: s.err}
		}
	}
	return outs, nil
}

func TestEngineUnexpectedOpErrorFailsTheCall(t *testing.T) {
	ms := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = ms.Close() })
	cause := errors.New("script returned an unexpected reply")
	p, err := leases.NewPolicy(engineRules)
	require.NoError(t, err)
	e := leases.NewEngine(leases.EngineOptions{Store: opErrStore{Store: ms, bad: "user:2", err: cause}, Policy: p})

	res, rep, err := e.Lease(context.Background(), own("svc/a"), []leases.LeaseAsk{{Key: "user:1", Want: 1}, {Key: "user:2", Want: 1}})
	require.ErrorIs(t, err, cause, "the cause is kept")
	assert.Contains(t, err.Error(), `lease "user:2"`)
	assert.False(t, errors.Is(err, leases.ErrStoreUnavailable))
	assert.Nil(t, res)
	assert.Equal(t, leases.Report{}, rep)

	// The documented per-operation errors still fail their entry alone.
	e = leases.NewEngine(leases.EngineOptions{Store: opErrStore{Store: ms, bad: "user:2", err: leases.ErrUnknownLease}, Policy: p})
	res, _, err = e.Lease(context.Background(), own("svc/a"), []leases.LeaseAsk{{Key: "user:1", Want: 1}, {Key: "user:2", Want: 1}})
	require.NoError(t, err)
	assert.NoError(t, res[0].Err)
	assert.ErrorIs(t, res[1].Err, leases.ErrUnknownLease)
}

func TestNewLeaseID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := leases.NewLeaseID()
		require.Len(t, id, 16)
		require.False(t, seen[id])
		seen[id] = true
	}
}

// TestMemoryStoreSweepsIdleBuckets: idle buckets (full, no open lease) are
// dropped by the background sweep even when no request arrives, and never a
// bucket with an open lease.
func TestMemoryStoreSweepsIdleBuckets(t *testing.T) {
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: 64 * time.Millisecond})
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
	long := b
	long.LeaseTTL = time.Hour
	for i := range 5000 {
		_, err := s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: fmt.Sprint("k", i), Bucket: b, Want: 1, NewLeaseID: "x"}})
		require.NoError(t, err)
	}
	_, err := s.Lease(ctx, own("a/1"), []leases.LeaseOp{{Key: "held", Bucket: long, Want: 1, NewLeaseID: "x"}})
	require.NoError(t, err)
	require.Equal(t, 5001, s.Len())
	// After the leases expire and the buckets refill, the sweeper drops the
	// idle buckets with no request at all; the bucket with a lease open for
	// an hour stays.
	clock.Advance(3 * time.Second)
	require.Eventually(t, func() bool { return s.Len() == 1 }, 10*time.Second, 5*time.Millisecond)
	st, err := s.State(ctx, "held", long)
	require.NoError(t, err)
	assert.EqualValues(t, 1, st.Outstanding)
}

// TestMemoryStoreSweep: without a sweeper, Sweep drops the idle buckets.
func TestMemoryStoreSweep(t *testing.T) {
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = s.Close() })
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: time.Second}
	_, err := s.Take(context.Background(), []leases.TakeOp{{Key: "a", Bucket: b, Cost: 5}, {Key: "b", Bucket: b, Cost: 1}})
	require.NoError(t, err)
	s.Sweep()
	require.Equal(t, 2, s.Len(), "neither bucket is full yet")
	clock.Advance(100 * time.Millisecond)
	s.Sweep()
	require.Equal(t, 1, s.Len(), "b refilled its token in 100 ms")
	clock.Advance(400 * time.Millisecond)
	s.Sweep()
	require.Zero(t, s.Len())
}

func TestMemoryStoreClosed(t *testing.T) {
	s := leases.NewMemoryStore(leases.MemoryOptions{})
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err := s.Lease(context.Background(), own("a"), []leases.LeaseOp{{Key: "k"}})
	assert.ErrorIs(t, err, leases.ErrClosed)
	assert.ErrorIs(t, s.Ping(context.Background()), leases.ErrClosed)
}

// own returns the Owner named "client/process".
func own(s string) leases.Owner {
	c, p, _ := strings.Cut(s, "/")
	return leases.Owner{Client: c, Process: p}
}

// TestEngineSeveralLimits: a rule of two limits grants the least of their
// grants under one lease ID; a settle credits each limit; a limit that
// grants nothing denies the entry, and the other's grant is given back.
func TestEngineSeveralLimits(t *testing.T) {
	rs := leases.RuleSet{Rules: []leases.Rule{{Name: "two", Match: "k:*", LeaseTTL: time.Second, Limits: []leases.Limit{
		{Limit: 10, Period: time.Second},
		{Limit: 20, Period: 10 * time.Second},
	}}}}
	e, clock, store := newEngine(t, rs)
	ctx := context.Background()
	r, _ := e.Policy().Match("k:1")
	b := r.Buckets()
	level := func(i int) float64 {
		key := "k:1"
		if i > 0 {
			key += "\x1f1"
		}
		st, err := store.State(ctx, key, b[i])
		require.NoError(t, err)
		return st.Level
	}

	res, rep, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "k:1", Want: 15}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.EqualValues(t, 10, res[0].Granted, "the least of 10 and 15")
	require.Len(t, res[0].Limits, 2)
	assert.EqualValues(t, 0, res[0].Limits[0].Remaining)
	assert.EqualValues(t, 5, res[0].Limits[1].Remaining, "the second limit granted 15 and keeps them until the settle")
	assert.EqualValues(t, 0, res[0].Remaining)
	assert.InDelta(t, 2.0, res[0].SafeRate, 1e-9, "the lower of 10/s and 2/s")
	assert.Equal(t, leases.Report{Grants: 1}, rep)

	// 4 used: the first limit gets 6 back, the second 11.
	res, rep, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "k:1", LeaseID: res[0].LeaseID, Used: 4}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.Equal(t, leases.Report{Settles: 1}, rep)
	assert.InDelta(t, 6, level(0), 1e-9)
	assert.InDelta(t, 16, level(1), 1e-9)

	// A direct take of 6 empties the first limit.
	resp, _, err := e.Check(ctx, []string{"k:1"}, 6)
	require.NoError(t, err)
	require.True(t, resp.Allowed)
	assert.InDelta(t, 0, level(0), 1e-9)
	assert.InDelta(t, 10, level(1), 1e-9)
	// The first limit is empty: nothing is granted, and the second limit's
	// grant is given back at once.
	res, rep, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "k:1", Want: 5}})
	require.NoError(t, err)
	assert.Zero(t, res[0].Granted)
	assert.Empty(t, res[0].LeaseID)
	assert.Equal(t, 100*time.Millisecond, res[0].RetryAfter)
	assert.Equal(t, leases.Report{Denials: 1}, rep)
	assert.InDelta(t, 10, level(1), 1e-9, "the second limit's grant came back")

	// A take needs both limits: the first refills, the second binds.
	clock.Advance(time.Second)
	resp, _, err = e.Check(ctx, []string{"k:1"}, 10)
	require.NoError(t, err)
	assert.True(t, resp.Allowed)
	resp, _, err = e.Check(ctx, []string{"k:1"}, 2)
	require.NoError(t, err)
	assert.False(t, resp.Allowed, "the first limit is empty")
	require.Len(t, resp.Keys[0].Limits, 2)
	assert.InDelta(t, 2, level(1), 1e-9, "the denied take gave the second limit its 2 back")
	assert.EqualValues(t, 0, resp.Keys[0].Limits[0].Remaining)
	assert.EqualValues(t, 2, resp.Keys[0].Limits[1].Remaining, "reported as given back")
	assert.EqualValues(t, 0, resp.Keys[0].Remaining)
}

// TestEngineSoft: a soft rule of 100 and 5% admits 105 and reports the
// base limit, what remains of it, and the overage in use.
func TestEngineSoft(t *testing.T) {
	e, _, _ := newEngine(t, leases.RuleSet{Rules: []leases.Rule{{Name: "soft", Match: "s:*", Limit: 100, Period: time.Minute, Soft: 0.05}}})
	ctx := context.Background()
	resp, _, err := e.Check(ctx, []string{"s:1"}, 90)
	require.NoError(t, err)
	require.True(t, resp.Allowed)
	st := resp.Keys[0].Limits[0]
	assert.EqualValues(t, 100, st.Limit.Limit, "the base limit is reported")
	assert.EqualValues(t, 10, st.Remaining)
	assert.Zero(t, st.Overage)
	resp, _, err = e.Check(ctx, []string{"s:1"}, 13)
	require.NoError(t, err)
	require.True(t, resp.Allowed, "103 of 105")
	st = resp.Keys[0].Limits[0]
	assert.Zero(t, st.Remaining)
	assert.EqualValues(t, 3, st.Overage)
	resp, _, err = e.Check(ctx, []string{"s:1"}, 3)
	require.NoError(t, err)
	assert.False(t, resp.Allowed, "106 > 105")
	resp, _, err = e.Check(ctx, []string{"s:1"}, 2)
	require.NoError(t, err)
	assert.True(t, resp.Allowed, "105")
	_, _, err = e.Check(ctx, []string{"s:2"}, 106)
	require.ErrorIs(t, err, leases.ErrCostExceedsBurst)
}

// TestEngineShadow: a shadow rule decides and counts, but admits: checks
// beyond the limit are allowed and reported; a lease is granted what was
// asked, and its settle reports to the store no more than the store granted.
func TestEngineShadow(t *testing.T) {
	e, _, store := newEngine(t, leases.RuleSet{Rules: []leases.Rule{
		{Name: "shadow", Match: "sh:*", Limit: 2, Period: time.Minute, Shadow: true},
		{Name: "hard", Match: "h:*", Limit: 1, Period: time.Minute},
	}})
	ctx := context.Background()
	for i := range 3 {
		resp, rep, err := e.Check(ctx, []string{"sh:1"}, 1)
		require.NoError(t, err)
		assert.True(t, resp.Allowed, "shadow admits: request %d", i)
		assert.Equal(t, i == 2, resp.ShadowDenied, "request %d", i)
		assert.Equal(t, i == 2, resp.Keys[0].ShadowDenied)
		assert.Equal(t, leases.Report{Grants: 1, ShadowDenials: map[bool]int{true: 1}[i == 2]}, rep)
	}
	// A hard key in the same take still denies.
	resp, _, err := e.Check(ctx, []string{"sh:1", "h:1"}, 1)
	require.NoError(t, err)
	require.True(t, resp.Allowed)
	resp, _, err = e.Check(ctx, []string{"sh:1", "h:1"}, 1)
	require.NoError(t, err)
	assert.False(t, resp.Allowed, "the hard rule denies")

	r, _ := e.Policy().Match("sh:2")
	res, rep, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:2", Want: 5}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.EqualValues(t, 5, res[0].Granted, "granted as asked")
	assert.True(t, res[0].ShadowDenied, "the limit would have granted 2")
	assert.Contains(t, res[0].LeaseID, "~2~", "the ID remembers what the limit granted")
	assert.Equal(t, 1, rep.ShadowDenials)
	st, err := store.State(ctx, "sh:2", r.Buckets()[0])
	require.NoError(t, err)
	assert.EqualValues(t, 2, st.Outstanding, "the store holds what it granted")
	// All 5 used: the store's lease is settled as fully spent, no error.
	res, rep, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:2", LeaseID: res[0].LeaseID, Used: 5}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.Equal(t, 1, rep.Settles)
	st, err = store.State(ctx, "sh:2", r.Buckets()[0])
	require.NoError(t, err)
	assert.Zero(t, st.Outstanding)
	assert.InDelta(t, 0, st.Level, 1e-9)
	// A lease the store granted nothing of settles without a store call.
	res, _, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:2", Want: 3}})
	require.NoError(t, err)
	require.Contains(t, res[0].LeaseID, "~0~", "the ID remembers that the limit granted nothing")
	assert.EqualValues(t, 3, res[0].Granted)
	res, rep, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:2", LeaseID: res[0].LeaseID, Used: 3}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.Equal(t, leases.Report{Settles: 1}, rep)
}

// TestEngineElastic: requests an elastic rule's own limit denies borrow
// from its pool, all of them together at most the pool's bound; a lease
// takes its shortfall from the pool, and its settle gives back what it
// borrowed and did not use.
func TestEngineElastic(t *testing.T) {
	rules := leases.RuleSet{Rules: []leases.Rule{
		{Name: "users", Match: "user:*", Limit: 2, Period: time.Minute, Elastic: "capacity:api"},
		{Name: "capacity", Match: "capacity:*", Limit: 3, Period: time.Minute},
	}}
	e, _, store := newEngine(t, rules)
	ctx := context.Background()
	var borrowed int
	for i, want := range []bool{true, true, true, true, true, false} {
		resp, rep, err := e.Check(ctx, []string{"user:1"}, 1)
		require.NoError(t, err)
		require.Equal(t, want, resp.Allowed, "request %d", i)
		if resp.Borrowed {
			borrowed++
			assert.True(t, resp.Keys[0].Borrowed)
			assert.Equal(t, 1, rep.Borrows)
		}
	}
	assert.Equal(t, 3, borrowed, "the pool's 3, after the user's own 2")
	resp, _, err := e.Check(ctx, []string{"user:2"}, 1)
	require.NoError(t, err)
	require.True(t, resp.Allowed, "user 2's own limit")
	require.False(t, resp.Borrowed)
	resp, _, err = e.Check(ctx, []string{"user:2"}, 1)
	require.NoError(t, err)
	require.True(t, resp.Allowed)
	resp, _, err = e.Check(ctx, []string{"user:2"}, 1)
	require.NoError(t, err)
	assert.False(t, resp.Allowed, "the pool is empty: no more than its bound is ever borrowed")

	// A lease: the own limit grants 2, the pool the other 3.
	e2, _, store2 := newEngine(t, rules)
	res, rep, err := e2.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "user:9", Want: 5}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.EqualValues(t, 5, res[0].Granted)
	assert.EqualValues(t, 3, res[0].Borrowed)
	assert.Equal(t, 1, rep.Borrows)
	pool, _ := e2.Policy().Match("capacity:api")
	level := func() float64 {
		st, err := store2.State(ctx, "capacity:api", pool.Buckets()[0])
		require.NoError(t, err)
		return st.Level
	}
	assert.InDelta(t, 0, level(), 1e-6)
	// 3 used: 2 from the own limit, 1 from the pool; 2 go back to the pool.
	res, _, err = e2.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "user:9", LeaseID: res[0].LeaseID, Used: 3}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	assert.InDelta(t, 2, level(), 1e-3, "the unused borrowed tokens are back")
	_ = store

	for _, bad := range []leases.RuleSet{
		{Rules: []leases.Rule{{Name: "u", Match: "user:*", Limit: 1, Period: time.Second, Elastic: "nowhere"}}},
		{Rules: []leases.Rule{{Name: "u", Match: "user:*", Limit: 1, Period: time.Second, Elastic: "user:pool"}}},
		{Rules: []leases.Rule{{Name: "u", Match: "user:*", Limit: 1, Period: time.Second, Shadow: true, Elastic: "p"}, {Name: "p", Match: "p", Limit: 1, Period: time.Second}}},
	} {
		_, err := leases.NewPolicy(bad)
		require.ErrorIs(t, err, leases.ErrInvalidRules)
		assert.Contains(t, err.Error(), "elastic")
	}
}

// TestEnginePrioritySaturation: the guarantee at engine level. A rule of
// 1000/s (burst 100) reserves 20% for critical; best-effort (low) callers
// ask for ten times the refill, by takes and by leases, every millisecond,
// and critical callers take at a steady 200/s, their reserved share of the
// rate, after the low ones in each millisecond. With the reserve they are
// admitted at ≥ 95% of their demand; without it, low drains the bucket
// first and critical gets what is left.
func TestEnginePrioritySaturation(t *testing.T) {
	run := func(t *testing.T, reserve map[string]float64) (critAsked, critAdmitted, lowAdmitted int64) {
		e, clock, _ := newEngine(t, leases.RuleSet{Rules: []leases.Rule{{Name: "api", Match: "api:*", Limit: 1000, Period: time.Second, Burst: 100, LeaseTTL: 20 * time.Millisecond, Reserve: reserve}}})
		ctx := context.Background()
		leaseIDs := make([]string, 4)
		granted := make([]int64, 4)
		for ms := 1; ms <= 2000; ms++ {
			for w := range 4 {
				res, _, err := e.Lease(ctx, own(fmt.Sprintf("low/%d", w)), []leases.LeaseAsk{{Key: "api:x", Want: 10, LeaseID: leaseIDs[w], Used: granted[w], Priority: "low"}})
				require.NoError(t, err)
				require.NoError(t, res[0].Err)
				leaseIDs[w], granted[w] = res[0].LeaseID, res[0].Granted
				lowAdmitted += res[0].Granted
			}
			for range 6 {
				res, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"api:x"}, Cost: 1, Priority: "low"}})
				require.NoError(t, err)
				if res[0].Allowed {
					lowAdmitted++
				}
			}
			if ms%5 == 0 {
				res, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"api:x"}, Cost: 1, Priority: "critical"}})
				require.NoError(t, err)
				require.NoError(t, res[0].Err)
				critAsked++
				if res[0].Allowed {
					critAdmitted++
				}
			}
			clock.Advance(time.Millisecond)
		}
		return critAsked, critAdmitted, lowAdmitted
	}
	asked, admitted, low := run(t, map[string]float64{"critical": 0.2})
	t.Logf("with a 20%% reserve: critical %d of %d admitted (%.1f%%), low %d tokens", admitted, asked, 100*float64(admitted)/float64(asked), low)
	assert.GreaterOrEqual(t, float64(admitted), 0.95*float64(asked))
	assert.LessOrEqual(t, low+admitted, int64(100+2000), "the bound holds")
	askedNo, admittedNo, lowNo := run(t, nil)
	t.Logf("without a reserve: critical %d of %d admitted (%.1f%%), low %d tokens", admittedNo, askedNo, 100*float64(admittedNo)/float64(askedNo), lowNo)
	assert.Less(t, float64(admittedNo), 0.5*float64(askedNo), "the control: without a reserve, best effort starves critical")
}

// TestEnginePriorityFloors: each limit of a rule takes its own floor; a
// take whose cost cannot fit above its class's floor is refused as it
// would be above the burst; a lease whose class can never be served waits
// a period.
func TestEnginePriorityFloors(t *testing.T) {
	e, _, _ := newEngine(t, leases.RuleSet{Rules: []leases.Rule{
		{Name: "two", Match: "two:*", Limits: []leases.Limit{{Limit: 10, Period: time.Hour}, {Limit: 40, Period: time.Hour}}, Reserve: map[string]float64{"critical": 0.3, "high": 0.2}},
		{Name: "tiny", Match: "tiny:*", Limit: 1, Period: time.Minute, Reserve: map[string]float64{"critical": 0.2}},
	}})
	ctx := context.Background()
	tests := []struct {
		name     string
		priority string
		cost     int64
		allowed  bool
		err      error
	}{
		{"normal takes what lies above 50% of the smaller limit", "normal", 5, true, nil},
		{"normal is then at its floor", "", 1, false, nil},
		{"high's floor is 30%", "high", 2, true, nil},
		{"high is at its floor", "high", 1, false, nil},
		{"critical takes the rest", "critical", 3, true, nil},
		{"the limit is spent", "critical", 1, false, nil},
		{"a cost above burst less the floor is refused", "low", 6, false, leases.ErrCostExceedsBurst},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"two:a"}, Cost: tt.cost, Priority: tt.priority}})
			require.NoError(t, err)
			if tt.err != nil {
				require.ErrorIs(t, res[0].Err, tt.err)
				assert.Contains(t, res[0].Err.Error(), `priority "low"`)
				return
			}
			require.NoError(t, res[0].Err)
			assert.Equal(t, tt.allowed, res[0].Allowed)
		})
	}
	res, _, err := e.Lease(ctx, own("c/1"), []leases.LeaseAsk{{Key: "tiny:a", Want: 1, Priority: "low"}})
	require.NoError(t, err)
	assert.Zero(t, res[0].Granted, "⌈1 × 20%⌉ = 1: nothing of a bucket of one is ever low's")
	assert.Equal(t, time.Minute, res[0].RetryAfter, "never, under this rule: ask again a period later")
	res, _, err = e.Lease(ctx, own("c/1"), []leases.LeaseAsk{{Key: "tiny:a", Want: 1, Priority: "critical"}})
	require.NoError(t, err)
	assert.EqualValues(t, 1, res[0].Granted)
}

// TestEngineDeferred: a lease that accepts a deferral (LeaseAsk.MaxDelay)
// of a rule with several limits waits for the slowest of them, and gets
// the least of their grants; a limit that refuses gives the others'
// deferred grants back, paying their debt; shadow and elastic rules never
// defer.
func TestEngineDeferred(t *testing.T) {
	rs := leases.RuleSet{Rules: []leases.Rule{
		{Name: "two", Match: "k:*", LeaseTTL: 2 * time.Second, Limits: []leases.Limit{
			{Limit: 100, Period: time.Second, Burst: 10},       // a token every 10 ms
			{Limit: 1000, Period: 10 * time.Second, Burst: 20}, // a token every 10 ms, deeper
		}},
		{Name: "shadow", Match: "sh:*", Limit: 100, Period: time.Second, Burst: 10, LeaseTTL: 2 * time.Second, Shadow: true},
		{Name: "elastic", Match: "el:*", Limit: 100, Period: time.Second, Burst: 10, LeaseTTL: 2 * time.Second, Elastic: "pool:x"},
		{Name: "pool", Match: "pool:*", Limit: 1, Period: time.Minute, Burst: 1},
	}}
	e, _, store := newEngine(t, rs)
	ctx := context.Background()
	r, _ := e.Policy().Match("k:1")
	b := r.Buckets()
	lease := func(key string, want int64, id string, used int64) leases.LeaseResult {
		t.Helper()
		res, _, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: key, Want: want, LeaseID: id, Used: used, MaxDelay: time.Second}})
		require.NoError(t, err)
		require.NoError(t, res[0].Err)
		return res[0]
	}
	level := func(key string, b leases.Bucket) float64 {
		st, err := store.State(ctx, key, b)
		require.NoError(t, err)
		return st.Level
	}

	// 10 from both; the first limit is then empty, the second holds 10.
	first := lease("k:1", 10, "", 0)
	require.EqualValues(t, 10, first.Granted)
	assert.Zero(t, first.Delay)
	// 10 more: the first limit defers them 100 ms, the second grants at
	// once; the lease waits for the first.
	next := lease("k:1", 10, first.LeaseID, 10)
	assert.EqualValues(t, 10, next.Granted)
	assert.Equal(t, 100*time.Millisecond, next.Delay)
	assert.InDelta(t, -10, level("k:1", b[0]), 1e-9, "the first limit in debt")
	assert.InDelta(t, 0, level("k:1\x1f1", b[1]), 1e-9)
	// b asks for 20: the first limit refuses it (its cap burst − O is
	// down to 0 with a's deferred 10 outstanding), so the entry is
	// refused, and what the second limit deferred for b (its fair batch,
	// 10) is given back: both limits are as a left them.
	res, _, err := e.Lease(ctx, own("b/1"), []leases.LeaseAsk{{Key: "k:1", Want: 20, MaxDelay: time.Second}})
	require.NoError(t, err)
	assert.Zero(t, res[0].Granted)
	assert.Positive(t, res[0].RetryAfter)
	assert.InDelta(t, -10, level("k:1", b[0]), 1e-9, "only a's debt is left")
	st, err := store.State(ctx, "k:1\x1f1", b[1])
	require.NoError(t, err)
	assert.InDelta(t, 0, st.Level, 1e-9, "the second limit's deferral for b given back")
	assert.EqualValues(t, 10, st.Outstanding, "a's lease only")

	// Shadow and elastic rules grant at once whatever their limits say
	// (elastic: what the pool lends), never deferred.
	for _, key := range []string{"sh:1", "el:1"} {
		r, _ := e.Policy().Match(key)
		o := lease(key, 10, "", 0)
		require.EqualValues(t, 10, o.Granted, key)
		o = lease(key, 10, o.LeaseID, 10)
		assert.Zero(t, o.Delay, key)
		assert.GreaterOrEqual(t, level(key, r.Buckets()[0]), 0.0, "%s: no debt", key)
	}
}

// TestEngineElasticLeakyPool (found by the invariant review): a pool
// governed by a leaky_bucket is refused. Its borrowed takes were taken
// from the shaper's queue with their slot's delay dropped: under a pool of
// 10/s (a slot every 100 ms, a queue of 10), ten requests of a key past
// its own limit borrowed at one instant, each admitted with delay 0, where
// the pool's own bound admits one request per 100 ms; a take of the pool
// key itself was told to wait for its slot.
func TestEngineElasticLeakyPool(t *testing.T) {
	_, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{
		{Name: "users", Match: "user:*", Limit: 1, Period: time.Hour, Elastic: "pool"},
		{Name: "pool", Match: "pool", Algorithm: leases.LeakyBucket, Limit: 10, Period: time.Second, Burst: 10},
	}})
	require.ErrorIs(t, err, leases.ErrInvalidRules)
	assert.Contains(t, err.Error(), `rule "users": elastic: the pool key "pool" is governed by rule "pool", a leaky_bucket`)
	for _, alg := range []leases.Algorithm{leases.TokenBucket, leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog} {
		_, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{
			{Name: "users", Match: "user:*", Limit: 1, Period: time.Hour, Elastic: "pool"},
			{Name: "pool", Match: "pool", Algorithm: alg, Limit: 10, Period: time.Second},
		}})
		require.NoError(t, err, "a pool of %s lends tokens outright", alg)
	}
}

// TestEngineElasticPoolReserve (found by the invariant review): a request
// that borrows from an elastic rule's pool leaves the pool's floor for its
// class, as a take of the pool key itself does. Borrows were taken with no
// floor: low requests past their own limit borrowed the whole pool of 10,
// critical's reserve of 5 included, and a critical take of the pool was
// then denied; a low lease borrowed its shortfall of 7 of the 10, and
// critical found 3.
func TestEngineElasticPoolReserve(t *testing.T) {
	rules := leases.RuleSet{Rules: []leases.Rule{
		{Name: "users", Match: "user:*", Limit: 1, Period: time.Hour, Elastic: "pool"},
		{Name: "pool", Match: "pool", Limit: 10, Period: time.Hour, Reserve: map[string]float64{"critical": 0.5}},
	}}
	ctx := context.Background()
	critical := func(t *testing.T, e *leases.Engine) int {
		n := 0
		for range 6 {
			res, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"pool"}, Cost: 1, Priority: "critical"}})
			require.NoError(t, err)
			require.NoError(t, res[0].Err)
			if res[0].Allowed {
				n++
			}
		}
		return n
	}
	t.Run("takes", func(t *testing.T) {
		e, _, _ := newEngine(t, rules)
		var own, borrowed int
		for range 20 {
			res, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"user:1"}, Cost: 1, Priority: "low"}})
			require.NoError(t, err)
			require.NoError(t, res[0].Err)
			switch {
			case res[0].Borrowed:
				borrowed++
			case res[0].Allowed:
				own++
			}
		}
		assert.Equal(t, 1, own, "the key's own limit")
		assert.Equal(t, 5, borrowed, "the pool's 10 less critical's reserve")
		assert.Equal(t, 5, critical(t, e), "critical finds its reserve in the pool")
	})
	t.Run("lease", func(t *testing.T) {
		e, _, _ := newEngine(t, rules)
		res, _, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "user:2", Want: 8, Priority: "low"}})
		require.NoError(t, err)
		require.NoError(t, res[0].Err)
		assert.EqualValues(t, 1, res[0].Granted, "the key's own limit")
		assert.Zero(t, res[0].Borrowed, "a shortfall of 7 reaches into the reserve")
		res, _, err = e.Lease(ctx, own("b/1"), []leases.LeaseAsk{{Key: "user:3", Want: 6, Priority: "low"}})
		require.NoError(t, err)
		require.NoError(t, res[0].Err)
		assert.EqualValues(t, 5, res[0].Borrowed, "a shortfall of 5 fits above the floor")
		assert.Equal(t, 5, critical(t, e), "critical finds its reserve in the pool")
	})
}
