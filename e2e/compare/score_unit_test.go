package compare

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const ms = time.Millisecond

func TestExactBucket(t *testing.T) {
	r10 := rule{limit: 10, period: time.Second, burst: 10}
	for _, c := range []struct {
		name string
		r    rule
		at   []time.Duration
		want []bool
	}{
		{
			name: "starts full: the burst, then nothing at the same moment",
			r:    r10,
			at:   []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			want: []bool{true, true, true, true, true, true, true, true, true, true, false},
		},
		{
			name: "one token per 100 ms once empty",
			r:    rule{limit: 10, period: time.Second, burst: 1},
			at:   []time.Duration{0, 50 * ms, 100 * ms, 150 * ms, 199 * ms, 200 * ms, 300 * ms},
			want: []bool{true, false, true, false, false, true, true},
		},
		{
			name: "the level never exceeds the burst",
			r:    rule{limit: 10, period: time.Second, burst: 2},
			at:   []time.Duration{0, 10 * time.Second, 10 * time.Second, 10 * time.Second},
			want: []bool{true, true, true, false},
		},
		{
			name: "a period longer than a second",
			r:    rule{limit: 1, period: 10 * time.Second, burst: 1},
			at:   []time.Duration{0, 5 * time.Second, 10 * time.Second},
			want: []bool{true, false, true},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b exactBucket
			for i, at := range c.at {
				assert.Equal(t, c.want[i], b.take(c.r, at), "arrival %d at %v", i, at)
			}
		})
	}
}

func TestExactDecisionsPerKey(t *testing.T) {
	r := rule{limit: 1, period: time.Second, burst: 1}
	arr := []arrival{{at: 0, key: 0}, {at: 0, key: 1}, {at: ms, key: 0}, {at: 2 * ms, key: 2}, {at: time.Second, key: 0}}
	assert.Equal(t, []bool{true, true, false, true, true}, exactDecisions(arr, r))
}

// TestExactWithinBound feeds the exact bucket a dense schedule and checks
// that its admissions, scored like a system's, never exceed the bound.
func TestExactWithinBound(t *testing.T) {
	for _, name := range []string{"saturated", "few-users", "users-zipf"} {
		wl, ok := workloadNamed(name)
		require.True(t, ok)
		arr := arrivals(wl, 2*time.Second, maxArrivals)
		exact := exactDecisions(arr, wl.rule)
		ds := make([]decision, len(arr))
		for i, a := range arr {
			ds[i] = decision{start: a.at, end: a.at, allowed: exact[i]}
		}
		s := scoreRun(arr, exact, ds, wl.rule)
		assert.Zero(t, s.lost, name)
		assert.Zero(t, s.extra, name)
		assert.True(t, s.held(), "%s: worst %+v", name, s.worst)
	}
}

// naiveWorst is worstWindow by brute force over every window of the slot
// grid.
func naiveWorst(adm []span, r rule) float64 {
	last := int32(0)
	for _, a := range adm {
		last = max(last, a.s1)
	}
	minSlots := int32(minWindow / windowSlot)
	best := math.Inf(-1)
	for s := int32(0); s <= last; s++ {
		for e := s; e <= last; e++ {
			n := 0
			for _, a := range adm {
				if a.s0 >= s && a.s1 <= e {
					n++
				}
			}
			if n == 0 {
				continue
			}
			w := time.Duration(max(e-s+1, minSlots)) * windowSlot
			best = math.Max(best, float64(n)-r.bound(w))
		}
	}
	return best
}

func TestWorstWindow(t *testing.T) {
	r := rule{limit: 10, period: time.Second, burst: 10}
	repeat := func(n int, sp span) []span {
		out := make([]span, n)
		for i := range out {
			out[i] = sp
		}
		return out
	}
	steady := func(n int) []span { // one admission per slot
		out := make([]span, n)
		for i := range out {
			out[i] = span{int32(i), int32(i)}
		}
		return out
	}
	for _, c := range []struct {
		name     string
		r        rule
		adm      []span
		ok       bool
		admitted int64
		length   time.Duration
		excess   float64
	}{
		{name: "no admission", r: r},
		{name: "the burst at once holds", r: r, adm: repeat(10, span{0, 0}), ok: true, admitted: 10, length: minWindow, excess: -1},
		{name: "twice the burst at once", r: r, adm: repeat(20, span{3, 3}), ok: true, admitted: 20, length: minWindow, excess: 9},
		{
			name: "a decision spanning slots counts only in windows holding all of it",
			r:    r,
			adm:  append(repeat(15, span{0, 0}), repeat(5, span{5, 30})...),
			ok:   true, admitted: 20, length: 310 * ms, excess: 20 - 13.1,
		},
		{
			name: "the whole run is the worst window",
			r:    rule{limit: 50, period: time.Second, burst: 5},
			adm:  steady(200),
			ok:   true, admitted: 200, length: 2 * time.Second, excess: 200 - 105,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, ok := worstWindow(c.adm, c.r)
			require.Equal(t, c.ok, ok)
			if !ok {
				return
			}
			assert.Equal(t, c.admitted, w.admitted)
			assert.Equal(t, c.length, w.length)
			assert.InDelta(t, c.excess, w.excess(), 1e-9)
			assert.InDelta(t, naiveWorst(c.adm, c.r), w.excess(), 1e-9)
		})
	}
}

func TestWorstWindowMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 200 {
		r := rule{limit: int64(1 + rng.IntN(50)), period: time.Second, burst: int64(1 + rng.IntN(20))}
		adm := make([]span, rng.IntN(40))
		for j := range adm {
			s0 := int32(rng.IntN(60))
			adm[j] = span{s0, s0 + int32(rng.IntN(3)*rng.IntN(3))}
		}
		w, ok := worstWindow(adm, r)
		require.Equal(t, len(adm) > 0, ok)
		if ok {
			require.InDelta(t, naiveWorst(adm, r), w.excess(), 1e-9, "case %d: %v %v", i, r, adm)
		}
	}
}

func TestScoreRun(t *testing.T) {
	r := rule{limit: 1, period: time.Second, burst: 1}
	arr := []arrival{
		{at: 0, key: 0}, {at: 1100 * ms, key: 0}, {at: 2200 * ms, key: 0}, // exact: 3 of key 0
		{at: 0, key: 1}, {at: 1 * ms, key: 1}, // exact: 1 of key 1
		{at: 0, key: 2}, // exact: 1 of key 2, failed
	}
	exact := exactDecisions(arr, r)
	require.Equal(t, []bool{true, true, true, true, false, true}, exact)
	ds := []decision{
		{allowed: true, start: 0, end: ms},
		{allowed: false, start: 1100 * ms, end: 1101 * ms},
		{allowed: false, start: 2200 * ms, end: 2201 * ms},
		{allowed: true, start: 0, end: ms},
		{allowed: true, start: ms, end: 2 * ms},
		{failed: true},
	}
	s := scoreRun(arr, exact, ds, r)
	assert.Equal(t, 6, s.arrivals)
	assert.Equal(t, int64(5), s.exactAdmitted)
	assert.Equal(t, int64(3), s.admitted)
	assert.Equal(t, int64(1), s.failed)
	assert.Equal(t, int64(3), s.lost, "2 of key 0, 1 of key 2")
	assert.Equal(t, int64(1), s.extra, "1 of key 1")
	assert.InDelta(t, 60, s.lostPct(), 1e-9)
	assert.InDelta(t, 20, s.extraPct(), 1e-9)
	// Key 1 admitted 2 within 100 ms against a bound of 1 + 0.1.
	require.True(t, s.hasWorst)
	assert.Equal(t, int32(1), s.worst.key)
	assert.InDelta(t, 0.9, s.worst.excess(), 1e-9)
	assert.False(t, s.held())

	empty := scoreRun(nil, nil, nil, r)
	assert.True(t, empty.held())
	assert.Zero(t, empty.lostPct())
}

func TestQuantiles(t *testing.T) {
	vs := make([]time.Duration, 1000)
	for i := range vs {
		vs[len(vs)-1-i] = time.Duration(i + 1) // 1..1000, reversed
	}
	for _, c := range []struct {
		qs   []float64
		want []time.Duration
	}{
		{[]float64{0.5, 0.99, 0.999, 1}, []time.Duration{500, 990, 999, 1000}},
		{[]float64{0}, []time.Duration{1}},
	} {
		assert.Equal(t, c.want, quantiles(vs, c.qs...))
	}
	assert.Equal(t, []time.Duration{0, 0}, quantiles(nil, 0.5, 0.99))
	assert.Equal(t, time.Duration(1000), vs[0], "the input is not reordered")
}
