package inbound

import (
	"net/http"
	"sync"
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
		{Limit: 1, Period: 0},
	}
	assert.Equal(t, []string{"100-per-1m", "5-per-10s", "5-per-10s-2", "7-per-1500ms", "1000-per-24h", "1-per-0s"}, policyNames(ls))
}

// TestPolicyWindow: q and w describe the rule's rate and, where the bucket
// holds more than a period's worth, its size; r never exceeds q. Before,
// a bucket of 10 per minute with a burst of 100 said q=10;w=60 beside
// r=99, and 5 per 100 ms said q=5;w=1, a tenth of its rate (found by
// review).
func TestPolicyWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		l      client.LimitState
		q, w   int64
		remain int64
	}{
		{"whole seconds", client.LimitState{Limit: 100, Period: time.Minute, Burst: 100, Remaining: 57}, 100, 60, 57},
		{"burst above the limit", client.LimitState{Limit: 10, Period: time.Minute, Burst: 100, Remaining: 99}, 100, 600, 99},
		{"burst below the limit", client.LimitState{Limit: 100, Period: time.Second, Burst: 10, Remaining: 10}, 100, 1, 10},
		{"a period under a second", client.LimitState{Limit: 5, Period: 100 * time.Millisecond, Burst: 5, Remaining: 5}, 50, 1, 5},
		{"a period of 1.5 s", client.LimitState{Limit: 7, Period: 1500 * time.Millisecond, Remaining: 7}, 9, 2, 7},
		{"a window (burst = limit)", client.LimitState{Limit: 3, Period: time.Hour, Burst: 3, Remaining: 3}, 3, 3600, 3},
		{"remaining above the limit, no burst told", client.LimitState{Limit: 10, Period: time.Second, Remaining: 40}, 10, 1, 10},
		{"a zero period", client.LimitState{Limit: 1, Period: 0, Remaining: 1}, 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, w := policyWindow(tc.l)
			assert.Equal(t, tc.q, q, "q")
			assert.Equal(t, tc.w, w, "w")
			_, st := RateLimitFields([]client.LimitState{tc.l}, time.Unix(0, 0))
			sl, err := httpsfv.UnmarshalList([]string{st})
			require.NoError(t, err)
			r, _ := sl[0].(httpsfv.Item).Params.Get("r")
			assert.Equal(t, tc.remain, r, "r")
			assert.LessOrEqual(t, r.(int64), q, "r above q")
		})
	}
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

	// The cache answers what RateLimitFields would, whatever slices and
	// times meet in its slots.
	other := append([]client.LimitState(nil), ls[1:]...)
	for i := range 50 {
		at := now.Add(time.Duration(i) * 73 * time.Millisecond)
		for _, l := range [][]client.LimitState{ls, ls[:1], ls[1:], other, make([]client.LimitState, maxCachedLimits+1)} {
			wp, ws := RateLimitFields(l, at)
			gp, gs := fc.fields(l, at)
			assert.Equal(t, wp, gp)
			assert.Equal(t, ws, gs)
		}
	}
	p, s = fc.fields(nil, now)
	assert.Empty(t, p)
	assert.Empty(t, s)
}

// TestFieldCacheConcurrent: goroutines that share the cache's slots, with
// slices and times of their own, each get their own fields (go test -race
// checks the slots).
func TestFieldCacheConcurrent(t *testing.T) {
	fc := newFieldCache()
	now := time.Unix(1000, 0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			ls := make([][]client.LimitState, 100) // more slices than slots
			for i := range ls {
				ls[i] = []client.LimitState{{Limit: int64(g*1000 + i), Period: time.Minute, Remaining: int64(i), Reset: now.Add(time.Duration(i) * time.Second)}}
			}
			for n := range 2000 {
				l, at := ls[n%len(ls)], now.Add(time.Duration(n%7)*400*time.Millisecond)
				wp, ws := RateLimitFields(l, at)
				gp, gs := fc.fields(l, at)
				if gp != wp || gs != ws {
					t.Errorf("goroutine %d: %q %q, want %q %q", g, gp, gs, wp, ws)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestLimiterFields: Fields says what Decided asks for.
func TestLimiterFields(t *testing.T) {
	l := newLimiter(t, Config{})
	now := time.Unix(1000, 0)
	ls := []client.LimitState{{Limit: 5, Period: 10 * time.Second, Remaining: 2, Reset: now.Add(8 * time.Second)}}
	const policy, state = `"5-per-10s";q=5;w=10`, `"5-per-10s";r=2;t=8`
	out := Decided{Decision: client.Decision{Limits: ls}, Fields: true, State: true}
	p, s := l.Fields(&out, now)
	assert.Equal(t, policy, p)
	assert.Equal(t, state, s)
	out.State = false
	p, s = l.Fields(&out, now)
	assert.Equal(t, policy, p)
	assert.Empty(t, s, "no fresh state")
	out.Fields = false
	p, s = l.Fields(&out, now)
	assert.Empty(t, p)
	assert.Empty(t, s)
}

func TestSetValues(t *testing.T) {
	h := http.Header{"A": {"old"}, "B": {"old"}, "C": {"old"}}
	SetValues(h, "A", "1", "B", "", "C", "3", "D", "4")
	assert.Equal(t, http.Header{"A": {"1"}, "B": {"old"}, "C": {"3"}, "D": {"4"}}, h)
	h.Add("A", "x") // must not overwrite C's value, which shares A's array
	assert.Equal(t, []string{"3"}, h["C"])
	assert.Equal(t, []string{"1", "x"}, h["A"])
	m := map[string][]string{}
	SetValues(m, "a", "", "b", "")
	assert.Empty(t, m)
	assert.Equal(t, 1.0, testing.AllocsPerRun(100, func() { SetValues(m, "a", "1", "b", "2", "c", "3") }))
}
