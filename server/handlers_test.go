package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

func TestLeaseGrant(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	res := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:42", Want: 30})[0]
	assert.Nil(t, res.Error)
	assert.Equal(t, "user:42", res.Key)
	assert.NotEmpty(t, res.LeaseID)
	assert.EqualValues(t, 30, res.Granted)
	assert.EqualValues(t, 2000, res.TTLMillis)
	assert.EqualValues(t, 100, res.Limit)
	assert.EqualValues(t, 1000, res.PeriodMillis)
	assert.EqualValues(t, 100, res.Burst)
	assert.EqualValues(t, 70, res.Remaining)
	assert.Equal(t, "per-user", res.Rule)
	assert.InDelta(t, 100.0, res.SafeRate, 1e-9)

	st := f.state("user:42")
	assert.EqualValues(t, 30, st.Outstanding)
	assert.Equal(t, 1, st.Leases)

	// A key that matches no rule is unlimited under default allow.
	res = f.lease("", "svc-1", protocol.LeaseEntry{Key: "free:1", Want: 5})[0]
	assert.True(t, res.Unlimited)
	assert.EqualValues(t, 5, res.Granted)
}

func TestLeaseSettleAndReturn(t *testing.T) {
	f := newFixture(t, rulesYAML, frozenStore(t), Options{})
	first := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:1", Want: 40})[0]
	require.EqualValues(t, 40, first.Granted)

	// Settle with 10 used, and take a new lease of 20 in the same step.
	next := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:1", Want: 20, LeaseID: first.LeaseID, Used: 10})[0]
	require.Nil(t, next.Error)
	assert.EqualValues(t, 20, next.Granted)
	assert.NotEqual(t, first.LeaseID, next.LeaseID)
	st := f.state("user:1")
	assert.EqualValues(t, 20, st.Outstanding)

	// A pure return: want 0 with the lease ID.
	ret := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:1", LeaseID: next.LeaseID, Used: 5})[0]
	require.Nil(t, ret.Error)
	assert.Zero(t, ret.Granted)
	st = f.state("user:1")
	assert.Zero(t, st.Outstanding)
	assert.Zero(t, st.Leases)
	assert.InDelta(t, 85, st.Level, 1e-9, "100 − 10 − 5 used (the store's clock stands still)")
}

func TestFairShare(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	a := f.lease("", "client-a", protocol.LeaseEntry{Key: "user:hot", Want: 10})[0]
	require.EqualValues(t, 10, a.Granted)
	// B asks for everything, but another client holds a lease on the key:
	// its grant is capped at burst / holders = 100 / 2.
	b := f.lease("", "client-b", protocol.LeaseEntry{Key: "user:hot", Want: 100})[0]
	assert.EqualValues(t, 50, b.Granted)
	assert.InDelta(t, 50.0, b.SafeRate, 1e-9, "safe rate is the rule's rate over the holders")
	assert.EqualValues(t, 60, f.state("user:hot").Outstanding)
}

func TestLeaseDenialHasRetryAfter(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	first := f.lease("", "c", protocol.LeaseEntry{Key: "tiny:1", Want: 5})[0]
	require.EqualValues(t, 1, first.Granted)
	// Another client finds the bucket empty: granted 0 is a result, not an
	// error, so the call succeeds.
	denied := f.lease("", "d", protocol.LeaseEntry{Key: "tiny:1", Want: 1})[0]
	assert.Nil(t, denied.Error)
	assert.Zero(t, denied.Granted)
	assert.Empty(t, denied.LeaseID)
	assert.Positive(t, denied.RetryAfterMillis)
}

func TestAuth(t *testing.T) {
	f := newFixture(t, authRulesYAML(), nil, Options{})
	body := `{"client_id":"c1","leases":[{"key":"user:1","want":1}]}`
	tests := []struct {
		name       string
		method     string
		path       string
		header     string // Authorization
		wantStatus int
	}{
		{"lease without token", http.MethodPost, protocol.PathLeases, "", http.StatusUnauthorized},
		{"lease with unknown token", http.MethodPost, protocol.PathLeases, "Bearer nope", http.StatusUnauthorized},
		{"lease with basic auth", http.MethodPost, protocol.PathLeases, "Basic YWxwaGE6YWxwaGEtdG9rZW4=", http.StatusUnauthorized},
		{"lease with empty bearer", http.MethodPost, protocol.PathLeases, "Bearer ", http.StatusUnauthorized},
		{"lease with the token's hash", http.MethodPost, protocol.PathLeases, "Bearer " + sha(alphaToken), http.StatusUnauthorized},
		{"lease with alpha", http.MethodPost, protocol.PathLeases, "Bearer " + alphaToken, http.StatusOK},
		{"lease with beta, lowercase scheme", http.MethodPost, protocol.PathLeases, "bearer " + betaToken, http.StatusOK},
		{"check without token", http.MethodPost, protocol.PathCheck, "", http.StatusUnauthorized},
		{"rules without token", http.MethodGet, protocol.PathRules, "", http.StatusUnauthorized},
		{"rules with alpha", http.MethodGet, protocol.PathRules, "Bearer " + alphaToken, http.StatusOK},
		{"healthz is open", http.MethodGet, protocol.PathHealthz, "", http.StatusOK},
		{"readyz is open", http.MethodGet, protocol.PathReadyz, "", http.StatusOK},
		{"metrics is open", http.MethodGet, protocol.PathMetrics, "", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := body
			if tt.path == protocol.PathCheck {
				b = `{"keys":["user:1"]}`
			}
			req, err := http.NewRequest(tt.method, f.url+tt.path, strings.NewReader(b))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			resp, err := f.client.Do(req)
			require.NoError(t, err)
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			r := response{status: resp.StatusCode, header: resp.Header, body: raw}
			require.Equal(t, tt.wantStatus, r.status, "body: %s", raw)
			if tt.wantStatus == http.StatusUnauthorized {
				p := r.problem(t)
				assert.Equal(t, protocol.CodeUnauthorized, p.Code)
				assert.Equal(t, `Bearer realm="ratelease"`, r.header.Get("WWW-Authenticate"))
			}
		})
	}
	// Nothing was leased by the refused calls: alpha's and beta's leases only.
	assert.Equal(t, 2, f.state("user:1").Leases)
}

func TestForbiddenKeys(t *testing.T) {
	f := newFixture(t, authRulesYAML(), nil, Options{})

	t.Run("one entry forbidden fails alone", func(t *testing.T) {
		res := f.lease(betaToken, "b1",
			protocol.LeaseEntry{Key: "user:1", Want: 5},
			protocol.LeaseEntry{Key: "tiny:1", Want: 1}, // beta may not use tiny:*
			protocol.LeaseEntry{Key: "user:2", Want: 7},
		)
		assert.EqualValues(t, 5, res[0].Granted)
		require.NotNil(t, res[1].Error)
		assert.Equal(t, protocol.CodeForbidden, res[1].Error.Code)
		assert.Equal(t, http.StatusForbidden, res[1].Error.Status)
		assert.Contains(t, res[1].Error.Detail, `"beta"`)
		assert.Zero(t, res[1].Granted)
		assert.EqualValues(t, 7, res[2].Granted)
		assert.Equal(t, "user:2", res[2].Key)
		assert.Zero(t, f.state("tiny:1").Leases, "the forbidden key was not touched")
	})

	t.Run("every entry forbidden is a 403 problem with the entries", func(t *testing.T) {
		r := f.postJSON(protocol.PathLeases, betaToken, protocol.LeaseRequest{ClientID: "b1", Leases: []protocol.LeaseEntry{{Key: "tiny:1", Want: 1}}})
		require.Equal(t, http.StatusForbidden, r.status)
		p := r.problem(t)
		assert.Equal(t, protocol.CodeForbidden, p.Code)
		require.Len(t, p.Leases, 1)
		assert.Equal(t, protocol.CodeForbidden, p.Leases[0].Error.Code)
	})

	t.Run("check with a forbidden key fails whole", func(t *testing.T) {
		r := f.postJSON(protocol.PathCheck, betaToken, `{"keys":["user:9","tiny:9"]}`)
		require.Equal(t, http.StatusForbidden, r.status)
		assert.Equal(t, protocol.CodeForbidden, r.problem(t).Code)
		assert.Equal(t, 100.0, f.state("user:9").Level, "no token was taken from the permitted key")
	})
}

func TestLeaseOwnerIsClientNameAndClientID(t *testing.T) {
	f := newFixture(t, authRulesYAML(), nil, Options{})
	a := f.lease(alphaToken, "shared-id", protocol.LeaseEntry{Key: "user:7", Want: 10})[0]
	require.EqualValues(t, 10, a.Granted)

	// Beta claims alpha's client_id and lease_id: it still cannot settle it.
	r := f.postJSON(protocol.PathLeases, betaToken, protocol.LeaseRequest{ClientID: "shared-id",
		Leases: []protocol.LeaseEntry{{Key: "user:7", LeaseID: a.LeaseID, Used: 0}}})
	require.Equal(t, http.StatusConflict, r.status, "body: %s", r.body)
	assert.Equal(t, protocol.CodeUnknownLease, r.problem(t).Code)
	st := f.state("user:7")
	assert.EqualValues(t, 10, st.Outstanding, "alpha's lease is still open")

	// Alpha can.
	ret := f.lease(alphaToken, "shared-id", protocol.LeaseEntry{Key: "user:7", LeaseID: a.LeaseID, Used: 10})[0]
	require.Nil(t, ret.Error)
	assert.Zero(t, f.state("user:7").Outstanding)
}

// TestBadInput sends every kind of bad request and checks that it gets the
// right 4xx problem, that the store did not change, and that the server
// still serves afterwards.
func TestBadInput(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	held := f.lease("", "holder", protocol.LeaseEntry{Key: "user:1", Want: 10})[0]
	require.EqualValues(t, 10, held.Granted)

	entries := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"client_id":"holder","leases":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"key":"user:%d","want":1}`, i)
		}
		b.WriteString(`]}`)
		return b.String()
	}
	twoMiB := `{"client_id":"holder","leases":[{"key":"user:1","want":1,"pad":"` + strings.Repeat("x", 2<<20) + `"}]}`
	longKey := strings.Repeat("k", 300)

	tests := []struct {
		name        string
		method      string
		path        string
		contentType string
		body        string
		chunked     bool // send without Content-Length
		wantStatus  int
		wantCode    protocol.Code
	}{
		{"malformed JSON", "POST", protocol.PathLeases, "application/json", `{"client_id":`, false, 400, protocol.CodeInvalidJSON},
		{"wrong JSON type", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":{"key":"user:1"}}`, false, 400, protocol.CodeInvalidJSON},
		{"two JSON objects", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"user:1","want":1}]} {}`, false, 400, protocol.CodeInvalidJSON},
		{"empty body", "POST", protocol.PathLeases, "application/json", ``, false, 400, protocol.CodeInvalidJSON},
		{"2 MiB body", "POST", protocol.PathLeases, "application/json", twoMiB, false, 413, protocol.CodeBodyTooLarge},
		{"2 MiB body, chunked", "POST", protocol.PathLeases, "application/json", twoMiB, true, 413, protocol.CodeBodyTooLarge},
		{"negative want", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"user:1","want":-1}]}`, false, 422, protocol.CodeInvalidCount},
		{"used without lease_id", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"user:1","want":1,"used":3}]}`, false, 422, protocol.CodeInvalidCount},
		{"300-byte key", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"` + longKey + `","want":1}]}`, false, 422, protocol.CodeInvalidKey},
		{"duplicate key", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"user:1","want":1},{"key":"user:1","want":1}]}`, false, 422, protocol.CodeDuplicateKey},
		{"missing client_id", "POST", protocol.PathLeases, "application/json", `{"leases":[{"key":"user:1","want":1}]}`, false, 422, protocol.CodeInvalidClientID},
		{"10,000 entries", "POST", protocol.PathLeases, "application/json", entries(10_000), false, 413, protocol.CodeTooManyEntries},
		{"unknown lease_id", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"user:1","want":5,"lease_id":"deadbeef","used":1}]}`, false, 409, protocol.CodeUnknownLease},
		{"used exceeds granted", "POST", protocol.PathLeases, "application/json", `{"client_id":"holder","leases":[{"key":"user:1","want":0,"lease_id":"` + held.LeaseID + `","used":11}]}`, false, 422, protocol.CodeUsedExceedsGranted},
		{"wrong content type", "POST", protocol.PathLeases, "text/plain", `{"client_id":"holder","leases":[{"key":"user:1","want":1}]}`, false, 415, protocol.CodeUnsupportedMediaType},
		{"malformed content type", "POST", protocol.PathLeases, "application/", `{"client_id":"holder","leases":[{"key":"user:1","want":1}]}`, false, 415, protocol.CodeUnsupportedMediaType},
		{"wrong method", "GET", protocol.PathLeases, "", ``, false, 405, protocol.CodeMethodNotAllowed},
		{"wrong method on check", "PUT", protocol.PathCheck, "application/json", `{"keys":["user:1"]}`, false, 405, protocol.CodeMethodNotAllowed},
		{"unknown route", "POST", "/v2/leases", "application/json", `{}`, false, 404, protocol.CodeNotFound},
		{"unknown route below v1", "GET", "/v1/rules/x", "", ``, false, 404, protocol.CodeNotFound},
		{"check negative cost", "POST", protocol.PathCheck, "application/json", `{"keys":["user:1"],"cost":-1}`, false, 422, protocol.CodeInvalidCount},
		{"check no keys", "POST", protocol.PathCheck, "application/json", `{"keys":[]}`, false, 422, protocol.CodeInvalidRequest},
		{"check cost exceeds burst", "POST", protocol.PathCheck, "application/json", `{"keys":["user:1"],"cost":101}`, false, 422, protocol.CodeCostExceedsBurst},
		{"check malformed", "POST", protocol.PathCheck, "application/json", `["user:1"]`, false, 400, protocol.CodeInvalidJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.state("user:1")
			var body io.Reader = strings.NewReader(tt.body)
			if tt.chunked {
				body = io.MultiReader(body) // hides the length: sent chunked
			}
			if tt.body == "" && tt.method == http.MethodGet {
				body = nil
			}
			r := f.do(tt.method, tt.path, "", tt.contentType, body)
			require.Equal(t, tt.wantStatus, r.status, "body: %.300s", r.body)
			p := r.problem(t)
			assert.Equal(t, tt.wantCode, p.Code)
			if tt.wantStatus == http.StatusMethodNotAllowed {
				assert.NotEmpty(t, r.header.Get("Allow"))
			}
			if tt.wantCode == protocol.CodeUnknownLease || tt.wantCode == protocol.CodeUsedExceedsGranted {
				require.Len(t, p.Leases, 1, "the per-entry results are in the problem")
				assert.Equal(t, tt.wantCode, p.Leases[0].Error.Code)
			}

			after := f.state("user:1")
			assert.Equal(t, before.Outstanding, after.Outstanding, "outstanding changed")
			assert.Equal(t, before.Leases, after.Leases, "open leases changed")
			assert.InDelta(t, before.Level, after.Level, 1e-9, "level changed")
			assert.Zero(t, f.state("user:0").Outstanding)

			// The server still serves.
			ok := f.lease("", "probe", protocol.LeaseEntry{Key: "probe:" + strconv.Itoa(len(tt.name)), Want: 1})
			assert.EqualValues(t, 1, ok[0].Granted)
		})
	}
	// The original lease is intact and can be settled.
	ret := f.lease("", "holder", protocol.LeaseEntry{Key: "user:1", LeaseID: held.LeaseID, Used: 10})[0]
	assert.Nil(t, ret.Error)
}

// TestInvalidUTF8 sends bodies that are not UTF-8, or that escape a lone
// surrogate, to both endpoints: each gets 422 invalid_utf8 naming the
// offset, and no bucket changes — in particular not the bucket of
// "user:\uFFFD", which encoding/json would have decoded them into.
func TestInvalidUTF8(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	const replaced = "user:\uFFFD"
	held := f.lease("", "holder", protocol.LeaseEntry{Key: replaced, Want: 10})[0]
	require.EqualValues(t, 10, held.Granted)

	for _, tt := range []struct {
		name, key string
	}{
		{"0xff", "user:\xff"},
		{"lone continuation byte", "user:\x80"},
		{"overlong encoding", "user:\xc0\xaf"},
		{"UTF-8 encoded surrogate", "user:\xed\xa0\x80"},
		{"escaped lone surrogate", `user:\ud800`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := f.state(replaced)
			for _, req := range []struct{ path, body string }{
				{protocol.PathLeases, `{"client_id":"holder","leases":[{"key":"` + tt.key + `","want":5}]}`},
				{protocol.PathCheck, `{"keys":["` + tt.key + `"],"cost":5}`},
			} {
				r := f.postJSON(req.path, "", req.body)
				require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: body: %s", req.path, r.body)
				p := r.problem(t)
				assert.Equal(t, protocol.CodeInvalidUTF8, p.Code)
				assert.Contains(t, p.Detail, fmt.Sprintf("offset %d", strings.Index(req.body, "user:")+len("user:")))
			}
			after := f.state(replaced)
			assert.Equal(t, before.Outstanding, after.Outstanding, "outstanding changed")
			assert.Equal(t, before.Leases, after.Leases, "open leases changed")
			assert.InDelta(t, before.Level, after.Level, 1e-9, "level changed")
		})
	}
	// A valid multibyte key is served.
	res := f.lease("", "holder", protocol.LeaseEntry{Key: "user:日本ü", Want: 1})[0]
	assert.EqualValues(t, 1, res.Granted)
}

func TestMaxBodyBytesOption(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{MaxBodyBytes: 64})
	r := f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":1}],"x":"`+strings.Repeat("y", 64)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	assert.Equal(t, protocol.CodeBodyTooLarge, r.problem(t).Code)
	f.lease("", "c", protocol.LeaseEntry{Key: "user:1", Want: 1})
}

func TestCheck(t *testing.T) {
	f := newFixture(t, rulesYAML, frozenStore(t), Options{})
	check := func(body string) (protocol.CheckResponse, response) {
		t.Helper()
		r := f.postJSON(protocol.PathCheck, "", body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var cr protocol.CheckResponse
		require.NoError(t, json.Unmarshal(r.body, &cr))
		return cr, r
	}

	cr, r := check(`{"keys":["tiny:a","user:1","free:1"]}`)
	assert.True(t, cr.Allowed)
	assert.Empty(t, r.header.Get("Retry-After"))
	require.Len(t, cr.Keys, 3)
	assert.Equal(t, "tiny", cr.Keys[0].Rule)
	assert.True(t, cr.Keys[2].Unlimited)
	assert.EqualValues(t, 99, cr.Keys[1].Remaining)

	// tiny:a is empty now (1 per hour): denied, all or nothing, with
	// Retry-After in whole seconds.
	cr, r = check(`{"keys":["user:1","tiny:a"]}`)
	assert.False(t, cr.Allowed)
	assert.Positive(t, cr.RetryAfterMillis)
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ra, 3000, "about an hour")
	assert.InDelta(t, 99, f.state("user:1").Level, 1e-9, "user:1's token was given back (the store's clock stands still)")
}

func TestCheckDefaultDeny(t *testing.T) {
	f := newFixture(t, "default: deny\n"+strings.TrimPrefix(rulesYAML, "\ndefault: allow\n"), nil, Options{})
	r := f.postJSON(protocol.PathCheck, "", `{"keys":["nomatch:1"]}`)
	require.Equal(t, http.StatusForbidden, r.status)
	assert.Equal(t, protocol.CodeNoRule, r.problem(t).Code)

	r = f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"nomatch:1","want":1}]}`)
	require.Equal(t, http.StatusForbidden, r.status)
	assert.Equal(t, protocol.CodeNoRule, r.problem(t).Code)
}

func TestRulesEndpoint(t *testing.T) {
	f := newFixture(t, authRulesYAML(), nil, Options{})
	r := f.do(http.MethodGet, protocol.PathRules, alphaToken, "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.NotContains(t, string(r.body), sha(alphaToken))
	assert.NotContains(t, string(r.body), sha(betaToken))
	assert.NotContains(t, string(r.body), "token_sha256")

	var rr protocol.RulesResponse
	require.NoError(t, json.Unmarshal(r.body, &rr))
	assert.Equal(t, f.srv.Rules().Version(), rr.Version)
	assert.Len(t, rr.Version, 64)
	assert.Equal(t, string(leases.DefaultAllow), rr.Default)
	assert.Equal(t, "alpha", rr.Client)
	assert.Equal(t, []string{"user:*", "tiny:*"}, rr.Keys)
	require.Len(t, rr.Rules, 2)
	assert.Equal(t, protocol.RuleInfo{Name: "per-user", Match: "user:*", Algorithm: "token_bucket", Limit: 100,
		Period: "1s", PeriodMillis: 1000, Burst: 100, LeaseTTL: "2s", LeaseTTLMillis: 2000,
		Limits: []protocol.LimitInfo{{Algorithm: "token_bucket", Limit: 100, Period: "1s", PeriodMillis: 1000, Burst: 100}}}, rr.Rules[0])
	assert.Equal(t, protocol.RuleInfo{Name: "tiny", Match: "tiny:*", Algorithm: "token_bucket", Limit: 1,
		Period: "1h", PeriodMillis: 3_600_000, Burst: 1, LeaseTTL: "2s", LeaseTTLMillis: 2000,
		Limits: []protocol.LimitInfo{{Algorithm: "token_bucket", Limit: 1, Period: "1h", PeriodMillis: 3_600_000, Burst: 1}}}, rr.Rules[1])

	// beta may use user:* only, so it does not see tiny.
	r = f.do(http.MethodGet, protocol.PathRules, betaToken, "", nil)
	require.Equal(t, http.StatusOK, r.status)
	rr = protocol.RulesResponse{}
	require.NoError(t, json.Unmarshal(r.body, &rr))
	assert.Equal(t, "beta", rr.Client)
	require.Len(t, rr.Rules, 1)
	assert.Equal(t, "per-user", rr.Rules[0].Name)

	// Without clients, the caller is anonymous and may use every key.
	open := newFixture(t, "", nil, Options{})
	r = open.do(http.MethodGet, protocol.PathRules, "", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	require.NoError(t, json.Unmarshal(r.body, &rr))
	assert.Equal(t, AnonymousClient, rr.Client)
	assert.Equal(t, []string{"*"}, rr.Keys)
	assert.Empty(t, rr.Rules)
}

// TestRulesFilteredByScopes: GET /v1/rules lists only the rules that some
// key the caller may use can match.
func TestRulesFilteredByScopes(t *testing.T) {
	const (
		narrowToken = "narrow-token"
		apiToken    = "api-token"
		allToken    = "all-token"
	)
	rules := `
default: deny
rules:
  - {name: per-user, match: "user:*", limit: 100, period: 1s}
  - {name: one-char-user, match: "user:?", limit: 10, period: 1s}
  - {name: search, match: "api:search", limit: 5, period: 1s}
  - {name: admin-anything, match: "*:admin", limit: 1, period: 1s}
  - {name: literal-star, match: "api:\\*", limit: 1, period: 1s}
  - {name: tiny, match: "tiny:*", limit: 1, period: 1h}
clients:
  - {name: narrow, token_sha256: "` + sha(narrowToken) + `", keys: ["user:4?"]}
  - {name: api, token_sha256: "` + sha(apiToken) + `", keys: ["api:s*", "x:admin"]}
  - {name: all, token_sha256: "` + sha(allToken) + `", keys: ["*"]}
`
	f := newFixture(t, rules, nil, Options{})
	for _, tt := range []struct {
		token string
		want  []string
	}{
		// user:4? reaches user:* (user:42) but not user:? (one character
		// after the colon) nor *:admin (user:4 plus one character is never
		// "…:admin").
		{narrowToken, []string{"per-user"}},
		// api:s* reaches api:search, and *:admin through api:s…:admin;
		// x:admin reaches *:admin too. Not api:\* (a literal star, which
		// api:s* does not start with).
		{apiToken, []string{"search", "admin-anything"}},
		{allToken, []string{"per-user", "one-char-user", "search", "admin-anything", "literal-star", "tiny"}},
	} {
		r := f.do(http.MethodGet, protocol.PathRules, tt.token, "", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var rr protocol.RulesResponse
		require.NoError(t, json.Unmarshal(r.body, &rr))
		names := []string{}
		for _, rl := range rr.Rules {
			names = append(names, rl.Name)
		}
		assert.Equal(t, tt.want, names, "client %s", rr.Client)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[string]string{"1s": "1s", "1m": "1m", "90s": "1m30s", "1h": "1h", "1h30m": "1h30m", "25h": "25h", "1500ms": "1.5s", "2ms": "2ms"} {
		pd, err := time.ParseDuration(d)
		require.NoError(t, err)
		assert.Equal(t, want, formatDuration(pd), d)
	}
}

func TestHealthAndReady(t *testing.T) {
	f := newFixture(t, "", nil, Options{})
	r := f.do(http.MethodGet, protocol.PathHealthz, "", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `{"status":"ok"}`, string(r.body))

	r = f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `{"status":"ok"}`, string(r.body))

	r = f.do(http.MethodHead, protocol.PathHealthz, "", "", nil)
	assert.Equal(t, http.StatusOK, r.status)

	// A closed store fails readiness, and lease calls answer 503.
	require.NoError(t, f.store.Close())
	r = f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, protocol.CodeStoreUnavailable, r.problem(t).Code)
	assert.Equal(t, "1", r.header.Get("Retry-After"))

	r = f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"k","want":1}]}`)
	require.Equal(t, http.StatusOK, r.status, "a key without rule needs no store")
	f2 := newFixture(t, rulesYAML, nil, Options{})
	require.NoError(t, f2.store.Close())
	r = f2.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, protocol.CodeShuttingDown, r.problem(t).Code)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	a := f.lease("", "m", protocol.LeaseEntry{Key: "user:1", Want: 10}, protocol.LeaseEntry{Key: "tiny:1", Want: 1})
	f.lease("", "n", protocol.LeaseEntry{Key: "tiny:1", Want: 1})                                 // denied
	f.lease("", "m", protocol.LeaseEntry{Key: "user:1", Want: 0, LeaseID: a[0].LeaseID, Used: 3}) // settled
	f.lease("", "m", protocol.LeaseEntry{Key: "tiny:1", Want: 0})                                 // replaces m's open lease: an expiry
	f.postJSON(protocol.PathLeases, "", `nope`)

	m := f.srv.metrics
	assert.Equal(t, 2.0, testutil.ToFloat64(m.grants))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.denials))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.settles))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.expiries))
	assert.Equal(t, 2.0, testutil.ToFloat64(m.rulesLoaded))

	// The exposition, over HTTP, as Prometheus scrapes it.
	assert.Equal(t, "2", f.metric("ratelease_grants_total"))
	// Each request is counted once, by route and status.
	assert.Equal(t, "4", f.metric(`ratelease_request_duration_seconds_count{code="200",route="POST /v1/leases"}`))
	assert.Equal(t, "1", f.metric(`ratelease_request_duration_seconds_count{code="400",route="POST /v1/leases"}`))
	assert.NotContains(t, string(f.do(http.MethodGet, protocol.PathMetrics, "", "", nil).body), "ratelease_requests_total")
	assert.Equal(t, "4", f.metric(`ratelease_store_latency_seconds_count{op="lease"}`))
	assert.Equal(t, "0", f.metric(`ratelease_store_errors_total{op="lease"}`))
	assert.Equal(t, "2", f.metric("ratelease_rules_loaded"))
	assert.Equal(t, "1", f.metric(`ratelease_rules_info{version="`+f.srv.Rules().Version()+`"}`), "the version in force")
	assert.Equal(t, "0", f.metric(`ratelease_rules_reloads_total{result="ok"}`))
}

func TestRegistryConflict(t *testing.T) {
	f := newFixture(t, "", nil, Options{})
	_, err := New(Options{Store: f.store, Registry: f.reg})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "own Registry")
}

// panicStore panics in every call.
type panicStore struct{ leases.Store }

func (panicStore) Lease(context.Context, leases.Owner, []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	panic("boom")
}

func TestPanicIsA500(t *testing.T) {
	ms := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = ms.Close() })
	f := newFixture(t, rulesYAML, panicStore{ms}, Options{})
	r := f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	assert.Equal(t, protocol.CodeInternal, r.problem(t).Code)
	assert.NotContains(t, string(r.body), "boom", "no internals leak to the caller")
	assert.Contains(t, f.logs.String(), "boom")
	assert.Contains(t, f.logs.String(), "goroutine", "the stack is logged")
	assert.Equal(t, "1", f.metric(`ratelease_request_duration_seconds_count{code="500",route="POST /v1/leases"}`))

	r = f.do(http.MethodGet, protocol.PathHealthz, "", "", nil)
	assert.Equal(t, http.StatusOK, r.status)
}

// opErrStore fails every lease operation with an error the Store interface
// does not document per operation.
type opErrStore struct{ leases.Store }

var errScript = errors.New("script returned an unexpected reply")

func (opErrStore) Lease(_ context.Context, _ leases.Owner, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	outs := make([]leases.LeaseOutcome, len(ops))
	for i := range outs {
		outs[i].Err = errScript
	}
	return outs, nil
}

// TestUnexpectedOpErrorIs500: an unexpected per-operation store error fails
// the call with a 500, and its cause is logged.
func TestUnexpectedOpErrorIs500(t *testing.T) {
	ms := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = ms.Close() })
	f := newFixture(t, rulesYAML, opErrStore{ms}, Options{})
	r := f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"free:1","want":1},{"key":"user:1","want":1}]}`)
	require.Equal(t, http.StatusInternalServerError, r.status, "body: %s", r.body)
	p := r.problem(t)
	assert.Equal(t, protocol.CodeInternal, p.Code)
	assert.Empty(t, p.Leases)
	assert.NotContains(t, string(r.body), errScript.Error(), "no internals leak to the caller")
	logs := f.logs.String()
	assert.Contains(t, logs, "engine failed")
	assert.Contains(t, logs, errScript.Error(), "the cause is logged")
	assert.Contains(t, logs, `lease \"user:1\"`)
}

func TestNoRulesFile(t *testing.T) {
	f := newFixture(t, "", nil, Options{})
	require.NoError(t, f.srv.Reload(), "no file, nothing to reload")
	res := f.lease("", "c", protocol.LeaseEntry{Key: "anything", Want: 123})[0]
	assert.True(t, res.Unlimited)
	assert.EqualValues(t, 123, res.Granted)
	assert.Empty(t, f.srv.Rules().Clients())
}

func TestLeaseResponseIsJSON(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	r := f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Equal(t, "no-store", r.header.Get("Cache-Control"))
	assert.True(t, bytes.HasPrefix(r.body, []byte(`{"leases":[`)))

	// Missing content type is accepted; a charset parameter too.
	r = f.do(http.MethodPost, protocol.PathLeases, "", "", strings.NewReader(`{"client_id":"c","leases":[{"key":"user:2","want":1}]}`))
	assert.Equal(t, http.StatusOK, r.status)
	r = f.do(http.MethodPost, protocol.PathLeases, "", "application/json; charset=utf-8", strings.NewReader(`{"client_id":"c","leases":[{"key":"user:3","want":1}]}`))
	assert.Equal(t, http.StatusOK, r.status)
}
