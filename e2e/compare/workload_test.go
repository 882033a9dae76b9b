package compare

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// rule is a token bucket: limit tokens per period, bucket size burst. Every
// system of a workload runs the same rule: rateleased from the rules file
// that rulesYAML writes, redis_rate from redisRateLimit, the exact
// reference from the rule itself.
type rule struct {
	limit  int64
	period time.Duration
	burst  int64
}

// perSecond is the refill rate in tokens per second.
func (r rule) perSecond() float64 { return float64(r.limit) / r.period.Seconds() }

// bound is the most a token bucket of this rule admits over any window of
// length w, whoever asks: burst + rate·w.
func (r rule) bound(w time.Duration) float64 {
	return float64(r.burst) + r.perSecond()*w.Seconds()
}

func (r rule) String() string {
	per := r.period.String()
	if r.period == time.Second {
		per = "s"
	}
	return fmt.Sprintf("%s/%s, burst %s", fmtInt(r.limit), per, fmtInt(r.burst))
}

// distribution is how a workload picks the key of each arrival.
type distribution int

const (
	distOne     distribution = iota // every arrival on key 0
	distZipf                        // Zipf over the keys: key 0 the most asked
	distUniform                     // every key equally likely
)

// workload is one row group of the matrix: who asks for which key, how
// often, from which instance, under which rule. The arrivals are generated
// once per run from seed, and every system replays the same ones.
type workload struct {
	name  string // sub-benchmark name and key prefix
	note  string // what the workload stands for, for the report
	keys  int
	dist  distribution
	zipfS float64 // distZipf: the exponent s (> 1) of rand.NewZipf, v = 1
	// instances is the number of SDK Client instances (standing for
	// application servers) the arrivals are spread over, round-robin; the
	// same number of redis_rate clients for (b), and of HTTP callers for
	// (c), which alternate between the two rateleased processes.
	instances int
	rate      float64 // arrivals per second, all keys together
	rule      rule
	seed      uint64
	// capacity marks the closed-loop hot-path run: no arrival schedule,
	// each system decides as fast as it can on one key for the run's
	// length. See runCapacity.
	capacity bool
}

// hotRule is far above any demand this machine can make (1e8/s), so that
// on the hot workloads the limit never binds and the limiter's own cost is
// what shows. Why not 1e9 per second: the burst can be at most
// protocol.MaxCount (1e9), so that bucket would fill in 1 s, and the SDK
// caps a batch at a quarter of the fill time (a fair-share rule for shared
// keys): 250 ms of demand, which a renewal on a loaded 2-core machine does
// not always beat. With a 10 s fill the batches are sized by the SDK's
// demand horizon, as for any key whose limit is far above its demand.
var hotRule = rule{limit: 1_000_000_000, period: 10 * time.Second, burst: 1_000_000_000}

// workloads is the matrix, in report order. The rates are chosen so that
// every system keeps pace on two shared cores (the report shows the
// pacer's lag, which says whether it did).
var workloads = []workload{
	{
		name: "hot", note: "a hot key; the limit never binds",
		keys: 1, dist: distOne, instances: 2, rate: 4000, rule: hotRule, seed: 1,
	},
	{
		name: "hot-path", note: "capacity: each system decides as fast as it can, closed loop, on one key",
		keys: 1, dist: distOne, instances: 1, rule: hotRule, capacity: true,
	},
	{
		name: "saturated", note: "one key asked for 3× its limit",
		keys: 1, dist: distOne, instances: 6, rate: 3000,
		rule: rule{limit: 1000, period: time.Second, burst: 100}, seed: 2,
	},
	{
		name: "users-zipf", note: "per-user keys, a few heavy users, requests round-robin over the instances",
		keys: 10_000, dist: distZipf, zipfS: 1.1, instances: 10, rate: 2000,
		rule: rule{limit: 10, period: time.Second, burst: 10}, seed: 3,
	},
	{
		name: "users-uniform", note: "per-user keys, each rarely asked: nearly every decision is a key's first in a while",
		keys: 100_000, dist: distUniform, instances: 10, rate: 2000,
		rule: rule{limit: 2, period: time.Second, burst: 5}, seed: 4,
	},
	{
		// The burst is small so that the limit binds: a Poisson demand at
		// the refill rate would take far longer than a run to empty a
		// bucket of 100 (a second's worth).
		name: "few-users", note: "a few users, each asking at about its limit, with a burst small enough that the limit binds",
		keys: 50, dist: distUniform, instances: 4, rate: 5000,
		rule: rule{limit: 100, period: time.Second, burst: 10}, seed: 5,
	},
}

// workloadNamed returns the workload called name.
func workloadNamed(name string) (workload, bool) {
	for _, wl := range workloads {
		if wl.name == name {
			return wl, true
		}
	}
	return workload{}, false
}

// key returns the key of user id for the system tagged tag: each system
// has buckets of its own, under the workload's rule.
func (wl *workload) key(tag string, id int32) string {
	return fmt.Sprintf("bench:%s:%s:%d", wl.name, tag, id)
}

// keyNames returns every key of the workload for the system tagged tag.
func (wl *workload) keyNames(tag string) []string {
	out := make([]string, wl.keys)
	for i := range out {
		out[i] = wl.key(tag, int32(i))
	}
	return out
}

// warmRule covers the keys used only to load the scripts into Redis before
// the first run; it never binds.
var warmRule = rule{limit: 1_000_000, period: time.Second, burst: 1_000_000}

// rulesYAML is the rules file of the rateleased processes: one rule per
// workload, from the workloads table, and every other key denied (so that
// a typo fails loudly instead of being unlimited).
func rulesYAML() string {
	var s strings.Builder
	s.WriteString("default: deny\nrules:\n")
	one := func(name, match string, r rule) {
		fmt.Fprintf(&s, "  - name: %s\n    match: %q\n    algorithm: token_bucket\n    limit: %d\n    period: %s\n    burst: %d\n",
			name, match, r.limit, r.period, r.burst)
	}
	one("warm", "warm:*", warmRule)
	for _, wl := range workloads {
		one(wl.name, "bench:"+wl.name+":*", wl.rule)
	}
	return s.String()
}

// arrival is one request of the schedule: when it comes, for which key,
// to which instance.
type arrival struct {
	at   time.Duration // since the start of the run
	key  int32
	inst uint16
}

// maxArrivals bounds the schedule of one run, whatever its length.
const maxArrivals = 200_000

// arrivals returns the workload's schedule over length d: a Poisson process
// of wl.rate arrivals per second (exponential gaps), each for a key drawn
// from the workload's distribution and sent to instance i mod
// wl.instances for the i-th arrival. The same seed gives the same
// schedule. At most limit arrivals: the schedule ends early rather than
// grow past it.
func arrivals(wl workload, d time.Duration, limit int) []arrival {
	if wl.rate <= 0 || wl.keys < 1 || wl.instances < 1 || d <= 0 {
		return nil
	}
	r := rand.New(rand.NewPCG(wl.seed, 0x6172726976616c73)) // "arrivals"
	var z *rand.Zipf
	if wl.dist == distZipf {
		z = rand.NewZipf(r, wl.zipfS, 1, uint64(wl.keys-1))
	}
	out := make([]arrival, 0, min(limit, int(wl.rate*d.Seconds()*1.1)+16))
	t := 0.0 // seconds
	for i := range limit {
		t += r.ExpFloat64() / wl.rate
		at := time.Duration(t * float64(time.Second))
		if at >= d {
			break
		}
		var k int32
		switch wl.dist {
		case distZipf:
			k = int32(z.Uint64())
		case distUniform:
			k = int32(r.IntN(wl.keys))
		}
		out = append(out, arrival{at: at, key: k, inst: uint16(i % wl.instances)})
	}
	return out
}
