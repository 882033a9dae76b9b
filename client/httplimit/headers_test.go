package httplimit

import (
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/ratelease/ratelease/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPolicyNames(t *testing.T) {
	ls := []client.LimitState{
		{Limit: 100, Period: time.Minute},
		{Limit: 5, Period: 10 * time.Second},
		{Limit: 5, Period: 10 * time.Second},
		{Limit: 7, Period: 1500 * time.Millisecond},
		{Limit: 1000, Period: 24 * time.Hour},
	}
	assert.Equal(t, []string{"100-per-1m", "5-per-10s", "5-per-10s-2", "7-per-1500ms", "1000-per-24h"}, policyNames(ls))
}

func TestFieldsAndCache(t *testing.T) {
	now := time.Unix(1000, 0)
	ls := []client.LimitState{
		{Limit: 10, Period: 500 * time.Millisecond, Remaining: 3, Reset: now.Add(1100 * time.Millisecond)},
		{Limit: 100, Period: time.Hour, Remaining: -2, Reset: now.Add(-time.Second)},
	}
	fc := newFieldCache()
	p, s := fc.fields(ls, now)
	pl, err := httpsfv.UnmarshalList([]string{p})
	require.NoError(t, err)
	sl, err := httpsfv.UnmarshalList([]string{s})
	require.NoError(t, err)
	require.Len(t, pl, 2)
	require.Len(t, sl, 2)
	get := func(m httpsfv.Member, k string) any { v, _ := m.(httpsfv.Item).Params.Get(k); return v }
	assert.Equal(t, int64(1), get(pl[0], "w"), "a period under a second rounds up to 1")
	assert.Equal(t, int64(2), get(sl[0], "t"), "1.1 s rounds up")
	assert.Equal(t, int64(0), get(sl[1], "r"), "never negative")
	assert.Equal(t, int64(0), get(sl[1], "t"))
	p2, s2 := fc.fields(ls, now.Add(50*time.Millisecond))
	assert.Equal(t, p, p2)
	assert.Equal(t, s, s2, "same second: the cached value")
	_, s3 := fc.fields(ls, now.Add(200*time.Millisecond))
	assert.NotEqual(t, s, s3, "t changed: serialized again")
}
