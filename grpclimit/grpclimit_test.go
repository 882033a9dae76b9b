package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/grpclimit"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Long periods: the buckets do not refill measurably during a test.
const testRules = `
default: allow
rules:
  - name: rpc
    match: "rpc:*"
    limit: 3
    period: 1h
  - name: ip
    match: "ip:*"
    limit: 2
    period: 1h
  - name: two
    match: "two:*"
    limits:
      - {limit: 3, period: 1h}
      - {limit: 10, period: 24h}
  - name: paced
    match: "paced:*"
    limit: 10
    period: 1s
    burst: 1
`

const checkMethod = "/grpc.health.v1.Health/Check"

// serve starts a gRPC server with the health service behind l's
// interceptors on 127.0.0.1, and returns a client connection to it.
func serve(t *testing.T, l *grpclimit.Limiter, extra ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(
		grpc.ChainUnaryInterceptor(append(extra, l.UnaryServerInterceptor())...),
		grpc.ChainStreamInterceptor(l.StreamServerInterceptor()),
	)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(ln) })
	t.Cleanup(func() { s.Stop(); wg.Wait() })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func newLimiter(t *testing.T, cfg grpclimit.Config) *grpclimit.Limiter {
	t.Helper()
	l, err := grpclimit.New(cfg)
	require.NoError(t, err)
	return l
}

// check calls Health.Check with the x-api-key metadata (and more pairs),
// returning the error and the header metadata.
func check(t *testing.T, hc healthpb.HealthClient, apiKey string, kv ...string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, append([]string{"x-api-key", apiKey}, kv...)...)
	var hdr metadata.MD
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	return hdr, err
}

type field = inboundtest.Field

// parseField parses a ratelimit or ratelimit-policy metadata value.
func parseField(t *testing.T, md metadata.MD, name string) []field {
	return inboundtest.ParseFields(t, name, md.Get(name))
}

func retryInfo(t *testing.T, err error) time.Duration {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("no RetryInfo in %v", st.Details())
	return 0
}

func TestAllowedAndDenied(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	var mu sync.Mutex
	var seen []grpclimit.Result
	l := newLimiter(t, grpclimit.Config{
		Client: inboundtest.DirectClient(t, srv),
		Keys:   []grpclimit.Key{{Template: "rpc:{md:x-api-key}|{method}"}},
		OnDecision: func(_ context.Context, method string, r grpclimit.Result) {
			assert.Equal(t, checkMethod, method)
			mu.Lock()
			seen = append(seen, r)
			mu.Unlock()
		},
	})
	hc := serve(t, l)
	for i := range 3 {
		hdr, err := check(t, hc, "alice")
		require.NoError(t, err, "call %d", i+1)
		pol := parseField(t, hdr, grpclimit.MetadataRateLimitPolicy)
		assert.Equal(t, []field{{Name: "3-per-1h", Params: map[string]int64{"q": 3, "w": 3600}}}, pol)
		st := parseField(t, hdr, grpclimit.MetadataRateLimit)
		require.Len(t, st, 1)
		assert.Equal(t, int64(2-i), st[0].Params["r"], "call %d: the fleet's remaining", i+1)
		assert.InDelta(t, (i+1)*1200, st[0].Params["t"], 2)
		assert.Empty(t, hdr.Get(grpclimit.MetadataRetryAfter))
	}
	hdr, err := check(t, hc, "alice")
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	delay := retryInfo(t, err)
	assert.InDelta(t, 1200, delay.Seconds(), 2, "RetryInfo: the time to one token")
	assert.Equal(t, []string{"1200"}, hdr.Get(grpclimit.MetadataRetryAfter))
	st := parseField(t, hdr, grpclimit.MetadataRateLimit)
	assert.Equal(t, int64(0), st[0].Params["r"])
	assert.InDelta(t, 3600, st[0].Params["t"], 2)
	// Another caller has a bucket of its own; a missing x-api-key is not a
	// rate limit.
	_, err = check(t, hc, "bob")
	require.NoError(t, err)
	ctx := context.Background()
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)

	s := l.Stats()
	assert.Equal(t, grpclimit.Stats{Allowed: 4, Denied: 1, Unidentified: 1}, s)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 6)
	assert.Equal(t, grpclimit.OutcomeDenied, seen[3].Outcome)
	assert.Equal(t, []string{"rpc:alice|/grpc.health.v1.Health/Check"}, seen[3].Keys)
	assert.Equal(t, grpclimit.OutcomeUnidentified, seen[5].Outcome)
}

func TestSeveralLimits(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	l := newLimiter(t, grpclimit.Config{Client: inboundtest.DirectClient(t, srv), Keys: []grpclimit.Key{{Template: "two:{service}"}}})
	hc := serve(t, l)
	hdr, err := check(t, hc, "")
	require.NoError(t, err)
	pol := parseField(t, hdr, grpclimit.MetadataRateLimitPolicy)
	assert.Equal(t, []field{
		{Name: "3-per-1h", Params: map[string]int64{"q": 3, "w": 3600}},
		{Name: "10-per-24h", Params: map[string]int64{"q": 10, "w": 86400}},
	}, pol)
	st := parseField(t, hdr, grpclimit.MetadataRateLimit)
	require.Len(t, st, 2)
	assert.Equal(t, int64(2), st[0].Params["r"])
	assert.Equal(t, int64(9), st[1].Params["r"])
}

// TestSpoofedForwardedFor: x-forwarded-for is read only from a trusted
// proxy; a client that is not one cannot pick its {ip}.
func TestSpoofedForwardedFor(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	c := inboundtest.DirectClient(t, srv)
	var mu sync.Mutex
	var keys []string
	hook := func(_ context.Context, _ string, r grpclimit.Result) {
		mu.Lock()
		keys = append(keys, r.Keys...)
		mu.Unlock()
	}
	last := func() string { mu.Lock(); defer mu.Unlock(); return keys[len(keys)-1] }

	// No trusted proxy: every call is the peer's, 127.0.0.1, whatever it
	// claims; the third is denied although each claimed another address.
	hc := serve(t, newLimiter(t, grpclimit.Config{Client: c, OnDecision: hook}))
	for i, spoof := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
		_, err := check(t, hc, "", "x-forwarded-for", spoof)
		if i < 2 {
			require.NoError(t, err)
		} else {
			assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		}
		assert.Equal(t, "ip:127.0.0.1", last())
	}

	// A trusted proxy range that does not hold the peer: still ignored.
	other := newLimiter(t, grpclimit.Config{Client: c, OnDecision: hook, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	_, _ = check(t, serve(t, other), "", "x-forwarded-for", "203.0.113.9")
	assert.Equal(t, "ip:127.0.0.1", last())

	// Loopback trusted: the right-most untrusted address is the client;
	// what the client wrote left of it is ignored.
	trusting := newLimiter(t, grpclimit.Config{Client: c, OnDecision: hook, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	hc = serve(t, trusting)
	_, err := check(t, hc, "", "x-forwarded-for", "198.51.100.66, 203.0.113.7")
	require.NoError(t, err)
	assert.Equal(t, "ip:203.0.113.7", last())
	k, err := trusting.Keys(context.Background(), checkMethod)
	assert.Nil(t, k)
	var mp *grpclimit.MissingPartError
	require.ErrorAs(t, err, &mp, "no peer in the context: {ip} missing")
	assert.Equal(t, "ip", mp.Kind)
}

// TestRefusedIsUnavailable: a key the lease servers refuse this service is
// a misconfiguration: Unavailable, never ResourceExhausted.
func TestRefusedIsUnavailable(t *testing.T) {
	c := inboundtest.RestrictedClient(t, testRules, "rpc:*")
	var seen grpclimit.Result
	var mu sync.Mutex
	l := newLimiter(t, grpclimit.Config{
		Client: c,
		Keys:   []grpclimit.Key{{Template: "two:{md:x-api-key}"}},
		OnDecision: func(_ context.Context, _ string, r grpclimit.Result) {
			mu.Lock()
			seen = r
			mu.Unlock()
		},
	})
	hc := serve(t, l)
	hdr, err := check(t, hc, "alice")
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Empty(t, hdr.Get(grpclimit.MetadataRetryAfter))
	mu.Lock()
	defer mu.Unlock()
	assert.ErrorIs(t, seen.Err, client.ErrForbidden)
	// The allowed key of the same token works.
	l2 := newLimiter(t, grpclimit.Config{Client: c, Keys: []grpclimit.Key{{Template: "rpc:{md:x-api-key}"}}})
	_, err = check(t, serve(t, l2), "alice")
	require.NoError(t, err)
}

func TestShadow(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	l := newLimiter(t, grpclimit.Config{Client: inboundtest.DirectClient(t, srv), Keys: []grpclimit.Key{{Template: "rpc:{md:x-api-key}"}}, Shadow: true})
	hc := serve(t, l)
	for range 5 {
		_, err := check(t, hc, "alice")
		require.NoError(t, err)
	}
	s := l.Stats()
	assert.Equal(t, int64(3), s.Allowed)
	assert.Equal(t, int64(2), s.Shadow)
	assert.Zero(t, s.Denied)
}

func TestMaxWait(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	l := newLimiter(t, grpclimit.Config{Client: inboundtest.DirectClient(t, srv), Keys: []grpclimit.Key{{Template: "paced:{md:x-api-key}"}}, MaxWait: 2 * time.Second})
	hc := serve(t, l)
	start := time.Now()
	for range 3 {
		_, err := check(t, hc, "alice")
		require.NoError(t, err)
	}
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "10/s with a burst of 1: the later calls waited")
	s := l.Stats()
	assert.Equal(t, int64(3), s.Allowed+s.Waited)
	assert.Positive(t, s.Waited)
	assert.Zero(t, s.Denied)
}

func TestIdentityAndFallback(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	var mu sync.Mutex
	var keys []string
	l := newLimiter(t, grpclimit.Config{
		Client: inboundtest.DirectClient(t, srv),
		Keys:   []grpclimit.Key{{Template: "rpc:{user}", Fallback: "ip:{ip}"}},
		OnDecision: func(_ context.Context, _ string, r grpclimit.Result) {
			mu.Lock()
			keys = append(keys, r.Keys...)
			mu.Unlock()
		},
	})
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			ctx = grpclimit.WithIdentity(ctx, u[0])
		}
		return h(ctx, req)
	}
	hc := serve(t, l, auth)
	_, err := check(t, hc, "", "x-user", "a|b:c")
	require.NoError(t, err)
	_, err = check(t, hc, "")
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"rpc:a%7Cb%3Ac", "ip:127.0.0.1"}, keys, "escaped as httplimit escapes; no identity: the fallback")
}

// TestStream: one decision per stream open; MessageCost prices messages.
func TestStream(t *testing.T) {
	srv := leasetest.Start(t, testRules, leasetest.Options{})
	c := inboundtest.DirectClient(t, srv)
	watch := func(hc healthpb.HealthClient, apiKey string) (metadata.MD, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", apiKey)
		st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return nil, err
		}
		_, err = st.Recv()
		hdr, _ := st.Header()
		if err != nil {
			return hdr, err
		}
		return hdr, nil
	}
	l := newLimiter(t, grpclimit.Config{Client: c, Keys: []grpclimit.Key{{Template: "rpc:{md:x-api-key}|{service}"}}})
	hc := serve(t, l)
	for i := range 3 {
		hdr, err := watch(hc, "alice")
		require.NoError(t, err, "stream %d", i+1)
		st := parseField(t, hdr, grpclimit.MetadataRateLimit)
		assert.Equal(t, int64(2-i), st[0].Params["r"])
	}
	hdr, err := watch(hc, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Positive(t, retryInfo(t, err))
	assert.Equal(t, []string{"1200"}, hdr.Get(grpclimit.MetadataRetryAfter))

	// Free opening, 2 tokens a message: the first stream's message takes
	// 2 of 3, the second's is denied in RecvMsg.
	ml := newLimiter(t, grpclimit.Config{
		Client:      c,
		Keys:        []grpclimit.Key{{Template: "rpc:{md:x-api-key}|msg"}},
		Cost:        func(context.Context, string) int64 { return 0 },
		MessageCost: func(_ context.Context, _ string, m any) int64 { _ = m.(*healthpb.HealthCheckRequest); return 2 },
	})
	hc = serve(t, ml)
	_, err = watch(hc, "bob")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := hc.Watch(metadata.AppendToOutgoingContext(ctx, "x-api-key", "bob"), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = ws.Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Positive(t, retryInfo(t, err))
	tr := ws.Trailer()
	assert.NotEmpty(t, tr.Get(grpclimit.MetadataRetryAfter), "a message's denial: its fields in the trailer")
	assert.Equal(t, int64(1), parseField(t, tr, grpclimit.MetadataRateLimit)[0].Params["r"])
	assert.Equal(t, int64(1), ml.Stats().Denied)
	assert.Equal(t, int64(1), ml.Stats().Allowed)
}

func TestConfigErrors(t *testing.T) {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for _, cfg := range []grpclimit.Config{
		{},
		{Client: c, Keys: []grpclimit.Key{{Template: "{route}"}}},
		{Client: c, Keys: []grpclimit.Key{{Template: "x:{md:grpc-timeout}"}}},
		{Client: c, Keys: []grpclimit.Key{{Template: "x:{md:a b}"}}},
		{Client: c, Keys: []grpclimit.Key{{Template: "{method}:{ip}"}}},
		{Client: c, Keys: []grpclimit.Key{{Template: "ok:{user}", Fallback: "{nope}"}}},
		{Client: c, IPv4Prefix: 33},
		{Client: c, Headers: 7},
		{Client: c, MaxWait: -1},
	} {
		_, err := grpclimit.New(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	l, err := grpclimit.New(grpclimit.Config{Client: c})
	require.NoError(t, err, "zero values work")
	assert.NotNil(t, l.UnaryServerInterceptor())
	_, err = grpclimit.New(grpclimit.Config{Client: c, Keys: []grpclimit.Key{{Template: "k:{md:X-API-Key}|{service}:{method}"}}})
	assert.NoError(t, err)
}

// TestDeadlineBeforeDecisionIsNoRateLimit: a call whose deadline passes
// while its decision's direct take is on the way (a lease server slower
// than the call's deadline) ends with the call's own status,
// DeadlineExceeded, and its Result carries the context's error: no limit
// judged it. It ended ResourceExhausted, "rate limit exceeded", with a
// RetryInfo, and OnDecision saw an OutcomeDenied without Err: a rate
// limit by every sign.
func TestDeadlineBeforeDecisionIsNoRateLimit(t *testing.T) {
	// A lease server that answers nothing: each call hangs until the
	// client cancels it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hung := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })}
	go func() { _ = hung.Serve(ln) }()
	t.Cleanup(func() { _ = hung.Close() })
	c, err := client.New(client.Config{Servers: []string{"http://" + ln.Addr().String()}, ProbeTimeout: -1, RequestTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	results := make(chan grpclimit.Result, 1)
	l := newLimiter(t, grpclimit.Config{
		Client: c,
		Keys:   []grpclimit.Key{{Template: "rpc:{md:x-api-key}"}},
		OnDecision: func(_ context.Context, _ string, r grpclimit.Result) {
			results <- r
		},
	})
	// Placed before the limiter: sees the status it returns, which the
	// caller, gone at its deadline, never gets.
	returned := make(chan error, 1)
	outer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		returned <- err
		return resp, err
	}
	hc := serve(t, l, outer)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", "alice")
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	// The server's context of the call ends at its deadline, or canceled
	// first when the caller's reset of the stream arrives: either way the
	// decision carries that error, and the limiter answers its status.
	r := <-results
	ended := r.Decision.Err
	require.True(t, errors.Is(ended, context.DeadlineExceeded) || errors.Is(ended, context.Canceled), "the client's decision: %v", ended)
	assert.ErrorIs(t, r.Err, ended)
	got := <-returned
	assert.Equal(t, status.FromContextError(ended).Code(), status.Code(got), "the limiter's answer: %v", got)
	assert.Zero(t, l.Stats().Allowed)
}
