package client_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of the SDK's public API as a caller meets it: what each
// exported name's documentation promises, at its edges.

// TestLimiterInvalidDenies: a Limiter made with an invalid key, or with no
// key or too many, denies every request and says why, as Client.Limiter's
// doc promises, through each of its methods. Allow on a Limiter of one
// invalid key dereferenced the key's state, never made (found by the API
// review: a nil pointer panic, the hot path of a caller who built the key
// from a request).
func TestLimiterInvalidDenies(t *testing.T) {
	c := transportClient(t)
	tests := []struct {
		name string
		keys []string
	}{
		{"empty key", []string{""}},
		{"key one byte too long", []string{strings.Repeat("k", protocol.MaxKeyBytes+1)}},
		{"invalid UTF-8", []string{"user:\xff"}},
		{"control character", []string{"user:\n1"}},
		{"valid, then invalid", []string{"user:1", ""}},
		{"invalid, then valid", []string{"", "user:1"}},
		{"no key", nil},
		{"too many keys", manyKeys(protocol.MaxEntries + 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := c.Limiter(tt.keys...)
			require.ErrorIs(t, l.Err(), client.ErrInvalidRequest)
			require.NotPanics(t, func() { assert.False(t, l.Allow(), "Allow") })
			require.NotPanics(t, func() { assert.False(t, l.AllowN(1), "AllowN") })
			require.NotPanics(t, func() {
				d := l.Decide(context.Background(), 1)
				assert.False(t, d.Allowed)
				assert.Equal(t, client.SourceDenied, d.Source)
				assert.ErrorIs(t, d.Err, client.ErrInvalidRequest)
			})
			require.NotPanics(t, func() {
				err := l.Wait(context.Background())
				assert.ErrorIs(t, err, client.ErrInvalidRequest)
				assert.NotErrorIs(t, err, client.ErrRateLimited)
			})
		})
	}
	// The longest valid key is valid.
	l := c.Limiter(strings.Repeat("k", protocol.MaxKeyBytes))
	require.NoError(t, l.Err())
	assert.True(t, l.Allow())
}

// TestNewRejectsInvalidConfig: a Config the client cannot work with fails
// New with an error that names the field and matches ErrInvalidConfig,
// before any call: never an outage, a refusal at every call, or a default
// put silently in the place of what was asked.
func TestNewRejectsInvalidConfig(t *testing.T) {
	const token = "api-token"
	srv := leasetest.Start(t, authRules(token), leasetest.Options{})
	ok := client.Config{Servers: []string{srv.URL()}, Token: token}
	tests := []struct {
		name  string
		edit  func(*client.Config)
		field string // named by the error
	}{
		// A token read from a file with its trailing newline: net/http
		// refuses to send the header, the probe took that for a server
		// down, and every decision went to the fallback (Online false,
		// no refusal, no error logged but "no lease server answered").
		{"token with a trailing newline", func(c *client.Config) { c.Token += "\n" }, "Token"},
		{"token with a carriage return", func(c *client.Config) { c.Token += "\r\n" }, "Token"},
		{"token with a NUL", func(c *client.Config) { c.Token = "api\x00token" }, "Token"},
		// The servers refuse every call of a client_id that is not 1 to
		// 128 bytes of printable ASCII without spaces (400
		// invalid_client_id); New's probe does not send it.
		{"client ID with a space", func(c *client.Config) { c.ClientID = "checkout 1" }, "ClientID"},
		{"client ID too long", func(c *client.Config) { c.ClientID = strings.Repeat("c", protocol.MaxClientIDBytes+1) }, "ClientID"},
		{"client ID not ASCII", func(c *client.Config) { c.ClientID = "caisse-é" }, "ClientID"},
		// Each call's URL is the server's with the API path appended: a
		// query or a fragment swallowed it (every call a 404, each
		// decision SourceRefused), an endpoint's URL doubled it, and a
		// URL without a host name dialed this machine (the fallback
		// decided). New's probe took the 404s for an answer.
		{"URL with a query", func(c *client.Config) { c.Servers = []string{srv.URL() + "?region=eu"} }, "Servers"},
		{"URL with a fragment", func(c *client.Config) { c.Servers = []string{srv.URL() + "#a"} }, "Servers"},
		{"URL with an empty fragment", func(c *client.Config) { c.Servers = []string{srv.URL() + "#"} }, "Servers"},
		{"URL with an empty query", func(c *client.Config) { c.Servers = []string{srv.URL() + "?"} }, "Servers"},
		{"URL of the leases endpoint", func(c *client.Config) { c.Servers = []string{srv.URL() + protocol.PathLeases} }, "Servers"},
		{"URL of the check endpoint", func(c *client.Config) { c.Servers = []string{srv.URL() + protocol.PathCheck + "/"} }, "Servers"},
		{"URL without a host name", func(c *client.Config) { c.Servers = []string{"http://:" + srvPort(t, srv)} }, "Servers"},
		{"second URL invalid", func(c *client.Config) { c.Servers = []string{srv.URL(), "http://:" + srvPort(t, srv)} }, "Servers"},
		// A negative duration or count was taken for zero, its default
		// put in its place without a word: IdleTimeout -1 (for "never")
		// forgot keys after 30 s, MaxKeys -1 (for "no cap") held 10,000.
		{"negative SettleInterval", func(c *client.Config) { c.SettleInterval = -time.Millisecond }, "SettleInterval"},
		{"negative Horizon", func(c *client.Config) { c.Horizon = -time.Second }, "Horizon"},
		{"negative IdleTimeout", func(c *client.Config) { c.IdleTimeout = -1 }, "IdleTimeout"},
		{"negative RequestTimeout", func(c *client.Config) { c.RequestTimeout = -time.Second }, "RequestTimeout"},
		{"negative MaxRetryWait", func(c *client.Config) { c.MaxRetryWait = -time.Second }, "MaxRetryWait"},
		{"negative LeaseMinTokens", func(c *client.Config) { c.LeaseMinTokens = -8 }, "LeaseMinTokens"},
		{"negative InitialBatch", func(c *client.Config) { c.InitialBatch = -1 }, "InitialBatch"},
		{"negative MaxBatch", func(c *client.Config) { c.MaxBatch = -1 }, "MaxBatch"},
		{"negative MaxKeys", func(c *client.Config) { c.MaxKeys = -1 }, "MaxKeys"},
		{"negative MaxWait", func(c *client.Config) { c.MaxWait = -time.Second }, "MaxWait"},
		{"DefaultSafeRate not a number", func(c *client.Config) { c.DefaultSafeRate = math.NaN() }, "DefaultSafeRate"},
		// A tick of a nanosecond (or a microsecond: a unit forgotten, 10
		// for 10 ms) made the settle loop spin on a core, its ticks far
		// shorter than any call it makes.
		{"SettleInterval of a nanosecond", func(c *client.Config) { c.SettleInterval = 1 }, "SettleInterval"},
		{"SettleInterval below a millisecond", func(c *client.Config) { c.SettleInterval = 999 * time.Microsecond }, "SettleInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			c, err := client.New(cfg)
			if c != nil {
				d := c.Allow(context.Background(), "user:1")
				t.Logf("New accepted it; a decision: %+v; %+v", d, c.Stats())
				_ = c.Close(context.Background())
			}
			require.Error(t, err)
			assert.Nil(t, c)
			assert.ErrorIs(t, err, client.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.field)
			assert.NotErrorIs(t, err, client.ErrServerRefused)
		})
	}
	t.Run("valid", func(t *testing.T) {
		cfg := ok
		cfg.ClientID = strings.Repeat("c", protocol.MaxClientIDBytes)
		cfg.Servers = []string{srv.URL() + "/"}
		c := newClient(t, cfg)
		assert.True(t, c.Allow(context.Background(), "user:1").Allowed)
	})
}

// srvPort returns the port srv listens on.
func srvPort(t *testing.T, srv *leasetest.Server) string {
	t.Helper()
	_, port, err := net.SplitHostPort(srv.Addr())
	require.NoError(t, err)
	return port
}

// TestStatsDeniedCountsRequests: Stats.Denied counts requests denied, as
// its doc says: an Allow denied counts one, a Wait that waits and then
// goes ahead none, a Wait that fails one, however many times each was
// decided. A Wait counted every try its loop made (found by the API
// review: a Wait that waited 100 ms for tiny:1's refill counted two
// denials, and with TransportOptions.Wait a service whose every request
// went ahead reported denials).
func TestStatsDeniedCountsRequests(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}})
	ctx := context.Background()
	for range 5 { // tiny: a bucket of 5, 10 a second
		require.True(t, c.Allow(ctx, "tiny:1").Allowed)
	}
	denied := func() int64 { return c.Stats().Denied }

	before := denied()
	require.False(t, c.Allow(ctx, "tiny:1").Allowed)
	assert.Equal(t, before+1, denied(), "an Allow denied")

	before = denied()
	require.NoError(t, c.Wait(ctx, "tiny:1"))
	assert.Equal(t, before, denied(), "a Wait that went ahead after a wait")

	before = denied()
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Wait(short, "tiny:1"), client.ErrRateLimited)
	assert.Equal(t, before+1, denied(), "a Wait that failed")

	before = denied()
	require.ErrorIs(t, c.WaitN(ctx, 6, "tiny:2"), client.ErrCostExceedsBurst)
	require.ErrorIs(t, c.WaitN(ctx, 0, "tiny:2"), client.ErrInvalidRequest)
	assert.Equal(t, before+2, denied(), "a Wait beyond the burst, and one of 0 tokens")
}

// TestEndedContextIsNoRateLimit: a decision whose context ends before a
// server decided it (canceled before, or its deadline passing while its
// direct take is on the way) says so in Decision.Err: the limit never
// judged it. It was a denial with Source direct, a RetryAfter of a tick
// and no Err, a rate limit by every sign a caller has (found by the API
// review: a handler answered 429 for a lease server slower than the
// request's deadline).
func TestEndedContextIsNoRateLimit(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	slow := slowProxy(t, srv.URL(), 200*time.Millisecond)
	c := newClient(t, client.Config{Servers: []string{slow}, ProbeTimeout: -1})
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"canceled before", func() (context.Context, context.CancelFunc) { return canceled, func() {} }, context.Canceled},
		{"deadline during the take", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 20*time.Millisecond)
		}, context.DeadlineExceeded},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			d := c.Allow(ctx, fmt.Sprint("user:ended-", i))
			require.False(t, d.Allowed)
			assert.ErrorIs(t, d.Err, tt.want, "%+v", d)
			assert.NotErrorIs(t, d.Err, client.ErrRateLimited)

			ctx, cancel = tt.ctx()
			defer cancel()
			err := c.Wait(ctx, fmt.Sprint("user:ended-wait-", i))
			assert.Equal(t, tt.want, err, "Wait returns ctx's error itself")
		})
	}
}

// TestStatsFallbackCountsRequests: Stats.FallbackDecisions counts requests
// decided by the fallback, as its doc says, one per decision whatever its
// keys, as DirectDecisions counts them. It counted each key the fallback
// allowed: a decision over three keys counted three, one denied at its
// first key one (found by the API review).
func TestStatsFallbackCountsRequests(t *testing.T) {
	for _, fb := range []client.Fallback{client.FallbackOpen, client.FallbackClosed, client.FallbackSafeRate} {
		t.Run(fb.String(), func(t *testing.T) {
			c := newClient(t, client.Config{Servers: []string{closedAddr(t)}, Fallback: fb, DefaultSafeRate: 1000, ProbeTimeout: -1})
			const decisions = 5
			for range decisions {
				d := c.Allow(context.Background(), "user:a", "user:b", "user:c")
				require.Equal(t, client.SourceFallback, d.Source, "%+v", d)
			}
			st := c.Stats()
			assert.EqualValues(t, decisions, st.FallbackDecisions, "%+v", st)
		})
	}
}

// TestClosedDecisionSaysClosed: after Close, every way to decide denies
// with an Err matching ErrClosed, so that a caller who answers a denial
// without Err as a rate limit (429 and its RetryAfter, as Decision.Err's
// doc invites) does not take a closed client for one. A closed client's
// decision carried Source SourceClosed and no Err (found by the API
// review: a server draining its requests at shutdown answered them 429
// with a Retry-After of 0).
func TestClosedDecisionSaysClosed(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1})
	require.NoError(t, err)
	leaseKey(t, c, "fast:leased")
	l := c.Limiter("fast:leased")
	require.NoError(t, c.Close(context.Background()))

	ctx := context.Background()
	decisions := map[string]client.Decision{
		"Allow, leased key":  c.Allow(ctx, "fast:leased"),
		"Allow, direct key":  c.Allow(ctx, "user:never-seen"),
		"AllowN, two keys":   c.AllowN(ctx, 2, "fast:leased", "user:never-seen"),
		"Limiter.Decide":     l.Decide(ctx, 1),
		"another class":      c.Allow(client.WithPriority(ctx, client.PriorityCritical), "user:never-seen"),
		"Limiter, made late": c.Limiter("user:late").Decide(ctx, 1),
	}
	for name, d := range decisions {
		assert.False(t, d.Allowed, name)
		assert.Equal(t, client.SourceClosed, d.Source, name)
		assert.ErrorIs(t, d.Err, client.ErrClosed, name)
		assert.NotErrorIs(t, d.Err, client.ErrRateLimited, name)
	}
	assert.False(t, l.Allow())
	assert.Equal(t, client.ErrClosed, c.Wait(ctx, "fast:leased"), "Wait returns ErrClosed itself")
	assert.Equal(t, client.ErrClosed, l.Wait(ctx))
}

// TestRateLimitedErrorOwnsItsKeys: the *RateLimitedError Wait returns
// holds its own copy of the keys, as the Transport's does: it held the
// caller's slice itself, so a caller that reused its slice (a buffer of
// keys per request) changed, or raced with, an error it had returned and
// logged (found by the API review).
func TestRateLimitedErrorOwnsItsKeys(t *testing.T) {
	srv := leasetest.Start(t, rules, leasetest.Options{})
	c := newClient(t, client.Config{Servers: []string{srv.URL()}})
	ctx := context.Background()
	for range 5 {
		require.True(t, c.Allow(ctx, "tiny:own").Allowed)
	}
	keys := []string{"tiny:own"}
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	err := c.Wait(short, keys...)
	var rl *client.RateLimitedError
	require.ErrorAs(t, err, &rl)
	keys[0] = "reused"
	assert.Equal(t, []string{"tiny:own"}, rl.Keys)
}
