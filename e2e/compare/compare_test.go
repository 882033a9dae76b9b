package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

const (
	// Every key's limit: limitTokens per limitPeriod, burst limitTokens.
	// That is 1e8 per second, several times any demand this machine can
	// make, from a bucket no run can empty, so every decision is allowed and
	// the limiter's own cost is what shows. Why not 1e9 per second: the
	// burst can be at most protocol.MaxCount (1e9), so that bucket would
	// fill in 1 s, and the SDK caps a batch at a quarter of the fill time
	// (a fair-share rule for shared keys): batches of 250 ms of demand,
	// renewed with about 60 ms to spare, which a loaded 2-core machine does
	// not always make; the lease then runs dry and decisions are denied
	// though the limit is far away. With a 10 s fill the batches are sized
	// by the SDK's horizon (1 s of demand), as for any key whose limit is
	// far above its demand.
	limitTokens  = 1_000_000_000
	limitPeriod  = 10 * time.Second
	limitRate    = float64(limitTokens) / float64(limitPeriod/time.Second) // per second
	zipfKeys     = 1000
	zipfS, zipfV = 1.1, 1.0
	seqLen       = 1 << 16 // key ids drawn up front, walked round by each goroutine

	// netParallelism is b.SetParallelism for the systems bound by a network
	// round trip (b, c): goroutines = netParallelism x GOMAXPROCS.
	netParallelism = 8
	// localSampleShift: the local systems (a, d) time a random 1 in
	// 1<<localSampleShift decisions; the network ones time every decision.
	localSampleShift = 4

	warmLocal   = 1500 * time.Millisecond // a: lets the client's demand average settle
	warmNetwork = 300 * time.Millisecond

	// Decisions timed one at a time by one goroutine, after the warm-up.
	serialLocal   = 200_000
	serialNetwork = 3_000
)

// rules for rateleased: one rule for every benchmark key, every other key
// denied (so a typo fails the benchmark instead of being unlimited). The
// lease TTL is the default (2 s), so leases renew during a run.
const rulesYAML = `default: deny
rules:
  - name: bench
    match: "bench:*"
    algorithm: token_bucket
    limit: 1000000000   # limitTokens
    period: 10s         # limitPeriod
`

// clockBase is the origin of the monotonic clock reads that time decisions:
// time.Since(clockBase) reads only the monotonic clock (one vDSO call).
var clockBase = time.Now()

// errDenied marks a decision that was not "allowed".
var errDenied = errors.New("denied")

// ---------------------------------------------------------------------------
// Workloads

type workload struct {
	name string
	keys []string // key id -> key
	seq  []int32  // seqLen key ids: the order decisions take
}

// zipfSeq is the Zipf-distributed sequence of key ids, the same for every
// system.
var zipfSeq = sync.OnceValue(func() []int32 {
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, zipfS, zipfV, zipfKeys-1)
	s := make([]int32, seqLen)
	for i := range s {
		s[i] = int32(z.Uint64())
	}
	return s
})

// makeWorkloads returns the workloads with keys under "bench:<tag>:", so
// that each system has buckets of its own.
func makeWorkloads(tag string) []workload {
	hot := workload{name: "hot", keys: []string{"bench:" + tag + ":hot"}, seq: make([]int32, seqLen)}
	zipf := workload{name: "zipf", keys: make([]string, zipfKeys), seq: zipfSeq()}
	for i := range zipf.keys {
		zipf.keys[i] = fmt.Sprintf("bench:%s:user:%04d", tag, i)
	}
	return []workload{hot, zipf}
}

// distinct returns the keys the workload's sequence uses.
func (w *workload) distinct() []string {
	seen := make(map[int32]bool)
	var out []string
	for _, id := range w.seq {
		if !seen[id] {
			seen[id] = true
			out = append(out, w.keys[id])
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// The processes

// env is the redis-server and rateleased shared by every system.
type env struct {
	redis  *redistest.Server
	rdb    *redis.Client // INFO only
	daemon *e2eproc.Daemon
}

func startEnv(b *testing.B) *env {
	b.Helper()
	rs := redistest.Start(b)
	dir := b.TempDir()
	bin, err := e2eproc.Build(dir, "github.com/ratelease/ratelease/server/cmd/rateleased")
	if err != nil {
		b.Fatal(err)
	}
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(rulesYAML), 0o600); err != nil {
		b.Fatal(err)
	}
	d := e2eproc.StartDaemon(b, bin, "-rules", rules, "-redis", rs.URL())
	if host, _, _ := net.SplitHostPort(d.Addr()); host != "127.0.0.1" {
		b.Fatalf("rateleased listens on %s, not loopback", d.Addr())
	}
	e := &env{redis: rs, rdb: rs.Client(b), daemon: d}
	info := e.rdb.InfoMap(context.Background(), "server")
	if err := info.Err(); err != nil {
		b.Fatal(err)
	}
	setRedisVersion(info.Item("Server", "redis_version"))
	return e
}

// procCPU returns the user+sys CPU time of process pid (all threads), at
// the resolution of clock ticks (USER_HZ, 100 on Linux).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const userHZ = 100
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// snap is what a run is measured against.
type snap struct {
	cpu       time.Duration // this process, user + sys
	mallocs   uint64
	calls     int64 // calls that left this process (per system)
	redisCmds int64
	redisCPU  time.Duration
	daemonCPU time.Duration
	machine   time.Duration // all CPUs busy, every process (/proc/stat)
	steal     time.Duration // taken by the hypervisor (/proc/stat)
}

func (e *env) snapshot(b *testing.B, inst *instance) snap {
	var s snap
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.mallocs = ms.Mallocs
	s.calls = inst.calls()
	info := e.rdb.InfoMap(context.Background(), "stats", "cpu")
	if err := info.Err(); err != nil {
		b.Fatal(err)
	}
	cmds, err1 := strconv.ParseInt(info.Item("Stats", "total_commands_processed"), 10, 64)
	user, err2 := strconv.ParseFloat(info.Item("CPU", "used_cpu_user"), 64)
	sys, err3 := strconv.ParseFloat(info.Item("CPU", "used_cpu_sys"), 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		b.Fatalf("INFO stats cpu: %v", err)
	}
	s.redisCmds = cmds
	s.redisCPU = time.Duration((user + sys) * float64(time.Second))
	var err error
	if s.daemonCPU, err = procCPU(e.daemon.PID()); err != nil {
		b.Fatal(err)
	}
	if s.machine, s.steal, err = machineCPU(); err != nil {
		b.Fatal(err)
	}
	return s
}

// machineCPU returns the busy time of all CPUs (user, nice, system, irq,
// softirq) and the time stolen by the hypervisor, from /proc/stat.
func machineCPU() (busy, steal time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	const userHZ = 100
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
	// user nice system idle iowait irq softirq steal
	return tick(v[0] + v[1] + v[2] + v[5] + v[6]), tick(v[7]), nil
}

// ---------------------------------------------------------------------------
// The systems

// instance is one system set up for one workload.
type instance struct {
	// decide makes one decision; nil means allowed.
	decide func(key string) error
	// calls counts the calls that left this process so far.
	calls func() int64
	// ready, if set, checks after the warm-up that the instance is in its
	// steady state.
	ready func(wl *workload) error
}

type system struct {
	name        string // sub-benchmark name
	tag         string // key prefix
	label       string // for the report
	parallelism int    // b.SetParallelism; 0: default (1)
	sampleShift uint   // time 1 in 1<<sampleShift decisions
	warm        time.Duration
	useRedis    bool // the decisions use redis-server
	useDaemon   bool // the decisions use rateleased
	setup       func(b *testing.B, e *env, wl *workload) *instance
}

var systems = []system{
	{
		name: "a-lease-sdk", tag: "a", label: "(a) ratelease SDK (leases)",
		sampleShift: localSampleShift, warm: warmLocal, useRedis: true, useDaemon: true,
		setup: setupLeases,
	},
	{
		name: "b-redis-gcra", tag: "b", label: "(b) Redis GCRA per request (redis_rate)",
		parallelism: netParallelism, warm: warmNetwork, useRedis: true,
		setup: setupRedisRate,
	},
	{
		name: "c-http-check", tag: "c", label: "(c) rateleased POST /v1/check per request",
		parallelism: netParallelism, warm: warmNetwork, useRedis: true, useDaemon: true,
		setup: setupCheck,
	},
	{
		name: "d-x-time-rate", tag: "d", label: "(d) x/time/rate, local only",
		sampleShift: localSampleShift, warm: warmNetwork,
		setup: setupXTimeRate,
	},
}

// setupLeases: (a), the SDK with its defaults except the batch sizes: a
// first batch of 1e6 and batches of up to 1e9 (protocol.MaxCount), since
// the demand here is tens of millions per second per key. Each batch is
// still the key's demand over min(Horizon, TTL/2) = 1 s.
func setupLeases(b *testing.B, e *env, wl *workload) *instance {
	c, err := client.New(client.Config{
		Servers:      []string{e.daemon.URL()},
		InitialBatch: 1_000_000,
		MaxBatch:     protocol.MaxCount,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	ctx := context.Background()
	return &instance{
		decide: func(key string) error {
			d := c.Allow(ctx, key)
			if !d.Allowed || d.Source != client.SourceLease {
				return fmt.Errorf("%w: %q allowed=%v source=%s", errDenied, key, d.Allowed, d.Source)
			}
			return nil
		},
		calls: func() int64 { return c.Stats().ServerCalls },
		ready: func(wl *workload) error {
			keys := wl.distinct()
			for _, k := range keys {
				if d := c.Allow(ctx, k); !d.Allowed || d.Source != client.SourceLease {
					return fmt.Errorf("after warm-up, %q: allowed=%v source=%s", k, d.Allowed, d.Source)
				}
			}
			st := c.Stats()
			if st.KeysHeld < len(keys) || st.ServerErrors > 0 || !st.Online {
				return fmt.Errorf("after warm-up: %d keys held of %d, %d server errors, online=%v",
					st.KeysHeld, len(keys), st.ServerErrors, st.Online)
			}
			return nil
		},
	}
}

// countHook counts the commands (and pipelines) a go-redis client sends.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// setupRedisRate: (b), GCRA in one Lua script per decision (EVALSHA). The
// go-redis pool (default 10 x GOMAXPROCS connections) is larger than the
// number of goroutines, so no goroutine waits for a connection.
func setupRedisRate(b *testing.B, e *env, wl *workload) *instance {
	rdb := e.redis.Client(b)
	var n atomic.Int64
	rdb.AddHook(countHook{&n})
	lim := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: limitTokens, Burst: limitTokens, Period: limitPeriod}
	ctx := context.Background()
	return &instance{
		decide: func(key string) error {
			res, err := lim.Allow(ctx, key, limit)
			if err != nil {
				return err
			}
			if res.Allowed != 1 {
				return fmt.Errorf("%w: %q: %+v", errDenied, key, *res)
			}
			return nil
		},
		calls: n.Load,
	}
}

// setupCheck: (c), a plain net/http client with keep-alive and an idle
// pool larger than the number of goroutines, JSON in and out.
func setupCheck(b *testing.B, e *env, wl *workload) *instance {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 256
	tr.MaxIdleConnsPerHost = 256
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	b.Cleanup(tr.CloseIdleConnections)
	url := e.daemon.URL() + protocol.PathCheck
	one := int64(1)
	var n atomic.Int64
	return &instance{
		decide: func(key string) error {
			body, err := json.Marshal(protocol.CheckRequest{Keys: []string{key}, Cost: &one})
			if err != nil {
				return err
			}
			n.Add(1)
			resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				return err
			}
			var cr protocol.CheckResponse
			err = json.NewDecoder(resp.Body).Decode(&cr)
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("POST %s: %s", url, resp.Status)
			}
			if err != nil {
				return fmt.Errorf("POST %s: %w", url, err)
			}
			if !cr.Allowed {
				return fmt.Errorf("%w: %q: %+v", errDenied, key, cr)
			}
			return nil
		},
		calls: n.Load,
	}
}

// setupXTimeRate: (d), one x/time/rate limiter per key in a map built up
// front (read-only while deciding, so no lock around it).
func setupXTimeRate(b *testing.B, e *env, wl *workload) *instance {
	m := make(map[string]*rate.Limiter, len(wl.keys))
	for _, k := range wl.keys {
		m[k] = rate.NewLimiter(rate.Limit(limitRate), limitTokens)
	}
	return &instance{
		decide: func(key string) error {
			if !m[key].Allow() {
				return fmt.Errorf("%w: %q", errDenied, key)
			}
			return nil
		},
		calls: func() int64 { return 0 },
	}
}

// ---------------------------------------------------------------------------
// The benchmark

// BenchmarkCompare runs every system on every workload against the same
// redis-server and rateleased. See the package documentation.
func BenchmarkCompare(b *testing.B) {
	e := startEnv(b)
	measureTimerFloor()
	for _, sys := range systems {
		b.Run(sys.name, func(b *testing.B) {
			for _, wl := range makeWorkloads(sys.tag) {
				inst := sys.setup(b, e, &wl)
				warmed := false
				var serial hist
				b.Run(wl.name, func(b *testing.B) {
					if !warmed {
						warmed = true
						warmUp(b, &sys, inst, &wl)
						if !b.Failed() {
							probeSerial(b, &sys, inst, &wl, &serial)
						}
					}
					if !b.Failed() {
						measure(b, e, &sys, inst, &wl, &serial)
					}
				})
			}
		})
	}
}

// warmUp runs the workload, unmeasured, for sys.warm with as many
// goroutines as the measured runs, then checks the instance is ready.
// Denials are tolerated here (a key's first lease may be late), not after.
func warmUp(b *testing.B, sys *system, inst *instance, wl *workload) {
	b.Helper()
	par := max(1, sys.parallelism) * runtime.GOMAXPROCS(0)
	deadline := time.Now().Add(sys.warm)
	var wg sync.WaitGroup
	var fails atomic.Int64
	var lastErr atomic.Value
	for g := range par {
		wg.Go(func() {
			pos := g * 7919
			for i := 0; ; i++ {
				if i&63 == 0 && time.Now().After(deadline) {
					return
				}
				if err := inst.decide(wl.keys[wl.seq[pos&(seqLen-1)]]); err != nil {
					fails.Add(1)
					lastErr.Store(err.Error())
					if !errors.Is(err, errDenied) {
						time.Sleep(time.Millisecond) // a failing server: don't spin
					}
				}
				pos++
			}
		})
	}
	wg.Wait()
	if n := fails.Load(); n > 0 {
		b.Logf("warm-up: %d decisions failed (last: %v)", n, lastErr.Load())
	}
	if inst.ready != nil {
		if err := inst.ready(wl); err != nil {
			b.Fatal(err)
		}
	}
}

// probeSerial times decisions made one at a time by one goroutine: the
// latency without queueing behind other goroutines, which for (b) and (c)
// is the bare round trip.
func probeSerial(b *testing.B, sys *system, inst *instance, wl *workload, h *hist) {
	b.Helper()
	n := serialLocal
	if sys.parallelism > 0 {
		n = serialNetwork
	}
	for i := range n {
		key := wl.keys[wl.seq[(i*7919)&(seqLen-1)]]
		t0 := time.Since(clockBase)
		err := inst.decide(key)
		h.record(int64(time.Since(clockBase) - t0))
		if err != nil {
			b.Fatalf("%s/%s, one goroutine: %v", sys.name, wl.name, err)
		}
	}
}

func measure(b *testing.B, e *env, sys *system, inst *instance, wl *workload, serial *hist) {
	b.ReportAllocs()
	if sys.parallelism > 0 {
		b.SetParallelism(sys.parallelism)
	}
	var (
		mu     sync.Mutex
		total  hist
		gid    atomic.Int64
		failed atomic.Bool
	)
	mask := uint64(1)<<sys.sampleShift - 1
	before := e.snapshot(b, inst)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		g := gid.Add(1)
		h := new(hist)
		pos := int(g) * 7919
		x := uint64(g)*0x9E3779B97F4A7C15 | 1 // xorshift state: which decisions are timed
		for pb.Next() {
			key := wl.keys[wl.seq[pos&(seqLen-1)]]
			pos++
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			var err error
			if x&mask == 0 {
				t0 := time.Since(clockBase)
				err = inst.decide(key)
				h.record(int64(time.Since(clockBase) - t0))
			} else {
				err = inst.decide(key)
			}
			if err != nil {
				if failed.CompareAndSwap(false, true) {
					b.Errorf("%s/%s: %v", sys.name, wl.name, err)
				}
				return
			}
		}
		mu.Lock()
		total.merge(h)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	after := e.snapshot(b, inst)
	if failed.Load() || b.Failed() {
		return
	}

	n := float64(b.N)
	r := result{
		System:      sys.name,
		Label:       sys.label,
		Workload:    wl.name,
		N:           b.N,
		Goroutines:  int(gid.Load()),
		Elapsed:     elapsed,
		PerSecond:   n / elapsed.Seconds(),
		Calls1000:   float64(after.calls-before.calls) * 1000 / n,
		P50:         total.quantile(0.50),
		P99:         total.quantile(0.99),
		Samples:     total.n,
		ClientCPU:   float64(after.cpu-before.cpu) / n,
		Allocs:      float64(after.mallocs-before.mallocs) / n,
		RedisCPU:    float64(after.redisCPU-before.redisCPU) / n,
		DaemonCPU:   float64(after.daemonCPU-before.daemonCPU) / n,
		UsesRedis:   sys.useRedis,
		UsesDaemon:  sys.useDaemon,
		SampleEvery: 1 << sys.sampleShift,
		SerialP50:   serial.quantile(0.50),
		SerialP99:   serial.quantile(0.99),
		SerialN:     serial.n,
	}
	ours := (after.cpu - before.cpu) + (after.redisCPU - before.redisCPU) + (after.daemonCPU - before.daemonCPU)
	r.OtherCores = max(0, float64(after.machine-before.machine-ours)) / float64(elapsed)
	r.StealCores = float64(after.steal-before.steal) / float64(elapsed)
	// The INFO of the first snapshot is counted in the second.
	r.RedisCmds = float64(after.redisCmds-before.redisCmds-1) * 1000 / n
	if sys.useRedis {
		r.ServerCPU += r.RedisCPU
	}
	if sys.useDaemon {
		r.ServerCPU += r.DaemonCPU
	}
	b.ReportMetric(r.PerSecond, "decisions/s")
	b.ReportMetric(r.Calls1000, "calls/1000")
	b.ReportMetric(r.RedisCmds, "redis-cmds/1000")
	b.ReportMetric(r.P50, "p50-ns")
	b.ReportMetric(r.P99, "p99-ns")
	b.ReportMetric(r.ClientCPU, "cpu-ns/decision")
	b.ReportMetric(r.ServerCPU, "srv-cpu-ns/decision")
	record(r)
}

// measureTimerFloor times nothing the way decisions are timed, so that the
// report can say what the clock reads add to p50 and p99.
func measureTimerFloor() {
	var h hist
	for range 1_000_000 {
		t0 := time.Since(clockBase)
		h.record(int64(time.Since(clockBase) - t0))
	}
	setTimerFloor(h.quantile(0.50), h.quantile(0.99))
}
