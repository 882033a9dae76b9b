// Package loadgen is the load generator of the end-to-end tests: a client
// process built on the SDK that asks for keys at a configured demand and
// writes, as JSON, how many requests were admitted in each time slot, per
// key, so that a test can merge the slots of many processes and check the
// global bound. The command e2e/cmd/loadgen runs it; the tests decode its
// output into Result.
//
//	loadgen -servers http://127.0.0.1:8081,http://127.0.0.1:8082 \
//	    -key acc:hot -rate 500 -duration 10s -out result.json
//
// With -keys N it spreads the demand over the keys <prefix>0 … <prefix>N-1
// with a Zipf distribution. With -phases the demand first follows a schedule
// of (duration, rate) phases, then stays at -rate:
//
//	loadgen -key cut:hot -phases 1ms@1000,1849ms@0 -rate 5000 -duration 3s
//
// asks once at the start, then nothing until 1.85 s, then 5000 times a
// second. -initial-batch sets the batch the SDK asks for a key with no
// demand history. Slots are counted from -start-unix-ms, so that
// every process of a test uses the same slot grid.
//
// With -schedule-seed the demand is one global arrival schedule (Schedule:
// Poisson arrivals at -rate over -duration, keys drawn as with -keys) shared
// by -procs processes behind a round-robin load balancer: each generates the
// same schedule and issues only its own share (Share), arrival i going to
// process i mod -procs, each at its scheduled time after -start-unix-ms.
// Every arrival of the share is decided, however late, so that a test can
// replay the whole schedule against an exact bucket:
//
//	loadgen -keys 2000 -rate 1200 -duration 8s -schedule-seed 7 -procs 4 -proc 1 \
//	    -start-unix-ms 1700000000000 -out result.json
//
// When ctx ends (the command cancels it on SIGTERM or SIGINT) the run stops
// early; the result is written either way.
package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelease/ratelease/client"
)

// Result is what loadgen writes.
type Result struct {
	ClientID string `json:"client_id"`
	// StartUnixMs and SlotMs define the slot grid.
	StartUnixMs int64 `json:"start_unix_ms"`
	SlotMs      int64 `json:"slot_ms"`
	Requested   int64 `json:"requested"`
	Admitted    int64 `json:"admitted"`
	Denied      int64 `json:"denied"`
	// Slots maps a key to its admitted requests as [first, last, count]
	// triples: count requests were admitted at moments between the start of
	// slot first (read just before Allow) and the end of slot last (read
	// just after). Mostly first == last; a checker that counts a request in
	// a window only when both fall inside never counts one the window did
	// not hold.
	Slots map[string][][3]int64 `json:"slots"`
	// FallbackSlots is Slots for the requests the fallback admitted.
	FallbackSlots map[string][][3]int64 `json:"fallback_slots"`
	// BySource counts admitted requests by client.Source.
	BySource map[string]int64 `json:"by_source"`
	// Schedule is set with -schedule-seed.
	Schedule   *ScheduleRun  `json:"schedule,omitempty"`
	Stats      client.Stats  `json:"stats"`
	CloseError string        `json:"close_error,omitempty"`
	Elapsed    time.Duration `json:"elapsed_ns"`
}

type options struct {
	servers     []string
	clientID    string
	token       string
	key         string
	keys        int
	prefix      string
	zipfS       float64
	rate        float64
	duration    time.Duration
	startUnixMs int64
	slot        time.Duration
	workers     int
	out         string
	fallback    client.Fallback
	maxKeys     int
	seed        uint64
	phases      []phase
	initial     int64
	schedSeed   uint64
	procs       int
	proc        int
	priority    string
}

// phase is a stretch of the demand schedule: rate requests per second for
// d.
type phase struct {
	d    time.Duration
	rate float64
}

// parsePhases parses "dur@rate,dur@rate,…".
func parsePhases(s string) ([]phase, error) {
	var out []phase
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		ds, rs, ok := strings.Cut(strings.TrimSpace(part), "@")
		if !ok {
			return nil, fmt.Errorf("-phases %q: want duration@rate, comma-separated", s)
		}
		d, err := time.ParseDuration(ds)
		if err != nil || d <= 0 || d > time.Hour {
			return nil, fmt.Errorf("-phases %q: duration %q: want 0 < duration <= 1h", s, ds)
		}
		r, err := strconv.ParseFloat(rs, 64)
		if err != nil || r < 0 || r > 1e7 || math.IsNaN(r) {
			return nil, fmt.Errorf("-phases %q: rate %q: want 0 <= rate <= 1e7", s, rs)
		}
		out = append(out, phase{d: d, rate: r})
	}
	return out, nil
}

// demand returns the requests due by elapsed since the start and the rate
// in force then: the phases in order, then rate.
func demand(phases []phase, rate float64, elapsed time.Duration) (due, cur float64) {
	for _, p := range phases {
		if elapsed < p.d {
			return due + p.rate*elapsed.Seconds(), p.rate
		}
		due += p.rate * p.d.Seconds()
		elapsed -= p.d
	}
	return due + rate*elapsed.Seconds(), rate
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	servers := fs.String("servers", env("RATELEASE_SERVERS", "http://127.0.0.1:8080"), "comma-separated lease server URLs (env RATELEASE_SERVERS)")
	fs.StringVar(&o.clientID, "client-id", "", "client ID (default: the SDK's)")
	// No default from the environment: flag prints a flag's default on -h
	// and after a bad flag, and a token is a secret. RATELEASE_TOKEN
	// applies after parsing, when -token is not given.
	fs.StringVar(&o.token, "token", "", "bearer token (env RATELEASE_TOKEN, never printed here)")
	fs.StringVar(&o.key, "key", "hot:key", "the key to ask for (without -keys)")
	fs.IntVar(&o.keys, "keys", 0, "spread demand over this many keys <prefix>0..N-1 (Zipf)")
	fs.StringVar(&o.prefix, "prefix", "user:", "key prefix with -keys")
	fs.Float64Var(&o.zipfS, "zipf-s", 1.1, "Zipf exponent s (> 1) with -keys")
	fs.Float64Var(&o.rate, "rate", 100, "demand: requests per second")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "how long to run")
	fs.Int64Var(&o.startUnixMs, "start-unix-ms", 0, "slot grid origin, Unix ms (default: now)")
	fs.DurationVar(&o.slot, "slot", 10*time.Millisecond, "slot length")
	fs.IntVar(&o.workers, "workers", 4, "goroutines making requests")
	fs.StringVar(&o.out, "out", "", "write the JSON result here (default: stdout)")
	fallback := fs.String("fallback", "safe_rate", "safe_rate, open or closed")
	fs.IntVar(&o.maxKeys, "max-keys", 0, "client MaxKeys (0: the SDK default)")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed for key choice")
	phases := fs.String("phases", "", "demand schedule before -rate applies: comma-separated duration@rate phases, e.g. 1ms@1000,1.8s@0")
	fs.Int64Var(&o.initial, "initial-batch", 0, "client InitialBatch: the batch asked for a key with no demand history (0: the SDK default)")
	fs.Uint64Var(&o.schedSeed, "schedule-seed", 0, "issue a share of the global arrival schedule of this seed (0: no schedule); -rate is the schedule's total rate")
	fs.IntVar(&o.procs, "procs", 1, "with -schedule-seed: the processes sharing the schedule round-robin")
	fs.IntVar(&o.proc, "proc", 0, "with -schedule-seed: this process's number, 0 to -procs-1")
	fs.StringVar(&o.priority, "priority", "", "the client's priority class (critical, high, normal, low; default normal)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "token" })
	if !given {
		o.token = env("RATELEASE_TOKEN", "")
	}
	var err error
	if o.phases, err = parsePhases(*phases); err != nil {
		return o, err
	}
	for _, s := range strings.Split(*servers, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.servers = append(o.servers, s)
		}
	}
	switch *fallback {
	case "safe_rate":
		o.fallback = client.FallbackSafeRate
	case "open":
		o.fallback = client.FallbackOpen
	case "closed":
		o.fallback = client.FallbackClosed
	default:
		return o, fmt.Errorf("-fallback %q: want safe_rate, open or closed", *fallback)
	}
	switch {
	case o.rate <= 0 || o.rate > 1e7:
		return o, fmt.Errorf("-rate %g: want 0 < rate <= 1e7", o.rate)
	case o.duration <= 0 || o.duration > time.Hour:
		return o, fmt.Errorf("-duration %v: want 0 < duration <= 1h", o.duration)
	case o.slot < time.Millisecond:
		return o, fmt.Errorf("-slot %v: want at least 1ms", o.slot)
	case o.workers < 1 || o.workers > 1024:
		return o, fmt.Errorf("-workers %d: want 1 to 1024", o.workers)
	case o.keys < 0 || o.keys > 10_000_000:
		return o, fmt.Errorf("-keys %d: want 0 to 10,000,000", o.keys)
	case o.keys > 0 && o.zipfS <= 1:
		return o, fmt.Errorf("-zipf-s %g: want > 1", o.zipfS)
	case o.initial < 0:
		return o, fmt.Errorf("-initial-batch %d: want 0 or more", o.initial)
	case o.procs < 1 || o.procs > 1024:
		return o, fmt.Errorf("-procs %d: want 1 to 1024", o.procs)
	case o.proc < 0 || o.proc >= o.procs:
		return o, fmt.Errorf("-proc %d: want 0 to -procs-1 (%d)", o.proc, o.procs-1)
	case o.schedSeed != 0 && o.keys == 0:
		return o, errors.New("-schedule-seed needs -keys")
	case o.schedSeed != 0 && len(o.phases) > 0:
		return o, errors.New("-schedule-seed and -phases exclude each other")
	case o.schedSeed != 0 && o.rate*o.duration.Seconds() > 10_000_000:
		return o, fmt.Errorf("-rate %g over -duration %v: a schedule of more than 10,000,000 arrivals", o.rate, o.duration)
	}
	return o, nil
}

// recorder counts admitted requests per key and slot span.
type recorder struct {
	mu       sync.Mutex
	origin   time.Time
	slot     time.Duration
	slots    map[string]map[[2]int64]int64
	fallback map[string]map[[2]int64]int64
	sources  map[string]int64
}

func (r *recorder) admit(key string, before, after time.Time, src client.Source) {
	span := [2]int64{int64(before.Sub(r.origin) / r.slot), int64(after.Sub(r.origin) / r.slot)}
	r.mu.Lock()
	add(r.slots, key, span)
	if src == client.SourceFallback {
		add(r.fallback, key, span)
	}
	r.sources[src.String()]++
	r.mu.Unlock()
}

func add(m map[string]map[[2]int64]int64, key string, span [2]int64) {
	k := m[key]
	if k == nil {
		k = map[[2]int64]int64{}
		m[key] = k
	}
	k[span]++
}

func triples(m map[string]map[[2]int64]int64) map[string][][3]int64 {
	out := make(map[string][][3]int64, len(m))
	for key, spans := range m {
		t := make([][3]int64, 0, len(spans))
		for sp, n := range spans {
			t = append(t, [3]int64{sp[0], sp[1], n})
		}
		sort.Slice(t, func(i, j int) bool { return t[i][0] < t[j][0] || t[i][0] == t[j][0] && t[i][1] < t[j][1] })
		out[key] = t
	}
	return out
}

// Run parses args (loadgen's flags, without the program name), runs the
// load and writes the Result as JSON to -out, or to stdout. Flag errors are
// printed to stderr.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	c, err := client.New(client.Config{
		Servers:      o.servers,
		ClientID:     o.clientID,
		Token:        o.token,
		Fallback:     o.fallback,
		Priority:     o.priority,
		MaxKeys:      o.maxKeys,
		InitialBatch: o.initial,
	})
	if err != nil {
		return err
	}
	origin := time.Now()
	if o.startUnixMs > 0 {
		origin = time.UnixMilli(o.startUnixMs)
	}
	rec := &recorder{origin: origin, slot: o.slot, slots: map[string]map[[2]int64]int64{}, fallback: map[string]map[[2]int64]int64{}, sources: map[string]int64{}}

	// newPicker returns a worker's key chooser: the one key, or a Zipf
	// draw over the key space.
	var names []string
	for i := range o.keys {
		names = append(names, o.prefix+strconv.Itoa(i))
	}
	newPicker := func(rng *rand.Rand) func() string {
		if o.keys == 0 {
			return func() string { return o.key }
		}
		z := rand.NewZipf(rng, o.zipfS, 1, uint64(o.keys-1))
		return func() string { return names[z.Uint64()] }
	}

	// With a schedule, this process's share of it.
	var share []Arrival
	var sched *ScheduleRun
	if o.schedSeed != 0 {
		all := Schedule(o.schedSeed, o.rate, o.duration, o.keys, o.zipfS)
		share = Share(all, o.procs, o.proc)
		sched = &ScheduleRun{Arrivals: len(all), Share: len(share), Digest: Digest(all)}
	}

	// decideCtx bounds the decisions: the run without a schedule; with one,
	// every arrival of the share is decided however late it comes, so only
	// ctx (a signal) ends them early.
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	decideCtx := runCtx
	if sched != nil {
		decideCtx = ctx
	}
	var requested, admitted, denied atomic.Int64
	var lagMu sync.Mutex
	var lags []time.Duration // how late scheduled decisions began
	work := make(chan job, 1024)
	var wg sync.WaitGroup
	for w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pick := newPicker(rand.New(rand.NewPCG(o.seed, uint64(w))))
			for j := range work {
				if decideCtx.Err() != nil {
					continue // the run is over: drain without deciding
				}
				key := j.key
				if key == "" {
					key = pick()
				}
				before := time.Now()
				if !j.at.IsZero() {
					lagMu.Lock()
					lags = append(lags, before.Sub(j.at))
					lagMu.Unlock()
				}
				d := c.Allow(decideCtx, key)
				requested.Add(1)
				if d.Allowed {
					admitted.Add(1)
					rec.admit(key, before, time.Now(), d.Source)
				} else {
					denied.Add(1)
				}
			}
		}()
	}
	start := time.Now()
	if sched != nil {
		sched.Ready = start.Sub(origin)
		issueShare(ctx, work, share, origin, names)
	} else {
		pace(runCtx, work, o.phases, o.rate, start)
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	if sched != nil {
		sched.LagP50, sched.LagP99, sched.LagMax = lagStats(lags)
	}

	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelClose()
	res := Result{
		ClientID:    c.ClientID(),
		StartUnixMs: origin.UnixMilli(),
		SlotMs:      o.slot.Milliseconds(),
		Requested:   requested.Load(),
		Admitted:    admitted.Load(),
		Denied:      denied.Load(),
		BySource:    rec.sources,
		Schedule:    sched,
		Elapsed:     elapsed,
	}
	res.Stats = c.Stats()
	if err := c.Close(closeCtx); err != nil {
		res.CloseError = err.Error()
	}
	rec.mu.Lock()
	res.Slots = triples(rec.slots)
	res.FallbackSlots = triples(rec.fallback)
	rec.mu.Unlock()

	var w io.Writer = stdout
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := json.NewEncoder(w).Encode(&res); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// job is one request to decide: for key, or for a key the worker picks when
// key is empty. at is its scheduled time; zero without a schedule.
type job struct {
	key string
	at  time.Time
}

// pace issues the demand (phases, then rate) from start until ctx ends,
// what is due every millisecond. A process that was paused (SIGSTOP) does
// not catch up on more than 10 ms of the demand it missed (at rates under
// 100/s, 10 ms is less than one request, and it catches up in full).
func pace(ctx context.Context, work chan<- job, phases []phase, rate float64, start time.Time) {
	var issued int64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			d, cur := demand(phases, rate, now.Sub(start))
			due := int64(d)
			if lag := due - issued; float64(lag) > cur/100 && cur >= 100 {
				issued = due - int64(cur/100)
			}
			for ; issued < due; issued++ {
				select {
				case work <- job{}:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// issueShare issues each arrival of share at its scheduled time after
// origin (at once when that time has passed), until the share ends or ctx
// does.
func issueShare(ctx context.Context, work chan<- job, share []Arrival, origin time.Time, names []string) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for _, a := range share {
		at := origin.Add(a.At)
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		select {
		case work <- job{key: names[a.Key], at: at}:
		case <-ctx.Done():
			return
		}
	}
}
