package leases_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
)

// settleLoop runs the steady state of a client's settle loop against store:
// every call settles the previous lease of each of n keys (half used) and
// takes the next one. It reports settled keys per second.
func settleLoop(b *testing.B, store leases.Store, owner string, n int, prefix string) {
	ctx := context.Background()
	bk := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000, LeaseTTL: 10 * time.Second}
	ops := make([]leases.LeaseOp, n)
	for i := range ops {
		ops[i] = leases.LeaseOp{Key: fmt.Sprintf("%s:%d", prefix, i), Bucket: bk, Want: 100}
	}
	run := func() {
		for i := range ops {
			ops[i].NewLeaseID = leases.NewLeaseID()
		}
		out, err := store.Lease(ctx, own(owner), ops)
		if err != nil {
			b.Fatal(err)
		}
		for i, o := range out {
			if o.Err != nil || o.Granted != 100 {
				b.Fatalf("key %d: %+v", i, o)
			}
			ops[i].LeaseID, ops[i].Used = o.LeaseID, 50
		}
	}
	run()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		run()
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkMemoryStoreSettle: one Lease call settling and renewing 100
// keys. Target: at least 1,000,000 settled keys per second.
func BenchmarkMemoryStoreSettle(b *testing.B) {
	s := leases.NewMemoryStore(leases.MemoryOptions{})
	settleLoop(b, s, "bench/1", 100, "user")
}

// BenchmarkMemoryStoreSettleParallel: the same from every core at once,
// each goroutine with its own owner and keys.
func BenchmarkMemoryStoreSettleParallel(b *testing.B) {
	s := leases.NewMemoryStore(leases.MemoryOptions{})
	ctx := context.Background()
	bk := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000, LeaseTTL: 10 * time.Second}
	var id atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		g := id.Add(1)
		owner := fmt.Sprintf("bench/%d", g)
		ops := make([]leases.LeaseOp, 100)
		for i := range ops {
			ops[i] = leases.LeaseOp{Key: fmt.Sprintf("user:%d:%d", g, i), Bucket: bk, Want: 100}
		}
		for pb.Next() {
			for i := range ops {
				ops[i].NewLeaseID = leases.NewLeaseID()
			}
			out, err := s.Lease(ctx, own(owner), ops)
			if err != nil {
				b.Error(err)
				return
			}
			for i, o := range out {
				ops[i].LeaseID, ops[i].Used = o.LeaseID, 50
			}
		}
	})
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkRedisStoreSettle: one pipelined round trip settling and renewing
// 100 keys on a real redis-server on loopback. Target: at least 10,000
// settled keys per second.
func BenchmarkRedisStoreSettle(b *testing.B) {
	srv := redistest.Start(b)
	s := leases.NewRedisStore(srv.Client(b), leases.RedisOptions{})
	settleLoop(b, s, "bench/1", 100, "user")
}

// BenchmarkEngineLease: the server's path without HTTP: rule matching, the
// memory store and the protocol results, for 100 keys per call.
func BenchmarkEngineLease(b *testing.B) {
	p, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{
		{Name: "users", Match: "user:*", Limit: 1_000_000_000, Period: time.Second},
		{Name: "apis", Match: "api:*", Limit: 1000, Period: time.Second},
	}})
	if err != nil {
		b.Fatal(err)
	}
	e := leases.NewEngine(leases.EngineOptions{Store: leases.NewMemoryStore(leases.MemoryOptions{}), Policy: p})
	entries := make([]leases.LeaseAsk, 100)
	for i := range entries {
		entries[i] = leases.LeaseAsk{Key: fmt.Sprintf("user:%d", i), Want: 100}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res, _, err := e.Lease(ctx, own("bench/1"), entries)
		if err != nil {
			b.Fatal(err)
		}
		for i := range res {
			entries[i].LeaseID, entries[i].Used = res[i].LeaseID, 50
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "keys/s")
}
