package server

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// rulesLimit returns the limit of the per-user rule in force, from
// GET /v1/rules.
func (f *fixture) rulesLimit(token string) int64 {
	f.t.Helper()
	r := f.do(http.MethodGet, protocol.PathRules, token, "", nil)
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	var rr protocol.RulesResponse
	require.NoError(f.t, json.Unmarshal(r.body, &rr))
	for _, rl := range rr.Rules {
		if rl.Name == "per-user" {
			return rl.Limit
		}
	}
	f.t.Fatalf("no per-user rule in %s", r.body)
	return 0
}

func TestHotReload(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{ReloadInterval: 20 * time.Millisecond})
	require.EqualValues(t, 100, f.rulesLimit(""))

	// A changed limit is in force within 2s (the contract; it takes about
	// one interval).
	f.writeRules(strings.Replace(rulesYAML, "limit: 100", "limit: 200", 1))
	require.Eventually(t, func() bool { return f.rulesLimit("") == 200 }, 2*time.Second, 10*time.Millisecond)
	assert.Contains(t, f.logs.String(), "rules reloaded")
	reloads := func(result string) float64 { return testutil.ToFloat64(f.srv.metrics.reloads.WithLabelValues(result)) }
	assert.Equal(t, 1.0, reloads("ok"))
	res := f.lease("", "c", protocol.LeaseEntry{Key: "user:1", Want: 1})[0]
	assert.EqualValues(t, 200, res.Limit, "the engine runs the new rules")

	// A broken file keeps the rules in force and logs why, naming the rule
	// and the field.
	f.writeRules(strings.Replace(rulesYAML, "limit: 100", "limit: -3", 1))
	require.Eventually(t, func() bool { return reloads("error") == 1 }, 2*time.Second, 10*time.Millisecond)
	logs := f.logs.String()
	assert.Contains(t, logs, "rules reload failed")
	assert.Contains(t, logs, `rule \"per-user\": limit`)
	assert.EqualValues(t, 200, f.rulesLimit(""))
	// It is logged once, not at every poll.
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, 1, strings.Count(f.logs.String(), "rules reload failed"))
	assert.Equal(t, 1.0, reloads("error"))
	assert.Equal(t, 2.0, testutil.ToFloat64(f.srv.metrics.rulesLoaded))

	// A deleted file too.
	require.NoError(t, os.Remove(f.path))
	require.Eventually(t, func() bool { return reloads("error") == 2 }, 2*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 200, f.rulesLimit(""))

	// A fixed file is picked up.
	f.writeRules(strings.Replace(rulesYAML, "limit: 100", "limit: 300", 1))
	require.Eventually(t, func() bool { return f.rulesLimit("") == 300 }, 2*time.Second, 10*time.Millisecond)
}

func TestHotReloadClients(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{ReloadInterval: 20 * time.Millisecond})
	r := f.do(http.MethodGet, protocol.PathRules, "", "", nil)
	require.Equal(t, http.StatusOK, r.status)

	// Adding clients turns authentication on.
	f.writeRules(authRulesYAML())
	require.Eventually(t, func() bool {
		return f.do(http.MethodGet, protocol.PathRules, "", "", nil).status == http.StatusUnauthorized
	}, 2*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 100, f.rulesLimit(alphaToken))

	// Changing a client's patterns applies to its next call.
	f.writeRules(strings.Replace(authRulesYAML(), `keys: ["user:*"]`, `keys: ["tiny:*"]`, 1))
	require.Eventually(t, func() bool {
		r := f.postJSON(protocol.PathLeases, betaToken, `{"client_id":"b","leases":[{"key":"user:1","want":1}]}`)
		return r.status == http.StatusForbidden
	}, 2*time.Second, 10*time.Millisecond)
}

// TestReloadAtDefaultInterval checks the documented contract at the default
// ReloadInterval: a changed file is in force within a second.
func TestReloadAtDefaultInterval(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	require.EqualValues(t, 100, f.rulesLimit(""))
	f.writeRules(strings.Replace(rulesYAML, "limit: 100", "limit: 200", 1))
	written := time.Now()
	for f.rulesLimit("") != 200 {
		require.Less(t, time.Since(written), time.Second, "the new rules are not in force within 1s")
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("in force after %v (ReloadInterval %v)", time.Since(written).Round(time.Millisecond), DefaultReloadInterval)
}

func TestReloadRefusesExposure(t *testing.T) {
	// The server would listen on every interface with clients configured;
	// a file without clients must not open it up. (Run would check its
	// loopback listener instead of ListenAddr: the handler is served
	// directly.)
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() })
	logs := &syncBuffer{}
	path := writeTemp(t, authRulesYAML())
	srv, err := New(Options{Store: store, RulesPath: path, ListenAddr: "0.0.0.0:8080", ReloadInterval: -1,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })

	replaceFile(t, path, rulesYAML)
	err = srv.Reload()
	require.ErrorIs(t, err, ErrInsecureListen)
	assert.Equal(t, []string{"alpha", "beta"}, srv.Rules().Clients(), "the old rules are in force")
	assert.Contains(t, logs.String(), "rules reload failed")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, protocol.PathRules, nil))
	assert.Equal(t, http.StatusUnauthorized, rec.Code)

	// Reload returns the error again, but logs it once.
	require.ErrorIs(t, srv.Reload(), ErrInsecureListen)
	assert.Equal(t, 1, strings.Count(logs.String(), "rules reload failed"))

	// Unchanged content is not a reload.
	replaceFile(t, path, authRulesYAML())
	require.NoError(t, srv.Reload())
	assert.NotContains(t, logs.String(), "rules reloaded")
}

func TestCloseStopsPolling(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{ReloadInterval: 10 * time.Millisecond})
	require.NoError(t, f.srv.Close())
	require.NoError(t, f.srv.Close(), "Close is idempotent")
	f.writeRules(strings.Replace(rulesYAML, "limit: 100", "limit: 200", 1))
	time.Sleep(100 * time.Millisecond)
	assert.EqualValues(t, 100, f.rulesLimit(""), "no reload after Close")
}

// TestReloadAlgorithmChangeBound: a rule whose algorithm changes starts
// its keys' state afresh beside the old one, as the README and
// leases/doc.go state with its bound: the leases granted under the old
// algorithm stay spendable until their deadlines and the new state starts
// full, so across one change a key admits at most the rule's bound plus
// one capacity of the new algorithm (its burst, or a window's limit). With
// 10 per hour, 10 tokens leased, then the algorithm changed: 20 admitted
// within the hour, 10 leased and 10 new, and never more. The review
// found the 20 against the 10 a reader of the rule expects; the bound was
// not stated, and the engine is unchanged.
func TestReloadAlgorithmChangeBound(t *testing.T) {
	rule := func(algorithm string) string {
		return "rules:\n  - {name: r, match: \"k:*\", algorithm: " + algorithm + ", limit: 10, period: 1h, lease_ttl: 30s}\n"
	}
	const limit, capacity = 10, 10 // the new algorithm's burst, or its window's limit
	for _, tc := range []struct{ before, after string }{
		{"token_bucket", "fixed_window"},
		{"token_bucket", "sliding_window_log"},
		{"fixed_window", "token_bucket"},
		{"sliding_window_counter", "token_bucket"},
	} {
		t.Run(tc.before+" to "+tc.after, func(t *testing.T) {
			f := newFixture(t, rule(tc.before), frozenStore(t), Options{ReloadInterval: -1})
			res := f.lease("", "p1", protocol.LeaseEntry{Key: "k:1", Want: limit})
			require.Nil(t, res[0].Error)
			require.EqualValues(t, limit, res[0].Granted, "the client holds the whole limit for 30 s")
			require.False(t, f.check("", "k:1").Allowed, "no more under the old algorithm")

			f.writeRules(rule(tc.after))
			require.NoError(t, f.srv.Reload())
			admitted := res[0].Granted
			for range 2 * limit {
				if f.check("", "k:1").Allowed {
					admitted++
				}
			}
			assert.LessOrEqual(t, admitted, int64(limit+capacity), "the stated bound: the rule's limit plus one capacity of the new algorithm")
			assert.Greater(t, admitted, int64(limit), "the change admits more than the limit, as documented")
		})
	}
}

// TestReloadLimitRemovedBound: a rule's limits are kept by their place in
// its list, so a reload that drops the first one gives the second, which
// did not change, the first one's state: that is a change of the place's
// algorithm or period, with its bound, the rule's bound plus one capacity
// of the limit now there (the invariant review's candidate A, documented:
// README, leases/doc.go).
func TestReloadLimitRemovedBound(t *testing.T) {
	const daily = 10
	before := "rules:\n  - name: r\n    match: \"k:*\"\n    limits:\n      - {limit: 1000, period: 1s}\n      - {limit: 10, period: 24h}\n"
	after := "rules:\n  - name: r\n    match: \"k:*\"\n    limits:\n      - {limit: 10, period: 24h}\n"
	f := newFixture(t, before, frozenStore(t), Options{ReloadInterval: -1})
	var admitted int64
	for range 2 * daily {
		if f.check("", "k:1").Allowed {
			admitted++
		}
	}
	require.EqualValues(t, daily, admitted, "the daily limit binds")

	f.writeRules(after)
	require.NoError(t, f.srv.Reload())
	for range 2 * daily {
		if f.check("", "k:1").Allowed {
			admitted++
		}
	}
	assert.LessOrEqual(t, admitted, int64(2*daily), "the stated bound: the limit plus one capacity of the limit now at the first place")
	assert.Greater(t, admitted, int64(daily), "the daily limit moved to the first limit's state, as documented")
}

// TestReloadEmptyFileKeepsRules: a rules file caught empty while it is
// rewritten in place (a shell's "> rules.yaml", an editor that truncates
// then writes) is refused at reload, not put in force: it parsed as a
// valid file with no rules and no clients, so one poll dropped every rule
// (every key unlimited) and turned authentication off (found by review:
// a call without a token was served as the anonymous client). A file that
// says so ("rules: []") still removes every rule.
func TestReloadEmptyFileKeepsRules(t *testing.T) {
	for _, empty := range []string{"", " \n\t\n", "# being rewritten\n"} {
		t.Run("", func(t *testing.T) {
			f := newFixture(t, authRulesYAML(), nil, Options{ReloadInterval: -1})
			require.Equal(t, http.StatusUnauthorized, f.do(http.MethodGet, protocol.PathRules, "", "", nil).status)
			require.Len(t, f.srv.Rules().Policy().Rules(), 2)

			require.NoError(t, os.WriteFile(f.path, []byte(empty), 0o600)) // truncated, not yet rewritten
			err := f.srv.Reload()
			require.ErrorIs(t, err, ErrEmptyRulesFile)
			assert.Len(t, f.srv.Rules().Policy().Rules(), 2, "the rules in force are kept")
			r := f.do(http.MethodGet, protocol.PathRules, "", "", nil)
			assert.Equal(t, http.StatusUnauthorized, r.status, "authentication stays on: %s", r.body)
			assert.Contains(t, f.logs.String(), "rules reload failed")
			assert.Equal(t, err, f.srv.ReloadError(), "reported as a failed reload")

			// Written in full, the file is put in force.
			require.NoError(t, os.WriteFile(f.path, []byte(rulesYAML), 0o600))
			require.NoError(t, f.srv.Reload())
			assert.Nil(t, f.srv.ReloadError())
			require.NoError(t, os.WriteFile(f.path, []byte("rules: []\n"), 0o600))
			require.NoError(t, f.srv.Reload(), "a file that says it has no rules")
			assert.Empty(t, f.srv.Rules().Policy().Rules())
		})
	}
}
