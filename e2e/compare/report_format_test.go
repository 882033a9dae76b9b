package compare

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixedResults is a full matrix with made-up figures that meet every
// target.
func fixedResults() []result {
	var rs []result
	for _, wl := range workloads {
		for _, sys := range systems {
			if !sys.runs(&wl) {
				continue
			}
			r := result{
				Workload: wl.name, System: sys.name, Label: sys.label, Capacity: wl.capacity,
				Arrivals: 8000, Decisions: 8000, Elapsed: 4 * time.Second, Length: 4 * time.Second,
				PerSecond: 2000, LagP99: 900e3, LagMax: 2e6,
				ExactAdmitted: 6000, Admitted: 6000, LostPct: 0.5,
				WindowsChecked: !wl.capacity, Held: true, HasWorst: !wl.capacity,
				Worst:    window{key: 3, length: time.Second, admitted: 18, bound: 20},
				WorstKey: wl.key(sys.tag+"1", 3),
				P50:      200e3, P99: 700e3, P999: 2e6,
				Calls: 1, RedisCmds: 4, RedisNet: 3.99, RedisBackground: 6, ClientCPU: 20e3, ServerCPU: 15e3,
				UsesRedis: sys.usesRdb, UsesDaemon: sys.usesSrv,
			}
			switch sys.tag {
			case "a":
				r.P50, r.P99, r.P999 = 80, 300, 5e3
				r.Calls, r.RedisCmds, r.RedisNet = 0.0001, 0.004, 0.001
				r.LostPct = 1.2
				r.SDK = &sdkResult{ServerCalls: 12, BySource: map[string]int64{"lease": 7900, "retry_after": 100}}
			case "c":
				r.Calls, r.RedisCmds, r.RedisNet = 1, 7, 6.99
			case "d":
				r.Calls, r.RedisCmds, r.RedisNet, r.RedisBackground = 0, 0, 0, 0
			}
			if wl.capacity {
				r.Goroutines = 2
				switch sys.tag {
				case "a":
					r.PerSecond = 25e6
				case "b":
					r.PerSecond = 55e3
				case "c":
					r.PerSecond = 13e3
				case "d":
					r.PerSecond = 10e6
				}
			}
			rs = append(rs, r)
		}
	}
	return rs
}

func mutate(rs []result, workload, system string, f func(r *result)) {
	for i := range rs {
		if rs[i].Workload == workload && rs[i].System == system {
			f(&rs[i])
		}
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{fmtSI(27_348_364), "27.3 M"},
		{fmtSI(9_995_732), "10.0 M"},
		{fmtSI(999_700), "1.00 M"},
		{fmtSI(59_633), "59.6 k"},
		{fmtSI(950), "950"},
		{fmtSI(1e9), "1.00 G"},
		{fmtDecade(1e3), "1 k"},
		{fmtDecade(1e8), "100 M"},
		{fmtDecade(1), "1"},
		{fmtDecade(0.001), "0.001"},
		{fmtNs(0), "0 ns"},
		{fmtNs(0.0867), "0.087 ns"},
		{fmtNs(80), "80 ns"},
		{fmtNs(999.7), "1.00 µs"},
		{fmtNs(1752), "1.75 µs"},
		{fmtNs(246_784), "247 µs"},
		{fmtNs(4_816_896), "4.82 ms"},
		{fmtNs(2.5e9), "2.50 s"},
		{fmtPerDecision(0), "0"},
		{fmtPerDecision(0.0001169), "0.00012"},
		{fmtPerDecision(3.647), "3.6"},
		{fmtPerDecision(18), "18"},
		{fmtPerDecision(1000), "1,000"},
		{fmtPerDecision(4), "4.0"},
		{fmtNum(4000), "4,000"},
		{fmtNum(0.2), "0.2"},
		{fmtNum(0.03), "0.03"},
		{fmtNum(2.5), "2.5"},
		{fmtPct(0), "0%"},
		{fmtPct(0.0421), "0.042%"},
		{fmtPct(3.14), "3.1%"},
		{fmtPct(50.2), "50%"},
		{fmtSigned(17), "+17"},
		{fmtSigned(16.2), "+16"},
		{fmtSigned(0.9), "+0.9"},
		{fmtSigned(-0.1), "-0.1"},
		{fmtSigned(-2), "-2.0"},
		{fmtSigned(-28.4), "-28"},
		{fmtSigned(-1e9), "-1.00 G"},
		{fmtFactor(0.001), "0.001×"},
		{fmtFactor(1), "1×"},
		{fmtRatio(459.2), "459×"},
		{fmtRatio(0.188), "0.19×"},
		{fmtInt(1234567), "1,234,567"},
		{fmtInt(-1234), "-1,234"},
	} {
		assert.Equal(t, c.want, c.got)
	}
}

func TestHistQuantiles(t *testing.T) {
	// Buckets are contiguous and each value falls in its own bucket.
	for v := uint64(0); v < 1<<20; v += 1 + v/1000 {
		i := bucketOf(v)
		low, width := bucketRange(i)
		require.True(t, v >= low && v < low+width, "value %d in bucket %d = [%d, %d)", v, i, low, low+width)
		if width > 1 {
			require.LessOrEqual(t, float64(width)/float64(low), 1.0/subCount+1e-9, "bucket %d too coarse", i)
		}
	}
	var h hist
	for v := int64(1); v <= 1000; v++ {
		h.record(v)
	}
	h.record(-5) // a clock step back counts as 0
	var o hist
	for range 10 {
		o.record(1_000_000)
	}
	h.merge(&o)
	assert.Equal(t, uint64(1011), h.n)
	assert.InEpsilon(t, 505, h.quantile(0.50), 0.01)
	assert.InEpsilon(t, 1e6, h.quantile(0.999), 0.01)
	var empty hist
	assert.Zero(t, empty.quantile(0.99))
}

func TestTargets(t *testing.T) {
	rs := fixedResults()
	ts := evalTargets(rs)
	// Per open-loop workload: lost, window, fallback, Redis; p99 on four;
	// hot-path adds decisions/s.
	want := 0
	for _, wl := range workloads {
		want += 4
		if contains(p99VsB, wl.name) || contains(p99Leased, wl.name) {
			want++
		}
		if wl.capacity {
			want++
		}
	}
	require.Len(t, ts, want)
	for _, tg := range ts {
		assert.True(t, tg.Pass, "%s (%s): %s should pass", tg.Name, tg.Workload, tg.Got)
	}

	for _, c := range []struct {
		name     string
		workload string
		system   string
		f        func(r *result)
		failing  string // the one target that fails
	}{
		{"lost beyond (b) + 1 point", "users-zipf", "a-lease-sdk", func(r *result) { r.LostPct = 50 }, "(a) admissions lost at most (b)'s + 1 point"},
		{"a window over the bound", "saturated", "a-lease-sdk", func(r *result) { r.Held = false; r.Worst.admitted = 37 }, "(a) bound held in every window"},
		{"fallback decisions", "few-users", "a-lease-sdk", func(r *result) { r.SDK = &sdkResult{FallbackDecisions: 3} }, "(a) no fallback decision (servers healthy)"},
		{"more Redis work than (b)", "users-uniform", "a-lease-sdk", func(r *result) { r.RedisCmds, r.RedisNet = 18, 17 }, "(a) Redis commands per decision, net of background, at most 1× (b)'s"},
		{"more than 0.3× (b)'s Redis work", "saturated", "a-lease-sdk", func(r *result) { r.RedisCmds, r.RedisNet = 1.3, 1.3 }, "(a) Redis commands per decision, net of background, at most 0.3× (b)'s"},
		{"more than 0.001× (b)'s net Redis work", "hot", "a-lease-sdk", func(r *result) { r.RedisNet = 0.0045 }, "(a) Redis commands per decision, net of background, at most 0.001× (b)'s"},
		{"a slower p99 than (b)", "users-zipf", "a-lease-sdk", func(r *result) { r.P99 = 71e6 }, "(a) p99 decision latency at most (b)'s"},
		{"over 1 µs on the leased key", "hot", "a-lease-sdk", func(r *result) { r.P99 = 1001 }, "(a) p99 decision latency on a leased key at most 1 µs"},
		{"under 100× (b)'s capacity", "hot-path", "a-lease-sdk", func(r *result) { r.PerSecond = 5e6 }, "(a) decisions/s at least 100× (b)'s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := fixedResults()
			mutate(rs, c.workload, c.system, c.f)
			var fails []string
			for _, tg := range evalTargets(rs) {
				if !tg.Pass {
					fails = append(fails, tg.Workload+": "+tg.Name)
				}
			}
			assert.Equal(t, []string{c.workload + ": " + c.failing}, fails)
		})
	}

	// The Redis targets are on the net figures: a gross above the target
	// with a net below it passes.
	rs = fixedResults()
	mutate(rs, "hot", "a-lease-sdk", func(r *result) { r.RedisCmds, r.RedisNet = 0.017, 0.0029 })
	for _, tg := range evalTargets(rs) {
		assert.True(t, tg.Pass, "%s (%s): %s should pass", tg.Name, tg.Workload, tg.Got)
	}
}

func TestWorkloadTable(t *testing.T) {
	rs := fixedResults()
	mutate(rs, "users-zipf", "a-lease-sdk", func(r *result) {
		r.Held, r.Worst = false, window{key: 0, length: time.Second, admitted: 37, bound: 20}
		r.Failed = 12
	})
	tbl := workloadTable(resultsOf(rs, "users-zipf"))
	for _, want := range []string{
		"| a-lease-sdk | 2.00 k | 900 µs | 6,000 (12 failed) | 1.2% | 0% | +17 (37 over 1.00 s, key 3) | ❌ | 80 ns | 300 ns | 5.00 µs | 0.00010 | 0.0040, 0.0010 |",
		"| b-redis-rate | 2.00 k | 900 µs | 6,000 | 0.50% | 0% | -2.0 (18 over 1.00 s, key 3) | ✅ | 200 µs | 700 µs | 2.00 ms | 1.0 | 4.0, 4.0 |",
	} {
		assert.Contains(t, tbl, want)
	}
	assert.Empty(t, paceText(resultsOf(rs, "users-zipf")))
	mutate(rs, "few-users", "c-http-check", func(r *result) { r.LagP99, r.LagMax = 2.05e9, 3e9 })
	tbl = workloadTable(resultsOf(rs, "few-users"))
	assert.Contains(t, tbl, "| c-http-check | 2.00 k | 2.05 s ⚠ |")
	assert.Equal(t, "c-http-check did not keep pace on this machine: its decisions began up to 2.05 s after their arrival (p99; at most 3.00 s), so its figures are not on the schedule's arrival times and compare with the others only roughly.\n",
		paceText(resultsOf(rs, "few-users")))

	tbl = workloadTable(resultsOf(rs, "hot-path"))
	assert.Contains(t, tbl, "| a-lease-sdk | 25.0 M | 455× | 2 |")
	assert.Contains(t, tbl, "| d-x-time-rate | 10.0 M | 182× | 2 | 0.50% |")
	assert.Contains(t, tbl, "| — | 20.0 µs, — |", "(d) uses no server")
}

func TestRedisByText(t *testing.T) {
	rs := []result{
		{System: "a-lease-sdk", UsesRedis: true, RedisByCmd: map[string]float64{"evalsha": 0.2, "hget": 1.4, "time": 0.2, "c1": 0.1, "c2": 0.1, "c3": 0.1, "c4": 0.05, "c5": 0.05}},
		{System: "b-redis-rate", UsesRedis: true, RedisByCmd: map[string]float64{"evalsha": 1, "get": 1, "time": 1, "set": 0.34}},
		{System: "d-x-time-rate"},
	}
	assert.Equal(t, "Redis commands per decision, by command: a: `hget` 1.4, `evalsha` 0.20, `time` 0.20, `c1` 0.10, `c2` 0.10, `c3` 0.10, 2 more 0.10; b: `evalsha` 1.0, `get` 1.0, `time` 1.0, `set` 0.34.\n", redisByText(rs))
	assert.Empty(t, redisByText(rs[2:]))
}

// TestNetRedis: the net figure is the gross less the fleet view's
// commands counted over the run and the rest of the idle background at its
// rate over the time between the snapshots, never below zero; the report
// says what was subtracted.
func TestNetRedis(t *testing.T) {
	at := time.Unix(1000, 0)
	for _, c := range []struct {
		name            string
		gross, peer     int64
		bg              background
		wantGross, want float64
		wantRate        float64
	}{
		{"background subtracted", 300, 0, background{cmds: 12, length: 2 * time.Second}, 0.03, 0.0276, 6},
		{"the fleet view counted, the rest at its idle rate", 300, 10, background{cmds: 12, peer: 8, length: 2 * time.Second}, 0.03, 0.0282, 2},
		{"the fleet view alone", 300, 10, background{cmds: 8, peer: 8, length: 2 * time.Second}, 0.03, 0.029, 0},
		{"no background measured", 300, 0, background{}, 0.03, 0.03, 0},
		{"more fleet view counted than idle commands: no other background", 300, 10, background{cmds: 4, peer: 8, length: 2 * time.Second}, 0.03, 0.029, 0},
		{"never below zero", 10, 0, background{cmds: 12, length: 2 * time.Second}, 0.001, 0, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r result
			before := snap{at: at, redisCmds: 1000, peerCmds: 50}
			after := snap{at: at.Add(4 * time.Second), redisCmds: 1000 + c.gross, peerCmds: 50 + c.peer}
			r.setCosts(before, after, c.bg, 10, 10_000)
			assert.InDelta(t, c.wantGross, r.RedisCmds, 1e-12)
			assert.InDelta(t, c.want, r.RedisNet, 1e-12)
			assert.InDelta(t, c.wantRate, r.RedisBackground, 1e-12)
			assert.InDelta(t, float64(c.peer)/10_000, r.RedisPeer, 1e-12)
		})
	}
	rs := []result{
		{System: "a-lease-sdk", UsesRedis: true, Decisions: 10_000, RedisCmds: 0.03, RedisNet: 0.0276, RedisBackground: 0.5, RedisPeer: 0.0022},
		{System: "d-x-time-rate"},
	}
	assert.Equal(t, "Background subtracted for the net figures: the `rateleased` processes' fleet view during the run (heartbeats and status snapshots, as they count them), plus the rest of the idle background (Redis commands per second with no system running, before each run): a 0.0022 per decision counted + 0.5/s idle (0.0024 per decision in all).\n", backgroundText(rs))
	assert.Empty(t, backgroundText(rs[1:]))
	assert.Equal(t, "0.030, 0.028", redisText(rs[0]))
	assert.Equal(t, "—", redisText(rs[1]))
}

// TestSnapExclude: a measurement of the harness's own moves every counter
// of a run's start forward by what it did, the fleet view's count too, so
// that a heartbeat inside it leaves the gross and the count alike; one
// that sends Redis nothing (drain's reads of /metrics) moves the CPU only,
// and the servers' Redis work meanwhile stays the run's.
func TestSnapExclude(t *testing.T) {
	start := snap{cpu: 10, daemonCPU: 20, redisCPU: 30, redisCmds: 100, peerCmds: 5, redisBy: map[string]int64{"get": 60, "zadd": 40}}
	x := snap{cpu: 50, daemonCPU: 60, redisCPU: 70, redisCmds: 500, peerCmds: 9, redisBy: map[string]int64{"get": 300, "zadd": 200}}
	y := snap{cpu: 55, daemonCPU: 62, redisCPU: 71, redisCmds: 510, peerCmds: 10, redisBy: map[string]int64{"get": 308, "zadd": 202}}

	s := start
	s.exclude(x, y)
	assert.Equal(t, time.Duration(15), s.cpu)
	assert.Equal(t, time.Duration(22), s.daemonCPU)
	assert.Equal(t, time.Duration(31), s.redisCPU)
	assert.Equal(t, int64(110), s.redisCmds)
	assert.Equal(t, int64(6), s.peerCmds, "the heartbeat inside the window leaves the count with the gross")
	assert.Equal(t, map[string]int64{"get": 68, "zadd": 42}, s.redisBy)
	assert.Equal(t, int64(60), start.redisBy["get"], "the start's map is not changed")

	s = start
	s.excludeCPU(x, y)
	assert.Equal(t, time.Duration(15), s.cpu)
	assert.Equal(t, time.Duration(22), s.daemonCPU)
	assert.Equal(t, time.Duration(30), s.redisCPU, "Redis's work in the window is the run's")
	assert.Equal(t, int64(100), s.redisCmds)
	assert.Equal(t, int64(5), s.peerCmds)
}

func TestMarkdown(t *testing.T) {
	d := reportData{
		Results:  fixedResults(),
		Machine:  machine{CPU: "Test CPU", Cores: 2, GOMAXPROCS: 2, Go: "go1.26", Redis: "7.0.15", OS: "linux/amd64"},
		Command:  command(),
		Date:     time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
		Run:      4 * time.Second,
		Took:     150 * time.Second,
		FloorP50: 30, FloorP99: 31,
	}
	md := renderMarkdown(d)
	for _, want := range []string{
		"Test CPU, 2 cores",
		"redis-server: 7.0.15",
		"2026-01-02 03:04 UTC",
		"RATELEASE_BENCH_REPORT=$PWD go test -run '^$' -bench Compare",
		"](docs/benchmarks.svg)",
		"took 2m30s",
		"1 key, 4,000 requests/s, Poisson arrivals, round-robin over 2 instances",
		"2,000 requests/s (0.02 per key on average)",
		"### users-zipf",
		"10,000 keys, Zipf demand (s = 1.1",
		"rule 10/s, burst 10",
		"8,000 arrivals in 4.00 s; the exact bucket admits 6,000 of them (75%).",
		"(a) decisions by source (`Decision.Source`): lease 7,900 (99%), retry_after 100 (1.2%).",
		"| (a) admissions lost at most (b)'s + 1 point | users-zipf | ≤ 0.50% + 1 | 1.2% | ✅ pass |",
		"| (a) decisions/s at least 100× (b)'s | hot-path | ≥ 100× | 455× | ✅ pass |",
		"| (a) Redis commands per decision, net of background, at most 0.001× (b)'s | hot | ≤ 0.0040 | 0.0010 net (0.0040 gross) | ✅ pass |",
		"Background subtracted for the net figures: the `rateleased` processes' fleet view during the run",
		"Net of background: the gross less the `rateleased` processes' fleet view over the run",
		"targets met.",
		"timing no work at all gives p50 30 ns, p99 31 ns",
		"For scale: (d), a decision in this process with no network at all, took p50 200 µs, p99 700 µs, p99.9 2.00 ms on the same arrivals, and (a) p50 80 ns, p99 300 ns, p99.9 5.00 µs.",
	} {
		assert.Contains(t, md, want)
	}
	checkTables(t, md)
}

// checkTables checks that each Markdown table's rows have the header's
// number of cells.
func checkTables(t *testing.T, md string) {
	t.Helper()
	cols := 0
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(line, "|") - 1
		if cols == 0 {
			cols = n
		} else {
			assert.Equal(t, cols, n, "row: %s", line)
		}
	}
}

func TestSVG(t *testing.T) {
	rs := fixedResults()
	mutate(rs, "users-zipf", "a-lease-sdk", func(r *result) { r.LostPct, r.P99 = 50, 71e6 })
	mutate(rs, "few-users", "b-redis-rate", func(r *result) { r.LostPct = 0 })
	svg := renderSVG(rs, "Test CPU, 2 cores & <more>")
	// Well-formed XML, one bar per panel and chart result, taller bars for
	// larger values within a panel.
	dec := xml.NewDecoder(bytes.NewReader(svg))
	type bar struct {
		panel         string
		value, height float64
	}
	var bars []bar
	texts := map[string]bool{}
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "SVG is not well-formed XML:\n%s", svg)
		switch tok := tok.(type) {
		case xml.StartElement:
			inText = tok.Name.Local == "text"
			attrs := map[string]string{}
			for _, a := range tok.Attr {
				attrs[a.Name.Local] = a.Value
			}
			if tok.Name.Local != "rect" || attrs["class"] != "bar" {
				continue
			}
			v, err1 := strconv.ParseFloat(attrs["data-value"], 64)
			h, err2 := strconv.ParseFloat(attrs["height"], 64)
			require.NoError(t, err1)
			require.NoError(t, err2)
			require.Positive(t, h, "even a zero shows as a hairline")
			bars = append(bars, bar{attrs["data-panel"], v, h})
		case xml.CharData:
			if inText {
				texts[string(tok)] = true
			}
		case xml.EndElement:
			inText = false
		}
	}
	shown, wls, syss := chartResults(rs)
	assert.Equal(t, []string{"hot", "saturated", "users-zipf", "users-uniform", "few-users"}, wls)
	assert.Equal(t, []string{"a-lease-sdk", "b-redis-rate", "c-http-check"}, syss)
	require.Len(t, bars, len(panels)*len(shown))
	for _, x := range bars {
		for _, y := range bars {
			if x.panel == y.panel && x.value > y.value && x.value > 0 && y.value > 0 {
				assert.Greater(t, x.height, y.height, "bar %v is not taller than %v", x, y)
			}
		}
	}
	for _, want := range []string{"50%", "71.0 ms", "0.0010", "users-zipf", "(a) ratelease SDK", "Test CPU, 2 cores & <more>",
		"hot-path, closed loop on one key: (a) makes 25.0 M decisions/s, (b) 55.0 k: 455×."} {
		assert.True(t, texts[want], "SVG has no text %q", want)
	}
}

func TestNiceCeil(t *testing.T) {
	for _, c := range []struct{ v, want float64 }{
		{1, 1}, {1.1, 2}, {2.2, 2.5}, {3, 4}, {4.5, 5}, {7, 8}, {9, 10}, {57.5, 60}, {0.03, 0.04},
	} {
		assert.InDelta(t, c.want, niceCeil(c.v), c.want*1e-9, "%v", c.v)
	}
	assert.False(t, math.IsNaN(niceCeil(1e-9)))
}
