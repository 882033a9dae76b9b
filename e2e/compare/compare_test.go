package compare

import (
	"context"
	"flag"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
)

// The length of a run comes from -benchtime: a duration is each run's
// length (clamped to minRun..maxRun); a count (-benchtime 1x) means
// defaultRun. Each sub-benchmark makes one run per call whatever b.N, so
// that the testing package, seeing a run at least as long as -benchtime,
// calls it once.
const (
	defaultRun = 4 * time.Second
	minRun     = time.Second
	maxRun     = 60 * time.Second
)

// replayGrace is how long after its schedule's end a run may take to finish
// its decisions; the decisions still in flight then are cut off (counted
// as failed, not admitted).
const replayGrace = 10 * time.Second

// Capacity (hot-path) runs: the network systems run netParallelism x
// GOMAXPROCS goroutines, each with one decision in flight; the local ones
// GOMAXPROCS. The local ones time a random 1 in 1<<localSampleShift
// decisions (two clock reads cost more than their decision); the network
// ones every decision.
const (
	netParallelism   = 8
	localSampleShift = 4
	warmLocal        = 1500 * time.Millisecond // (a): lets its demand estimate settle
	warmNetwork      = 300 * time.Millisecond
	// maxCapacityRun caps a capacity run, so that its decisions stay far
	// below hotRule's burst (checked after each run).
	maxCapacityRun = 10 * time.Second
	// maxCapacityDecisions bounds one goroutine's loop besides the clock.
	maxCapacityDecisions = 1 << 40
)

// runLength returns the length of each run from -benchtime.
func runLength() time.Duration {
	f := flag.Lookup("test.benchtime")
	if f == nil {
		return defaultRun
	}
	return runLengthOf(f.Value.String())
}

func runLengthOf(benchtime string) time.Duration {
	if strings.HasSuffix(benchtime, "x") {
		if _, err := strconv.Atoi(strings.TrimSuffix(benchtime, "x")); err == nil {
			return defaultRun
		}
	}
	d, err := time.ParseDuration(benchtime)
	if err != nil {
		return defaultRun
	}
	return min(max(d, minRun), maxRun)
}

// clockBase is the origin of the monotonic clock reads that time the
// capacity runs' decisions: time.Since(clockBase) reads only the monotonic
// clock (one vDSO call).
var clockBase = time.Now()

// BenchmarkCompare runs every system on every workload against the same
// redis-server and rateleased processes: BenchmarkCompare/<workload>/<system>.
// See the package documentation.
func BenchmarkCompare(b *testing.B) {
	e := startEnv(b)
	setMemory(measureMemory(b, e.rdb))
	setAlgorithms(measureAlgorithms(b, e.redis.Client(b), algoRun))
	measureTimerFloor()
	d := runLength()
	setRun(d)
	for _, wl := range workloads {
		b.Run(wl.name, func(b *testing.B) {
			var arr []arrival
			var exact []bool
			if !wl.capacity {
				arr = arrivals(wl, d, maxArrivals)
				exact = exactDecisions(arr, wl.rule)
			}
			for _, sys := range systems {
				if !sys.runs(&wl) {
					continue
				}
				b.Run(sys.name, func(b *testing.B) {
					runSeq.Add(1)
					if wl.capacity {
						runCapacity(b, e, &sys, &wl, d)
					} else {
						runOpen(b, e, &sys, &wl, arr, exact, d)
					}
				})
			}
		})
	}
}

// runOpen replays the workload's arrivals through sys and scores its
// decisions against the exact ones.
func runOpen(b *testing.B, e *env, sys *system, wl *workload, arr []arrival, exact []bool, d time.Duration) {
	keys := wl.keyNames(currentTag(sys.tag))
	bg := e.measureBackground(b, sys)
	r := sys.setup(b, e, wl)
	closed := false
	defer func() {
		if !closed {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = r.close(ctx)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), d+replayGrace)
	defer cancel()
	runtime.GC() // the last run's garbage is not this run's cost
	before := e.countedSnapshot(b, false)
	calls0 := r.calls()
	// The benchmark timer keeps running from the setup on, so that the
	// testing package sees at least the run's length (the schedule's last
	// arrival comes a little before it) and does not call again.
	rep := replay(ctx, arr, keys, r.decide)
	b.StopTimer()
	var held int64 // (a): tokens left in leases as the run ends, before Close returns them
	var debt float64
	debtKnown := false
	if r.sdk != nil {
		held = r.sdk().TokensHeld
		// The debt right after (a GET per key, ~1 ms each: the refill pays
		// about rate·1 ms of it meanwhile), its Redis and server work kept
		// out of the run's figures.
		x := e.countedSnapshot(b, true)
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		debt, debtKnown = e.debtAt(dctx, keys)
		dcancel()
		before.exclude(x, e.countedSnapshot(b, false))
	}
	closeCtx, closeCancel := context.WithTimeout(context.Background(), 10*time.Second)
	closeErr := r.close(closeCtx)
	closeCancel()
	closed = true
	after := e.drain(b, sys, bg, &before)
	if closeErr != nil {
		b.Logf("%s/%s: close: %v", wl.name, sys.name, closeErr)
	}

	sc := scoreRun(arr, exact, rep.decisions, wl.rule)
	lat := make([]time.Duration, 0, len(rep.decisions))
	for _, dc := range rep.decisions {
		if !dc.failed {
			lat = append(lat, dc.end-dc.start)
		}
	}
	q := quantiles(lat, 0.50, 0.99, 0.999)
	lag := quantiles(rep.lag, 0.99, 1)
	n := float64(len(arr))
	res := result{
		Workload: wl.name, System: sys.name, Label: sys.label,
		Arrivals: len(arr), Decisions: len(arr), Elapsed: rep.elapsed, Length: d, Workers: rep.workers,
		LagP99: float64(lag[0]), LagMax: float64(lag[1]),
		ExactAdmitted: sc.exactAdmitted, Admitted: sc.admitted, Failed: sc.failed,
		Lost: sc.lost, Extra: sc.extra, LostPct: sc.lostPct(), ExtraPct: sc.extraPct(),
		WindowsChecked: true, Held: sc.held(),
		P50: float64(q[0]), P99: float64(q[1]), P999: float64(q[2]),
		UsesRedis: sys.usesRdb, UsesDaemon: sys.usesSrv,
	}
	if rep.elapsed > 0 {
		res.PerSecond = n / rep.elapsed.Seconds()
	}
	if sc.hasWorst {
		res.Worst = sc.worst
		res.WorstKey = keys[sc.worst.key]
		res.HasWorst = true
	}
	res.setCosts(before, after, bg, float64(r.calls()-calls0), n)
	if r.sdk != nil {
		res.SDK = sdkResultOf(r.sdk(), rep.decisions)
		res.SDK.TokensHeld, res.SDK.HeldKnown = held, true
		res.SDK.Debt, res.SDK.DebtKnown = debt, debtKnown
	}
	reportMetrics(b, &res)
	record(res)
}

// setCosts fills the per-decision costs from the snapshots around the run,
// and the cores other processes kept busy between them. The net Redis
// commands are the gross less the fleet view's commands between the
// snapshots, and less the rest of the background bg, at its rate, over
// the time between them (see background).
func (r *result) setCosts(before, after snap, bg background, calls, n float64) {
	if n == 0 {
		return
	}
	r.Calls = calls / n
	gross := float64(after.redisCmds - before.redisCmds)
	r.RedisCmds = gross / n
	r.RedisBackground = bg.otherPerSecond()
	peer := float64(after.peerCmds - before.peerCmds)
	r.RedisPeer = peer / n
	r.RedisNet = max(0, gross-peer-r.RedisBackground*after.at.Sub(before.at).Seconds()) / n
	r.RedisByCmd = make(map[string]float64)
	for name, c := range after.redisBy {
		if d := c - before.redisBy[name]; d > 0 {
			r.RedisByCmd[name] = float64(d) / n
		}
	}
	r.ClientCPU = float64(after.cpu-before.cpu) / n
	r.RedisCPU = float64(after.redisCPU-before.redisCPU) / n
	r.DaemonCPU = float64(after.daemonCPU-before.daemonCPU) / n
	if r.UsesRedis {
		r.ServerCPU += r.RedisCPU
	}
	if r.UsesDaemon {
		r.ServerCPU += r.DaemonCPU
	}
	if wall := after.at.Sub(before.at); wall > 0 {
		ours := (after.cpu - before.cpu) + (after.redisCPU - before.redisCPU) + (after.daemonCPU - before.daemonCPU)
		r.OtherCores = max(0, float64(after.machine-before.machine-ours)+float64(after.steal-before.steal)) / float64(wall)
	}
}

// sdkResultOf sums the SDK's counters and its decisions by source.
func sdkResultOf(st client.Stats, ds []decision) *sdkResult {
	s := &sdkResult{
		ServerCalls: st.ServerCalls, ServerErrors: st.ServerErrors,
		FallbackDecisions: st.FallbackDecisions, MaxKeysHeld: st.MaxKeysHeld,
		BySource: make(map[string]int64),
	}
	for _, d := range ds {
		if !d.failed {
			s.BySource[client.Source(d.source).String()]++
		}
	}
	return s
}

func reportMetrics(b *testing.B, r *result) {
	b.ReportMetric(r.PerSecond, "decisions/s")
	b.ReportMetric(r.LostPct, "lost-%")
	b.ReportMetric(r.ExtraPct, "extra-%")
	if r.HasWorst {
		b.ReportMetric(r.Worst.excess(), "worst-excess")
	}
	b.ReportMetric(r.P99, "p99-ns")
	b.ReportMetric(r.Calls, "calls/decision")
	b.ReportMetric(r.RedisCmds, "redis-cmds/decision")
	if r.UsesRedis {
		b.ReportMetric(r.RedisNet, "redis-cmds-net/decision")
	}
	if r.Workers > 0 {
		b.ReportMetric(float64(r.Workers), "workers")
	}
	if r.SDK != nil && r.SDK.HeldKnown {
		b.ReportMetric(float64(r.SDK.TokensHeld), "tokens-held-at-end")
	}
	if r.SDK != nil && r.SDK.DebtKnown {
		b.ReportMetric(r.SDK.Debt, "debt-at-end")
	}
}

// runCapacity is the hot-path run: sys decides on one key as fast as it can,
// closed loop, for d (at most maxCapacityRun), after a warm-up on the same key (the limit never
// binds, so the warm-up costs the run nothing). No arrival schedule: every
// system makes as many decisions as it can, and what is compared is how
// many. Since the run's decisions are fewer than the burst, the exact
// bucket admits them all and no window can exceed the bound: lost is the
// decisions denied, and the bound holds by count.
func runCapacity(b *testing.B, e *env, sys *system, wl *workload, d time.Duration) {
	d = min(d, maxCapacityRun)
	key := wl.key(currentTag(sys.tag), 0)
	bg := e.measureBackground(b, sys)
	r := sys.setup(b, e, wl)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.close(ctx)
	}()
	par := runtime.GOMAXPROCS(0)
	warm := warmNetwork
	mask := uint64(1)<<localSampleShift - 1
	if sys.network {
		par *= netParallelism
		mask = 0
	}
	if r.sdk != nil {
		warm = warmLocal
	}
	ctx := context.Background()
	closedLoop(ctx, par, time.Now().Add(warm), func(*loopState) bool {
		return r.decide(ctx, 0, key).allowed
	})

	runtime.GC()
	before := e.countedSnapshot(b, false)
	calls0 := r.calls()
	b.ResetTimer()
	start := time.Now()
	total, allowed, st := closedLoop(ctx, par, start.Add(d), func(ls *loopState) bool {
		var dc decision
		if ls.x&mask == 0 {
			t0 := time.Since(clockBase)
			dc = r.decide(ctx, 0, key)
			ls.lat.record(int64(time.Since(clockBase) - t0))
		} else {
			dc = r.decide(ctx, 0, key)
		}
		ls.sources[dc.source]++
		return dc.allowed
	})
	elapsed := time.Since(start)
	b.StopTimer()
	calls := float64(r.calls() - calls0)
	after := e.countedSnapshot(b, true)

	n := float64(total)
	lat := &st.lat
	res := result{
		Workload: wl.name, System: sys.name, Label: sys.label, Capacity: true,
		Decisions: int(total), Elapsed: elapsed, Length: d, Goroutines: par,
		ExactAdmitted: total, Admitted: allowed, Lost: total - allowed,
		P50: lat.quantile(0.50), P99: lat.quantile(0.99), P999: lat.quantile(0.999),
		Samples: lat.n, SampleEvery: int(mask + 1),
		UsesRedis: sys.usesRdb, UsesDaemon: sys.usesSrv,
	}
	if total > wl.rule.burst {
		// More decisions than the burst: the count alone no longer
		// shows that the exact bucket admitted them all.
		b.Errorf("%s/%s: %d decisions, more than the burst %d: raise hotRule", wl.name, sys.name, total, wl.rule.burst)
	}
	res.LostPct = pct(res.Lost, res.ExactAdmitted)
	res.Held = allowed <= wl.rule.burst
	if elapsed > 0 {
		res.PerSecond = n / elapsed.Seconds()
	}
	res.setCosts(before, after, bg, calls, n)
	if r.sdk != nil {
		res.SDK = &sdkResult{BySource: make(map[string]int64)}
		cs := r.sdk()
		res.SDK.ServerCalls, res.SDK.ServerErrors, res.SDK.FallbackDecisions, res.SDK.MaxKeysHeld =
			cs.ServerCalls, cs.ServerErrors, cs.FallbackDecisions, cs.MaxKeysHeld
		for i, v := range st.sources {
			if v > 0 {
				res.SDK.BySource[client.Source(i).String()] = v
			}
		}
	}
	reportMetrics(b, &res)
	record(res)
}

// loopState is one closed-loop goroutine's own: a xorshift value, new for
// each decision (which decisions to time), the latencies timed and the
// decisions by source, merged after the run (no shared write while
// deciding).
type loopState struct {
	x       uint64
	lat     hist
	sources [256]int64
}

// closedLoop runs par goroutines, each calling decide back to back until
// deadline (read every 64 decisions) or maxCapacityDecisions, and returns
// the decisions made, those allowed, and the goroutines' states merged.
func closedLoop(ctx context.Context, par int, deadline time.Time, decide func(ls *loopState) bool) (total, allowed int64, merged *loopState) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	merged = new(loopState)
	for g := range par {
		wg.Go(func() {
			ls := &loopState{x: uint64(g+1)*0x9E3779B97F4A7C15 | 1}
			var all, ok int64
			for i := int64(0); i < maxCapacityDecisions; i++ {
				if i&63 == 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
					break
				}
				ls.x ^= ls.x << 13
				ls.x ^= ls.x >> 7
				ls.x ^= ls.x << 17
				all++
				if decide(ls) {
					ok++
				}
			}
			mu.Lock()
			total += all
			allowed += ok
			merged.lat.merge(&ls.lat)
			for i, v := range ls.sources {
				merged.sources[i] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return total, allowed, merged
}

// measureTimerFloor times nothing the way capacity runs time decisions, so
// that the report can say what the clock reads add.
func measureTimerFloor() {
	var h hist
	for range 1_000_000 {
		t0 := time.Since(clockBase)
		h.record(int64(time.Since(clockBase) - t0))
	}
	setTimerFloor(h.quantile(0.50), h.quantile(0.99))
}
