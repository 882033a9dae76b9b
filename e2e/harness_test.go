package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/stretchr/testify/require"
)

// bins are the binaries TestMain builds once for all scenarios.
var bins struct {
	rateleased, loadgen string
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

// The rules of every scenario; each scenario uses its own keys.
const rules = `
default: deny
rules:
  - {name: accuracy, match: "acc:*",   limit: 1000, period: 1s, burst: 100, lease_ttl: 1s}
  - {name: fairness, match: "fair:*",  limit: 1000, period: 1s, burst: 100, lease_ttl: 1s}
  - {name: users,    match: "user:*",  limit: 20,   period: 1s, burst: 20,  lease_ttl: 1s}
  - {name: faults,   match: "fault:*", limit: 1000, period: 1s, burst: 100, lease_ttl: 1s}
`

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

// result is loadgen's JSON output (see e2e/cmd/loadgen).
type result struct {
	ClientID      string                `json:"client_id"`
	SlotMs        int64                 `json:"slot_ms"`
	Requested     int64                 `json:"requested"`
	Admitted      int64                 `json:"admitted"`
	Denied        int64                 `json:"denied"`
	Slots         map[string][][3]int64 `json:"slots"`
	FallbackSlots map[string][][3]int64 `json:"fallback_slots"`
	BySource      map[string]int64      `json:"by_source"`
	MaxKeysHeld   int                   `json:"max_keys_held"`
	Stats         struct {
		Allowed, Denied, ServerCalls, ServerErrors, FallbackDecisions int64
		KeysHeld                                                      int
		Online                                                        bool
	} `json:"stats"`
	CloseError string `json:"close_error"`
}

// startLoads starts the loadgens at once on a common slot grid; the grid
// starts at the returned time.
func startLoads(t *testing.T, loads []*load) time.Time {
	t.Helper()
	origin := time.Now()
	dir := t.TempDir()
	for i, l := range loads {
		l.out = filepath.Join(dir, fmt.Sprintf("load-%d.json", i))
		args := append([]string{"-start-unix-ms", strconv.FormatInt(origin.UnixMilli(), 10), "-out", l.out, "-client-id", fmt.Sprintf("%s-%d", l.name, i)}, l.args...)
		l.proc = e2eproc.Run(t, bins.loadgen, args...)
	}
	return time.UnixMilli(origin.UnixMilli())
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
		t.Logf("%-10s requested %6d admitted %6d denied %6d sources %v calls %d fallback %d maxkeys %d",
			l.name, l.res.Requested, l.res.Admitted, l.res.Denied, l.res.BySource, l.res.Stats.ServerCalls, l.res.Stats.FallbackDecisions, l.res.MaxKeysHeld)
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

// windows is the window lengths checked, in slots of 10 ms: 100 ms to 10 s.
var windows = []int64{10, 20, 50, 100, 200, 500, 1000}

// worstWindow returns, for a window of k slots, the most requests that
// were certainly admitted inside one window, and the window's first slot.
// A request counts only if its whole span lies in the window, so the
// result never exceeds the truth.
func worstWindow(ss []span, k int64) (worst, at int64) {
	if len(ss) == 0 {
		return 0, 0
	}
	lo, hi := ss[0].first, ss[0].last
	for _, s := range ss {
		lo, hi = min(lo, s.first), max(hi, s.last)
	}
	n := hi - lo + 1
	exact := make([]int64, n+1) // prefix sums of single-slot spans
	var wide []span
	for _, s := range ss {
		if s.first == s.last {
			exact[s.first-lo+1] += s.n
		} else {
			wide = append(wide, s)
		}
	}
	for i := int64(1); i <= n; i++ {
		exact[i] += exact[i-1]
	}
	sort.Slice(wide, func(i, j int) bool { return wide[i].first < wide[j].first })
	for start := lo; start <= hi; start++ {
		end := min(start+k-1, hi) // inclusive
		sum := exact[end-lo+1] - exact[start-lo]
		for _, w := range wide {
			if w.first > end {
				break
			}
			if w.first >= start && w.last <= end {
				sum += w.n
			}
		}
		if sum > worst {
			worst, at = sum, start
		}
	}
	return worst, at
}

// checkBound asserts burst + rate·W (+ extra) for every window length, and
// returns the worst excess over the plain bound seen (0 or negative when
// the plain bound held).
func checkBound(t *testing.T, label string, ss []span, rate float64, burst int64, slotMs int64, extra func(start, k int64) float64) {
	t.Helper()
	for _, k := range windows {
		worst, at := worstWindow(ss, k)
		w := time.Duration(k*slotMs) * time.Millisecond
		bound := float64(burst) + rate*w.Seconds()
		allow := bound
		if extra != nil {
			allow += extra(at, k)
		}
		if float64(worst) > allow {
			t.Errorf("%s: window %v at slot %d: %d admitted > bound %.0f (burst %d + rate·W %.0f, + allowance %.0f)", label, w, at, worst, allow, burst, rate*w.Seconds(), allow-bound)
		}
	}
}

// logWindows logs the worst windows, for the record.
func logWindows(t *testing.T, label string, ss []span, rate float64, burst int64, slotMs int64) {
	t.Helper()
	var parts []string
	for _, k := range windows {
		worst, _ := worstWindow(ss, k)
		w := time.Duration(k*slotMs) * time.Millisecond
		parts = append(parts, fmt.Sprintf("%v: %d/%.0f", w, worst, float64(burst)+rate*w.Seconds()))
	}
	t.Logf("%s worst window / bound: %s", label, strings.Join(parts, ", "))
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
