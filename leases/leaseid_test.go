package leases_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/ratelease/ratelease/protocol"
)

// elasticRules: user keys own 2 a minute and borrow from a pool of 3 a
// minute; the clock of the tests never moves, so nothing refills.
var elasticRules = leases.RuleSet{Rules: []leases.Rule{
	{Name: "users", Match: "user:*", Limit: 2, Period: time.Minute, Elastic: "capacity:api"},
	{Name: "capacity", Match: "capacity:*", Limit: 3, Period: time.Minute},
	{Name: "shadow", Match: "sh:*", Limit: 2, Period: time.Minute, Shadow: true},
}}

// TestElasticForgedLeaseID is a finding of the invariant review: an
// elastic lease's ID remembers what the pool lent, and its settle gives
// the pool back what was lent and not used. The client holds the ID; one
// that wrote a larger loan into it was given that much back at every
// settle, so the pool lent 15 tokens of a bound of 3 in five rounds, and
// any number in more. Now the ID carries a MAC: an ID altered in any part,
// or sent for another key or by another client, is unknown to the store,
// settles nothing, and gives the pool nothing back.
func TestElasticForgedLeaseID(t *testing.T) {
	alter := func(part int, to string) func(string) string {
		return func(id string) string {
			p := strings.Split(id, "~")
			p[part] = to
			return strings.Join(p, "~")
		}
	}
	cases := []struct {
		name   string
		forge  func(string) string
		key    string // the key settled; "" for the lease's own
		client string // the client that settles; "" for the lease's own
	}{
		{"a larger loan", alter(2, "999999"), "", ""},
		{"another stamp", alter(3, "1"), "", ""},
		{"a larger own grant", alter(1, "5"), "", ""},
		{"no MAC", func(id string) string { return id[:strings.LastIndex(id, "~")] }, "", ""},
		{"a MAC of another ID", alter(4, "AAAAAAAAAAA"), "", ""},
		{"another key", func(id string) string { return id }, "user:other", ""},
		{"another client", func(id string) string { return id }, "", "evil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, _, store := newEngine(t, elasticRules)
			ctx := context.Background()
			pool, _ := e.Policy().Match("capacity:api")
			poolLevel := func() float64 {
				st, err := store.State(ctx, "capacity:api", pool.Buckets()[0])
				require.NoError(t, err)
				return st.Level
			}
			// 2 from the own limit, 3 borrowed: the pool is empty.
			res, _, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "user:1", Want: 5}})
			require.NoError(t, err)
			require.NoError(t, res[0].Err)
			require.EqualValues(t, 3, res[0].Borrowed)
			require.InDelta(t, 0, poolLevel(), 1e-9)

			key, owner := "user:1", own("a/1")
			if tc.key != "" {
				key = tc.key
			}
			if tc.client != "" {
				owner = own(tc.client + "/1")
			}
			forged := tc.forge(res[0].LeaseID)
			out, _, err := e.Lease(ctx, owner, []leases.LeaseAsk{{Key: key, LeaseID: forged, Used: 2}})
			require.NoError(t, err)
			require.ErrorIs(t, out[0].Err, leases.ErrUnknownLease, "%s: %q", tc.name, forged)
			assert.InDelta(t, 0, poolLevel(), 1e-9, "the pool got nothing back")

			// The true ID still settles, once: 2 used of the own grant,
			// the 3 borrowed back to the pool.
			out, _, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "user:1", LeaseID: res[0].LeaseID, Used: 2}})
			require.NoError(t, err)
			require.NoError(t, out[0].Err)
			assert.InDelta(t, 3, poolLevel(), 1e-9)
			out, _, err = e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "user:1", LeaseID: res[0].LeaseID, Used: 2}})
			require.NoError(t, err)
			require.ErrorIs(t, out[0].Err, leases.ErrUnknownLease, "settled already")
			assert.InDelta(t, 3, poolLevel(), 1e-9, "given back once")
		})
	}
}

// TestElasticPoolBoundWithForgedSettles is the review's attack itself: five
// rounds of a lease that borrows the pool's whole bound, each settled with
// a loan rewritten to 999,999. The pool never lends more than its 3.
func TestElasticPoolBoundWithForgedSettles(t *testing.T) {
	e, _, _ := newEngine(t, elasticRules)
	ctx := context.Background()
	var borrowed int64
	for round := range 5 {
		key := "user:" + strconv.Itoa(round)
		res, _, err := e.Lease(ctx, own("evil/1"), []leases.LeaseAsk{{Key: key, Want: 5}})
		require.NoError(t, err)
		require.NoError(t, res[0].Err)
		borrowed += res[0].Borrowed
		if res[0].Borrowed == 0 {
			continue // nothing lent: a plain lease
		}
		parts := strings.Split(res[0].LeaseID, "~")
		require.GreaterOrEqual(t, len(parts), 4)
		parts[2] = "999999"
		_, _, err = e.Lease(ctx, own("evil/1"), []leases.LeaseAsk{{Key: key, LeaseID: strings.Join(parts, "~"), Used: 2}})
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, borrowed, int64(3), "tokens lent by a pool of burst 3 that never refills")
}

// TestShadowLeaseIDSigned: a shadow lease's ID is signed too; an altered
// one (its own grant raised, so that more of the use is charged... or
// lowered to 0, which made the entry a new request) settles nothing.
func TestShadowLeaseIDSigned(t *testing.T) {
	e, _, _ := newEngine(t, elasticRules)
	ctx := context.Background()
	res, _, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:1", Want: 5}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	p := strings.Split(res[0].LeaseID, "~")
	require.Len(t, p, 3, res[0].LeaseID)
	for _, own0 := range []string{"0", "1"} {
		forged := p[0] + "~" + own0 + "~" + p[2]
		out, _, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:1", LeaseID: forged, Used: 1, Want: 5}})
		require.NoError(t, err)
		require.ErrorIs(t, out[0].Err, leases.ErrUnknownLease, forged)
	}
	out, _, err := e.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: "sh:1", LeaseID: res[0].LeaseID, Used: 5}})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
}

// TestLeaseIDsAcrossEngines: a lease ID signed by one engine settles
// through another over the same store: after a reload (a new Engine over
// the same memory store), and between two servers sharing a Redis (their
// stores read the one key kept there). Over a store that keeps no key, an
// engine's IDs do not outlive it: the settle through another is refused
// as an unknown lease.
func TestLeaseIDsAcrossEngines(t *testing.T) {
	p, err := leases.NewPolicy(elasticRules)
	require.NoError(t, err)
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mem := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	rdb := redistest.Start(t).Client(t)
	red1 := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	red2 := leases.NewRedisStore(rdb, leases.RedisOptions{Now: clock.Now})
	engine := func(s leases.Store) *leases.Engine {
		return leases.NewEngine(leases.EngineOptions{Store: s, Policy: p})
	}
	cases := []struct {
		name     string
		from, to *leases.Engine
		settles  bool
	}{
		{"memory store, reloaded", engine(mem), engine(mem), true},
		{"two servers on one Redis", engine(red1), engine(red2), true},
		{"a store without a key", engine(bare{mem}), engine(bare{mem}), false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := "user:" + strconv.Itoa(i)
			res, _, err := tc.from.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: key, Want: 3}})
			require.NoError(t, err)
			require.NoError(t, res[0].Err)
			require.EqualValues(t, 1, res[0].Borrowed, res[0].LeaseID)
			out, _, err := tc.to.Lease(ctx, own("a/1"), []leases.LeaseAsk{{Key: key, LeaseID: res[0].LeaseID, Used: 1}})
			require.NoError(t, err)
			if tc.settles {
				require.NoError(t, out[0].Err)
			} else {
				require.ErrorIs(t, out[0].Err, leases.ErrUnknownLease)
			}
		})
	}
	k1, err := red1.IDKey(context.Background())
	require.NoError(t, err)
	k2, err := red2.IDKey(context.Background())
	require.NoError(t, err)
	assert.Equal(t, k1, k2, "one key in Redis")
	assert.GreaterOrEqual(t, len(k1), 32)
}

// bare hides a store's IDKey: a Store of some other package.
type bare struct{ leases.Store }

// TestLeaseIDLength: the longest ID the engine can sign fits the
// protocol's lease_id: every count at its largest, the stamp at its
// largest, and it is a valid lease_id (printable ASCII, no spaces).
func TestLeaseIDLength(t *testing.T) {
	e, _, _ := newEngine(t, leases.RuleSet{Rules: []leases.Rule{
		{Name: "users", Match: "user:*", Limit: 1, Period: time.Hour, Elastic: "pool"},
		{Name: "pool", Match: "pool", Limit: protocol.MaxCount, Period: time.Second},
	}})
	res, _, err := e.Lease(context.Background(), own("a/1"), []leases.LeaseAsk{{Key: "user:1", Want: protocol.MaxCount}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	require.EqualValues(t, protocol.MaxCount-1, res[0].Borrowed)
	id := res[0].LeaseID
	t.Logf("%d bytes: %s", len(id), id)
	// The stamp here is a time in µs; at its largest (2^63−1) it is 13
	// digits in base 36, 3 more than now.
	assert.LessOrEqual(t, len(id)+3, protocol.MaxLeaseIDBytes)
	req := protocol.LeaseRequest{ClientID: "c", Leases: []protocol.LeaseEntry{{Key: "user:1", LeaseID: id, Used: 1}}}
	require.NoError(t, req.Validate())
}

// TestSettlesLease: which lease IDs settle a lease the store keeps, for
// the server's cap on a client's keys.
func TestSettlesLease(t *testing.T) {
	for id, want := range map[string]bool{
		"8f3a9c0d1e2b4a5c":                   true,  // a store's ID
		"8f3a9c0d1e2b4a5c~2~AAAAAAAAAAA":     true,  // a shadow lease the limits granted 2 of
		"8f3a9c0d1e2b4a5c~0~AAAAAAAAAAA":     false, // ... granted nothing: a new request
		"8f3a9c0d1e2b4a5c~0~3~k~AAAAAAAAAAA": false, // an elastic one all borrowed
		"8f3a9c0d1e2b4a5c~2~3~k~AAAAAAAAAAA": true,
		"x~0":                                true, // not such an ID: the store will not know it
		"x~-1~AAAAAAAAAAA":                   true,
	} {
		assert.Equal(t, want, leases.SettlesLease(id), id)
	}
}
