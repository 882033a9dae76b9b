package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
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

// directRules keep per-user keys direct: a burst of 5 is too small for a
// lease of LeaseMinTokens (8), so no key ever moves to a lease.
const directRules = `
default: deny
rules:
  - {name: users, match: "user:*", algorithm: token_bucket, limit: 2, period: 1s, burst: 5}
`

// stubLeaseServer is an http.RoundTripper that answers every direct take
// as a lease server would allow it, without a network or a server: it
// finds the take's key in the body and answers for it (one take of one key
// per call, as BenchmarkDirectDecision makes them). It measures the
// client's own work.
type stubLeaseServer struct{}

func (stubLeaseServer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil { // the probe at start: GET /v1/rules
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil, err
	}
	const open = `"keys":["`
	i := bytes.Index(body, []byte(open))
	j := bytes.IndexByte(body[i+len(open):], '"')
	if i < 0 || j < 0 {
		return nil, fmt.Errorf("stub: no key in %s", body)
	}
	key := body[i+len(open) : i+len(open)+j]
	out := make([]byte, 0, 400)
	out = append(out, `{"leases":[],"takes":[{"allowed":true,"retry_after_ms":0,"keys":[{"key":"`...)
	out = append(out, key...)
	out = append(out, `","allowed":true,"retry_after_ms":0,"remaining":4,"limit":2,"period_ms":1000,"burst":5,"rule":"users","lease_ttl_ms":2000,"algorithm":"token_bucket","limits":[{"algorithm":"token_bucket","limit":2,"period_ms":1000,"burst":5,"remaining":4,"reset_ms":500}]}]}]}`+"\n"...)
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(out)),
		ContentLength: int64(len(out)), Request: r,
	}, nil
}

// BenchmarkDirectDecision measures Client.Allow on a key the client has
// never seen (a per-user key of a rule whose keys stay direct), one
// decision at a time, so that each is one direct take: one call to a lease
// server with one take.
//
//   - stub: the calls go to stubLeaseServer, in memory: the client's own
//     work (queueing, encoding, the HTTP client's request and response,
//     decoding, applying the answer);
//
//   - server: to two real lease servers in this process (one memory store)
//     over loopback HTTP: client and servers together.
//
//     go test -run '^$' -bench DirectDecision -benchtime 20000x ./client/
func BenchmarkDirectDecision(b *testing.B) {
	for _, tt := range []struct {
		name string
		cfg  func(b *testing.B) client.Config
	}{
		{"stub", func(b *testing.B) client.Config {
			// Two servers, so that the takes are routed by key, as with
			// the servers of a fleet.
			return client.Config{Servers: []string{"http://a.stub.invalid", "http://b.stub.invalid"}, HTTPClient: &http.Client{Transport: stubLeaseServer{}}}
		}},
		{"server", func(b *testing.B) client.Config {
			store := leases.NewMemoryStore(leases.MemoryOptions{})
			b.Cleanup(func() { _ = store.Close() })
			opts := leasetest.Options{Store: store}
			return client.Config{Servers: []string{leasetest.Start(b, directRules, opts).URL(), leasetest.Start(b, directRules, opts).URL()}}
		}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			cfg := tt.cfg(b)
			cfg.ClientID = "bench-1"
			c, err := client.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close(context.Background()) })
			ctx := context.Background()
			key := make([]byte, 0, 32)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				key = strconv.AppendInt(append(key[:0], "user:"...), int64(i), 10)
				if d := c.Allow(ctx, string(key)); !d.Allowed || d.Source != client.SourceDirect {
					b.Fatalf("decision %+v", d)
				}
			}
		})
	}
}
