// Package compare benchmarks ratelease against per-request rate limiting,
// with real processes: one redis-server and one rateleased (the built
// binary, Redis store) on loopback, started by the benchmark itself.
//
// All the code is in _test.go files: this file only documents the package,
// and github.com/go-redis/redis_rate/v10 stays a test-only dependency.
//
//	go test -run '^$' -bench Compare -benchtime 3s ./e2e/compare/
//
// runs BenchmarkCompare/<system>/<workload> for four systems, each deciding
// the same workload:
//
//	a-lease-sdk    ratelease via the SDK: Client.Allow(ctx, key), spent from leases
//	b-redis-gcra   per-request GCRA in Redis: redis_rate/v10 Limiter.Allow
//	c-http-check   per-request POST /v1/check on rateleased (HTTP/1.1 keep-alive, JSON)
//	d-x-time-rate  golang.org/x/time/rate, one Limiter per key: local only, no global limit
//
// and two workloads: hot (every decision on one key) and zipf (1,000 keys,
// Zipf-distributed, s=1.1, v=1). The limit, 1e9 tokens per 10 s per key
// with a burst of 1e9 (see limitTokens for why not 1e9 per second), is far
// above demand, so that every decision is "allowed" and what is measured is
// the limiter's own cost. A denied decision (or, for a-lease-sdk, one not
// decided by a live lease) fails the benchmark.
//
// # What is measured
//
// Each decision is made inside b.RunParallel with the key given as a string
// (the realistic case: the key comes with the request). Per run:
//
//   - decisions/s: b.N over the wall time of RunParallel.
//   - calls/1000: calls that left the process per 1,000 decisions: lease
//     server calls (Client.Stats().ServerCalls) for a, Redis commands
//     (counted by a go-redis hook) for b, HTTP calls for c, none for d.
//     redis-cmds/1000 is the same for the redis-server, from its own
//     INFO counters, whoever sent them (for a and c, rateleased).
//   - p50-ns, p99-ns: the latency of one decision, read with two monotonic
//     clock reads around it and kept in a per-goroutine log-linear
//     histogram (64 buckets per power of two: the bucket midpoint reported is at most 0.8% off; exact below
//     128 ns) merged after the run. Every decision is timed for the network
//     systems (b, c); for the local ones (a, d) a random 1 in 16, because
//     the clock read pair costs more than the decision itself and would
//     otherwise halve their decisions/s. The figures include one clock
//     read's cost (the report states the measured floor: the same timing
//     around no work).
//   - cpu-ns/decision: this process's CPU time (user + sys, getrusage
//     RUSAGE_SELF) per decision: the client's cost, including the
//     benchmark's own loop, the SDK's settle loop and the GC.
//     srv-cpu-ns/decision: the CPU time of the server processes the system
//     uses (redis-server from INFO cpu; rateleased from /proc/<pid>/stat, at
//     10 ms resolution) per decision. All processes share the same cores;
//     the report also gives the CPU that other processes used, and the host
//     stole, during each run (/proc/stat), so that a run on a busy machine
//     shows as such.
//
// After its warm-up, each sub-benchmark also times decisions made one at a
// time by a single goroutine: the latency without queueing, which for b and
// c is the bare round trip (the report puts it beside the latency under
// load).
//
// Parallelism: a and d run GOMAXPROCS goroutines (the default): they are
// CPU-bound, and more goroutines would only queue. b and c are bound by a
// network round trip, so they run 8 x GOMAXPROCS goroutines
// (b.SetParallelism(8)) to pipeline round trips over several connections, as
// a busy service would; with one goroutine per core they would mostly
// measure idle waiting.
//
// Before its first measured run each sub-benchmark warms up for a moment
// with the same workload (connections opened, scripts loaded; for a, every
// key leased and the batch sizes settled on the demand), and a checks that
// it holds a live lease for every key of the workload.
//
// # The report
//
// With RATELEASE_BENCH_REPORT=<dir> set, TestMain, after the benchmarks,
// prints the table and writes <dir>/BENCHMARKS.md (machine, command, date,
// table, targets with pass/fail) and the chart <dir>/docs/benchmarks.svg,
// from the last run of each sub-benchmark. `make bench` does that for the
// repository root.
package compare
