package inbound

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two parts: {a}, escaped, and {ip}, raw.
const (
	partA uint8 = iota + 1
	partIP
)

func resolve(name string) (keytemplate.Segment, error) {
	switch name {
	case "a":
		return keytemplate.Segment{Kind: partA}, nil
	case "ip":
		return keytemplate.Segment{Kind: partIP, Raw: true}, nil
	}
	return keytemplate.Segment{}, fmt.Errorf("unknown part {%s}", name)
}

// closedClient is a client closed already: it asks no server, and every
// decision is client.SourceClosed.
func closedClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:1"}})
	require.NoError(t, err)
	require.NoError(t, c.Close(context.Background()))
	return c
}

func newLimiter(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = closedClient(t)
	}
	cfg.Prefix, cfg.Resolve = "test", resolve
	l, err := New(cfg)
	require.NoError(t, err)
	return l
}

// TestNewErrors: each error names the limiter (Prefix), and they come in
// the documented order, CheckProxies between the trusted proxies and the
// header mode.
func TestNewErrors(t *testing.T) {
	c := closedClient(t)
	bad := errors.New("test: bad proxy header")
	checked := func([]netip.Prefix) error { return bad }
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "test: Config.Client is required"},
		{Config{Client: c, Keys: make([]Key, protocol.MaxEntries+1)}, "test: 1001 keys; at most 1000"},
		{Config{Client: c, Keys: []Key{{Template: "x:{b}"}}}, "test: Keys[0].Template: "},
		{Config{Client: c, Keys: []Key{{Template: "x:{a}", Fallback: "{a}{a}"}}}, "test: Keys[0].Fallback: "},
		{Config{Client: c, IPv4Prefix: 33, Headers: 9}, "test: IPv6Prefix 0 or IPv4Prefix 33 out of range"},
		{Config{Client: c, IPv6Prefix: -1}, "test: IPv6Prefix -1 or IPv4Prefix 0 out of range"},
		{Config{Client: c, TrustedProxies: []netip.Prefix{{}}, CheckProxies: checked}, "test: trusted proxy prefix invalid Prefix is not valid"},
		{Config{Client: c, CheckProxies: checked, Headers: 9}, "test: bad proxy header"},
		{Config{Client: c, Headers: 9, MaxWait: -1}, "test: unknown HeaderMode 9"},
		{Config{Client: c, MaxWait: -1, MaxQueue: -1}, "test: MaxWait -1ns is negative"},
		{Config{Client: c, MaxQueue: -1}, "test: MaxQueue -1 is negative"},
	} {
		tc.cfg.Prefix, tc.cfg.Resolve = "test", resolve
		_, err := New(tc.cfg)
		require.Error(t, err, "%+v", tc.cfg)
		assert.True(t, strings.HasPrefix(err.Error(), tc.want), "%q, want %q", err, tc.want)
	}
}

func TestDefaults(t *testing.T) {
	var trusted []netip.Prefix
	l := newLimiter(t, Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.1.2.3/104")},
		CheckProxies:   func(p []netip.Prefix) error { trusted = p; return nil },
		MaxWait:        time.Second,
	})
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, trusted, "normalized before CheckProxies sees them")
	assert.Equal(t, &Peers{Trusted: trusted, V4Bits: 32, V6Bits: 64}, l.Peers())
	assert.Equal(t, DefaultMaxQueue, cap(l.queue))
	assert.NotNil(t, l.Logger())
	keys, err := l.MakeKeys(func(s keytemplate.Segment) (string, bool) { return "192.0.2.1", s.Kind == partIP })
	require.NoError(t, err)
	assert.Equal(t, []string{"ip:192.0.2.1"}, keys, "no Keys: DefaultKey")
}

func TestKeys(t *testing.T) {
	type publicKey struct {
		// A limiter's Key: its own documentation, the same fields.
		Template string
		Fallback string
	}
	assert.Equal(t, []Key{{"a:{a}", "ip:{ip}"}}, Keys([]publicKey{{"a:{a}", "ip:{ip}"}}))
}

func TestMakeKeys(t *testing.T) {
	l := newLimiter(t, Config{Keys: []Key{{Template: "a:{a}", Fallback: "ip:{ip}"}, {Template: "k|{a}"}}})
	vals := map[uint8]string{partA: "x|y", partIP: "2001:db8::/64"}
	value := func(s keytemplate.Segment) (string, bool) { v := vals[s.Kind]; return v, v != "" }
	keys, err := l.MakeKeys(value)
	require.NoError(t, err)
	assert.Equal(t, []string{"a:x%7Cy", "k|x%7Cy"}, keys)

	delete(vals, partA)
	_, err = l.MakeKeys(value)
	var miss *keytemplate.MissingPartError
	require.ErrorAs(t, err, &miss, "the first key falls back; the second has no fallback")
	assert.Equal(t, "k|{a}", miss.Template)
	assert.Equal(t, "{a}", miss.Segment.Written)

	delete(vals, partIP)
	_, err = l.MakeKeys(value)
	require.ErrorAs(t, err, &miss)
	assert.Equal(t, "ip:{ip}", miss.Template, "the fallback lacks a part too: the fallback's")
	assert.Equal(t, partIP, miss.Segment.Kind)
}

func TestPeers(t *testing.T) {
	peer := netip.MustParseAddr("10.0.0.1")
	called := false
	forwarded := func() []string { called = true; return []string{"198.51.100.1", "203.0.113.5"} }
	none := Peers{V4Bits: 24, V6Bits: 48}
	assert.Equal(t, peer, none.Client(peer, forwarded))
	assert.False(t, called, "no trusted proxy: the forwarded addresses are not read")
	other := Peers{Trusted: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	assert.Equal(t, peer, other.Client(peer, forwarded))
	assert.False(t, called, "an untrusted peer: the forwarded addresses are not read")
	trusting := Peers{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	assert.Equal(t, netip.MustParseAddr("203.0.113.5"), trusting.Client(peer, forwarded))
	assert.True(t, called)
	assert.Equal(t, "10.0.0.0/24", none.Part(peer))
	assert.Equal(t, "2001:db8::/48", none.Part(netip.MustParseAddr("2001:db8::1")))
}

// TestDecideClosed: a closed client's decision is VerdictClosing (a
// closed client is not a rate limit: httplimit answered it 429 with
// "the rate limit is exhausted" before, found by review); Shadow admits it.
// Each is counted.
func TestDecideClosed(t *testing.T) {
	ctx := context.Background()
	for _, wait := range []time.Duration{0, time.Second} {
		l := newLimiter(t, Config{MaxWait: wait})
		out := l.Decide(ctx, []string{"k"}, 2)
		assert.Equal(t, VerdictClosing, out.Verdict)
		assert.Equal(t, Outcome(OutcomeDenied), out.Outcome)
		assert.Equal(t, client.SourceClosed, out.Decision.Source)
		assert.ErrorIs(t, out.Err, client.ErrClosed)
		assert.Equal(t, Stats{Denied: 1}, l.Stats())
	}

	l := newLimiter(t, Config{Shadow: true})
	out := l.Decide(ctx, []string{"k"}, 1)
	assert.Equal(t, VerdictAdmit, out.Verdict)
	assert.Equal(t, Outcome(OutcomeShadow), out.Outcome)
	l.Unidentified()
	assert.Equal(t, Stats{Shadow: 1, Unidentified: 1}, l.Stats())
}

func TestRetryAfterSeconds(t *testing.T) {
	assert.Equal(t, "1", RetryAfterSeconds(-time.Second))
	assert.Equal(t, "1", RetryAfterSeconds(0))
	assert.Equal(t, "1", RetryAfterSeconds(time.Millisecond))
	assert.Equal(t, "1", RetryAfterSeconds(time.Second))
	assert.Equal(t, "3", RetryAfterSeconds(2001*time.Millisecond))
	assert.Equal(t, int64(0), CeilSeconds(0))
	assert.Equal(t, int64(2), CeilSeconds(1100*time.Millisecond))
}

// TestDecideEndedIsNoDenial: a decision whose context ended before a
// server decided it (client.Decision.Err is the context's error) is the
// request's end, VerdictEnded with that error, as when the context ends
// while the request waits in the queue: no limit judged it. Without a
// queue it was VerdictDeny with no Err, a rate limit by every sign (grpclimit
// answered ResourceExhausted and its RetryInfo, not the context's status),
// while with MaxWait the same decision was VerdictEnded.
func TestDecideEndedIsNoDenial(t *testing.T) {
	srv := leasetest.Start(t, "rules:\n  - {name: k, match: \"k*\", limit: 100, period: 1h}\n", leasetest.Options{})
	c := inboundtest.DirectClient(t, srv)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"canceled", canceled, context.Canceled},
		{"deadline passed", expired, context.DeadlineExceeded},
	} {
		for _, wait := range []time.Duration{0, time.Second} {
			l := newLimiter(t, Config{Client: c, MaxWait: wait})
			out := l.Decide(tc.ctx, []string{"k"}, 1)
			require.ErrorIs(t, out.Decision.Err, tc.want, "%s, MaxWait %v: the client's decision", tc.name, wait)
			assert.Equal(t, VerdictEnded, out.Verdict, "%s, MaxWait %v", tc.name, wait)
			assert.Equal(t, Outcome(OutcomeDenied), out.Outcome, "%s, MaxWait %v", tc.name, wait)
			assert.ErrorIs(t, out.Err, tc.want, "%s, MaxWait %v", tc.name, wait)
			assert.Equal(t, Stats{Denied: 1}, l.Stats(), "%s, MaxWait %v", tc.name, wait)
		}
	}
	// The key was never taken: its 100 tokens are all there.
	l := newLimiter(t, Config{Client: c})
	out := l.Decide(context.Background(), []string{"k"}, 100)
	assert.Equal(t, VerdictAdmit, out.Verdict)
}
