package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"golang.org/x/time/rate"
)

// The hot path, beside its peer: run
//
//	go test -run '^$' -bench 'Allow' -benchmem ./client/
//
// and compare BenchmarkLimiterAllow* with BenchmarkXTimeRateAllow* of the
// same run. Targets: Limiter.Allow in parallel at most 15 ns/op, 0 allocs,
// at most 0.25x x/time/rate.

const benchRules = `
rules:
  - {name: bench, match: "bench:*", limit: 1000000000, period: 1s, lease_ttl: 1h}
`

func liveLimiter(b *testing.B) *client.Limiter {
	srv := leasetest.Start(b, benchRules, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, InitialBatch: 1_000_000_000, MaxBatch: 1_000_000_000, LeaseMinTokens: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	// The key starts direct and moves to a lease after its first decision
	// (LeaseMinTokens 1): measure once a lease decides.
	deadline := time.Now().Add(5 * time.Second)
	for c.Allow(context.Background(), "bench:hot").Source != client.SourceLease {
		if time.Now().After(deadline) {
			b.Fatal("no lease")
		}
	}
	return c.Limiter("bench:hot")
}

func BenchmarkLimiterAllow(b *testing.B) {
	l := liveLimiter(b)
	b.ReportAllocs()
	for b.Loop() {
		if !l.Allow() {
			b.Fatal("denied")
		}
	}
}

func BenchmarkLimiterAllowParallel(b *testing.B) {
	l := liveLimiter(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !l.Allow() {
				b.Error("denied")
				return
			}
		}
	})
}

func BenchmarkXTimeRateAllow(b *testing.B) {
	l := rate.NewLimiter(1e12, 1e9)
	b.ReportAllocs()
	for b.Loop() {
		if !l.Allow() {
			b.Fatal("denied")
		}
	}
}

func BenchmarkXTimeRateAllowParallel(b *testing.B) {
	l := rate.NewLimiter(1e12, 1e9)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !l.Allow() {
				b.Error("denied")
				return
			}
		}
	})
}

// BenchmarkClientAllow is the keyed API (a map lookup per call).
func BenchmarkClientAllow(b *testing.B) {
	srv := leasetest.Start(b, benchRules, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, InitialBatch: 1_000_000_000, MaxBatch: 1_000_000_000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()
	c.Allow(ctx, "bench:hot")
	time.Sleep(10 * time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		if !c.Allow(ctx, "bench:hot").Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkSteadyDemandServerCalls paces requests at 5,000/s against a limit
// of 10,000/s (b.N requests take b.N/5000 s) and reports the lease-server
// calls per 1,000 admitted requests. Target: at most 10. Run it long enough
// for the steady state:
//
//	go test -run '^$' -bench SteadyDemand -benchtime 10000x ./client/
func BenchmarkSteadyDemandServerCalls(b *testing.B) {
	srv := leasetest.Start(b, `
rules:
  - {name: steady, match: "steady:*", limit: 10000, period: 1s, lease_ttl: 2s}
`, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	l := c.Limiter("steady:key")
	const perSecond = 5000
	admitted := 0
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; {
		due := int(time.Since(start).Seconds() * perSecond)
		for ; i < due && i < b.N; i++ {
			if l.Allow() {
				admitted++
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
	b.StopTimer()
	st := c.Stats()
	b.ReportMetric(float64(st.ServerCalls)*1000/float64(max(1, admitted)), "calls/1000")
	b.ReportMetric(float64(admitted)/float64(b.N)*100, "%admitted")
}
