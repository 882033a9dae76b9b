// Package compare benchmarks ratelease against per-request rate limiting on
// a matrix of workloads whose limits bind, with real processes: one
// redis-server and two rateleased processes (the built binary, Redis store)
// on 127.0.0.1, started by the benchmark itself.
//
// All the code is in _test.go files: this file only documents the package,
// and github.com/go-redis/redis_rate/v10 stays a test-only dependency.
//
//	go test -run '^$' -bench Compare -benchtime 4s ./e2e/compare/
//
// runs BenchmarkCompare/<workload>/<system>. The systems:
//
//	a-lease-sdk    the SDK: client.Client instances (standing for application
//	               servers), each with its own client_id and HTTP pool, all
//	               with the SDK's defaults, instance i listing rateleased
//	               i mod 2 first; Client.Allow(ctx, key) per decision
//	b-redis-rate   redis_rate/v10 Limiter.Allow per decision: one GCRA Lua
//	               script (EVALSHA) in Redis, one go-redis client per instance
//	c-http-check   POST /v1/check per decision, instance i asking rateleased
//	               i mod 2 (HTTP/1.1 keep-alive, JSON)
//	d-x-time-rate  golang.org/x/time/rate, one limiter per key and instance:
//	               local only, no global limit, so it runs only on the hot
//	               workloads, where no limit binds
//
// The workloads (see the workloads table in workload_test.go for the
// exact figures; every one has a rule of its own in rateleased's rules
// file, and the same rule for redis_rate and for the exact reference):
//
//	hot            one key, two instances, a limit that never binds
//	hot-path       one key, closed loop: the capacity run (below)
//	saturated      one key, six instances, demand 3x a 1,000/s rule, burst 100
//	users-zipf     10,000 users with Zipf demand, ten instances, 10/s burst 10
//	users-uniform  100,000 users, uniform demand, ten instances, 2/s burst 5
//	               (at 2,000/s in all each user asks so rarely that the rule
//	               almost never binds: the workload measures cold keys)
//	few-users      50 users each asking about 100/s, four instances, 100/s
//	               burst 10
//
// # Open loop, the same arrivals for every system
//
// For each workload but hot-path, one schedule of arrivals is generated
// from a fixed seed: a Poisson process at the workload's rate, each arrival
// with a key drawn from the workload's distribution and the instance
// i mod n for the i-th. Every system replays that schedule at wall-clock
// pace (replay): a pacer goroutine sleeps until the next arrival is due and
// hands it to an idle worker goroutine, or starts a new one, up to
// maxInFlight, so that a slow decision never delays the next arrivals (the
// idle worker that finished last is reused first, so decisions run on
// goroutines whose stacks have grown, as in a long-running server). The
// worker reads the clock, decides, and reads it again: the decision's
// start and end. The pacer's lag (start less scheduled time) says whether
// the pacer kept up. Each run has keys of its own, so every bucket starts
// full, and is bounded in time (its schedule, then at most replayGrace for
// the decisions in flight; arrivals not decided by then count as failed)
// and in count (maxArrivals).
//
// The length of a run comes from -benchtime: a duration is each run's
// length (clamped to 1 s .. 60 s); a count such as 1x means 4 s. Each
// sub-benchmark makes exactly one run per call, whatever b.N, so the
// testing package, seeing a run as long as -benchtime, calls it once.
//
// # Figures of an open-loop run
//
//   - decisions/s: decisions over the time from the run's start to the end
//     of its last decision, and the pacer's lag at p99.
//   - lost and extra against one exact token bucket per key fed the same
//     arrivals at their scheduled times (exactBucket: it starts full, as
//     rateleased's and redis_rate's do): per key, lost = max(0, exact
//     admissions − the system's), extra = max(0, the system's − exact),
//     summed over keys, as a percentage of the exact admissions.
//   - the worst window against the bound: for each key, admissions counted
//     in 10 ms slots by decision time, an admission counted in a window
//     only if its decision began and ended inside it (so that a window is
//     never charged an admission it may not have held); over every window
//     of 100 ms up to the run's length, the largest admitted − (burst +
//     rate·W) (worstWindow), for the worst key. The bound held if it is at
//     most 0.
//   - latency p50, p99, p99.9 of a decision (end − start), every decision.
//   - calls per decision that left the process: lease-server calls for (a)
//     (Stats().ServerCalls summed over the instances), Redis round trips for
//     (b) (a go-redis hook), HTTP calls for (c); and Redis commands per
//     decision: the delta of INFO commandstats over the run, every
//     command's calls summed (EVALSHA and the commands its script ran each
//     count), INFO's own excluded, whoever sent them: the gross figure.
//     The net figure subtracts the background: the rateleased processes'
//     fleet view (recording themselves among the peers every
//     server.PeerInterval, publishing their status snapshots every other
//     time, whatever the traffic), whose Redis commands they count
//     (ratelease_peer_commands_total, read on both sides of the INFO that
//     starts and ends a run: countedSnapshot), is taken off as counted
//     over the run; anything else reaching Redis with no system
//     running, counted over one server.PeerInterval before each run of a
//     system that uses Redis (idleWindow), before it is set up, is taken
//     off at that rate times the run's length (it is normally nothing).
//     The tables show both; the Redis targets use the net figures, of (a)
//     and (b) alike, since on a hot key the daemons' own periodic work
//     would otherwise be much of what (a) is charged. Both include closing
//     the run's clients (for (a), returning its leases), and the work the
//     run left the rateleased processes (drain: the buckets they owned,
//     handed back to Redis once unused; the measurement ends when no
//     daemon owns one and Redis is back to its idle background, at most
//     maxDrain after the run), so that it is charged to its run and not
//     counted as the next run's idle background.
//   - for (a), its decisions by Decision.Source and its Stats counters
//     (server calls, failed calls, fallback decisions, keys held), and
//     what a finite run charges leasing at its end: the tokens left in the
//     instances' leases when the replay ended (Stats().TokensHeld, read
//     before Close returns them), and, on workloads of at most maxDebtKeys
//     keys, what the buckets then owed their refill (their negative
//     levels, GET /v1/keys/{key}: deferred grants made ahead of it; the
//     reads' own Redis and server work is taken out of the run). The
//     tokens held less that debt had been granted out of the refill so far
//     and not spent; the report sets them beside (a)'s lost admissions.
//   - CPU per decision of this process and of the servers the system uses
//     (redis-server from INFO cpu, rateleased from /proc/<pid>/stat), and
//     the cores other processes used meanwhile (/proc/stat), since the
//     machine may be shared.
//
// # The capacity run (hot-path)
//
// hot-path has no schedule: each system decides on one key, back to back,
// for the run's length (at most maxCapacityRun), after a warm-up on the
// same key (its limit never binds), with GOMAXPROCS goroutines for the
// local systems and 8 x GOMAXPROCS for the network ones. It reports
// decisions/s (the targets compare (a) with (b)), the decisions denied
// (lost: the exact bucket admits every one, the run's decisions being
// fewer than the burst, which is also why the bound holds by count),
// latency from a log-linear histogram (hist) of every decision for the
// network systems and a random 1 in 16 for the local ones, and the same
// costs per decision as an open-loop run.
//
// # The report
//
// With RATELEASE_BENCH_REPORT=<dir> set, TestMain, after the benchmarks,
// prints the tables and the targets, and, if every workload and system ran,
// writes <dir>/BENCHMARKS.md (workloads, machine, command, date, targets
// with pass or fail computed from the run, a table per workload) and the
// chart <dir>/docs/benchmarks.svg (lost %, Redis commands per decision and
// p99 latency per workload and system), from the last run of each
// sub-benchmark. `make bench` does that for the repository root.
package compare
