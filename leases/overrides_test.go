package leases_test

import (
	"context"
	"errors"
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
