package compare

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/server"
)

func TestArrivals(t *testing.T) {
	const d = time.Second
	for _, wl := range workloads {
		if wl.capacity {
			continue
		}
		t.Run(wl.name, func(t *testing.T) {
			arr := arrivals(wl, d, maxArrivals)
			require.Equal(t, arr, arrivals(wl, d, maxArrivals), "the same seed gives the same schedule")

			// A Poisson count: within 5 standard deviations of rate·d.
			mean := wl.rate * d.Seconds()
			assert.InDelta(t, mean, float64(len(arr)), 5*math.Sqrt(mean))
			counts := make(map[int32]int)
			for i, a := range arr {
				require.GreaterOrEqual(t, a.at, time.Duration(0))
				require.Less(t, a.at, d)
				if i > 0 {
					require.GreaterOrEqual(t, a.at, arr[i-1].at, "arrivals in time order")
				}
				require.GreaterOrEqual(t, a.key, int32(0))
				require.Less(t, a.key, int32(wl.keys))
				require.Equal(t, uint16(i%wl.instances), a.inst, "round-robin over the instances")
				counts[a.key]++
			}
			switch wl.dist {
			case distOne:
				assert.Len(t, counts, 1)
			case distZipf:
				for k, n := range counts {
					assert.LessOrEqual(t, n, counts[0], "key 0 is the most asked, not key %d", k)
				}
				assert.Greater(t, counts[0], counts[1])
			case distUniform:
				// Each key gets about its share (loose: a few keys per
				// run for users-uniform).
				share := float64(len(arr)) / float64(wl.keys)
				for k, n := range counts {
					assert.Less(t, float64(n), share+10*math.Sqrt(share)+3, "key %d", k)
				}
			}
		})
	}
}

func TestArrivalsBounds(t *testing.T) {
	wl, ok := workloadNamed("few-users")
	require.True(t, ok)
	for _, c := range []struct {
		name  string
		d     time.Duration
		limit int
		want  int // -1: any
	}{
		{"count limit", time.Second, 10, 10},
		{"no time", 0, 100, 0},
		{"no count", time.Second, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Len(t, arrivals(wl, c.d, c.limit), c.want)
		})
	}
	capWl, ok := workloadNamed("hot-path")
	require.True(t, ok)
	assert.Empty(t, arrivals(capWl, time.Second, 100), "a capacity workload has no schedule")
}

// TestRulesYAML checks that rateleased's rules give every workload's keys
// the workload's rule, and deny every other key.
func TestRulesYAML(t *testing.T) {
	rules, err := server.ParseRules([]byte(rulesYAML()))
	require.NoError(t, err)
	p := rules.Policy()
	assert.Equal(t, leases.DefaultDeny, p.Default())
	for _, wl := range workloads {
		for _, tag := range []string{"a1", "c27"} {
			for _, id := range []int32{0, int32(wl.keys - 1)} {
				r, ok := p.Match(wl.key(tag, id))
				require.True(t, ok, wl.key(tag, id))
				assert.Equal(t, wl.name, r.Name)
				assert.Equal(t, wl.rule, rule{limit: r.Limits[0].Limit, period: r.Limits[0].Period, burst: r.Limits[0].Burst}, wl.name)
			}
		}
	}
	r, ok := p.Match("warm:sdk")
	require.True(t, ok)
	assert.Equal(t, "warm", r.Name)
	_, ok = p.Match("bench:nope:a1:0")
	assert.False(t, ok)
}

func TestRule(t *testing.T) {
	for _, c := range []struct {
		r     rule
		w     time.Duration
		bound float64
		str   string
	}{
		{rule{10, time.Second, 10}, time.Second, 20, "10/s, burst 10"},
		{rule{1000, time.Second, 100}, 100 * time.Millisecond, 200, "1,000/s, burst 100"},
		{rule{2, time.Second, 5}, 2500 * time.Millisecond, 10, "2/s, burst 5"},
		{hotRule, 10 * time.Second, 2e9, "1,000,000,000/10s, burst 1,000,000,000"},
	} {
		assert.InDelta(t, c.bound, c.r.bound(c.w), 1e-6, c.str)
		assert.Equal(t, c.str, c.r.String())
	}
}

func TestRunLength(t *testing.T) {
	for _, c := range []struct {
		benchtime string
		want      time.Duration
	}{
		{"1x", defaultRun},
		{"3x", defaultRun},
		{"3s", 3 * time.Second},
		{"100ms", minRun},
		{"5m", maxRun},
		{"junk", defaultRun},
	} {
		assert.Equal(t, c.want, runLengthOf(c.benchtime), c.benchtime)
	}
}

func TestSystemsRun(t *testing.T) {
	// (d) runs only where no limit binds; everything else everywhere.
	for _, wl := range workloads {
		for _, sys := range systems {
			want := sys.name != "d-x-time-rate" || wl.rule == hotRule
			assert.Equal(t, want, sys.runs(&wl), "%s on %s", sys.name, wl.name)
		}
	}
}

// TestRulesBind checks, with the exact bucket on one second of each
// schedule, which workloads' rules bind: all but the hot ones and
// users-uniform, whose users each ask too rarely for it.
func TestRulesBind(t *testing.T) {
	for _, wl := range workloads {
		if wl.capacity {
			continue
		}
		arr := arrivals(wl, time.Second, maxArrivals)
		denied := 0
		for _, ok := range exactDecisions(arr, wl.rule) {
			if !ok {
				denied++
			}
		}
		t.Logf("%s: the exact bucket denies %d of %d arrivals in 1 s", wl.name, denied, len(arr))
		binds := wl.rule != hotRule && wl.name != "users-uniform"
		if binds {
			assert.Greater(t, float64(denied), 0.01*float64(len(arr)), "%s: %d of %d denied", wl.name, denied, len(arr))
		} else {
			assert.Less(t, float64(denied), 0.01*float64(len(arr)), "%s: %d of %d denied", wl.name, denied, len(arr))
		}
	}
}
