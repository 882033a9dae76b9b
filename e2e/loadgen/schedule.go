package loadgen

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"
)

// Arrival is one request of a global arrival schedule: at At after the
// slot grid's origin, for key number Key.
type Arrival struct {
	At  time.Duration
	Key int
}

// Schedule returns the global arrival schedule of seed: a Poisson process
// of rate arrivals a second over [0, d), each for a key drawn from a Zipf
// distribution of exponent zipfS over keys keys (key 0 the most asked
// for). The same arguments give the same schedule in every process, so
// that processes standing behind one load balancer can each issue their
// own share of one schedule (Share), and a test can replay it whole.
func Schedule(seed uint64, rate float64, d time.Duration, keys int, zipfS float64) []Arrival {
	times := rand.New(rand.NewPCG(seed, 1))
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, 2)), zipfS, 1, uint64(keys-1))
	var out []Arrival
	at := 0.0 // seconds
	for {
		at += times.ExpFloat64() / rate
		t := time.Duration(at * float64(time.Second))
		if t >= d {
			return out
		}
		out = append(out, Arrival{At: t, Key: int(z.Uint64())})
	}
}

// Share returns the arrivals that process proc of procs issues: arrival i
// goes to process i mod procs, as a round-robin load balancer sends them.
func Share(all []Arrival, procs, proc int) []Arrival {
	var out []Arrival
	for i := proc; i < len(all); i += procs {
		out = append(out, all[i])
	}
	return out
}

// Digest returns a hash of a schedule, for processes to show that they
// generated the same one.
func Digest(all []Arrival) uint64 {
	h := fnv.New64a()
	var b [16]byte
	for _, a := range all {
		binary.LittleEndian.PutUint64(b[:8], uint64(a.At))
		binary.LittleEndian.PutUint64(b[8:], uint64(a.Key))
		h.Write(b[:])
	}
	return h.Sum64()
}

// ScheduleRun is what a process with -schedule-seed reports of its
// schedule.
type ScheduleRun struct {
	// Arrivals is the number of arrivals in the global schedule, Share
	// this process's, Digest the global schedule's Digest.
	Arrivals int    `json:"arrivals"`
	Share    int    `json:"share"`
	Digest   uint64 `json:"digest"`
	// Ready is when the process was ready to issue its share, after the
	// slot grid's origin (negative: before it, as it should be).
	Ready time.Duration `json:"ready_ns"`
	// LagP50, LagP99 and LagMax describe how late the decisions began
	// after their scheduled times.
	LagP50 time.Duration `json:"lag_p50_ns"`
	LagP99 time.Duration `json:"lag_p99_ns"`
	LagMax time.Duration `json:"lag_max_ns"`
}

// lagStats returns the median, 99th percentile and maximum of lags; it
// sorts lags.
func lagStats(lags []time.Duration) (p50, p99, maxLag time.Duration) {
	if len(lags) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lags)
	at := func(q float64) time.Duration { return lags[min(len(lags)-1, int(q*float64(len(lags))))] }
	return at(0.5), at(0.99), lags[len(lags)-1]
}
