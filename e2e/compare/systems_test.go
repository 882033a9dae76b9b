package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
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
	"github.com/ratelease/ratelease/server"
)

// ---------------------------------------------------------------------------
// The processes

// daemons is the number of rateleased processes, all on the one Redis.
const daemons = 2

// env is the redis-server and the rateleased processes every system shares.
type env struct {
	redis   *redistest.Server
	rdb     *redis.Client // INFO only
	daemons []*e2eproc.Daemon
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
	if err := os.WriteFile(rules, []byte(rulesYAML()), 0o600); err != nil {
		b.Fatal(err)
	}
	e := &env{redis: rs, rdb: rs.Client(b)}
	for range daemons {
		d := e2eproc.StartDaemon(b, bin, "-rules", rules, "-redis", rs.URL())
		if host, _, _ := net.SplitHostPort(d.Addr()); host != "127.0.0.1" {
			b.Fatalf("rateleased listens on %s, not loopback", d.Addr())
		}
		e.daemons = append(e.daemons, d)
	}
	info := e.rdb.InfoMap(context.Background(), "server")
	if err := info.Err(); err != nil {
		b.Fatal(err)
	}
	setRedisVersion(info.Item("Server", "redis_version"))
	e.loadScripts(b)
	e.warmDaemonRedis(b)
	return e
}

// daemonRedisWarm is how many decisions warmDaemonRedis sends a rateleased
// process at once, per core of this machine (which the rateleased
// processes share): more than its Redis pool holds (go-redis's default,
// 10 per GOMAXPROCS).
const daemonRedisWarm = 12

// warmDaemonRedis fills the Redis connection pools of the rateleased
// processes, as (b)'s are opened before its runs (MinIdleConns): it sends
// each, a few times, daemonRedisWarm checks at once, each of which holds a
// connection of its pool. A pool otherwise grows during the runs whose
// concurrency exceeds every earlier one's, each new connection a HELLO
// charged to that run: at a workload whose Redis commands per decision tie
// with (b)'s, that decided the comparison.
func (e *env) warmDaemonRedis(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := newTransport()
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var failed atomic.Int64
	for i, d := range e.daemons {
		for round := range 3 {
			var wg sync.WaitGroup
			for j := range daemonRedisWarm * runtime.GOMAXPROCS(0) {
				wg.Go(func() {
					if _, err := postCheck(ctx, hc, d.URL()+protocol.PathCheck, fmt.Sprintf("warm:pool:%d:%d:%d", i, round, j)); err != nil {
						failed.Add(1)
					}
				})
			}
			wg.Wait()
		}
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("warm-up of the rateleased Redis pools: %d checks failed", n)
	}
}

// loadScripts makes one decision of each kind on a key of the warm rule, so
// that every Lua script is in Redis's cache before the first measured run
// (whichever system runs first would otherwise pay for loading it).
func (e *env) loadScripts(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, d := range e.daemons {
		if _, err := postCheck(ctx, http.DefaultClient, d.URL()+protocol.PathCheck, fmt.Sprintf("warm:check:%d", i)); err != nil {
			b.Fatalf("warm-up check: %v", err)
		}
	}
	c, err := client.New(client.Config{Servers: e.urls(0), ClientID: "bench-warm"})
	if err != nil {
		b.Fatal(err)
	}
	if d := c.Allow(ctx, "warm:sdk"); !d.Allowed {
		b.Logf("warm-up: SDK decision not allowed (source %s)", d.Source)
	}
	if err := c.Close(ctx); err != nil {
		b.Logf("warm-up: SDK Close: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr()})
	defer rdb.Close()
	if _, err := redis_rate.NewLimiter(rdb).Allow(ctx, "warm:rr", redis_rate.PerSecond(1000)); err != nil {
		b.Fatalf("warm-up redis_rate: %v", err)
	}
}

// urls returns the rateleased URLs, rotated by first: instance i lists
// server i mod daemons first, so that the instances spread over the
// servers (the SDK talks to the first server that answers).
func (e *env) urls(first int) []string {
	out := make([]string, len(e.daemons))
	for i := range out {
		out[i] = e.daemons[(first+i)%len(e.daemons)].URL()
	}
	return out
}

// idleWindow is how long the Redis commands are counted with no system
// running, before each run of a system that uses Redis: one
// server.PeerInterval, the period of the rateleased processes' heartbeats.
// Their fleet view is counted (see background); what else the window
// finds is normally nothing.
const idleWindow = server.PeerInterval

// background is what Redis counted over an idle window before a run: the
// rateleased processes' periodic work (their fleet view: heartbeats and
// status snapshots), and anything else still reaching Redis then (what
// the previous run left behind). peer is the part of cmds the rateleased
// processes counted as their fleet view's (ratelease_peer_commands_total).
//
// A run's net Redis commands are its gross less the fleet view's commands
// the rateleased processes counted during the run, and less the rest of
// the background at its idle rate over the run's length. The fleet view
// costs the same whatever the traffic (a heartbeat every
// server.PeerInterval, a snapshot every other one), but it comes in
// rounds, and a run holds one more or less whatever its length: at a
// per-user workload, whose Redis commands per decision tie with
// redis_rate's, estimating it from the idle rate decided the comparison,
// so it is counted.
type background struct {
	cmds   int64
	peer   int64
	length time.Duration
}

// perSecond returns the background's commands per second.
func (bg background) perSecond() float64 {
	if bg.length <= 0 {
		return 0
	}
	return float64(bg.cmds) / bg.length.Seconds()
}

// otherPerSecond returns the background's commands per second other than
// the fleet view's.
func (bg background) otherPerSecond() float64 {
	if bg.length <= 0 {
		return 0
	}
	return float64(max(0, bg.cmds-bg.peer)) / bg.length.Seconds()
}

// measureBackground counts the Redis commands over idleWindow, before sys
// is set up (setting it up opens its connections); it measures nothing
// for a system that does not use Redis. The wait is the measurement, not
// a synchronisation.
func (e *env) measureBackground(b *testing.B, sys *system) background {
	b.Helper()
	if !sys.usesRdb {
		return background{}
	}
	before := e.countedSnapshot(b, false)
	time.Sleep(idleWindow)
	after := e.countedSnapshot(b, true)
	return background{cmds: after.redisCmds - before.redisCmds, peer: after.peerCmds - before.peerCmds, length: after.at.Sub(before.at)}
}

// maxDrain bounds drain: how long after a run, its clients closed, the
// harness waits for the rateleased processes to finish the work the run
// left them.
const maxDrain = 5 * time.Second

// drainWindow is drain's quiet window, and drainSlack the commands above
// the idle background it still calls quiet (one round of a rateleased
// process's periodic work is a few).
const (
	drainWindow = 250 * time.Millisecond
	drainSlack  = 8
)

// drain waits, after a run of sys and its clients' Close, until the
// rateleased processes are done with the work the run left them, and
// returns the snapshot that ends the run's measurement: a run's Redis
// commands and CPU are its own, and not the idle background of the next
// system's run. The work is chiefly the buckets a server owned (see
// leases.OwningStore): each is handed back to Redis once unused for half a
// lease TTL. drain waits until no daemon owns a bucket
// (ratelease_owned_buckets), then for a drainWindow in which Redis counts
// no more than the idle background bg would (plus drainSlack), at most
// maxDrain in all. The waits are the measurement, polled on observed
// state, not a synchronisation; the reads of /metrics are the harness's
// own work, their CPU excluded from the run that began at run
// (snap.excludeCPU). The snapshot it returns is counted (countedSnapshot). A
// system that uses no rateleased process leaves them nothing: its run ends
// at once.
func (e *env) drain(b *testing.B, sys *system, bg background, run *snap) snap {
	b.Helper()
	if !sys.usesSrv {
		return e.countedSnapshot(b, true)
	}
	last := e.snapshot(b)
	deadline := last.at.Add(maxDrain)
	for time.Now().Before(deadline) {
		x := e.snapshot(b)
		owned := e.daemonMetric(b, "ratelease_owned_buckets")
		run.excludeCPU(x, e.snapshot(b))
		if owned == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	last = e.snapshot(b)
	for time.Now().Before(deadline) {
		time.Sleep(drainWindow)
		s := e.snapshot(b)
		expect := bg.perSecond() * s.at.Sub(last.at).Seconds()
		if float64(s.redisCmds-last.redisCmds) <= expect+drainSlack {
			return e.countedSnapshot(b, true)
		}
		last = s
	}
	b.Logf("drain: the rateleased processes were still busy %s after the run", maxDrain)
	return e.countedSnapshot(b, true)
}

// daemonMetric sums the unlabelled sample name over the rateleased
// processes' /metrics (0 without rateleased processes).
func (e *env) daemonMetric(b *testing.B, name string) int64 {
	b.Helper()
	var n int64
	for _, d := range e.daemons {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.URL()+"/metrics", nil)
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			b.Fatalf("GET /metrics: %v", err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		_ = resp.Body.Close()
		cancel()
		if err != nil {
			b.Fatalf("GET /metrics: %v", err)
		}
		v, ok := metricValue(string(body), name)
		if !ok {
			b.Fatalf("no %s in %s/metrics", name, d.URL())
		}
		n += int64(v)
	}
	return n
}

// metricValue returns the value of the unlabelled sample name in a
// Prometheus text exposition.
func metricValue(text, name string) (float64, bool) {
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

// snap is what a run is measured against.
type snap struct {
	at        time.Time
	cpu       time.Duration    // this process, user + sys
	redisCmds int64            // INFO commandstats: every command's calls, INFO's own excluded
	redisBy   map[string]int64 // the same by command
	peerCmds  int64            // of those, the rateleased processes' fleet view's (ratelease_peer_commands_total)
	redisCPU  time.Duration
	daemonCPU time.Duration // all rateleased processes
	machine   time.Duration // all CPUs busy, every process (/proc/stat)
	steal     time.Duration // taken by the hypervisor (/proc/stat)
}

// excludeCPU takes the CPU used from x to y (a measurement of the
// harness's own, such as drain's reads of /metrics, which send Redis
// nothing) out of a run that began at s: it moves s's CPU counters forward
// by it, so that after − s no longer counts it. The Redis commands in the
// window stay the run's: the servers' work it left them goes on meanwhile.
func (s *snap) excludeCPU(x, y snap) {
	s.cpu += y.cpu - x.cpu
	s.daemonCPU += y.daemonCPU - x.daemonCPU
}

// exclude is excludeCPU for every counter: x and y must be counted
// snapshots (see countedSnapshot), so that a heartbeat between them leaves
// both the gross and the fleet view's count.
func (s *snap) exclude(x, y snap) {
	s.cpu += y.cpu - x.cpu
	s.redisCmds += y.redisCmds - x.redisCmds
	s.peerCmds += y.peerCmds - x.peerCmds
	by := make(map[string]int64, len(s.redisBy))
	for k, v := range s.redisBy {
		by[k] = v
	}
	for k, v := range y.redisBy {
		by[k] += v - x.redisBy[k]
	}
	s.redisBy = by
	s.redisCPU += y.redisCPU - x.redisCPU
	s.daemonCPU += y.daemonCPU - x.daemonCPU
}

// countedSnapshot is snapshot with the rateleased processes' fleet-view
// commands (peerCmds), read on both sides of INFO, again until no
// heartbeat fell between the two reads, so that the count and INFO's
// agree. Serving /metrics costs the servers some CPU, a fraction of a
// millisecond, which must stay outside what is measured: a snapshot that
// starts a measurement (a run, or the idle window) reads the CPU after
// the counts (cpuFirst false), one that ends it reads the CPU first; a
// measurement of the harness's own taken out of a run (snap.exclude) is
// the other way round, so that its /metrics reads fall inside it. Only
// the ends of those read the count.
func (e *env) countedSnapshot(b *testing.B, cpuFirst bool) snap {
	b.Helper()
	var s snap
	if cpuFirst {
		e.readCPU(b, &s)
	}
	for range 5 {
		p := e.daemonMetric(b, peerMetric)
		e.readRedis(b, &s)
		if q := e.daemonMetric(b, peerMetric); q == p {
			s.peerCmds = p
			if !cpuFirst {
				e.readCPU(b, &s)
			}
			return s
		}
	}
	b.Fatalf("%s kept changing across INFO", peerMetric)
	return snap{}
}

// peerMetric counts a rateleased process's fleet-view Redis commands.
const peerMetric = "ratelease_peer_commands_total"

// snapshot reads every counter a measurement needs but the fleet view's
// (see countedSnapshot).
func (e *env) snapshot(b *testing.B) snap {
	b.Helper()
	var s snap
	e.readCPU(b, &s)
	e.readRedis(b, &s)
	return s
}

// readCPU reads the CPU counters into s, and the time.
func (e *env) readCPU(b *testing.B, s *snap) {
	b.Helper()
	s.at = time.Now()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	for _, d := range e.daemons {
		c, err := procCPU(d.PID())
		if err != nil {
			b.Fatal(err)
		}
		s.daemonCPU += c
	}
	var err error
	if s.machine, s.steal, err = machineCPU(); err != nil {
		b.Fatal(err)
	}
}

// readRedis reads Redis's counters into s (INFO commandstats and cpu).
func (e *env) readRedis(b *testing.B, s *snap) {
	b.Helper()
	txt, err := e.rdb.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatalf("INFO: %v", err)
	}
	if s.redisBy, err = commandStats(txt); err != nil {
		b.Fatal(err)
	}
	s.redisCmds = 0
	for _, n := range s.redisBy {
		s.redisCmds += n
	}
	if s.redisCPU, err = redisCPU(txt); err != nil {
		b.Fatal(err)
	}
}

// commandCalls sums the calls of every command in the text of INFO
// commandstats (cmdstat_<name>:calls=N,usec=…), except INFO itself. Redis
// counts there the commands a Lua script runs too, so a script's call
// counts as 1 + the commands it ran.
func commandCalls(info string) (int64, error) {
	by, err := commandStats(info)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, n := range by {
		total += n
	}
	return total, nil
}

// commandStats returns the calls of each command in the text of INFO
// commandstats, by command name, INFO itself excluded.
func commandStats(info string) (map[string]int64, error) {
	by := make(map[string]int64)
	found := false
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		found = true
		name = strings.TrimPrefix(name, "cmdstat_")
		if name == "info" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("INFO commandstats: %q: %w", line, err)
				}
				by[name] += n
			}
		}
	}
	if !found {
		return nil, errors.New("INFO commandstats: no cmdstat_ line")
	}
	return by, nil
}

// redisCPU returns used_cpu_user + used_cpu_sys from the text of INFO cpu.
func redisCPU(info string) (time.Duration, error) {
	var sum float64
	n := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu: %q: %w", line, err)
			}
			sum += f
			n++
		}
	}
	if n != 2 {
		return 0, errors.New("INFO cpu: no used_cpu_user and used_cpu_sys")
	}
	return time.Duration(sum * float64(time.Second)), nil
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

// runner is one system set up for one run of one workload.
type runner struct {
	decide decideFunc
	// calls counts the calls that left this process so far: lease-server
	// calls for (a), Redis round trips for (b), HTTP calls for (c).
	calls func() int64
	// close ends the instances; its work (for (a), returning leases)
	// counts in the run.
	close func(ctx context.Context) error
	// sdk, for (a), sums the instances' Stats.
	sdk func() client.Stats
}

type system struct {
	name     string // sub-benchmark name
	tag      string // key prefix, with the run's number
	label    string // for the report
	network  bool   // a decision waits for a round trip
	matrix   bool   // runs the open-loop workloads (else only hot and hot-path)
	usesRdb  bool   // its decisions use redis-server
	usesSrv  bool   // its decisions use rateleased
	setup    func(b *testing.B, e *env, wl *workload) *runner
	capacity bool // runs hot-path
}

var systems = []system{
	{
		name: "a-lease-sdk", tag: "a", label: "(a) ratelease SDK",
		matrix: true, capacity: true, usesRdb: true, usesSrv: true, setup: setupSDK,
	},
	{
		name: "b-redis-rate", tag: "b", label: "(b) redis_rate, one GCRA call per decision",
		network: true, matrix: true, capacity: true, usesRdb: true, setup: setupRedisRate,
	},
	{
		name: "c-http-check", tag: "c", label: "(c) POST /v1/check per decision",
		network: true, matrix: true, capacity: true, usesRdb: true, usesSrv: true, setup: setupCheck,
	},
	{
		name: "d-x-time-rate", tag: "d", label: "(d) x/time/rate per instance, local only",
		capacity: true, setup: setupXTimeRate,
	},
}

// runs reports whether sys runs on wl: (d), which limits each instance on
// its own, only on the two hot workloads, where no limit binds.
func (sys *system) runs(wl *workload) bool {
	if wl.capacity {
		return sys.capacity
	}
	return sys.matrix || wl.rule == hotRule
}

// warmPools opens n connections of hc to url at once (GET /readyz), so that
// a run does not pay for dialing.
func warmPools(ctx context.Context, hc *http.Client, url string, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
			if err != nil {
				return
			}
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

func newTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 512
	tr.MaxIdleConnsPerHost = 256
	return tr
}

// setupSDK: (a), wl.instances Client instances with the SDK's defaults, as
// a new user would write them, each with its own client_id and HTTP pool,
// instance i listing rateleased i mod 2 first.
func setupSDK(b *testing.B, e *env, wl *workload) *runner {
	b.Helper()
	cs := make([]*client.Client, wl.instances)
	seq := runSeq.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range cs {
		hc := &http.Client{Transport: newTransport()}
		c, err := client.New(client.Config{
			Servers:    e.urls(i),
			ClientID:   fmt.Sprintf("bench-%s-%d-%d", wl.name, seq, i),
			HTTPClient: hc,
		})
		if err != nil {
			b.Fatal(err)
		}
		warmPools(ctx, hc, e.urls(i)[0], 4)
		cs[i] = c
	}
	sum := func() client.Stats {
		var s client.Stats
		for _, c := range cs {
			st := c.Stats()
			s.Allowed += st.Allowed
			s.Denied += st.Denied
			s.ServerCalls += st.ServerCalls
			s.ServerErrors += st.ServerErrors
			s.FallbackDecisions += st.FallbackDecisions
			s.KeysHeld += st.KeysHeld
			s.MaxKeysHeld += st.MaxKeysHeld
			s.TokensHeld += st.TokensHeld
		}
		return s
	}
	var closeOnce sync.Once
	return &runner{
		decide: func(ctx context.Context, inst int, key string) decision {
			d := cs[inst].Allow(ctx, key)
			return decision{allowed: d.Allowed, source: uint8(d.Source)}
		},
		calls: func() int64 { return sum().ServerCalls },
		close: func(ctx context.Context) error {
			var err error
			closeOnce.Do(func() {
				errs := make([]error, len(cs))
				var wg sync.WaitGroup
				for i, c := range cs {
					wg.Go(func() { errs[i] = c.Close(ctx) })
				}
				wg.Wait()
				err = errors.Join(errs...)
			})
			return err
		},
		sdk: sum,
	}
}

// countHook counts the round trips (a command or a pipeline) a go-redis
// client makes.
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

// redisRateLimit is the rule as redis_rate states it: GCRA with the same
// rate and burst, which is the same token bucket.
func redisRateLimit(r rule) redis_rate.Limit {
	return redis_rate.Limit{Rate: int(r.limit), Period: r.period, Burst: int(r.burst)}
}

// rrPool is the Redis pool of each of (b)'s go-redis clients, all of it
// opened before the run (see fillPool): the most decisions one instance
// has in flight (the hot-path run's goroutines), and more than enough for
// the others.
func rrPool() int { return netParallelism * runtime.GOMAXPROCS(0) }

// fillPool opens rdb's whole pool and readies each connection (go-redis
// sends a connection's HELLO at its first command, not when it dials it):
// it holds PoolSize connections at once, each with a PING, then puts them
// back. The run then opens and readies none, as the rateleased processes'
// pools, filled once (warmDaemonRedis), and no HELLO is charged to either.
func fillPool(b *testing.B, rdb *redis.Client) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conns := make([]*redis.Conn, rdb.Options().PoolSize)
	for i := range conns {
		conns[i] = rdb.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			b.Fatalf("redis pool: %v", err)
		}
	}
	for _, c := range conns {
		if err := c.Close(); err != nil {
			b.Fatalf("redis pool: %v", err)
		}
	}
}

// setupRedisRate: (b), one go-redis client (its own pool, opened in full
// up front) per instance and one redis_rate Limiter.Allow, a GCRA Lua
// script (EVALSHA), per decision.
func setupRedisRate(b *testing.B, e *env, wl *workload) *runner {
	b.Helper()
	var n atomic.Int64
	lims := make([]*redis_rate.Limiter, wl.instances)
	rdbs := make([]*redis.Client, wl.instances)
	for i := range lims {
		rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr(), PoolSize: rrPool()})
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
		fillPool(b, rdb)
		rdb.AddHook(countHook{&n})
		rdbs[i] = rdb
		lims[i] = redis_rate.NewLimiter(rdb)
	}
	limit := redisRateLimit(wl.rule)
	return &runner{
		decide: func(ctx context.Context, inst int, key string) decision {
			res, err := lims[inst].Allow(ctx, key, limit)
			if err != nil {
				return decision{failed: true}
			}
			return decision{allowed: res.Allowed > 0}
		},
		calls: n.Load,
		close: func(context.Context) error {
			var errs []error
			for _, rdb := range rdbs {
				errs = append(errs, rdb.Close())
			}
			return errors.Join(errs...)
		},
	}
}

// postCheck makes one POST /v1/check for key and returns whether it was
// allowed.
func postCheck(ctx context.Context, hc *http.Client, url, key string) (bool, error) {
	one := int64(1)
	body, err := json.Marshal(protocol.CheckRequest{Keys: []string{key}, Cost: &one})
	if err != nil {
		return false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	var cr protocol.CheckResponse
	err = json.NewDecoder(resp.Body).Decode(&cr)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("POST %s: %s", url, resp.Status)
	}
	if err != nil {
		return false, fmt.Errorf("POST %s: %w", url, err)
	}
	return cr.Allowed, nil
}

// setupCheck: (c), a plain net/http client (keep-alive, JSON), instance i
// asking rateleased i mod 2.
func setupCheck(b *testing.B, e *env, wl *workload) *runner {
	b.Helper()
	tr := newTransport()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	urls := make([]string, len(e.daemons))
	for i, d := range e.daemons {
		urls[i] = d.URL() + protocol.PathCheck
		warmPools(ctx, hc, d.URL(), 8)
	}
	var n atomic.Int64
	return &runner{
		decide: func(ctx context.Context, inst int, key string) decision {
			n.Add(1)
			ok, err := postCheck(ctx, hc, urls[inst%len(urls)], key)
			if err != nil {
				return decision{failed: true}
			}
			return decision{allowed: ok}
		},
		calls: n.Load,
		close: func(context.Context) error { tr.CloseIdleConnections(); return nil },
	}
}

// setupXTimeRate: (d), one x/time/rate limiter per key and instance, built
// up front (read-only while deciding, so no lock around the map): each
// instance limits on its own, so the limit is not global.
func setupXTimeRate(b *testing.B, e *env, wl *workload) *runner {
	b.Helper()
	tag := currentTag("d")
	ms := make([]map[string]*rate.Limiter, wl.instances)
	for i := range ms {
		ms[i] = make(map[string]*rate.Limiter, wl.keys)
		for _, k := range wl.keyNames(tag) {
			ms[i][k] = rate.NewLimiter(rate.Limit(wl.rule.perSecond()), int(wl.rule.burst))
		}
	}
	return &runner{
		decide: func(_ context.Context, inst int, key string) decision {
			l := ms[inst][key]
			return decision{allowed: l != nil && l.Allow()}
		},
		calls: func() int64 { return 0 },
		close: func(context.Context) error { return nil },
	}
}

// runSeq numbers the runs, so that each run has keys (and client ids) of
// its own even when a sub-benchmark runs again (-count, -benchtime Nx):
// a bucket drained by one run must not start the next.
var runSeq atomic.Int64

// currentTag is the key tag of system tag in the current run.
func currentTag(tag string) string { return fmt.Sprintf("%s%d", tag, runSeq.Load()) }

// maxDebtKeys bounds the keys whose bucket levels debtAt reads.
const maxDebtKeys = 64

// debtAt returns what the token buckets of keys owe the refill right now,
// read from the first rateleased (GET /v1/keys/{key}): per key, the most
// negative level among its rule's limits, summed over the keys: the tokens
// deferred grants took ahead of the refill. ok is false, with the reason
// logged, when there are more than maxDebtKeys keys or a read failed. Each
// read runs a script on Redis: the caller takes that work out of the run
// (snap.exclude).
func (e *env) debtAt(ctx context.Context, keys []string) (debt float64, ok bool) {
	if len(keys) > maxDebtKeys {
		return 0, false
	}
	for _, k := range keys {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.daemons[0].URL()+protocol.PathKeysPrefix+url.PathEscape(k), nil)
		if err != nil {
			return 0, false
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Printf("compare: debt of %q: %v", k, err)
			return 0, false
		}
		var ks protocol.KeyStateResponse
		err = json.NewDecoder(resp.Body).Decode(&ks)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			log.Printf("compare: debt of %q: %s: %v", k, resp.Status, err)
			return 0, false
		}
		owed := 0.0
		for _, l := range ks.Limits {
			owed = max(owed, -l.Level)
		}
		debt += owed
	}
	return debt, true
}
