package compare

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/ratelease/ratelease/server"
)

// reportEnv names the directory (the repository root) where TestMain
// writes BENCHMARKS.md and docs/benchmarks.svg after BenchmarkCompare ran.
const reportEnv = "RATELEASE_BENCH_REPORT"

const (
	reportFile = "BENCHMARKS.md"
	chartFile  = "docs/benchmarks.svg"
)

// result is the last run of one system on one workload. Latencies and CPU
// times are nanoseconds.
type result struct {
	Workload, System, Label string
	Capacity                bool // a hot-path (closed-loop) run
	Arrivals                int  // open loop: the schedule's arrivals
	Decisions               int
	Goroutines              int           // capacity runs
	Workers                 int           // open loop: the most decisions in flight at once
	Elapsed                 time.Duration // open loop: to the end of the last decision
	Length                  time.Duration // the run's scheduled length
	PerSecond               float64       // decisions per second
	LagP99, LagMax          float64       // open loop: pacer lag
	ExactAdmitted, Admitted int64
	Failed                  int64 // errors and cut-off decisions: not admitted
	Lost, Extra             int64
	LostPct, ExtraPct       float64 // of ExactAdmitted
	WindowsChecked          bool    // every window of every key checked (open loop)
	Held                    bool    // the bound held in every window
	HasWorst                bool
	Worst                   window
	WorstKey                string
	P50, P99, P999          float64
	Samples                 uint64 // capacity runs: decisions timed
	SampleEvery             int    // capacity runs: 1 in SampleEvery timed
	Calls                   float64
	RedisCmds               float64            // per decision, gross: every command Redis counted during the run
	RedisNet                float64            // per decision, net: RedisCmds less the background over the run (see background)
	RedisBackground         float64            // commands per second Redis counted while idle, before the run, the fleet view's excluded
	RedisPeer               float64            // per decision: the rateleased processes' fleet view's commands during the run
	RedisByCmd              map[string]float64 // per decision, by command
	ClientCPU, ServerCPU    float64            // per decision
	RedisCPU, DaemonCPU     float64            // per decision, each server whether used or not
	OtherCores              float64            // cores busy with other processes (and stolen) during the run
	UsesRedis, UsesDaemon   bool
	SDK                     *sdkResult
}

// sdkResult is what the SDK's instances counted (client.Stats, summed)
// and its decisions by client.Source.
type sdkResult struct {
	ServerCalls, ServerErrors, FallbackDecisions int64
	MaxKeysHeld                                  int
	BySource                                     map[string]int64
	// TokensHeld is what the instances held in their leases, unspent,
	// when the replay ended (open-loop runs: HeldKnown): tokens the
	// servers counted as taken that only decisions after the run would
	// have spent.
	TokensHeld int64
	HeldKnown  bool
	// Debt is what the keys' buckets owed the refill then (their negative
	// levels: tokens deferred grants took ahead of it), read from a
	// rateleased when the workload has at most maxDebtKeys keys
	// (DebtKnown). TokensHeld less Debt is what the servers had granted
	// out of the refill so far and the instances had not spent.
	Debt      float64
	DebtKnown bool
}

// collected holds what the benchmarks measured, for TestMain.
var collected struct {
	sync.Mutex
	results            map[string]result // "workload/system"; the last run wins
	redisVersion       string
	floorP50, floorP99 float64
	run                time.Duration
	memory             storetest.BucketMemory
	algorithms         []algoResult
}

func record(r result) {
	collected.Lock()
	defer collected.Unlock()
	if collected.results == nil {
		collected.results = make(map[string]result)
	}
	collected.results[r.Workload+"/"+r.System] = r
}

func setRedisVersion(v string) {
	collected.Lock()
	defer collected.Unlock()
	collected.redisVersion = v
}

func setTimerFloor(p50, p99 float64) {
	collected.Lock()
	defer collected.Unlock()
	collected.floorP50, collected.floorP99 = p50, p99
}

func setMemory(m storetest.BucketMemory) {
	collected.Lock()
	defer collected.Unlock()
	collected.memory = m
}

func setAlgorithms(rs []algoResult) {
	collected.Lock()
	defer collected.Unlock()
	collected.algorithms = rs
}

func setRun(d time.Duration) {
	collected.Lock()
	defer collected.Unlock()
	collected.run = d
}

// TestMain runs the tests and benchmarks, then, if RATELEASE_BENCH_REPORT
// is set and BenchmarkCompare ran, prints the tables and, if it ran every
// workload and system, writes the report there.
func TestMain(m *testing.M) {
	code := m.Run()
	dir := os.Getenv(reportEnv)
	collected.Lock()
	n := len(collected.results)
	collected.Unlock()
	if dir != "" && code == 0 && n > 0 {
		if err := writeReport(dir); err != nil {
			fmt.Fprintf(os.Stderr, "compare: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// reportData is everything the report shows.
type reportData struct {
	Results            []result // workloads in order, each system in order
	Machine            machine
	Command            string
	Date               time.Time
	Run                time.Duration // each run's length
	Took               time.Duration // the whole benchmark
	FloorP50, FloorP99 float64
	Memory             storetest.BucketMemory
	Algorithms         []algoResult
}

type machine struct {
	CPU        string
	Cores      int
	GOMAXPROCS int
	Memory     string
	Go         string
	Redis      string
	OS         string
}

func (m machine) summary() string {
	return fmt.Sprintf("%s, %d cores, %s, redis-server %s", m.CPU, m.Cores, m.Go, m.Redis)
}

// processStart is when the test binary started: the report says how long
// the whole run took.
var processStart = time.Now()

func writeReport(dir string) error {
	collected.Lock()
	d := reportData{
		Machine:    currentMachine(collected.redisVersion),
		Command:    command(),
		Date:       time.Now().UTC(),
		Run:        collected.run,
		Took:       time.Since(processStart),
		FloorP50:   collected.floorP50,
		FloorP99:   collected.floorP99,
		Memory:     collected.memory,
		Algorithms: collected.algorithms,
	}
	var missing []string
	for _, wl := range workloads {
		for _, sys := range systems {
			if !sys.runs(&wl) {
				continue
			}
			r, ok := collected.results[wl.name+"/"+sys.name]
			if !ok {
				missing = append(missing, wl.name+"/"+sys.name)
				continue
			}
			d.Results = append(d.Results, r)
		}
	}
	collected.Unlock()

	for _, wl := range workloads {
		if rs := resultsOf(d.Results, wl.name); len(rs) > 0 {
			fmt.Printf("\n%s\n%s%s%s%s", wl.name, workloadTable(rs), paceText(rs), redisByText(rs), backgroundText(rs))
			for _, r := range rs {
				if t := sdkText(r); t != "" {
					fmt.Println(t)
				}
			}
		}
	}
	fmt.Println()
	for _, t := range evalTargets(d.Results) {
		fmt.Printf("target %-62s %-14s %-30s %s\n", t.Name, t.Workload, t.Got, t.verdict())
	}
	if len(missing) > 0 {
		fmt.Printf("\n%s not written: no result for %s (run every sub-benchmark of BenchmarkCompare)\n",
			reportFile, strings.Join(missing, ", "))
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(chartFile)), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, chartFile), renderSVG(d.Results, d.Machine.summary()+", "+d.Date.Format("2006-01-02")), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, reportFile), []byte(renderMarkdown(d)), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %s\n", filepath.Join(dir, reportFile), filepath.Join(dir, chartFile))
	return nil
}

// command is the command line that reproduces the run, from the flags the
// test binary got.
func command() string {
	args := []string{"go test -run '^$' -bench Compare"}
	if f := flag.Lookup("test.benchtime"); f != nil && f.Value.String() != f.DefValue {
		args = append(args, "-benchtime "+f.Value.String())
	}
	if f := flag.Lookup("test.count"); f != nil && f.Value.String() != f.DefValue {
		args = append(args, "-count "+f.Value.String())
	}
	if f := flag.Lookup("test.cpu"); f != nil && f.Value.String() != "" {
		args = append(args, "-cpu "+f.Value.String())
	}
	if f := flag.Lookup("test.timeout"); f != nil && f.Value.String() != f.DefValue {
		args = append(args, "-timeout "+f.Value.String())
	}
	return reportEnv + "=$PWD " + strings.Join(args, " ") + " ./e2e/compare/"
}

func currentMachine(redisVersion string) machine {
	m := machine{
		CPU:        "unknown CPU",
		Cores:      runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go:         runtime.Version(),
		Redis:      redisVersion,
		OS:         runtime.GOOS + "/" + runtime.GOARCH,
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64); err == nil {
					m.Memory = fmt.Sprintf("%.0f GiB", kb/(1<<20))
				}
			}
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`) + ", " + m.OS
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.OS += ", Linux " + strings.TrimSpace(string(b))
	}
	return m
}

// ---------------------------------------------------------------------------
// Targets

type target struct {
	Name, Workload, Want, Got string
	Pass                      bool
}

func (t target) verdict() string {
	if t.Pass {
		return "✅ pass"
	}
	return "❌ FAIL"
}

// The targets of issue 8 for (a) against (b), per workload.
var (
	// redisFactor: (a)'s Redis commands per decision at most this times
	// (b)'s.
	redisFactor = map[string]float64{
		"hot": 0.001, "hot-path": 0.001, "saturated": 0.3, "few-users": 0.3,
		"users-zipf": 1, "users-uniform": 1,
	}
	// p99VsB: (a)'s p99 at most (b)'s.
	p99VsB = []string{"users-zipf", "users-uniform"}
	// p99Leased: (a)'s p99 at most p99LeasedMax, the key being leased.
	p99Leased    = []string{"hot", "hot-path"}
	p99LeasedMax = float64(time.Microsecond)
	// capacityFactor: on hot-path, (a) makes at least this many times
	// (b)'s decisions per second.
	capacityFactor = 100.0
	// lostSlack: (a) loses at most (b)'s share plus this many points.
	lostSlack = 1.0
)

// evalTargets checks the targets on (a) against (b), per workload, in
// workload order.
func evalTargets(rs []result) []target {
	var out []target
	for _, wl := range workloads {
		a, okA := find(rs, "a-", wl.name)
		b, okB := find(rs, "b-", wl.name)
		if !okA {
			continue
		}
		if okB {
			out = append(out, target{
				Name: "(a) admissions lost at most (b)'s + 1 point", Workload: wl.name,
				Want: fmt.Sprintf("≤ %s + %.0f", fmtPct(b.LostPct), lostSlack),
				Got:  fmtPct(a.LostPct), Pass: a.LostPct <= b.LostPct+lostSlack,
			})
		}
		out = append(out, target{
			Name: "(a) bound held in every window", Workload: wl.name,
			Want: "excess ≤ 0", Got: heldText(a), Pass: a.Held,
		})
		if a.SDK != nil {
			out = append(out, target{
				Name: "(a) no fallback decision (servers healthy)", Workload: wl.name,
				Want: "0", Got: fmtInt(a.SDK.FallbackDecisions), Pass: a.SDK.FallbackDecisions == 0,
			})
		}
		if f, ok := redisFactor[wl.name]; ok && okB {
			// On the net figures: the rateleased processes' periodic work
			// is no decision's cost, and on a hot key it would be most of
			// what is left. The gross stays in the tables and here.
			out = append(out, target{
				Name: "(a) Redis commands per decision, net of background, at most " + fmtFactor(f) + " (b)'s", Workload: wl.name,
				Want: "≤ " + fmtPerDecision(f*b.RedisNet),
				Got:  fmtPerDecision(a.RedisNet) + " net (" + fmtPerDecision(a.RedisCmds) + " gross)",
				Pass: a.RedisNet <= f*b.RedisNet,
			})
		}
		if slices.Contains(p99VsB, wl.name) && okB {
			out = append(out, target{
				Name: "(a) p99 decision latency at most (b)'s", Workload: wl.name,
				Want: "≤ " + fmtNs(b.P99), Got: fmtNs(a.P99), Pass: a.P99 <= b.P99,
			})
		}
		if slices.Contains(p99Leased, wl.name) {
			out = append(out, target{
				Name: "(a) p99 decision latency on a leased key at most 1 µs", Workload: wl.name,
				Want: "≤ " + fmtNs(p99LeasedMax), Got: fmtNs(a.P99), Pass: a.P99 <= p99LeasedMax,
			})
		}
		if wl.capacity && okB && b.PerSecond > 0 {
			ratio := a.PerSecond / b.PerSecond
			out = append(out, target{
				Name: fmt.Sprintf("(a) decisions/s at least %.0f× (b)'s", capacityFactor), Workload: wl.name,
				Want: fmt.Sprintf("≥ %.0f×", capacityFactor), Got: fmtRatio(ratio), Pass: ratio >= capacityFactor,
			})
		}
	}
	return out
}

func heldText(r result) string {
	if !r.WindowsChecked {
		if r.Held {
			return "held (by count)"
		}
		return "unknown"
	}
	if !r.HasWorst {
		return "held (no admission)"
	}
	key := r.WorstKey
	if i := strings.LastIndexByte(key, ':'); i >= 0 {
		key = key[i+1:]
	}
	return fmt.Sprintf("%s (%s over %s, key %s)", fmtSigned(r.Worst.excess()), fmtCount(float64(r.Worst.admitted)), fmtDur(r.Worst.length), key)
}

func find(rs []result, prefix, workload string) (result, bool) {
	for _, r := range rs {
		if strings.HasPrefix(r.System, prefix) && r.Workload == workload {
			return r, true
		}
	}
	return result{}, false
}

func resultsOf(rs []result, workload string) []result {
	var out []result
	for _, r := range rs {
		if r.Workload == workload {
			out = append(out, r)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Markdown

// workloadTable is one workload's results, a row per system.
func workloadTable(rs []result) string {
	var s strings.Builder
	if len(rs) > 0 && rs[0].Capacity {
		s.WriteString("| system | decisions/s | vs (b) | goroutines | denied | p50 | p99 | p99.9 | calls / decision | Redis cmds / decision: gross, net of background | CPU / decision: client, servers | other load (cores) |\n")
		s.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rs {
			vs := "—"
			if b, ok := find(rs, "b-", r.Workload); ok && b.PerSecond > 0 {
				vs = fmtRatio(r.PerSecond / b.PerSecond)
			}
			fmt.Fprintf(&s, "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %.2f |\n",
				r.System, fmtSI(r.PerSecond), vs, r.Goroutines, fmtPct(r.LostPct),
				fmtNs(r.P50), fmtNs(r.P99), fmtNs(r.P999), fmtPerDecision(r.Calls), redisText(r), cpuText(r), r.OtherCores)
		}
		return s.String()
	}
	s.WriteString("| system | decisions/s | pacer lag p99 | admitted | lost | extra | worst window: excess (admitted over length, key) | bound held | p50 | p99 | p99.9 | calls / decision | Redis cmds / decision: gross, net of background | CPU / decision: client, servers | other load (cores) |\n")
	s.WriteString("|---|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		admitted := fmtInt(r.Admitted)
		if r.Failed > 0 {
			admitted += fmt.Sprintf(" (%s failed)", fmtInt(r.Failed))
		}
		held := "✅"
		if !r.Held {
			held = "❌"
		}
		lag := fmtNs(r.LagP99)
		if !r.keptPace() {
			lag += " ⚠"
		}
		fmt.Fprintf(&s, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f |\n",
			r.System, fmtSI(r.PerSecond), lag, admitted,
			fmtPct(r.LostPct), fmtPct(r.ExtraPct), heldText(r), held,
			fmtNs(r.P50), fmtNs(r.P99), fmtNs(r.P999), fmtPerDecision(r.Calls), redisText(r), cpuText(r), r.OtherCores)
	}
	return s.String()
}

// paceLag is the pacer lag, at p99, above which a system did not keep
// pace with the schedule: its decisions are then no longer on the
// arrival times the exact bucket was fed.
const paceLag = 50 * time.Millisecond

// keptPace reports whether the system kept pace with the schedule.
func (r result) keptPace() bool {
	return r.Capacity || r.LagP99 <= float64(paceLag)
}

// paceText explains, under a workload's table, which systems did not keep
// pace.
func paceText(rs []result) string {
	var s strings.Builder
	for _, r := range rs {
		if r.keptPace() {
			continue
		}
		fmt.Fprintf(&s, "%s did not keep pace on this machine: its decisions began up to %s after their arrival (p99; at most %s), so its figures are not on the schedule's arrival times and compare with the others only roughly.\n",
			r.System, fmtNs(r.LagP99), fmtNs(r.LagMax))
	}
	return s.String()
}

// localText compares, on an open-loop workload where (d) ran, (a)'s
// latency with that of a purely local decision on the same arrivals.
func localText(rs []result) string {
	var a, d result
	var okA, okD bool
	for _, r := range rs {
		if strings.HasPrefix(r.System, "a-") {
			a, okA = r, true
		}
		if strings.HasPrefix(r.System, "d-") {
			d, okD = r, true
		}
	}
	if !okA || !okD || a.Capacity {
		return ""
	}
	return fmt.Sprintf("For scale: (d), a decision in this process with no network at all, took p50 %s, p99 %s, p99.9 %s on the same arrivals, and (a) p50 %s, p99 %s, p99.9 %s. "+
		"Decisions made one by one as requests arrive run on a goroutine just woken, with caches other processes have used meanwhile; the closed-loop hot-path run below shows the same decisions back to back.\n",
		fmtNs(d.P50), fmtNs(d.P99), fmtNs(d.P999), fmtNs(a.P50), fmtNs(a.P99), fmtNs(a.P999))
}

// maxCmdsShown is how many commands redisByText names per system.
const maxCmdsShown = 6

// redisByText lists, for each system of a workload that uses Redis, its
// Redis commands per decision by command, the most first.
func redisByText(rs []result) string {
	var parts []string
	for _, r := range rs {
		if !r.UsesRedis || len(r.RedisByCmd) == 0 {
			continue
		}
		names := make([]string, 0, len(r.RedisByCmd))
		for name := range r.RedisByCmd {
			names = append(names, name)
		}
		slices.SortFunc(names, func(x, y string) int {
			if c := cmpFloat(r.RedisByCmd[y], r.RedisByCmd[x]); c != 0 {
				return c
			}
			return strings.Compare(x, y)
		})
		var cmds []string
		var rest float64
		for i, name := range names {
			if i >= maxCmdsShown {
				rest += r.RedisByCmd[name]
				continue
			}
			cmds = append(cmds, fmt.Sprintf("`%s` %s", name, fmtPerDecision(r.RedisByCmd[name])))
		}
		if n := len(names) - maxCmdsShown; n > 0 {
			cmds = append(cmds, fmt.Sprintf("%d more %s", n, fmtPerDecision(rest)))
		}
		parts = append(parts, fmt.Sprintf("%s: %s", r.System[:1], strings.Join(cmds, ", ")))
	}
	if len(parts) == 0 {
		return ""
	}
	return "Redis commands per decision, by command: " + strings.Join(parts, "; ") + ".\n"
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// redisText is the Redis commands per decision, gross and net of the
// background, or a dash for a system that does not use Redis.
func redisText(r result) string {
	if !r.UsesRedis {
		return "—"
	}
	return fmtPerDecision(r.RedisCmds) + ", " + fmtPerDecision(r.RedisNet)
}

// backgroundText gives, for a workload, the background each system's net
// Redis figure had subtracted.
func backgroundText(rs []result) string {
	var parts []string
	for _, r := range rs {
		if !r.UsesRedis {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s per decision counted + %s/s idle (%s per decision in all)", r.System[:1], fmtPerDecision(r.RedisPeer), fmtNum(r.RedisBackground), fmtPerDecision(r.RedisCmds-r.RedisNet)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "Background subtracted for the net figures: the `rateleased` processes' fleet view during the run (heartbeats and status snapshots, as they count them), plus the rest of the idle background (Redis commands per second with no system running, before each run): " + strings.Join(parts, ", ") + ".\n"
}

func cpuText(r result) string {
	if !r.UsesRedis && !r.UsesDaemon {
		return fmtNs(r.ClientCPU) + ", —"
	}
	return fmtNs(r.ClientCPU) + ", " + fmtNs(r.ServerCPU)
}

// sdkText describes (a)'s decisions by source and its counters.
func sdkText(r result) string {
	if r.SDK == nil {
		return ""
	}
	var total int64
	names := make([]string, 0, len(r.SDK.BySource))
	for name, n := range r.SDK.BySource {
		names = append(names, name)
		total += n
	}
	slices.SortFunc(names, func(x, y string) int {
		if c := r.SDK.BySource[y] - r.SDK.BySource[x]; c != 0 {
			if c > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(x, y)
	})
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %s (%s)", name, fmtInt(r.SDK.BySource[name]), fmtPct(pct(r.SDK.BySource[name], total))))
	}
	held := ""
	if r.SDK.HeldKnown {
		held = fmt.Sprintf(", %s tokens left in leases when the run ended (`TokensHeld`: counted as taken by the servers, for decisions after the run)", fmtInt(r.SDK.TokensHeld))
		if r.SDK.DebtKnown && r.SDK.TokensHeld > 0 {
			held += fmt.Sprintf("; the buckets then owed their refill %s (deferred grants made ahead of it), and %s held less that debt had been granted out of the refill and not spent, beside %s admissions lost",
				fmtCount(r.SDK.Debt), fmtCount(float64(r.SDK.TokensHeld)-r.SDK.Debt), fmtInt(r.Lost))
		}
	}
	return fmt.Sprintf("(a) decisions by source (`Decision.Source`): %s. `Stats()` summed over the instances: %s lease-server calls, %s failed calls, %s fallback decisions, at most %s keys held%s.",
		strings.Join(parts, ", "), fmtInt(r.SDK.ServerCalls), fmtInt(r.SDK.ServerErrors), fmtInt(r.SDK.FallbackDecisions), fmtInt(int64(r.SDK.MaxKeysHeld)), held)
}

// describe states a workload from its fields.
func describe(wl workload, rs []result) string {
	keys := "1 key"
	switch {
	case wl.keys > 1 && wl.dist == distZipf:
		keys = fmt.Sprintf("%s keys, Zipf demand (s = %.1f, v = 1: key 0 the most asked)", fmtInt(int64(wl.keys)), wl.zipfS)
	case wl.keys > 1:
		keys = fmt.Sprintf("%s keys, uniform demand", fmtInt(int64(wl.keys)))
	}
	inst := fmt.Sprintf("%d instances", wl.instances)
	if wl.instances == 1 {
		inst = "1 instance"
	}
	if wl.capacity {
		return fmt.Sprintf("%s, %s, rule %s: %s.", keys, inst, wl.rule, wl.note)
	}
	perKey := ""
	if wl.keys > 1 {
		perKey = fmt.Sprintf(" (%s per key on average)", fmtNum(wl.rate/float64(wl.keys)))
	}
	s := fmt.Sprintf("%s, %s requests/s%s, Poisson arrivals, round-robin over %s, rule %s: %s.",
		keys, fmtNum(wl.rate), perKey, inst, wl.rule, wl.note)
	if len(rs) > 0 && rs[0].Arrivals > 0 {
		r := rs[0]
		s += fmt.Sprintf(" %s arrivals in %s; the exact bucket admits %s of them (%s).",
			fmtInt(int64(r.Arrivals)), fmtDur(r.Length), fmtInt(r.ExactAdmitted), fmtPct(pct(r.ExactAdmitted, int64(r.Arrivals))))
	}
	return s
}

func renderMarkdown(d reportData) string {
	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	m := d.Machine
	p("# Benchmarks\n\n")
	p("<!-- Generated by `make bench` (e2e/compare, TestMain): do not edit by hand; run it again. -->\n\n")
	p("Does a global rate limit with leases admit what an exact limiter would, and what does each decision cost? ")
	p("Each workload below is one schedule of arrival times (key and instance included), generated once, that every system replays at wall-clock pace in the same run, against the same `redis-server` and the same %d `rateleased` processes (the built binary, Redis store):\n\n", daemons)
	for _, sys := range systems {
		p("- **%s** — `%s`\n", sys.label, sys.name)
	}
	p("\nEach system's decisions are scored against **one exact token bucket per key fed the same arrival times** (lost and extra admissions), and against the bound of the rule, burst + rate·W, in every window of every key. ")
	p("(d) limits each instance on its own, so it runs only where no limit binds. ")
	p("The hot-path workload is the one closed-loop run: there each system decides as fast as it can, to show what a decision costs when the key is hot.\n\n")
	p("![admissions lost, Redis commands and p99 latency per decision, per workload and system](%s)\n\n", chartFile)

	p("## Workloads\n\n")
	for _, wl := range workloads {
		p("- **%s** — %s\n", wl.name, describe(wl, resultsOf(d.Results, wl.name)))
	}
	p("\n")

	p("## Machine and command\n\n")
	p("- CPU: %s, %d cores (GOMAXPROCS %d)", m.CPU, m.Cores, m.GOMAXPROCS)
	if m.Memory != "" {
		p(", %s RAM", m.Memory)
	}
	p("\n- OS: %s\n- Go: %s\n- redis-server: %s\n", m.OS, m.Go, m.Redis)
	p("- Date: %s\n", d.Date.Format("2006-01-02 15:04 MST"))
	p("- Command, from the repository root (`make bench` runs the engine and SDK micro-benchmarks, then this):\n\n")
	p("  ```sh\n  %s\n  ```\n\n", d.Command)
	p("  Each run replays %s of arrivals (from `-benchtime`; a count such as `1x` means %s); the whole benchmark, %d runs, took %s. ", fmtDur(d.Run), fmtDur(defaultRun), len(d.Results), d.Took.Round(time.Second))
	p("Everything runs on this one machine over loopback: the benchmark process (all the instances), `redis-server` and the `rateleased` processes share its %d cores, ", m.Cores)
	p("and the machine may be shared with other work: the tables give the cores that other processes used during each run.\n\n")

	p("## Targets\n\n")
	p("Computed from this run; (a) against (b) on the same arrivals.\n\n")
	p("| target | workload | wanted | measured | |\n|---|---|---|--:|---|\n")
	pass, all := 0, 0
	for _, t := range evalTargets(d.Results) {
		all++
		if t.Pass {
			pass++
		}
		p("| %s | %s | %s | %s | %s |\n", t.Name, t.Workload, t.Want, t.Got, t.verdict())
	}
	p("\n%d of %d targets met.\n\n", pass, all)

	p("## Results\n\n")
	for _, wl := range workloads {
		rs := resultsOf(d.Results, wl.name)
		if len(rs) == 0 {
			continue
		}
		p("### %s\n\n%s\n\n%s\n", wl.name, describe(wl, rs), workloadTable(rs))
		if t := paceText(rs); t != "" {
			p("%s\n", t)
		}
		if t := localText(rs); t != "" {
			p("%s\n", t)
		}
		if t := redisByText(rs); t != "" {
			p("%s\n", t)
		}
		if t := backgroundText(rs); t != "" {
			p("%s\n", t)
		}
		for _, r := range rs {
			if t := sdkText(r); t != "" {
				p("%s\n", t)
			}
		}
		if wl.capacity {
			p("\nDecisions timed: every one for the network systems, a random 1 in %d for the local ones (two clock reads cost more than their decision); timing no work at all gives p50 %s, p99 %s on this machine, included in the figures. ",
				1<<localSampleShift, fmtNs(d.FloorP50), fmtNs(d.FloorP99))
			p("Goroutines: one per core for the local systems, %d per core for the network ones, each with one decision in flight.\n", netParallelism)
		}
		p("\n")
	}

	p("%s", algorithmsText(d.Algorithms))
	p("%s", memoryText(d.Memory))
	p("## How it is measured\n\n")
	p("- **Arrivals**: a Poisson process at the workload's rate, keys drawn from its distribution, the i-th arrival sent to instance i mod n; a fixed seed per workload, so every system, and every run, gets the same schedule. ")
	p("A pacer goroutine sleeps until the next arrival is due and hands it to an idle worker goroutine, or starts one (at most %s in flight), so a slow decision never holds back the next; the idle worker that finished last goes first, so decisions run on goroutines whose stacks have grown, as in a long-running server. **pacer lag** is when a decision began less its scheduled time, and says whether the pacer kept up (⚠: above %s at p99). The pacer's sleep wakes with about a millisecond's resolution, so a lag near 1 ms is the clock's, not the system's.\n", fmtInt(maxInFlight), fmtDur(paceLag))
	p("- **decisions/s**: decisions made over the time from the run's start to the end of its last decision (open loop, this is the arrival rate when the system keeps pace).\n")
	p("- **lost / extra**: per key, the exact bucket's admissions the system did not make, max(0, exact − system), and those it made beyond them, max(0, system − exact), summed over keys, as a share of the exact bucket's admissions. The exact bucket starts full, as rateleased's and redis_rate's do, and is fed each arrival at its scheduled time.\n")
	p("- **worst window**: admissions are counted per key in %s slots by decision time, an admission in a window only if its decision began and ended inside it; over every window of %s or more (up to the run's length), the largest admitted − (burst + rate·W), for the worst key. Above 0 the rule's bound did not hold. ", fmtDur(windowSlot), fmtDur(minWindow))
	p("An admission made by a round trip happened somewhere between the decision's start and end, so a window is never charged one it may not have held.\n")
	p("- **latency**: of each decision, from the goroutine's first clock read to the decision's return; p50, p99, p99.9 over every decision of the run.\n")
	p("- **calls / decision**: calls that left the benchmark process per decision: lease-server calls for (a) (`Stats().ServerCalls`, summed over the instances), Redis round trips for (b) (a go-redis hook), HTTP calls for (c). ")
	p("**Redis cmds / decision**, gross: what redis-server counted in `INFO commandstats` during the run, every command's `calls` summed (a script's EVALSHA and each command it ran inside), the INFO calls excluded, whoever sent them. ")
	p("Net of background: the gross less the `rateleased` processes' fleet view over the run — each records itself among the peers every %s and publishes its status snapshot every other time, whatever the traffic: a cost per second, not per decision — as they count it (`ratelease_peer_commands_total`, read on both sides of the `INFO` that starts and ends the run), and less anything else Redis counts with no system running, at the rate counted over %s just before the run (before the system is set up), times the run's length: were there any, what the previous run left behind, since a run's measurement ends only when the `rateleased` processes are done with the work it left them (the buckets they owned, handed back to Redis once unused; at most %s after the run), which is charged to it. ", fmtDur(server.PeerInterval), fmtDur(idleWindow), fmtDur(maxDrain))
	p("The fleet view is counted, not estimated from an idle rate: a run holds one of its rounds more or less whatever its length, and where (a)'s and (b)'s commands per decision tie, that estimate decided the comparison. Connection pools are filled before the runs, (b)'s before each run, the `rateleased` processes' once, so that no run dials; other work that only load brings stays in the net figure. The Redis targets are evaluated on the net figures, of (a) and of (b) alike. ")
	p("Calls and commands both count the closing of the run's clients too: for (a), returning its leases.\n")
	p("- **CPU / decision**: this process (user + sys, `getrusage`: the instances, the pacer and the GC), and the servers the system uses (`redis-server` from `INFO cpu`, `rateleased` from `/proc/<pid>/stat` at 10 ms ticks). ")
	p("**other load**: cores busy with other processes, or stolen by the host, on average during the run (`/proc/stat`).\n")
	p("- (a) runs with the SDK's defaults, as a new user would write it, each instance a `client.Client` with its own `client_id` and HTTP pool, instance i listing `rateleased` i mod %d first. (b) has one go-redis client per instance, (c) alternates between the `rateleased` processes by instance. ", daemons)
	p("Before the first run every Lua script is loaded into Redis; before each run the system's connection pools are opened. Each run uses keys of its own, so every bucket starts full.\n")
	return s.String()
}

// ---------------------------------------------------------------------------
// Number formats

// fmtSI formats v with 3 significant digits and a k, M or G suffix.
func fmtSI(v float64) string {
	if v < 0 {
		return "-" + fmtSI(-v)
	}
	units := []struct {
		div float64
		suf string
	}{{1e9, " G"}, {1e6, " M"}, {1e3, " k"}}
	for _, u := range units {
		if v >= u.div*0.9995 {
			return fmtSig(v/u.div, 3) + u.suf
		}
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmtSig(v, 3)
}

// fmtDecade formats a power of ten for an axis: "1 k", "10 M", "0.01".
func fmtDecade(v float64) string {
	if v < 1 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	s := fmtSI(v)
	num, suf, _ := strings.Cut(s, " ")
	if f, err := strconv.ParseFloat(num, 64); err == nil {
		num = strconv.FormatFloat(f, 'f', -1, 64)
	}
	if suf == "" {
		return num
	}
	return num + " " + suf
}

// fmtNs formats nanoseconds: "35 ns", "1.25 µs", "3.10 ms", "1.20 s".
func fmtNs(ns float64) string {
	switch {
	case ns == 0:
		return "0 ns"
	case ns < 10:
		return fmtSig(ns, 2) + " ns"
	case ns < 999.5:
		return fmt.Sprintf("%.0f ns", ns)
	case ns < 999.5e3:
		return strings.TrimSpace(fmtSig(ns/1e3, 3)) + " µs"
	case ns < 999.5e6:
		return strings.TrimSpace(fmtSig(ns/1e6, 3)) + " ms"
	default:
		return strings.TrimSpace(fmtSig(ns/1e9, 3)) + " s"
	}
}

func fmtDur(d time.Duration) string { return fmtNs(float64(d)) }

// fmtPerDecision formats a count per decision: "18", "3.6", "0.0041".
func fmtPerDecision(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmtInt(int64(math.Round(v)))
	default:
		return fmtSig(v, 2)
	}
}

// fmtNum formats a workload parameter: "4,000", "100", "0.2", "0.03".
func fmtNum(v float64) string {
	if v >= 1 && v == math.Trunc(v) {
		return fmtInt(int64(v))
	}
	s := fmtSig(v, 3)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// fmtPct formats a percentage: "0%", "0.042%", "3.1%", "50%".
func fmtPct(v float64) string {
	switch {
	case v == 0:
		return "0%"
	case v >= 10:
		return fmt.Sprintf("%.0f%%", v)
	default:
		return fmtSig(v, 2) + "%"
	}
}

// fmtCount formats a count that may be huge: "37", "1.00 G".
func fmtCount(v float64) string {
	if math.Abs(v) < 1e4 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmtSI(v)
}

// fmtSigned formats an excess: "+17", "+0.9", "-0.1", "-1.00 G".
func fmtSigned(v float64) string {
	if math.Abs(v) < 9.95 {
		return fmt.Sprintf("%+.1f", v)
	}
	if v > 0 {
		return "+" + fmtCount(math.Round(v))
	}
	return "-" + fmtCount(math.Round(-v))
}

// fmtFactor formats a target factor: "0.001×", "0.3×", "1×".
func fmtFactor(f float64) string {
	return strconv.FormatFloat(f, 'f', -1, 64) + "×"
}

// fmtSig formats v > 0 with sig significant digits, without exponent.
func fmtSig(v float64, sig int) string {
	if v <= 0 {
		return "0"
	}
	e := int(math.Floor(math.Log10(v)))
	prec := max(0, sig-1-e)
	s := strconv.FormatFloat(v, 'f', prec, 64)
	// Rounding may carry into one more digit (9.996 -> "10.00"): one less.
	if r, err := strconv.ParseFloat(s, 64); err == nil && r >= math.Pow10(e+1) && prec > 0 {
		s = strconv.FormatFloat(v, 'f', prec-1, 64)
	}
	return s
}

func fmtRatio(x float64) string {
	if x >= 10 {
		return fmtInt(int64(math.Round(x))) + "×"
	}
	return fmt.Sprintf("%.2f×", x)
}

func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return "-" + fmtInt(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
