package compare

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/redis/go-redis/v9"
)

// algoRun is how long each algorithm's loops run.
const algoRun = 500 * time.Millisecond

// algoKeys is the number of keys the store measurement settles per call,
// as one client's settle loop would.
const algoKeys = 100

// algoResult is what measureAlgorithms found for one algorithm.
type algoResult struct {
	Algorithm string
	// KeysPerSec: keys settled and renewed per second on Redis, algoKeys
	// keys per Lease call, one connection.
	KeysPerSec float64
	// CmdsPerGrant: Redis commands (INFO commandstats, every command's
	// calls, a script's EVALSHA and what it ran) per renewal of one key.
	CmdsPerGrant float64
	// MemActive: MEMORY USAGE of one key's Redis keys while it holds an
	// open lease, averaged over algoKeys keys, after the loop.
	MemActive int64
	// MemTake: the same for a key decided by one direct take only.
	MemTake int64
	// DecisionsPerSec: Limiter.Allow on a leased key of a rule of this
	// algorithm, one goroutine (the SDK's local spend).
	DecisionsPerSec float64
}

// algoBucket returns parameters of a for the measurement: limits far above
// what the loop asks, so that every renewal is granted.
func algoBucket(a leases.Algorithm) leases.Bucket {
	b := leases.Bucket{Algorithm: a, Limit: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000, LeaseTTL: 10 * time.Second}
	switch a {
	case leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog:
		b.Period = time.Hour // no window ends during the loop
	}
	return b
}

// measureAlgorithms measures every implemented algorithm on rdb and in the
// SDK, each for about d.
func measureAlgorithms(b *testing.B, rdb *redis.Client, d time.Duration) []algoResult {
	b.Helper()
	var out []algoResult
	for _, a := range []leases.Algorithm{leases.TokenBucket, leases.FixedWindow, leases.SlidingWindowLog, leases.SlidingWindowCounter, leases.LeakyBucket} {
		if !leases.Implemented(a) {
			continue
		}
		r := algoResult{Algorithm: string(a)}
		measureAlgoStore(b, rdb, a, d, &r)
		r.DecisionsPerSec = measureAlgoSDK(b, a, d)
		out = append(out, r)
	}
	return out
}

func commandTotal(b *testing.B, rdb *redis.Client) int64 {
	b.Helper()
	txt, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	n, err := commandCalls(txt)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// memoryOf sums MEMORY USAGE over key's Redis keys under a.
func memoryOf(b *testing.B, rdb *redis.Client, key string, a leases.Algorithm) int64 {
	b.Helper()
	k1, k2, k3 := leases.AlgorithmRedisKeys(key, a)
	var sum int64
	for _, k := range []string{k1, k2, k3} {
		n, err := rdb.MemoryUsage(context.Background(), k).Result()
		if err != nil && err != redis.Nil {
			b.Fatal(err)
		}
		sum += n
	}
	return sum
}

func measureAlgoStore(b *testing.B, rdb *redis.Client, a leases.Algorithm, d time.Duration, r *algoResult) {
	b.Helper()
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{NoEviction: true})
	bk := algoBucket(a)
	owner := leases.Owner{Client: "bench", Process: "p"}
	ops := make([]leases.LeaseOp, algoKeys)
	for i := range ops {
		ops[i] = leases.LeaseOp{Key: fmt.Sprintf("algo:%s:%06d", a, i), Bucket: bk, Want: 100}
	}
	renew := func() {
		for i := range ops {
			ops[i].NewLeaseID = leases.NewLeaseID()
		}
		outs, err := s.Lease(ctx, owner, ops)
		if err != nil {
			b.Fatal(err)
		}
		for i, o := range outs {
			if o.Err != nil || o.Granted == 0 {
				b.Fatalf("%s key %d: %+v", a, i, o)
			}
			ops[i].LeaseID, ops[i].Used = o.LeaseID, o.Granted/2
		}
	}
	renew() // loads the script and opens the leases
	cmds0 := commandTotal(b, rdb)
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		renew()
		n++
	}
	elapsed := time.Since(start)
	cmds := commandTotal(b, rdb) - cmds0
	r.KeysPerSec = float64(n*algoKeys) / elapsed.Seconds()
	r.CmdsPerGrant = float64(cmds) / float64(n*algoKeys)
	var mem int64
	for i := range ops {
		mem += memoryOf(b, rdb, ops[i].Key, a)
	}
	r.MemActive = mem / algoKeys
	take := fmt.Sprintf("algo:%s:take", a)
	if _, err := s.Take(ctx, []leases.TakeOp{{Key: take, Bucket: bk, Cost: 1}}); err != nil {
		b.Fatal(err)
	}
	r.MemTake = memoryOf(b, rdb, take, a)
}

// measureAlgoSDK measures Limiter.Allow on a leased key whose rule runs a,
// against an in-process lease server on the memory store.
func measureAlgoSDK(b *testing.B, a leases.Algorithm, d time.Duration) float64 {
	b.Helper()
	period := "1s"
	if a != leases.TokenBucket && a != leases.LeakyBucket {
		period = "1h"
	}
	srv := leasetest.Start(b, fmt.Sprintf("rules:\n  - {name: a, match: \"a:*\", algorithm: %s, limit: 1000000000, period: %s, lease_ttl: 2s}\n", a, period), leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}()
	lim := c.Limiter("a:hot")
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for c.Allow(ctx, "a:hot").Source != client.SourceLease {
		if time.Now().After(deadline) {
			b.Fatalf("%s: the key was never leased", a)
		}
	}
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		for range 1000 {
			lim.Allow()
		}
		n += 1000
	}
	return float64(n) / time.Since(start).Seconds()
}

// algorithmsText renders the algorithms section of the report.
func algorithmsText(rs []algoResult) string {
	if len(rs) == 0 {
		return ""
	}
	var s strings.Builder
	s.WriteString("## Algorithms\n\n")
	fmt.Fprintf(&s, "Each implemented algorithm on this run's redis-server: a loop that settles and renews the leases of %d keys per call (one connection, half of each lease used), and the SDK's `Limiter.Allow` on a leased key of a rule of that algorithm (one goroutine, in-process lease server). Limits far above the demand, so that every renewal is granted: these are costs, not accuracy (the e2e scenarios check each algorithm's bound).\n\n", algoKeys)
	s.WriteString("| algorithm | keys settled/s (Redis) | Redis cmds / renewal | Redis memory per active key | per key of direct takes | SDK decisions/s on a leased key |\n|---|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		fmt.Fprintf(&s, "| %s | %s | %.1f | %d B | %d B | %s |\n", r.Algorithm, fmtSI(r.KeysPerSec), r.CmdsPerGrant, r.MemActive, r.MemTake, fmtSI(r.DecisionsPerSec))
	}
	s.WriteString("\n")
	return s.String()
}

// BenchmarkAlgorithms measures the algorithms section alone, once (its
// loops are timed by themselves), and logs it; BenchmarkCompare measures it
// too, for the report.
func BenchmarkAlgorithms(b *testing.B) {
	out := measureAlgorithms(b, redistest.Start(b).Client(b), algoRun)
	b.Log("\n" + algorithmsText(out))
	for _, r := range out {
		b.ReportMetric(r.KeysPerSec, r.Algorithm+"-keys/s")
	}
	for range b.N {
	}
}
