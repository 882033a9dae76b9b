// Package e2e proves the global limit with real processes: one
// redis-server, three rateleased daemons sharing it, and several load
// generator processes (e2e/cmd/loadgen, built on the client SDK) that
// hammer shared keys and report how many requests they admitted in each
// 10 ms slot. The tests merge the slots and check the bound
// burst + rate·W for every window, fairness, many keys, and the bound under
// faults: a daemon killed, every daemon stopped, Redis stopped, a client
// paused, and a client that vanishes after leasing the whole bucket (one
// simulated in the test process, speaking the wire protocol itself), whose
// lease expires unsettled, spent to its last token just before its
// deadline, while the others wait on retry_after for that expiry.
//
// TestPerUserFleet is the per-user workload: four loadgens stand for app
// servers behind a round-robin load balancer and issue their shares of one
// global arrival schedule (Zipf over 2,000 users, 1,200 arrivals a second,
// arrival i to process i mod 4), so that each user's few requests a second
// reach every process. Besides each user's bound, it replays the schedule
// against one exact token bucket per user and bounds the admissions lost
// (and made beyond it), asserts that no fallback decided while the servers
// were healthy, and logs Redis commands and lease-server calls per
// decision.
//
// The default scenarios run in `make test` (about a minute and a half on
// two cores); `make e2e-long` runs them three times longer. Subpackages hold the
// helpers: redistest (real redis-server processes), leasetest (in-process
// lease servers), e2eproc (the real binaries as child processes).
package e2e
