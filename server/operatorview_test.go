package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/protocol"
)

func TestKeyState(t *testing.T) {
	f := newFixture(t, authRulesYAML(), nil, Options{})
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
			assert.InDelta(t, 70, l.Level, 1)
			assert.EqualValues(t, "token_bucket", l.Algorithm)
			require.NotNil(t, l.FullMillis)
			require.NotNil(t, l.NextTokenMillis)
			assert.LessOrEqual(t, *l.FullMillis, int64(300))
			assert.LessOrEqual(t, *l.NextTokenMillis, *l.FullMillis)
			assert.Equal(t, f.srv.Rules().Version(), ks.Version)
		}},
		{"fresh key is full", betaToken, "user:2", http.StatusOK, func(t *testing.T, ks protocol.KeyStateResponse) {
			require.Len(t, ks.Limits, 1)
			assert.EqualValues(t, 100, ks.Limits[0].Free)
			assert.EqualValues(t, 0, *ks.Limits[0].FullMillis)
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
