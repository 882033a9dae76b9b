package compare

import (
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// reportEnv names the directory (the repository root) where TestMain
// writes BENCHMARKS.md and docs/benchmarks.svg after BenchmarkCompare ran.
const reportEnv = "RATELEASE_BENCH_REPORT"

const (
	reportFile = "BENCHMARKS.md"
	chartFile  = "docs/benchmarks.svg"
)

// result is the last run of one sub-benchmark. Times are nanoseconds.
type result struct {
	System, Label, Workload string
	N, Goroutines           int
	Elapsed                 time.Duration
	PerSecond               float64 // decisions per second
	Calls1000               float64 // calls that left the process per 1,000 decisions
	RedisCmds               float64 // commands redis-server ran per 1,000 decisions
	P50, P99                float64 // decision latency
	Samples                 uint64  // decisions timed
	SampleEvery             int     // 1 in SampleEvery decisions timed
	ClientCPU               float64 // this process's CPU per decision
	ServerCPU               float64 // CPU of the servers the system uses, per decision
	RedisCPU, DaemonCPU     float64 // each server's, whether used or not
	Allocs                  float64 // heap allocations per decision, whole process
	SerialP50, SerialP99    float64 // decision latency, one goroutine deciding alone
	SerialN                 uint64  // decisions timed for SerialP50, SerialP99
	OtherCores, StealCores  float64 // cores used by other processes, and stolen by the host, on average during the run
	UsesRedis, UsesDaemon   bool
}

// collected holds what the benchmarks measured, for TestMain.
var collected struct {
	sync.Mutex
	results            map[string]result // "system/workload"; the last run wins
	redisVersion       string
	floorP50, floorP99 float64
}

func record(r result) {
	collected.Lock()
	defer collected.Unlock()
	if collected.results == nil {
		collected.results = make(map[string]result)
	}
	collected.results[r.System+"/"+r.Workload] = r
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

// TestMain runs the tests and benchmarks, then, if RATELEASE_BENCH_REPORT
// is set and BenchmarkCompare ran for every system and workload, writes the
// report there.
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
	Results            []result // systems in order, each workload in order
	Machine            machine
	Command            string
	Date               time.Time
	FloorP50, FloorP99 float64
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
	return fmt.Sprintf("%s, %d cores, %s, redis-server %s, %s", m.CPU, m.Cores, m.Go, m.Redis, m.OS)
}

func writeReport(dir string) error {
	collected.Lock()
	d := reportData{
		Machine:  currentMachine(collected.redisVersion),
		Command:  command(),
		Date:     time.Now().UTC(),
		FloorP50: collected.floorP50,
		FloorP99: collected.floorP99,
	}
	var missing []string
	for _, sys := range systems {
		for _, wl := range makeWorkloads(sys.tag) {
			r, ok := collected.results[sys.name+"/"+wl.name]
			if !ok {
				missing = append(missing, sys.name+"/"+wl.name)
				continue
			}
			d.Results = append(d.Results, r)
		}
	}
	collected.Unlock()

	fmt.Printf("\n%s\n", markdownTable(d.Results))
	for _, t := range evalTargets(d.Results) {
		fmt.Printf("target %-55s %-8s %s\n", t.Name+" ("+t.Workload+")", t.Got, t.verdict())
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

// evalTargets checks the targets of issue 4 on (a), per workload.
func evalTargets(rs []result) []target {
	var out []target
	for _, a := range rs {
		if !strings.HasPrefix(a.System, "a-") {
			continue
		}
		if b, ok := find(rs, "b-", a.Workload); ok && b.PerSecond > 0 {
			ratio := a.PerSecond / b.PerSecond
			out = append(out, target{
				Name: "(a) decisions/s at least 100x (b)", Workload: a.Workload,
				Want: "≥ 100×", Got: fmtRatio(ratio), Pass: ratio >= 100,
			})
		}
		out = append(out, target{
			Name: "(a) server calls per 1,000 decisions at most 10", Workload: a.Workload,
			Want: "≤ 10", Got: fmtCalls(a.Calls1000), Pass: a.Calls1000 <= 10,
		})
		out = append(out, target{
			Name: "(a) p99 decision latency on a live lease at most 1 µs", Workload: a.Workload,
			Want: "≤ 1 µs", Got: fmtNs(a.P99), Pass: a.P99 <= 1000,
		})
	}
	return out
}

// maxPerSecond returns the highest decisions/s of any run.
func maxPerSecond(rs []result) float64 {
	var m float64
	for _, r := range rs {
		m = max(m, r.PerSecond)
	}
	return m
}

func find(rs []result, prefix, workload string) (result, bool) {
	for _, r := range rs {
		if strings.HasPrefix(r.System, prefix) && r.Workload == workload {
			return r, true
		}
	}
	return result{}, false
}

// ---------------------------------------------------------------------------
// Markdown

func markdownTable(rs []result) string {
	var s strings.Builder
	s.WriteString("| system | workload | decisions/s | vs (b) | calls / 1,000 decisions | Redis commands run / 1,000 decisions | p50 latency | p99 latency | client CPU / decision | server CPU / decision | allocs / decision |\n")
	s.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		vs := "—"
		if b, ok := find(rs, "b-", r.Workload); ok && b.PerSecond > 0 {
			vs = fmtRatio(r.PerSecond / b.PerSecond)
		}
		srv := "—"
		if r.UsesRedis || r.UsesDaemon {
			srv = fmtNs(r.ServerCPU)
		}
		redisCmds := "—"
		if r.UsesRedis {
			redisCmds = fmtCalls(r.RedisCmds)
		}
		fmt.Fprintf(&s, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.System, r.Workload, fmtSI(r.PerSecond), vs, fmtCalls(r.Calls1000), redisCmds,
			fmtNs(r.P50), fmtNs(r.P99), fmtNs(r.ClientCPU), srv, fmtAllocs(r.Allocs))
	}
	return s.String()
}

// latencyTable puts the latency under load beside that of one goroutine
// deciding alone.
func latencyTable(rs []result) string {
	var s strings.Builder
	s.WriteString("| system | workload | under load: goroutines | p50 | p99 | one goroutine alone: p50 | p99 |\n")
	s.WriteString("|---|---|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		fmt.Fprintf(&s, "| %s | %s | %d | %s | %s | %s | %s |\n",
			r.System, r.Workload, r.Goroutines, fmtNs(r.P50), fmtNs(r.P99), fmtNs(r.SerialP50), fmtNs(r.SerialP99))
	}
	return s.String()
}

// cpuTable shows how many cores each process kept busy during each run:
// what bounds the throughput on a machine whose cores they share.
func cpuTable(rs []result, cores int) string {
	var s strings.Builder
	s.WriteString("| system | workload | goroutines | this process (client) | redis-server | rateleased | total busy | other processes | stolen by the host |\n")
	s.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		busy := func(perDecision float64) float64 { return perDecision * r.PerSecond / 1e9 }
		client := busy(r.ClientCPU)
		redisC, daemonC := "—", "—"
		total := client
		if r.UsesRedis {
			redisC = fmt.Sprintf("%.2f", busy(r.RedisCPU))
			total += busy(r.RedisCPU)
		}
		if r.UsesDaemon {
			daemonC = fmt.Sprintf("%.2f", busy(r.DaemonCPU))
			total += busy(r.DaemonCPU)
		}
		fmt.Fprintf(&s, "| %s | %s | %d | %.2f | %s | %s | %.2f of %d | %.2f | %.2f |\n",
			r.System, r.Workload, r.Goroutines, client, redisC, daemonC, total, cores, r.OtherCores, r.StealCores)
	}
	return s.String()
}

func renderMarkdown(d reportData) string {
	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	m := d.Machine
	p("# Benchmarks\n\n")
	p("<!-- Generated by `make bench` (e2e/compare, TestMain): do not edit by hand; run it again. -->\n\n")
	p("How fast can a process decide \"may this request go ahead?\" under a **global** rate limit? ")
	p("The same workload goes through these %d limiters, all in one run, against the same `redis-server`:\n\n", len(systems))
	for _, sys := range systems {
		p("- **%s** — `%s`\n", sys.label, sys.name)
	}
	p("\nWorkloads: **hot**, every decision on one key; **zipf**, %s keys with Zipf-distributed demand (s=%.1f, v=%.0f). ", fmtInt(zipfKeys), zipfS, zipfV)
	p("The limit, the same for every system, is %s tokens per %v per key with a burst of %s (%s per second)",
		fmtInt(limitTokens), limitPeriod, fmtInt(limitTokens), fmtInt(int64(limitRate)))
	if fastest := maxPerSecond(d.Results); fastest > 0 {
		p("; the fastest run made %s decisions/s, all its keys together", fmtSI(fastest))
	}
	p(". ")
	p("(Not %s per second: the burst can be at most %s (`protocol.MaxCount`), so that bucket would refill in 1 s, and the SDK caps a batch at a quarter of the refill time, 250 ms of demand; ", fmtInt(limitTokens), fmtInt(limitTokens))
	p("a renewal that did not land within that, as may happen while the benchmark keeps all %d cores of this machine busy, would leave the key without a lease. See `limitTokens` in `e2e/compare/compare_test.go`.) ", m.Cores)
	p("A denied decision fails the benchmark, so in these results the limit never bound and what is measured is the limiter's own cost; a decision of (a) not made from a live lease fails the benchmark too.\n\n")
	p("![decisions per second, log scale](%s)\n\n", chartFile)

	p("## Machine and command\n\n")
	p("- CPU: %s, %d cores (GOMAXPROCS %d)", m.CPU, m.Cores, m.GOMAXPROCS)
	if m.Memory != "" {
		p(", %s RAM", m.Memory)
	}
	p("\n- OS: %s\n- Go: %s\n- redis-server: %s\n", m.OS, m.Go, m.Redis)
	p("- Date: %s\n", d.Date.Format("2006-01-02 15:04 MST"))
	p("- Command, from the repository root: `make bench`, which runs the engine and SDK micro-benchmarks and then\n\n")
	p("  ```sh\n  %s\n  ```\n\n", d.Command)
	p("  and writes this file and `%s`. Everything runs on this one machine over loopback: ", chartFile)
	p("the benchmark process, one `redis-server` and one `rateleased` (the built binary, `-redis` store) share its %d cores.\n\n", m.Cores)

	p("## Results\n\n")
	p("%s\n", markdownTable(d.Results))
	p("- **decisions/s**: decisions over the wall time of `b.RunParallel`; **vs (b)**: the ratio to (b) on the same workload.\n")
	p("- **calls / 1,000 decisions**: calls that left the benchmark process: lease-server calls for (a) (`Client.Stats().ServerCalls`: acquire, renew and settle, batched over keys), Redis round trips for (b) (counted by a go-redis hook), HTTP calls for (c), none for (d). ")
	p("**Redis commands run** is what `redis-server` itself counted (`INFO stats`, which counts the commands a Lua script runs too), whoever sent them: for (a) and (c), `rateleased`.\n")
	p("- **p50 / p99 latency**: of one decision, timed with two monotonic clock reads around it, in a log-linear histogram (≤ %.1f%% off). ", 100/(2.0*subCount))
	p("Every decision of (b) and (c) is timed, and a random 1 in %d of (a) and (d)", 1<<localSampleShift)
	a, okA := find(d.Results, "a-", "hot")
	dd, okD := find(d.Results, "d-", "hot")
	if okA && okD && a.PerSecond > 0 && dd.PerSecond > 0 {
		p(", whose decisions took %s and %s of wall time per goroutine on hot", fmtNs(float64(a.Goroutines)/a.PerSecond*1e9), fmtNs(float64(dd.Goroutines)/dd.PerSecond*1e9))
	}
	p(". The clock reads are included in the figures: timing no work at all gives p50 %s, p99 %s on this machine.\n", fmtNs(d.FloorP50), fmtNs(d.FloorP99))
	p("- **client CPU / decision**: this process's CPU time (user + sys, `getrusage`) per decision, everything included (the benchmark loop, the SDK's background settle loop, the GC). ")
	p("**server CPU / decision**: the CPU time of the server processes the system uses (`redis-server` from `INFO cpu`; `rateleased` from `/proc/<pid>/stat`, 10 ms ticks).\n")
	p("- **allocs / decision**: heap allocations of the whole process per decision (`runtime.MemStats.Mallocs`).\n")
	p("- Goroutines: (a) and (d) decide without a network call and run one per core (GOMAXPROCS, `b.RunParallel`'s default). ")
	p("(b) and (c) wait on a round trip per decision, so they run %d per core (`b.SetParallelism(%d)`) to keep several round trips in flight over as many connections.\n", netParallelism, netParallelism)
	p("- Each sub-benchmark warms up first with the same workload (%v for (a), so that its batch sizes follow the demand, then a check that every key of the workload holds a live lease; %v for the others); the figures are the last run of each (`b.N` grows over runs).\n\n", warmLocal, warmNetwork)

	p("### Latency under load and alone\n\n")
	p("%s\n", latencyTable(d.Results))
	p("%s\n", latencyText(d.Results))

	p("### Where the CPU goes\n\n")
	p("Cores kept busy during each run (CPU time per decision × decisions/s), and what else the machine did meanwhile (`/proc/stat`: all CPU time less that of the three processes above; time stolen by the hypervisor):\n\n")
	p("%s\n", cpuTable(d.Results, m.Cores))
	p("%s\n", limitsText(d.Results, m.Cores))

	p("## Targets (issue 4)\n\n")
	p("| target | workload | wanted | measured | |\n|---|---|---|--:|---|\n")
	for _, t := range evalTargets(d.Results) {
		p("| %s | %s | %s | %s | %s |\n", t.Name, t.Workload, t.Want, t.Got, t.verdict())
	}
	p("\nChart: [%s](%s).\n", chartFile, chartFile)
	return s.String()
}

// latencyText compares, from the measured figures, the latency under load
// of the network-bound systems with Little's law and with a decision made
// alone.
func latencyText(rs []result) string {
	var s strings.Builder
	for _, prefix := range []string{"b-", "c-"} {
		r, ok := find(rs, prefix, "hot")
		if !ok || r.PerSecond == 0 {
			continue
		}
		fmt.Fprintf(&s, "%s/hot runs %d goroutines, each with one decision in flight: by Little's law a decision takes %d / %s/s = %s on average. The measured p50 is %s",
			r.System, r.Goroutines, r.Goroutines, fmtSI(r.PerSecond), fmtNs(float64(r.Goroutines)/r.PerSecond*1e9), fmtNs(r.P50))
		if r.SerialP50 > 0 {
			fmt.Fprintf(&s, ", %s the p50 of a decision made alone (%s)", fmtRatio(r.P50/r.SerialP50), fmtNs(r.SerialP50))
		}
		fmt.Fprintf(&s, "; p99 %s. ", fmtNs(r.P99))
	}
	if a, ok := find(rs, "a-", "hot"); ok {
		fmt.Fprintf(&s, "(a) decides from its lease, with %s server calls per 1,000 decisions: %s p99 under load, %s alone, clock reads included.", fmtCalls(a.Calls1000), fmtNs(a.P99), fmtNs(a.SerialP99))
	}
	return s.String() + "\n"
}

// limitsText says, from the measured figures, what bounds each system.
func limitsText(rs []result, cores int) string {
	var s strings.Builder
	all := func(r result) float64 { return r.ClientCPU + r.ServerCPU }
	for _, wl := range []string{"hot", "zipf"} {
		b, okB := find(rs, "b-", wl)
		c, okC := find(rs, "c-", wl)
		if !okB || !okC || all(b) == 0 || all(c) == 0 {
			continue
		}
		fmt.Fprintf(&s, "- %s: (b) and (c) make %s and %s calls per 1,000 decisions over loopback and cost %s and %s of CPU per decision, all processes together. ",
			wl, fmtCalls(b.Calls1000), fmtCalls(c.Calls1000), fmtNs(all(b)), fmtNs(all(c)))
		fmt.Fprintf(&s, "At that cost %d cores could make at most about %s and %s decisions/s; the runs got %s and %s.",
			cores, fmtSI(float64(cores)*1e9/all(b)), fmtSI(float64(cores)*1e9/all(c)), fmtSI(b.PerSecond), fmtSI(c.PerSecond))
		for _, r := range []result{b, c} {
			busy := all(r) * r.PerSecond / 1e9
			idle := float64(cores) - busy - r.OtherCores - r.StealCores
			switch {
			case idle < 0.1*float64(cores):
				fmt.Fprintf(&s, " %s was bound by CPU: %.2f of %d cores busy with it, %.2f with other work.", r.System, busy, cores, r.OtherCores+r.StealCores)
			case idle < 0.5*float64(cores):
				fmt.Fprintf(&s, " %s kept %.2f of %d cores busy (%.2f with other work, %.2f idle).",
					r.System, busy, cores, r.OtherCores+r.StealCores, idle)
			default:
				fmt.Fprintf(&s, " %s left %.2f of %d cores idle: CPU did not bound it.", r.System, idle, cores)
			}
		}
		s.WriteString("\n")
	}
	for _, wl := range []string{"hot", "zipf"} {
		a, okA := find(rs, "a-", wl)
		d, okD := find(rs, "d-", wl)
		if !okA || !okD {
			continue
		}
		fmt.Fprintf(&s, "- %s: (a) makes %s server calls per 1,000 decisions and (d) %s; (a) and (d) cost %s and %s of CPU per decision in this process, the benchmark loop included, with %.2f and %.2f of %d cores busy (other work meanwhile: %.2f and %.2f). ",
			wl, fmtCalls(a.Calls1000), fmtCalls(d.Calls1000), fmtNs(a.ClientCPU), fmtNs(d.ClientCPU), a.ClientCPU*a.PerSecond/1e9, d.ClientCPU*d.PerSecond/1e9, cores,
			a.OtherCores+a.StealCores, d.OtherCores+d.StealCores)
		fmt.Fprintf(&s, "The servers behind (a) (`rateleased` and `redis-server`) spent %s of CPU per decision.\n", fmtNs(a.ServerCPU))
	}
	var worst result
	for _, r := range rs {
		if r.OtherCores+r.StealCores > worst.OtherCores+worst.StealCores {
			worst = r
		}
	}
	if worst.OtherCores+worst.StealCores >= 0.05 {
		fmt.Fprintf(&s, "\nThe machine was not quiet: during %s/%s, other processes used %.2f cores and the host stole %.2f.\n",
			worst.System, worst.Workload, worst.OtherCores, worst.StealCores)
	} else {
		s.WriteString("\nThe machine was otherwise idle: other processes and the host took less than 0.05 cores during every run.\n")
	}
	s.WriteString("\n(a) here takes the key as a string (`Client.Allow(ctx, key)`: a map lookup, then atomic operations on the lease). ")
	s.WriteString("A `client.Limiter` handle kept for a key skips the lookup: `BenchmarkLimiterAllowParallel` in `client/`, which `make bench` runs first, measures it beside `x/time/rate`.\n")
	for _, t := range evalTargets(rs) {
		if t.Pass {
			continue
		}
		fmt.Fprintf(&s, "\n**Missed: %s on %s: %s.** ", t.Name, t.Workload, t.Got)
		if a, ok := find(rs, "a-", t.Workload); ok {
			fmt.Fprintf(&s, "Measured for (a) on %s: %s decisions/s with %.2f of %d cores busy in the client, %s client CPU per decision, %s calls per 1,000 decisions, p99 %s under load and %s alone.\n",
				t.Workload, fmtSI(a.PerSecond), a.ClientCPU*a.PerSecond/1e9, cores, fmtNs(a.ClientCPU), fmtCalls(a.Calls1000), fmtNs(a.P99), fmtNs(a.SerialP99))
		}
	}
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

// fmtDecade formats a power of ten for an axis: "1 k", "10 M".
func fmtDecade(v float64) string {
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

// fmtNs formats nanoseconds: "35 ns", "1.25 µs", "3.10 ms".
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
	default:
		return strings.TrimSpace(fmtSig(ns/1e6, 3)) + " ms"
	}
}

// fmtCalls formats a count per 1,000 decisions: "1,000", "3.2", "0.0041".
func fmtCalls(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmtInt(int64(math.Round(v)))
	default:
		return fmtSig(v, 2)
	}
}

func fmtAllocs(v float64) string {
	if v < 0.01 {
		return fmtCalls(v)
	}
	return fmt.Sprintf("%.2f", v)
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

// ---------------------------------------------------------------------------
// The chart

var barColors = map[string]string{"a": "#1f77b4", "b": "#d95f02", "c": "#7570b3", "d": "#8c8c8c"}

// renderSVG draws decisions/s per system (bars) and workload (groups) on a
// log scale, each bar labelled with its value.
func renderSVG(rs []result, subtitle string) []byte {
	const (
		width, height          = 900, 500
		left, right, top, bott = 80, 20, 110, 80
		barW, barGap           = 64, 16
	)
	plotW, plotH := float64(width-left-right), float64(height-top-bott)

	var workloads []string
	var sysNames []string
	for _, r := range rs {
		if !contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
		if !contains(sysNames, r.System) {
			sysNames = append(sysNames, r.System)
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		if r.PerSecond > 0 {
			lo = math.Min(lo, math.Floor(math.Log10(r.PerSecond)))
			hi = math.Max(hi, math.Ceil(math.Log10(r.PerSecond)))
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 0, 1
	}
	if hi <= lo {
		hi = lo + 1
	}
	y := func(v float64) float64 {
		if v <= 0 {
			return top + plotH
		}
		return top + plotH*(1-(math.Log10(v)-lo)/(hi-lo))
	}

	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	esc := html.EscapeString
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="28" font-size="18" font-weight="bold">Rate-limit decisions per second (log scale, higher is better)</text>`+"\n", left)
	p(`<text x="%d" y="48" font-size="11" fill="#555555">%s</text>`+"\n", left, esc(subtitle))

	// Legend: two columns.
	for i, name := range sysNames {
		label := name
		for _, r := range rs {
			if r.System == name {
				label = r.Label
				break
			}
		}
		lx, ly := float64(left+(i%2)*400), 62+float64(i/2)*18
		p(`<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", lx, ly, barColors[name[:1]])
		p(`<text x="%.1f" y="%.1f" font-size="12">%s</text>`+"\n", lx+17, ly+10, esc(label))
	}

	// Grid and axis labels, one per decade.
	for e := lo; e <= hi; e++ {
		yy := y(math.Pow(10, e))
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#dddddd" stroke-width="1"/>`+"\n", left, yy, width-right, yy)
		p(`<text x="%d" y="%.1f" font-size="12" text-anchor="end" fill="#333333">%s</text>`+"\n", left-8, yy+4, esc(fmtDecade(math.Pow(10, e))))
	}
	p(`<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="#333333" stroke-width="1"/>`+"\n", left, top, left, top+plotH)
	p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333333" stroke-width="1"/>`+"\n", left, top+plotH, width-right, top+plotH)
	p(`<text transform="translate(20 %.1f) rotate(-90)" font-size="12" text-anchor="middle" fill="#333333">decisions / s</text>`+"\n", top+plotH/2)

	// Bars.
	groupW := plotW / float64(max(1, len(workloads)))
	for gi, wl := range workloads {
		var bars []result
		for _, r := range rs {
			if r.Workload == wl {
				bars = append(bars, r)
			}
		}
		total := float64(len(bars))*barW + float64(len(bars)-1)*barGap
		x0 := float64(left) + groupW*float64(gi) + (groupW-total)/2
		for bi, r := range bars {
			x := x0 + float64(bi)*(barW+barGap)
			yy := y(r.PerSecond)
			p(`<rect class="bar" data-system="%s" data-workload="%s" data-value="%g" x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s"/>`+"\n",
				esc(r.System), esc(r.Workload), r.PerSecond, x, yy, barW, top+plotH-yy, barColors[r.System[:1]])
			p(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x+barW/2, yy-6, esc(fmtSI(r.PerSecond)))
			p(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">(%s)</text>`+"\n", x+barW/2, top+plotH+18, esc(r.System[:1]))
		}
		title := wl
		switch wl {
		case "hot":
			title = "hot: one key"
		case "zipf":
			title = fmt.Sprintf("zipf: %s keys", fmtInt(zipfKeys))
		}
		p(`<text x="%.1f" y="%.1f" font-size="14" text-anchor="middle" font-weight="bold">%s</text>`+"\n", float64(left)+groupW*(float64(gi)+0.5), top+plotH+44, esc(title))
		a, okA := find(rs, "a-", wl)
		b, okB := find(rs, "b-", wl)
		if okA && okB && b.PerSecond > 0 {
			p(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" fill="#555555">%s</text>`+"\n",
				float64(left)+groupW*(float64(gi)+0.5), top+plotH+62, esc("(a) makes "+fmtRatio(a.PerSecond/b.PerSecond)+" the decisions/s of (b)"))
		}
	}
	p("</svg>\n")
	return []byte(s.String())
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
