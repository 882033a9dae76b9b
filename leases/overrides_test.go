package leases_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
)

// mapOverrides is a leases.Overrides over a map; err fails every lookup.
type mapOverrides struct {
	m   map[string]*leases.Rule
	err error
}

func (o *mapOverrides) Lookup(_ context.Context, keys []string) (map[string]*leases.Rule, error) {
	if o.err != nil {
		return nil, o.err
	}
	out := map[string]*leases.Rule{}
	for _, k := range keys {
		if r := o.m[k]; r != nil {
			out[k] = r
		}
	}
	return out, nil
}

// TestOverridesBeatThePolicy: an override governs its key only, in leases
// and takes; the other keys keep the policy's rule; a lookup error fails
// the call.
func TestOverridesBeatThePolicy(t *testing.T) {
	p, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{{Name: "per-user", Match: "user:*", Limit: 100, Period: time.Second}}})
	require.NoError(t, err)
	ov, err := leases.NewOverrideRule("user:*vip", leases.Rule{Limit: 2, Period: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, `user:\*vip`, ov.Match, "the key is escaped: the override matches it alone")
	src := &mapOverrides{m: map[string]*leases.Rule{"user:*vip": ov}}
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	defer store.Close()
	e := leases.NewEngine(leases.EngineOptions{Store: store, Policy: p, Overrides: src})
	ctx := context.Background()

	res, _, err := e.Lease(ctx, leases.Owner{Client: "c", Process: "p"}, []leases.LeaseAsk{{Key: "user:*vip", Want: 10}, {Key: "user:1", Want: 10}})
	require.NoError(t, err)
	assert.Equal(t, leases.OverrideRuleName, res[0].Rule.Name)
	assert.EqualValues(t, 2, res[0].Granted)
	assert.Equal(t, "per-user", res[1].Rule.Name)
	assert.EqualValues(t, 10, res[1].Granted)

	took, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"user:2", "user:*vip"}, Cost: 1}})
	require.NoError(t, err)
	assert.False(t, took[0].Allowed, "the override's 2 are leased out")
	assert.Equal(t, leases.OverrideRuleName, took[0].Keys[1].Rule.Name)

	_, err = leases.NewOverrideRule("k", leases.Rule{Limit: 1})
	require.ErrorIs(t, err, leases.ErrInvalidRules)
	assert.Contains(t, err.Error(), `override of key "k"`)
	assert.Contains(t, err.Error(), "period")

	// KeyState (behind GET /v1/keys/{key} and `ratelease key show`)
	// reports the override too; it reported the policy's rule, a bucket
	// of 100 for a key limited to 2.
	ks, err := e.KeyState(ctx, "user:*vip")
	require.NoError(t, err)
	require.NotNil(t, ks.Rule)
	assert.Equal(t, leases.OverrideRuleName, ks.Rule.Name)
	require.Len(t, ks.Limits, 1)
	assert.EqualValues(t, 2, ks.Limits[0].Bucket.Burst)
	assert.EqualValues(t, 2, ks.Limits[0].State.Outstanding, "the override's bucket, with its lease")
	ks, err = e.KeyState(ctx, "user:1")
	require.NoError(t, err)
	assert.Equal(t, "per-user", ks.Rule.Name)

	src.err = leases.ErrStoreUnavailable
	_, _, err = e.Lease(ctx, leases.Owner{Client: "c", Process: "p"}, []leases.LeaseAsk{{Key: "user:3", Want: 1}})
	assert.True(t, errors.Is(err, leases.ErrStoreUnavailable))
	_, err = e.KeyState(ctx, "user:3")
	assert.ErrorIs(t, err, leases.ErrStoreUnavailable, "a lookup error fails KeyState: no rule is reported that may not be the key's")
}

// partialOverrides is a leases.Overrides whose source does not answer for
// the keys that start with "new:" (the node that holds it is down, and
// they were never cached); the others are answered by mapOverrides.
type partialOverrides struct{ mapOverrides }

func (o *partialOverrides) Lookup(ctx context.Context, keys []string) (map[string]*leases.Rule, error) {
	m, _ := o.mapOverrides.Lookup(ctx, keys)
	var unknown []string
	for _, k := range keys {
		if len(k) > 4 && k[:4] == "new:" {
			unknown = append(unknown, k)
		}
	}
	if unknown == nil {
		return m, nil
	}
	return m, &leases.OverridesUnavailableError{Keys: unknown, Err: fmt.Errorf("redis: %w: connection refused", leases.ErrStoreUnavailable)}
}

// servingStore is a store that says whether it serves other keys than
// those that failed (see leases.RedisStore.ServesOthers).
type servingStore struct {
	leases.Store
	serves bool
}

func (s servingStore) ServesOthers(context.Context) bool { return s.serves }

// TestOverridesUnavailableForSomeKeys (found by the second review of the
// shard-down change): the overrides of some keys cannot be looked up (the
// Redis Cluster node that holds the rule database is down), and the store
// serves the other keys: those keys' entries and takes fail alone with an
// error wrapping ErrStoreUnavailable, the others are decided, their
// overrides included. When the store does not serve others (one Redis
// down), the call fails whole, as before. It failed whole either way.
func TestOverridesUnavailableForSomeKeys(t *testing.T) {
	p, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{{Name: "per-user", Match: "*", Limit: 100, Period: time.Hour}}})
	require.NoError(t, err)
	ov, err := leases.NewOverrideRule("old:vip", leases.Rule{Limit: 2, Period: time.Minute})
	require.NoError(t, err)
	src := &partialOverrides{mapOverrides{m: map[string]*leases.Rule{"old:vip": ov}}}
	mem := leases.NewMemoryStore(leases.MemoryOptions{})
	defer mem.Close()
	store := &servingStore{Store: mem, serves: true}
	e := leases.NewEngine(leases.EngineOptions{Store: store, Policy: p, Overrides: src})
	ctx := context.Background()
	owner := leases.Owner{Client: "c", Process: "p"}

	res, _, err := e.Lease(ctx, owner, []leases.LeaseAsk{{Key: "old:vip", Want: 10}, {Key: "new:a", Want: 10}, {Key: "old:b", Want: 10}})
	require.NoError(t, err)
	assert.EqualValues(t, 2, res[0].Granted, "the override governs")
	require.ErrorIs(t, res[1].Err, leases.ErrStoreUnavailable)
	de, ok := errors.AsType[*leases.DecisionError](res[1].Err)
	require.True(t, ok)
	assert.Contains(t, de.Detail, `"new:a"`)
	assert.Zero(t, res[1].Granted)
	assert.EqualValues(t, 10, res[2].Granted)

	took, _, err := e.Take(ctx, []leases.TakeAsk{{Keys: []string{"old:b", "new:a"}, Cost: 1}, {Keys: []string{"old:c"}, Cost: 1}})
	require.NoError(t, err)
	require.ErrorIs(t, took[0].Err, leases.ErrStoreUnavailable)
	assert.True(t, took[1].Allowed)
	st, err := e.KeyState(ctx, "old:b")
	require.NoError(t, err)
	assert.InDelta(t, 90, st.Limits[0].State.Level, 1, "the failed take took nothing of old:b (its lease holds 10)")
	_, err = e.KeyState(ctx, "new:a")
	require.ErrorIs(t, err, leases.ErrStoreUnavailable)

	store.serves = false
	_, _, err = e.Lease(ctx, owner, []leases.LeaseAsk{{Key: "old:b", Want: 1}, {Key: "new:a", Want: 1}})
	require.ErrorIs(t, err, leases.ErrStoreUnavailable, "the store serves nothing: the call fails whole")
	_, _, err = e.Take(ctx, []leases.TakeAsk{{Keys: []string{"new:a"}, Cost: 1}})
	require.ErrorIs(t, err, leases.ErrStoreUnavailable)
}
