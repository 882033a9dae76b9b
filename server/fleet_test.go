package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// statusPage fetches f's status page.
func (f *fixture) statusPage() string {
	f.t.Helper()
	r := f.do(http.MethodGet, protocol.PathStatus, "", "", nil)
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	return string(r.body)
}

// find returns the first group of pattern in page, or fails.
func find(t *testing.T, page, pattern string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)` + pattern).FindStringSubmatch(page)
	require.NotNil(t, m, "no %s in the page:\n%s", pattern, page)
	return m[1]
}

// ruleCell returns the count in column class (granted, denied) of rule's row.
func ruleCell(t *testing.T, page, rule, class string) string {
	t.Helper()
	return find(t, page, `<tr data-rule="`+regexp.QuoteMeta(rule)+`">.*?class="n `+class+`">(\d+)<`)
}

// keyCount returns key's count in the top-K table id.
func keyCount(t *testing.T, page, id, key string) string {
	t.Helper()
	table := find(t, page, `id="`+id+`">(.*?)</table>`)
	return find(t, table, `data-key="`+regexp.QuoteMeta(key)+`"><td><code>[^<]*</code></td><td class="n">(\d+)<`)
}

// heartbeat records f's server among its peers and publishes its
// snapshot now, as its operator's loop does every other PeerInterval: the
// round is forced, so that the test need not wait for it.
func (f *fixture) heartbeat() {
	f.t.Helper()
	last := &f.srv.ops.published
	last.mu.Lock()
	last.name = ""
	last.mu.Unlock()
	_, err := f.srv.heartbeat()
	require.NoError(f.t, err)
}

// TestStatusPageFleet: two servers share a real Redis; traffic through
// each shows, summed, on both pages once each has published its snapshot;
// a stopped server drops out; when Redis fails, the page shows the server's
// own figures and says so.
func TestStatusPageFleet(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	store := leases.NewRedisStore(rdb, leases.RedisOptions{})
	a := newFixture(t, rulesYAML, store, Options{Peers: NewRedisPeers(rdb)})
	b := newFixture(t, rulesYAML, store, Options{Peers: NewRedisPeers(rdb)})

	// Through a: tiny:7 granted once, then denied twice; a lease on
	// user:9 left open. Through b: tiny:7 denied (the bucket is shared)
	// and tiny:8 granted.
	for range 3 {
		a.check("", "tiny:7")
	}
	a.lease("", "p", protocol.LeaseEntry{Key: "user:9", Want: 5})
	b.check("", "tiny:7")
	b.check("", "tiny:8")
	a.heartbeat()
	b.heartbeat()

	for _, f := range []*fixture{a, b} {
		page := f.statusPage()
		assert.Equal(t, "2", find(t, page, `id="fleet" data-fleet="true" data-counted="(\d+)"`))
		assert.Equal(t, "2", ruleCell(t, page, "tiny", "granted"))
		assert.Equal(t, "3", ruleCell(t, page, "tiny", "denied"))
		assert.Equal(t, "1", ruleCell(t, page, "per-user", "granted"))
		assert.Equal(t, "3", keyCount(t, page, "denied-keys", "tiny:7"))
		assert.Equal(t, "4", keyCount(t, page, "busiest-keys", "tiny:7"))
		assert.Equal(t, "1", keyCount(t, page, "busiest-keys", "tiny:8"))
		assert.Equal(t, "1", find(t, page, `id="open-leases">(\d+)<`))
		servers := find(t, page, `id="servers">(.*?)</table>`)
		assert.Len(t, regexp.MustCompile(`data-counted="true"`).FindAllString(servers, -1), 2, servers)
		assert.Contains(t, servers, "(this server)")
	}

	// A server that stops leaves, snapshot and all.
	require.NoError(t, a.stop())
	page := b.statusPage()
	assert.Equal(t, "1", find(t, page, `id="fleet" data-fleet="true" data-counted="(\d+)"`))
	assert.Equal(t, "1", ruleCell(t, page, "tiny", "granted"))
	assert.NotContains(t, find(t, page, `id="servers">(.*?)</table>`), a.url[len("http://"):])

	// Redis stops: this server's figures, said to be alone.
	rs.Stop(t)
	page = b.statusPage()
	assert.Contains(t, find(t, page, `id="fleet" data-fleet="false" data-counted="1">(.*?)</p>`), "the store did not answer")
	assert.Equal(t, "1", ruleCell(t, page, "tiny", "denied"))
	assert.Equal(t, "1", keyCount(t, page, "denied-keys", "tiny:7"))
}

// commandCalls returns the calls of each command Redis counted so far
// (INFO commandstats).
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	txt, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, m := range regexp.MustCompile(`cmdstat_([^:]+):calls=(\d+)`).FindAllStringSubmatch(txt, -1) {
		n, err := strconv.ParseInt(m[2], 10, 64)
		require.NoError(t, err)
		out[m[1]] = n
	}
	return out
}

// TestRedisPeersBeat: a heartbeat is one ZADD; the first, and then one
// every peerTidy, also removes the servers silent for peerForget and
// renews the record's time to live.
func TestRedisPeersBeat(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	ctx := context.Background()
	p := NewRedisPeers(rdb)
	t0 := time.UnixMilli(1_700_000_000_000)
	for i, step := range []struct {
		name string
		at   time.Duration
		tidy bool
	}{
		{"the first beat tidies", 0, true},
		{"a beat an interval later is one ZADD", PeerInterval, false},
		{"so is one just before peerTidy", peerTidy - time.Millisecond, false},
		{"a beat peerTidy after the last upkeep tidies", peerTidy, true},
		{"the next one does not", peerTidy + PeerInterval, false},
	} {
		now := t0.Add(step.at)
		// A server silent for longer than peerForget, and one silent
		// for less.
		gone, quiet := fmt.Sprintf("gone-%d", i), fmt.Sprintf("quiet-%d", i)
		require.NoError(t, rdb.ZAdd(ctx, RedisPeersKey,
			redis.Z{Score: float64(now.Add(-peerForget - time.Second).UnixMilli()), Member: gone},
			redis.Z{Score: float64(now.Add(-peerForget + time.Second).UnixMilli()), Member: quiet}).Err())
		require.NoError(t, rdb.Persist(ctx, RedisPeersKey).Err())
		before := commandCalls(t, rdb)
		require.NoError(t, p.Beat(ctx, "self", now), step.name)
		after := commandCalls(t, rdb)
		upkeep := int64(0)
		if step.tidy {
			upkeep = 1
		}
		assert.Equal(t, int64(1), after["zadd"]-before["zadd"], step.name)
		assert.Equal(t, upkeep, after["zremrangebyscore"]-before["zremrangebyscore"], step.name)
		assert.Equal(t, upkeep, after["pexpire"]-before["pexpire"], step.name)
		_, err := rdb.ZScore(ctx, RedisPeersKey, gone).Result()
		if step.tidy {
			assert.ErrorIs(t, err, redis.Nil, "%s: a server silent for peerForget is removed", step.name)
			ttl, err := rdb.PTTL(ctx, RedisPeersKey).Result()
			require.NoError(t, err)
			assert.InDelta(t, float64(peerForget), float64(ttl), float64(time.Minute), step.name)
		} else {
			assert.NoError(t, err, "%s: no upkeep, nothing removed", step.name)
		}
		score, err := rdb.ZScore(ctx, RedisPeersKey, quiet).Result()
		require.NoError(t, err, "%s: a server silent for less is kept", step.name)
		assert.Equal(t, float64(now.Add(-peerForget+time.Second).UnixMilli()), score)
		seen, err := rdb.ZScore(ctx, RedisPeersKey, "self").Result()
		require.NoError(t, err)
		assert.Equal(t, float64(now.UnixMilli()), seen, step.name)
	}
}

// TestRedisPeersCommands: RedisPeers counts every Redis command it sends,
// as Redis counts them, so that ratelease_peer_commands_total tells the
// fleet view's Redis work from the store's; the server exports it.
func TestRedisPeersCommands(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	ctx := context.Background()
	p := NewRedisPeers(rdb)
	total := func() int64 {
		var n int64
		for name, c := range commandCalls(t, rdb) {
			if name != "info" && name != "hello" && !strings.HasPrefix(name, "client|") {
				n += c
			}
		}
		return n
	}
	t0 := time.UnixMilli(1_700_000_000_000)
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"a first beat, with its upkeep", func() error { return p.Beat(ctx, "self", t0) }},
		{"a beat", func() error { return p.Beat(ctx, "self", t0.Add(PeerInterval)) }},
		{"a snapshot", func() error { return p.Publish(ctx, "self", []byte("{}"), SnapshotTTL) }},
		{"a list", func() error { _, err := p.List(ctx, t0); return err }},
		{"the snapshots", func() error { _, err := p.Snapshots(ctx, []string{"self", "other"}); return err }},
		{"no snapshot asked for", func() error { _, err := p.Snapshots(ctx, nil); return err }},
		{"leaving", func() error { return p.Leave(ctx, "self") }},
	} {
		before, sent := total(), p.Commands()
		require.NoError(t, step.do(), step.name)
		assert.Equal(t, total()-before, p.Commands()-sent, step.name)
	}
	assert.Equal(t, int64(9), p.Commands())

	f := newFixture(t, rulesYAML, nil, Options{Peers: p})
	mfs, err := f.reg.Gather()
	require.NoError(t, err)
	var got float64
	for _, mf := range mfs {
		if mf.GetName() == "ratelease_peer_commands_total" {
			got = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	assert.GreaterOrEqual(t, got, float64(9), "exported as ratelease_peer_commands_total")
}

// TestHeartbeatPublishesEveryOtherInterval: a heartbeat publishes the
// status snapshot every other interval, changed or not (its first one at
// once), and otherwise costs the store its ZADD only: the fleet view costs
// the same whatever the traffic.
func TestHeartbeatPublishesEveryOtherInterval(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	ctx := context.Background()
	t0 := time.UnixMilli(1_700_000_000_000)
	var clock atomic.Int64
	clock.Store(int64(t0.Sub(time.Unix(0, 0))))
	at := func() time.Time { return time.Unix(0, clock.Load()) }
	f := newFixture(t, rulesYAML, nil, Options{Peers: NewRedisPeers(rdb), Now: at})
	f.statusPage() // Run serves: the server's name has its address
	// The operator's loop beats once as the server starts, then every
	// PeerInterval of real time: let its first beat be done, so that the
	// commands counted below are the test's own.
	require.Eventually(t, func() bool {
		last := &f.srv.ops.published
		last.mu.Lock()
		defer last.mu.Unlock()
		return last.name != ""
	}, 10*time.Second, time.Millisecond, "the operator loop's first heartbeat")

	// beat makes a heartbeat and returns the snapshot published and the
	// Redis commands it ran: the operator loop's heartbeats (when Run has
	// bound the listener, and every PeerInterval of real time) wait
	// meanwhile, so under load none of theirs is counted as the test's.
	beat := func() (statusSnapshot, map[string]int64) {
		t.Helper()
		last := &f.srv.ops.published
		last.mu.Lock()
		before := commandCalls(t, rdb)
		name, err := f.srv.heartbeatLocked(last)
		after := commandCalls(t, rdb)
		last.mu.Unlock()
		require.NoError(t, err)
		doc, err := rdb.Get(ctx, RedisSnapshotPrefix+name).Bytes()
		require.NoError(t, err)
		var snap statusSnapshot
		require.NoError(t, json.Unmarshal(doc, &snap))
		for k, v := range after {
			after[k] = v - before[k]
		}
		return snap, after
	}
	published := func() statusSnapshot {
		t.Helper()
		snap, _ := beat()
		return snap
	}
	assert.Equal(t, t0.UnixMilli(), published().At, "the first heartbeat publishes")

	// A decision changes the figures: they wait for the next round.
	f.check("", "tiny:1")
	clock.Add(int64(PeerInterval))
	snap, ran := beat()
	assert.Equal(t, t0.UnixMilli(), snap.At, "one interval later, changed: not published yet")
	assert.Zero(t, snap.Rules["tiny"].Granted)
	assert.Equal(t, int64(0), ran["set"])
	assert.Equal(t, int64(1), ran["zadd"])

	clock.Add(int64(PeerInterval))
	snap = published()
	assert.Equal(t, t0.Add(snapshotRefresh).UnixMilli(), snap.At, "two intervals later: published, before the last one expires")
	assert.Equal(t, int64(1), snap.Rules["tiny"].Granted)

	clock.Add(int64(PeerInterval))
	assert.Equal(t, t0.Add(snapshotRefresh).UnixMilli(), published().At, "unchanged, one interval later: not published")
	clock.Add(int64(PeerInterval - 100*time.Millisecond))
	assert.Equal(t, at().UnixMilli(), published().At, "a heartbeat a little early still publishes its round")
}

// TestStatusPageAlone: a server without peers (the memory store) shows its
// own figures and says why.
func TestStatusPageAlone(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	f.check("", "tiny:1")
	f.lease("", "p", protocol.LeaseEntry{Key: "user:1", Want: 1})
	page := f.statusPage()
	assert.Contains(t, find(t, page, `id="fleet" data-fleet="false" data-counted="1">(.*?)</p>`), "shares no store")
	assert.Equal(t, "1", ruleCell(t, page, "tiny", "granted"))
	assert.Equal(t, "1", find(t, page, `id="open-leases">(\d+)<`))
}

// TestMergeKeys: merged summaries of a worked example, and, over random
// streams, every merged count bounds its key's true weight from above
// within its error, every error is at most MaxErr, and every key heavier
// than the floors together is listed.
func TestMergeKeys(t *testing.T) {
	got := mergeKeys("k", []keySummary{
		{K: 2, Total: 10, Floor: 3, Entries: []topKEntry{{Key: "x", Count: 5}, {Key: "y", Count: 3, Err: 2}}},
		{K: 2, Total: 8, Floor: 2, Entries: []topKEntry{{Key: "z", Count: 4, Err: 1}, {Key: "x", Count: 2}}},
	}, 10)
	assert.Equal(t, statusKeys{ID: "k", Total: 18, MaxErr: 9, Entries: []topKEntry{
		{Key: "x", Count: 7, Err: 0},
		{Key: "z", Count: 7, Err: 4},
		{Key: "y", Count: 5, Err: 4},
	}}, got)

	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		truth := map[string]int64{}
		var sums []keySummary
		var floors int64
		for range 1 + rng.IntN(4) {
			tk := newTopK(1 + rng.IntN(8))
			for range rng.IntN(300) {
				k := fmt.Sprint("k", int(rng.ExpFloat64()*5))
				tk.add(k, 1)
				truth[k]++
			}
			s := tk.summary()
			floors += s.Floor
			sums = append(sums, s)
		}
		m := mergeKeys("k", sums, 1000)
		listed := map[string]bool{}
		for _, e := range m.Entries {
			listed[e.Key] = true
			require.GreaterOrEqual(t, e.Count, truth[e.Key], "round %d key %s", round, e.Key)
			require.LessOrEqual(t, e.Count-e.Err, truth[e.Key], "round %d key %s", round, e.Key)
			require.LessOrEqual(t, e.Err, m.MaxErr, "round %d key %s", round, e.Key)
		}
		for k, w := range truth {
			if w > floors {
				require.True(t, listed[k], "round %d: key %s weighs %d > %d and is not listed", round, k, w, floors)
			}
		}
	}
}
