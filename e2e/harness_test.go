package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/loadgen"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/stretchr/testify/require"
)

// bins are the binaries TestMain builds once for all scenarios.
var bins struct {
	rateleased, loadgen, protected string
}

// scale stretches every scenario: 1 in `make test`, 3 in `make e2e-long`
// (RATELEASE_E2E_SCALE).
var scale = 1.0

func TestMain(m *testing.M) {
	flag.Parse()
	if v := os.Getenv("RATELEASE_E2E_SCALE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 100 {
			fmt.Fprintf(os.Stderr, "RATELEASE_E2E_SCALE=%q: want a number in (0, 100]\n", v)
			os.Exit(2)
		}
		scale = f
	}
	code := func() int {
		if testing.Short() {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "ratelease-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, b := range []struct {
			dst *string
			pkg string
		}{
			{&bins.rateleased, "github.com/ratelease/ratelease/server/cmd/rateleased"},
			{&bins.loadgen, "github.com/ratelease/ratelease/e2e/cmd/loadgen"},
			{&bins.protected, "github.com/ratelease/ratelease/examples/protected"},
		} {
			if *b.dst, err = e2eproc.Build(dir, b.pkg); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }

// The user:* rule of TestPerUserFleet: a per-user limit, small enough that
// a user's requests, spread by a load balancer over many processes, come a
// few a second to each.
const (
	userRate  = 10.0 // tokens per second
	userBurst = 10
	userTTL   = time.Second
)

// The many:* rule of TestManyKeys: its bucket is big enough to lease (the
// SDK leases no bucket smaller than four times Config.LeaseMinTokens), so
// the hottest keys are leased and MaxKeys is exercised.
const (
	manyRate  = 40.0 // tokens per second
	manyBurst = 40
)

// The rules of every scenario; each scenario uses its own keys. rate and
// burst are the acc:*, fair:* and fault:* rules' (scenarios_test.go),
// cutRate, cutBurst and cutTTL the cut:* rule's (cutoff_test.go), ownRate,
// ownBurst and ownTTL the own:* rule's (owned_test.go).
var rules = fmt.Sprintf(`
default: deny
rules:
  - {name: accuracy, match: "acc:*",   limit: %[1]g, period: 1s, burst: %[2]d, lease_ttl: 1s}
  - {name: fairness, match: "fair:*",  limit: %[1]g, period: 1s, burst: %[2]d, lease_ttl: 1s}
  - {name: users,    match: "user:*",  limit: %[3]g, period: 1s, burst: %[4]d, lease_ttl: %[5]v}
  - {name: many,     match: "many:*",  limit: %[9]g, period: 1s, burst: %[10]d, lease_ttl: 1s}
  - {name: faults,   match: "fault:*", limit: %[1]g, period: 1s, burst: %[2]d, lease_ttl: 1s}
  - {name: cutoff,   match: "cut:*",   limit: %[6]g, period: 1s, burst: %[7]d, lease_ttl: %[8]v}
  - {name: owned,    match: "own:*",   limit: %[11]g, period: 1s, burst: %[12]d, lease_ttl: %[13]v}
`, rate, burst, userRate, userBurst, userTTL, cutRate, cutBurst, cutTTL, manyRate, manyBurst, ownRate, ownBurst, ownTTL) + algorithmRules

// cluster is one redis-server and three rateleased daemons sharing it.
type cluster struct {
	redis   *redistest.Server
	daemons []*e2eproc.Daemon
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process scenario")
	}
	c := &cluster{redis: redistest.StartWith(t, redistest.Options{Persist: true})}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rules), 0o600))
	for range 3 {
		c.daemons = append(c.daemons, e2eproc.StartDaemon(t, bins.rateleased, "-rules", path, "-redis", c.redis.URL()))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, d := range c.daemons {
				t.Logf("rateleased %d (%s) output:\n%s", i, d.Addr(), tail(d.Output(), 3000))
			}
		}
	})
	return c
}

// servers returns the daemons' URLs, starting with the i-th, so that
// clients spread over the servers.
func (c *cluster) servers(i int) string {
	var urls []string
	for j := range c.daemons {
		urls = append(urls, c.daemons[(i+j)%len(c.daemons)].URL())
	}
	return strings.Join(urls, ",")
}

// load is one loadgen process.
type load struct {
	name string
	args []string
	proc *e2eproc.Process
	out  string
	res  *result
}

// result is loadgen's JSON output.
type result = loadgen.Result

// startLoads starts the loadgens at once on a common slot grid; the grid
// starts at the returned time.
func startLoads(t *testing.T, loads []*load) time.Time {
	t.Helper()
	origin := time.UnixMilli(time.Now().UnixMilli())
	startLoadsOn(t, loads, origin)
	return origin
}

// startLoadsOn starts the loadgens at once on the slot grid that starts at
// origin (a whole millisecond, as startLoads returns it), so that loadgens
// started at different moments share one grid.
func startLoadsOn(t *testing.T, loads []*load, origin time.Time) {
	t.Helper()
	dir := t.TempDir()
	for i, l := range loads {
		l.out = filepath.Join(dir, fmt.Sprintf("load-%d.json", i))
		args := append([]string{"-start-unix-ms", strconv.FormatInt(origin.UnixMilli(), 10), "-slot", slot.String(), "-out", l.out, "-client-id", fmt.Sprintf("%s-%d", l.name, i)}, l.args...)
		l.proc = e2eproc.Run(t, bins.loadgen, args...)
	}
}

// waitLoads waits for every loadgen and reads its result.
func waitLoads(t *testing.T, loads []*load, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, l := range loads {
		out, err := l.proc.Wait(ctx)
		require.NoError(t, err, "loadgen %s:\n%s", l.name, tail(out, 3000))
		data, err := os.ReadFile(l.out)
		require.NoError(t, err)
		l.res = &result{}
		require.NoError(t, json.Unmarshal(data, l.res))
		require.Empty(t, l.res.CloseError, "loadgen %s: Close", l.name)
		require.Equal(t, slot.Milliseconds(), l.res.SlotMs, "loadgen %s: slot grid", l.name)
		t.Logf("%-10s requested %6d admitted %6d denied %6d sources %v calls %d direct %d fallback %d maxkeys %d",
			l.name, l.res.Requested, l.res.Admitted, l.res.Denied, l.res.BySource, l.res.Stats.ServerCalls, l.res.Stats.DirectDecisions, l.res.Stats.FallbackDecisions, l.res.Stats.MaxKeysHeld)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// span is count admitted requests somewhere between slots first and last.
type span struct{ first, last, n int64 }

// merge gathers one key's spans from every result; from picks Slots or
// FallbackSlots.
func merge(loads []*load, key string, from func(*result) map[string][][3]int64) []span {
	var out []span
	for _, l := range loads {
		for _, tr := range from(l.res)[key] {
			out = append(out, span{tr[0], tr[1], tr[2]})
		}
	}
	return out
}

func allSlots(r *result) map[string][][3]int64      { return r.Slots }
func fallbackSlots(r *result) map[string][][3]int64 { return r.FallbackSlots }

// total sums spans.
func total(ss []span) int64 {
	var n int64
	for _, s := range ss {
		n += s.n
	}
	return n
}

// The window lengths checked, in slots: every length from minWindow
// (100 ms) to maxWindow (10 s).
const (
	minWindow = 10
	maxWindow = 1000
)

// sampleWindows are the lengths logged, and checked against a
// window-dependent allowance.
var sampleWindows = []int64{10, 20, 50, 100, 200, 500, 1000}

// counter counts, for any window of slots [s, e], the requests that may
// have been admitted in it: every span that overlaps the window. That is
// never fewer than the requests truly admitted in it. It can be more: a
// request in flight across the window's edge counts although it may have
// been decided just outside. Every request it counts was decided within
// [s − spread, e + spread] (spread: the longest span, in slots, less one),
// so the bound is checked against that widened window: the check never
// fails a run that kept the bound, and it still fails any run that broke it
// by more than rate·2·spread slots.
type counter struct {
	lo, hi  int64
	n       int64
	spread  int64   // the longest span's extra slots
	firstGT []int64 // firstGT[e-lo]: requests whose first slot is after e
	lastLT  []int64 // lastLT[s-lo]: requests whose last slot is before s
}

func newCounter(ss []span) *counter {
	c := &counter{}
	if len(ss) == 0 {
		return c
	}
	c.lo, c.hi = ss[0].first, ss[0].last
	for _, s := range ss {
		c.lo, c.hi = min(c.lo, s.first), max(c.hi, s.last)
		c.n += s.n
		c.spread = max(c.spread, s.last-s.first)
	}
	size := c.hi - c.lo + 1
	byFirst := make([]int64, size+1)
	byLast := make([]int64, size+1)
	for _, s := range ss {
		byFirst[s.first-c.lo] += s.n
		byLast[s.last-c.lo] += s.n
	}
	c.firstGT = make([]int64, size)
	c.lastLT = make([]int64, size)
	for i := size - 2; i >= 0; i-- {
		c.firstGT[i] = c.firstGT[i+1] + byFirst[i+1]
	}
	for i := int64(1); i < size; i++ {
		c.lastLT[i] = c.lastLT[i-1] + byLast[i-1]
	}
	return c
}

// count returns the requests that may have been admitted in slots [s, e],
// with lo <= s <= e <= hi.
func (c *counter) count(s, e int64) int64 {
	return c.n - c.firstGT[e-c.lo] - c.lastLT[s-c.lo]
}

// excess is a window whose count exceeds its allowed number.
type excess struct {
	start, end int64
	count      int64
	allowed    float64
}

// worstExcess checks every window from minWindow to maxWindow slots long
// against burst + rate·W and returns the one that exceeds it most (ok is
// false when none does). For a fixed end e, count − rate·W is largest for
// the start s that minimizes lastLT(s) − rate·s·slot; a monotone deque
// keeps that minimum over the sliding range of starts, so every length is
// checked in linear time.
func (c *counter) worstExcess(rate float64, burst int64) (worst excess, ok bool) {
	if c.n == 0 {
		return excess{}, false
	}
	perSlot := rate * slot.Seconds()
	key := func(s int64) float64 { return float64(c.lastLT[s-c.lo]) - perSlot*float64(s) }
	var dq []int64 // candidate starts, key increasing
	bestOver := 0.0
	for e := c.lo + minWindow - 1; e <= c.hi; e++ {
		// Starts s with e-maxWindow+1 <= s <= e-minWindow+1 (windows that
		// begin before lo hold nothing more than the one from lo).
		if ns := e - minWindow + 1; ns >= c.lo {
			for len(dq) > 0 && key(dq[len(dq)-1]) >= key(ns) {
				dq = dq[:len(dq)-1]
			}
			dq = append(dq, ns)
		}
		for len(dq) > 0 && dq[0] < e-maxWindow+1 {
			dq = dq[1:]
		}
		if len(dq) == 0 {
			continue
		}
		s := dq[0]
		cnt := c.count(s, e)
		allowed := float64(burst) + perSlot*float64(e-s+1+2*c.spread)
		if over := float64(cnt) - allowed; over > 0 && (!ok || over > bestOver) {
			bestOver, ok = over, true
			worst = excess{start: s, end: e, count: cnt, allowed: allowed}
		}
	}
	return worst, ok
}

// worstWindow returns, for windows of k slots, the largest count and the
// first slot of that window.
func (c *counter) worstWindow(k int64) (worst, at int64) {
	for s := c.lo; s+k-1 <= c.hi; s++ {
		if n := c.count(s, s+k-1); n > worst {
			worst, at = n, s
		}
	}
	if c.hi-c.lo+1 < k && c.n > worst {
		worst, at = c.n, c.lo
	}
	return worst, at
}

// slot is the loadgens' slot length.
const slot = 10 * time.Millisecond

// checkBound asserts burst + rate·W for every window from 100 ms to 10 s.
func checkBound(t *testing.T, label string, ss []span, rate float64, burst int64) {
	t.Helper()
	c := newCounter(ss)
	if w, bad := c.worstExcess(rate, burst); bad {
		t.Errorf("%s: slots %d–%d (%v, widened by the longest span, %d slots, each side): %d admitted > bound burst %d + rate·W = %.0f",
			label, w.start, w.end, time.Duration(w.end-w.start+1)*slot, c.spread, w.count, burst, w.allowed)
	}
}

// checkBoundWith asserts, for the sampled window lengths, burst + rate·W +
// extra(s, e) for the window of slots [s, e].
func checkBoundWith(t *testing.T, label string, ss []span, rate float64, burst int64, extra func(s, e int64) float64) {
	t.Helper()
	c := newCounter(ss)
	if c.n == 0 {
		return
	}
	for _, k := range sampleWindows {
		for s := c.lo; s+k-1 <= c.hi; s++ {
			e := s + k - 1
			allowed := float64(burst) + rate*(time.Duration(k)*slot).Seconds() + extra(s, e)
			if n := c.count(s, e); float64(n) > allowed {
				t.Errorf("%s: slots %d–%d: %d admitted > %.0f (bound + allowance)", label, s, e, n, allowed)
				break
			}
		}
	}
}

// logWindows logs the worst windows of the sampled lengths, for the record.
func logWindows(t *testing.T, label string, ss []span, rate float64, burst int64) {
	t.Helper()
	c := newCounter(ss)
	var parts []string
	for _, k := range sampleWindows {
		worst, _ := c.worstWindow(k)
		w := time.Duration(k) * slot
		parts = append(parts, fmt.Sprintf("%v: %d/%.0f", w, worst, float64(burst)+rate*w.Seconds()))
	}
	var wide, all int64
	for _, s := range ss {
		all += s.n
		if s.last > s.first {
			wide += s.n
		}
	}
	t.Logf("%s worst window / bound: %s (%d of %d requests span more than one slot)", label, strings.Join(parts, ", "), wide, all)
}

// get fetches url and returns the status code (0 when it fails).
func get(url string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// postLease asks a server for one token and returns the status code.
func postLease(url, key string) int {
	c := http.Client{Timeout: 5 * time.Second}
	body := fmt.Sprintf(`{"client_id":"probe","leases":[{"key":%q,"want":1}]}`, key)
	resp, err := c.Post(url+"/v1/leases", "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
