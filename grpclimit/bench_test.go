package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/grpclimit"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
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
	c := inboundtest.LeasedClient(b, "ip:198.51.100.7")
	b.Run("leased-headers", func(b *testing.B) { benchUnary(b, c, grpclimit.HeadersAll) })
	b.Run("leased-noheaders", func(b *testing.B) { benchUnary(b, c, grpclimit.HeadersNone) })
}

// benchUnary measures the unary interceptor of a limiter of c with the
// header mode h on calls of 198.51.100.7.
func benchUnary(b *testing.B, c *client.Client, h grpclimit.HeaderMode) {
	l, err := grpclimit.New(grpclimit.Config{Client: c, Headers: h})
	require.NoError(b, err)
	ic := l.UnaryServerInterceptor()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 4711}})
	ctx = grpc.NewContextWithServerTransportStream(ctx, discardStream{})
	info := &grpc.UnaryServerInfo{FullMethod: checkMethod}
	handler := func(context.Context, any) (any, error) { return nil, nil }
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
}
