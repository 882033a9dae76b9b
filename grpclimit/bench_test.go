package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/grpclimit"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// discardStream is a grpc.ServerTransportStream that keeps nothing, so
// that the benchmark measures the interceptor, not a transport.
type discardStream struct{}

func (discardStream) Method() string               { return checkMethod }
func (discardStream) SetHeader(metadata.MD) error  { return nil }
func (discardStream) SendHeader(metadata.MD) error { return nil }
func (discardStream) SetTrailer(metadata.MD) error { return nil }

// BenchmarkUnaryOverhead is the unary interceptor's cost per call on a
// leased key (one "ip:{ip}" key, decided from the process's lease), called
// directly with a peer in the context: no network, no gRPC server.
//
//	cd grpclimit && go test -run '^$' -bench UnaryOverhead -benchmem
func BenchmarkUnaryOverhead(b *testing.B) {
	srv := leasetest.Start(b, `
rules:
  - {name: bench, match: "ip:*", limit: 1000000000, period: 1s}
`, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}})
	require.NoError(b, err)
	defer c.Close(context.Background())

	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 4711}})
	ctx = grpc.NewContextWithServerTransportStream(ctx, discardStream{})
	deadline := time.Now().Add(10 * time.Second)
	for c.Allow(context.Background(), "ip:198.51.100.7").Source != client.SourceLease {
		require.True(b, time.Now().Before(deadline), "the key never leased")
	}
	info := &grpc.UnaryServerInfo{FullMethod: checkMethod}
	handler := func(context.Context, any) (any, error) { return nil, nil }

	for _, mode := range []struct {
		name string
		h    grpclimit.HeaderMode
	}{{"leased-headers", grpclimit.HeadersAll}, {"leased-noheaders", grpclimit.HeadersNone}} {
		l, err := grpclimit.New(grpclimit.Config{Client: c, Headers: mode.h})
		require.NoError(b, err)
		ic := l.UnaryServerInterceptor()
		b.Run(mode.name, func(b *testing.B) {
			// Warm up: a leased key's batches follow its demand.
			for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
				for range 1000 {
					_, _ = ic(ctx, nil, info, handler)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_, _ = ic(ctx, nil, info, handler)
			}
		})
	}
}
