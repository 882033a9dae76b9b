package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/ratelease/ratelease/protocol"
)

func TestKeyState(t *testing.T) {
	f := newFixture(t, authRulesYAML(), frozenStore(t), Options{})
	// alpha holds a lease of 30 on user:1.
	res := f.lease(alphaToken, "p1", protocol.LeaseEntry{Key: "user:1", Want: 30})
	require.EqualValues(t, 30, res[0].Granted)

	tests := []struct {
		name, token, key string
		status           int
		check            func(t *testing.T, ks protocol.KeyStateResponse)
	}{
		{"held key", alphaToken, "user:1", http.StatusOK, func(t *testing.T, ks protocol.KeyStateResponse) {
			require.NotNil(t, ks.Rule)
			assert.Equal(t, "per-user", ks.Rule.Name)
			require.Len(t, ks.Limits, 1)
			l := ks.Limits[0]
			assert.EqualValues(t, 30, l.Outstanding)
			assert.Equal(t, 1, l.Leases)
			assert.InDelta(t, 70, l.Level, 1e-9, "the store's clock stands still")
			assert.EqualValues(t, "token_bucket", l.Algorithm)
			assert.Equal(t, 1, l.Holders)
			assert.LessOrEqual(t, l.FullMillis, int64(300))
			assert.LessOrEqual(t, l.NextTokenMillis, l.FullMillis)
			assert.Nil(t, l.WindowEndMillis, "a token bucket has no window")
			assert.Equal(t, f.srv.Rules().Version(), ks.Version)
		}},
		{"fresh key is full", betaToken, "user:2", http.StatusOK, func(t *testing.T, ks protocol.KeyStateResponse) {
			require.Len(t, ks.Limits, 1)
			assert.EqualValues(t, 100, ks.Limits[0].Free)
			assert.EqualValues(t, 0, ks.Limits[0].FullMillis)
			assert.EqualValues(t, 0, ks.Limits[0].NextTokenMillis)
			assert.Zero(t, ks.Limits[0].Holders)
		}},
		{"key with a slash", alphaToken, "user:a/b c", http.StatusOK, func(t *testing.T, ks protocol.KeyStateResponse) {
			assert.Equal(t, "user:a/b c", ks.Key)
		}},
		{"unlimited key", alphaToken, "tiny:x", http.StatusOK, func(t *testing.T, ks protocol.KeyStateResponse) {
			assert.Equal(t, "tiny", ks.Rule.Name)
		}},
		{"outside the client's patterns", betaToken, "tiny:x", http.StatusForbidden, nil},
		{"no token", "", "user:1", http.StatusUnauthorized, nil},
		{"empty key", alphaToken, "", http.StatusUnprocessableEntity, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.do(http.MethodGet, protocol.PathKeysPrefix+url.PathEscape(tt.key), tt.token, "", nil)
			require.Equal(t, tt.status, r.status, "body: %s", r.body)
			if tt.check == nil {
				r.problem(t)
				return
			}
			var ks protocol.KeyStateResponse
			require.NoError(t, json.Unmarshal(r.body, &ks))
			tt.check(t, ks)
		})
	}
	t.Run("POST is 405", func(t *testing.T) {
		r := f.do(http.MethodPost, protocol.PathKeysPrefix+"user:1", alphaToken, "", nil)
		assert.Equal(t, http.StatusMethodNotAllowed, r.status)
	})
}

// algorithmsYAML has one rule per algorithm, each 10 per second (a burst
// or queue of 10) with leases of 200 ms.
const algorithmsYAML = `
rules:
  - {name: tb, match: "tb:*", limit: 10, period: 1s, burst: 10, lease_ttl: 200ms}
  - {name: fw, match: "fw:*", algorithm: fixed_window, limit: 10, period: 1s, lease_ttl: 200ms}
  - {name: swc, match: "swc:*", algorithm: sliding_window_counter, limit: 10, period: 1s, lease_ttl: 200ms}
  - {name: swl, match: "swl:*", algorithm: sliding_window_log, limit: 10, period: 1s, lease_ttl: 200ms}
  - {name: lb, match: "lb:*", algorithm: leaky_bucket, limit: 10, period: 1s, burst: 10, lease_ttl: 200ms}
`

// TestKeyStateAlgorithms: GET /v1/keys/{key} shows, for every algorithm,
// the free tokens, the holders (distinct processes) and the times to the
// next token, to a whole bucket and to the window's end, on a store whose
// clock the test drives. At 0, process p1 leases 3 and p2 leases 1, and a
// check takes 2; the key is shown at 30 ms.
func TestKeyStateAlgorithms(t *testing.T) {
	tests := []struct {
		key              string
		free, next, full int64
		windowEnd        *int64
	}{
		// Level 10 − 6, refilled by 0.3 by 30 ms under the cap 10 − 4: the
		// next whole token in 70 ms, the cap in 170 ms.
		{key: "tb:1", free: 4, next: 70, full: 170},
		// 6 counted in [0, 1 s).
		{key: "fw:1", free: 4, next: 970, full: 970, windowEnd: ptr(int64(970))},
		// 5 free once 6·(1 − e/W) ≤ 5 in the next window: e = ⌈W/6⌉ =
		// 166.667 ms after its start; zero at the next window's end.
		{key: "swc:1", free: 4, next: 1137, full: 1970, windowEnd: ptr(int64(970))},
		// The take is the oldest entry (it leaves at 1 s); the leases, the
		// newest, end at ⌈200 ms⌉ of 15.625 ms = 203.125 ms.
		{key: "swl:1", free: 4, next: 970, full: 1174},
		// One slot per 100 ms: slices [0, 300), [300, 400), the take
		// [400, 600). At 30 ms the queue is 5.7 long: 4 free, a fifth once
		// it is 5 long, empty at 600 ms.
		{key: "lb:1", free: 4, next: 70, full: 570},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			store := leases.NewMemoryStore(leases.MemoryOptions{Now: clock.Now, SweepInterval: -1})
			t.Cleanup(func() { _ = store.Close() })
			f := newFixture(t, algorithmsYAML, store, Options{})
			require.EqualValues(t, 3, f.lease("", "p1", protocol.LeaseEntry{Key: tt.key, Want: 3})[0].Granted)
			require.EqualValues(t, 1, f.lease("", "p2", protocol.LeaseEntry{Key: tt.key, Want: 1})[0].Granted)
			r := f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{tt.key}, Cost: ptr(int64(2))})
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			clock.Advance(30 * time.Millisecond)

			r = f.do(http.MethodGet, protocol.PathKeysPrefix+tt.key, "", "", nil)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var ks protocol.KeyStateResponse
			require.NoError(t, json.Unmarshal(r.body, &ks))
			require.Len(t, ks.Limits, 1)
			l := ks.Limits[0]
			assert.Equal(t, tt.free, l.Free, "free")
			assert.EqualValues(t, 4, l.Outstanding)
			assert.Equal(t, 2, l.Leases)
			assert.Equal(t, 2, l.Holders, "p1 and p2")
			assert.Equal(t, tt.next, l.NextTokenMillis, "next_token_ms")
			assert.Equal(t, tt.full, l.FullMillis, "full_ms")
			assert.Equal(t, tt.windowEnd, l.WindowEndMillis, "window_end_ms")
			assert.Equal(t, clock.Now().UnixMilli(), l.AtUnixMillis)
			// The JSON names an operator reads.
			for _, field := range []string{`"holders":2`, `"next_token_ms":`, `"full_ms":`} {
				assert.Contains(t, string(r.body), field)
			}
			assert.Equal(t, tt.windowEnd != nil, strings.Contains(string(r.body), `"window_end_ms":`))
		})
	}
}

func TestKeyStateNoRule(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	r := f.do(http.MethodGet, protocol.PathKeysPrefix+"other", "", "", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var ks protocol.KeyStateResponse
	require.NoError(t, json.Unmarshal(r.body, &ks))
	assert.Nil(t, ks.Rule)
	assert.True(t, ks.Unlimited)
	assert.Empty(t, ks.Limits)
}

func TestRuleDecisionsAndStatusPage(t *testing.T) {
	f := newFixture(t, rulesYAML+`
  - name: dry
    match: "dry:*"
    limit: 1
    period: 1h
    shadow: true
`, nil, Options{})
	for range 3 {
		f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"tiny:7"}})
		f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"dry:1"}})
	}
	f.lease("", "p", protocol.LeaseEntry{Key: "user:9", Want: 5})
	f.lease("", "p", protocol.LeaseEntry{Key: "user:9", Want: 0}) // a return: no decision

	for _, tt := range []struct{ rule, result, want string }{
		{"tiny", "granted", "1"},
		{"tiny", "denied", "2"},
		{"dry", "granted", "1"},
		{"dry", "shadow_denied", "2"},
		{"per-user", "granted", "1"},
	} {
		assert.Equal(t, tt.want, f.metric(fmt.Sprintf(`ratelease_rule_decisions_total{result=%q,rule=%q}`, tt.result, tt.rule)), "%s %s", tt.rule, tt.result)
	}

	r := f.do(http.MethodGet, protocol.PathStatus, "", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	page := string(r.body)
	assert.Contains(t, page, f.srv.Rules().Version())
	assert.Contains(t, page, `<tr data-rule="tiny">`)
	_, denied, ok := strings.Cut(page, `id="denied-keys"`)
	require.True(t, ok)
	denied, _, _ = strings.Cut(denied, "</table>")
	assert.Contains(t, denied, `data-key="tiny:7"`)
	assert.NotContains(t, denied, `dry:1`, "a shadow denial is not a denial")
	assert.Contains(t, page, "(this server)")
}

func TestStatusPageMetricsToken(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{MetricsTokenSHA256: sha("scrape")})
	assert.Equal(t, http.StatusUnauthorized, f.do(http.MethodGet, protocol.PathStatus, "", "", nil).status)
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, protocol.PathStatus, "scrape", "", nil).status)
}

func TestTopK(t *testing.T) {
	tk := newTopK(3)
	// a: 10, b: 5, then 6 distinct keys once each, then c: 4.
	for range 10 {
		tk.add("a", 1)
	}
	for range 5 {
		tk.add("b", 1)
	}
	for i := range 6 {
		tk.add(fmt.Sprint("x", i), 1)
	}
	tk.add("c", 4)
	top, total := tk.top(3)
	assert.EqualValues(t, 25, total)
	require.Len(t, top, 3)
	assert.Equal(t, "a", top[0].Key)
	assert.EqualValues(t, 10, top[0].Count)
	assert.EqualValues(t, 0, top[0].Err)
	// Every count bounds its key's weight from above, within its error,
	// and every error is at most total/k.
	truth := map[string]int64{"a": 10, "b": 5, "c": 4}
	for i := range 6 {
		truth[fmt.Sprint("x", i)] = 1
	}
	for _, e := range top {
		assert.GreaterOrEqual(t, e.Count, truth[e.Key], e.Key)
		assert.LessOrEqual(t, e.Count-e.Err, truth[e.Key], e.Key)
		assert.LessOrEqual(t, e.Err, total/3, e.Key)
	}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// TestKeyStateInvalidKey: a key that breaks the key rules in the path of
// GET /v1/keys/{key} gets 422 invalid_key, as the same key in a body does.
// It got invalid_request (found by review).
func TestKeyStateInvalidKey(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	for _, p := range []string{"a%0Ab", strings.Repeat("k", protocol.MaxKeyBytes+1), "a%FFb"} {
		r := f.do(http.MethodGet, protocol.PathKeysPrefix+p, "", "", nil)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status, "GET /v1/keys/%.20s", p)
		assert.Equal(t, protocol.CodeInvalidKey, r.problem(t).Code, "GET /v1/keys/%.20s: %s", p, r.body)
	}
}

// TestNonCanonicalPathHint: a path refused as not canonical says how to
// send the key so that it is, and the path it suggests is served. A key
// of "." or ".." (or ending in one, after a '/') is no path segment of its
// own unless its dots are escaped: the hint said to escape its '/' only,
// which for ".." named the same refused path (the handler review's
// candidate).
func TestNonCanonicalPathHint(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	for _, tc := range []struct{ key, escaped string }{
		{"a//b", "a%2F%2Fb"},
		{"path:/a/../b", "path:%2Fa%2F..%2Fb"},
		{"..", "%2E%2E"},
		{".", "%2E"},
		{"a/..", "a%2F.."}, // one segment once its '/' is escaped
	} {
		t.Run(tc.key, func(t *testing.T) {
			r := f.do(http.MethodGet, protocol.PathKeysPrefix+tc.key, "", "", nil)
			require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
			p := r.problem(t)
			assert.Equal(t, protocol.CodeInvalidPath, p.Code)
			hint := protocol.PathKeysPrefix + tc.escaped
			require.True(t, strings.HasSuffix(p.Detail, ": "+hint), "the hint %q ends %q", p.Detail, hint)
			r = f.do(http.MethodGet, hint, "", "", nil)
			require.Equal(t, http.StatusOK, r.status, "the hinted path is served: %s", r.body)
			var ks protocol.KeyStateResponse
			require.NoError(t, json.Unmarshal(r.body, &ks))
			assert.Equal(t, tc.key, ks.Key)
		})
	}
}
