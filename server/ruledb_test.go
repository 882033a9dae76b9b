package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

const adminToken = "admin-token"

// newDBFixture starts a server in database mode over rs: its store and its
// rule database share that Redis.
func newDBFixture(t *testing.T, rs *redistest.Server, opts Options) *fixture {
	t.Helper()
	return newDBFixtureOn(t, rs.Client(t), opts)
}

// newDBFixtureOn starts a server in database mode whose store and rule
// database are in rdb (a cluster client, say).
func newDBFixtureOn(t *testing.T, rdb redis.UniversalClient, opts Options) *fixture {
	t.Helper()
	opts.RuleDB = NewRuleDB(rdb, RuleDBOptions{})
	opts.AdminTokenSHA256 = sha(adminToken)
	return newFixture(t, "", leases.NewRedisStore(rdb, leases.RedisOptions{}), opts)
}

// admin sends an admin request with the admin token (or token, when set)
// and optional headers ("If-Match", ...).
func (f *fixture) admin(method, path, token string, body any, headers ...string) response {
	f.t.Helper()
	if token == "" {
		token = adminToken
	}
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(f.t, err)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, f.url+path, rd)
	require.NoError(f.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := f.client.Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	require.NoError(f.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}
}

// check posts a check of key with token and returns its decision.
func (f *fixture) check(token, key string) protocol.CheckResponse {
	f.t.Helper()
	r := f.postJSON(protocol.PathCheck, token, protocol.CheckRequest{Keys: []string{key}})
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	var cr protocol.CheckResponse
	require.NoError(f.t, json.Unmarshal(r.body, &cr))
	return cr
}

// ruleLimit returns the limit of rule name as f's GET /v1/rules lists it,
// 0 when it is not listed.
func (f *fixture) ruleLimit(token, name string) int64 {
	f.t.Helper()
	r := f.do(http.MethodGet, protocol.PathRules, token, "", nil)
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	var rr protocol.RulesResponse
	require.NoError(f.t, json.Unmarshal(r.body, &rr))
	for _, rl := range rr.Rules {
		if rl.Name == name {
			return rl.Limit
		}
	}
	return 0
}

// within polls cond every 5ms until it holds or d has passed, and
// returns how long it took; it fails the test at the deadline.
func within(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond) // polling an observed state, not synchronising
	}
	return time.Since(start)
}

// TestRuleDBChangeReachesEveryServer: a rule put through one server's admin
// API applies on another server sharing the Redis within a second, and so
// does its change and its deletion.
func TestRuleDBChangeReachesEveryServer(t *testing.T) {
	rs := redistest.Start(t)
	a := newDBFixture(t, rs, Options{})
	b := newDBFixture(t, rs, Options{})

	r := a.admin(http.MethodPut, protocol.PathAdminRules+"/api", "", protocol.AdminRule{Match: "api:*", Limit: 2, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	took := within(t, time.Second, "rule on server b", func() bool { return b.ruleLimit("", "api") == 2 })
	t.Logf("rule put on a applied on b after %v", took)
	assert.Equal(t, int64(2), a.ruleLimit("", "api"), "a syncs at once after its own change")

	// It limits: 2 per minute, shared through Redis, whichever server decides.
	assert.True(t, a.check("", "api:x").Allowed)
	assert.True(t, b.check("", "api:x").Allowed)
	denied := b.check("", "api:x")
	assert.False(t, denied.Allowed)
	assert.Equal(t, "api", denied.Keys[0].Rule)

	r = b.admin(http.MethodPut, protocol.PathAdminRules+"/api", "", protocol.AdminRule{Match: "api:*", Limit: 50, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	took = within(t, time.Second, "changed rule on server a", func() bool { return a.ruleLimit("", "api") == 50 })
	t.Logf("rule changed on b applied on a after %v", took)

	r = a.admin(http.MethodDelete, protocol.PathAdminRules+"/api", "", nil)
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	within(t, time.Second, "deleted rule on server b", func() bool { return b.ruleLimit("", "api") == 0 })
	assert.True(t, b.check("", "api:x").Keys[0].Unlimited)

	// The change log has who, what and when.
	r = a.admin(http.MethodGet, protocol.PathAdminChanges, "", nil)
	require.Equal(t, http.StatusOK, r.status)
	var ch protocol.AdminChanges
	require.NoError(t, json.Unmarshal(r.body, &ch))
	require.Len(t, ch.Changes, 3)
	assert.Equal(t, protocol.AdminChange{Version: 3, At: ch.Changes[0].At, Who: AdminPrincipal, Op: "delete", Kind: KindRule, Name: "api"}, ch.Changes[0])
	assert.Equal(t, "put", ch.Changes[2].Op)
	assert.WithinDuration(t, time.Now(), time.UnixMilli(ch.Changes[0].At), time.Minute)
	assert.Contains(t, a.logs.String(), `msg="rule database changed" who=admin op=put kind=rule name=api version=1`)
}

// TestRuleDBOverride: an override applies to its key only, on every server;
// cached lookups make no Redis call; a deleted override stops applying.
func TestRuleDBOverride(t *testing.T) {
	rs := redistest.Start(t)
	a := newDBFixture(t, rs, Options{})
	b := newDBFixture(t, rs, Options{})
	r := a.admin(http.MethodPut, protocol.PathAdminRules+"/per-user", "", protocol.AdminRule{Match: "user:*", Limit: 100, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	within(t, time.Second, "rule on b", func() bool { return b.ruleLimit("", "per-user") == 100 })

	// b looks the key up once before the override exists: the absence is
	// cached, and the change must invalidate it.
	assert.Equal(t, "per-user", b.check("", "user:241531").Keys[0].Rule)

	r = a.admin(http.MethodPut, protocol.PathAdminOverrides+"/user:241531", "", protocol.AdminOverride{Limit: 2, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	took := within(t, time.Second, "override on b", func() bool {
		return b.check("", "user:241531").Keys[0].Rule == leases.OverrideRuleName
	})
	t.Logf("override put on a applied on b after %v", took)

	// The check above took one token of 2; one more is allowed, then none.
	assert.True(t, a.check("", "user:241531").Allowed)
	d := a.check("", "user:241531")
	assert.False(t, d.Allowed)
	assert.EqualValues(t, 2, d.Keys[0].Limit)
	// Other keys keep their rule.
	for range 5 {
		res := b.check("", "user:1")
		assert.True(t, res.Allowed)
		assert.Equal(t, "per-user", res.Keys[0].Rule)
		assert.EqualValues(t, 100, res.Keys[0].Limit)
	}

	// Cached keys make no Redis call for their override: Redis's own count
	// of HMGET commands does not move.
	rdb := rs.Client(t)
	ctx := context.Background()
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	_, missesBefore := b.srv.db.cache.stats()
	for range 20 {
		b.check("", "user:241531")
		b.check("", "user:1")
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	assert.NotContains(t, stats, "cmdstat_hmget", "no override lookup reached Redis")
	lookups, missesAfter := b.srv.db.cache.stats()
	assert.Equal(t, missesBefore, missesAfter)
	// The same figures on /metrics.
	assert.Equal(t, strconv.FormatUint(lookups, 10), b.metric("ratelease_override_lookups_total"))
	assert.Equal(t, strconv.FormatUint(missesAfter, 10), b.metric("ratelease_override_cache_misses_total"))
	assert.Equal(t, "2", b.metric("ratelease_override_cache_entries"), "user:241531 and user:1")

	r = b.admin(http.MethodDelete, protocol.PathAdminOverrides+"/user:241531", "", nil)
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	within(t, time.Second, "override deleted on a", func() bool {
		return a.check("", "user:241531").Keys[0].Rule == "per-user"
	})
	r = a.admin(http.MethodGet, protocol.PathAdminOverrides+"/user:241531", "", nil)
	assert.Equal(t, http.StatusNotFound, r.status)
	assert.Equal(t, protocol.CodeNoSuchItem, r.problem(t).Code)
}

// TestRuleDBKeyPathNotCanonical: a key holding "//", "/./" or "/../"
// (valid keys: "url:https://example.com/x", "path:/a/../b") sent in a
// path with its '/' unescaped gets 400 invalid_path on every keyed route,
// and no other key is touched; sent with '/' as %2F, it round-trips
// through PUT, GET, the listing, GET /v1/keys and DELETE. Before,
// ServeMux answered 307 to the cleaned path, another key's
// ("path:/b"), and a client following it stored that key's override.
func TestRuleDBKeyPathNotCanonical(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	f.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	db := NewRuleDB(rs.Client(t), RuleDBOptions{})
	ctx := context.Background()
	put := protocol.AdminOverride{Limit: 1, Period: "1m"}
	for _, tc := range []struct{ key, cleaned string }{
		{"url:https://example.com/x", "url:https:/example.com/x"},
		{"path:/a/../b", "path:/b"},
		{"path:/a/./b", "path:/a/b"},
		{"path:/a/..", "path:"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			for _, rt := range []struct {
				method, path string
				body         any
			}{
				{http.MethodPut, protocol.PathAdminOverrides + "/" + tc.key, put},
				{http.MethodGet, protocol.PathAdminOverrides + "/" + tc.key, nil},
				{http.MethodDelete, protocol.PathAdminOverrides + "/" + tc.key, nil},
				{http.MethodGet, protocol.PathKeysPrefix + tc.key, nil},
			} {
				r := f.admin(rt.method, rt.path, "", rt.body)
				require.Equal(t, http.StatusBadRequest, r.status, "%s %s: %s (Location %q)", rt.method, rt.path, r.body, r.header.Get("Location"))
				p := r.problem(t)
				assert.Equal(t, protocol.CodeInvalidPath, p.Code)
				assert.Contains(t, p.Detail, strings.ReplaceAll(tc.key, "/", "%2F"), "the detail shows the escaped path")
			}
			for _, k := range []string{tc.key, tc.cleaned} {
				_, err := db.Override(ctx, k)
				require.ErrorIs(t, err, ErrNoSuchItem, "nothing stored for %q", k)
			}

			esc := url.PathEscape(tc.key)
			r := f.admin(http.MethodPut, protocol.PathAdminOverrides+"/"+esc, "", put)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			o, err := db.Override(ctx, tc.key)
			require.NoError(t, err, "stored under the key as sent")
			assert.EqualValues(t, 1, o.Limit)
			_, err = db.Override(ctx, tc.cleaned)
			require.ErrorIs(t, err, ErrNoSuchItem)
			r = f.admin(http.MethodGet, protocol.PathAdminOverrides+"/"+esc, "", nil)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			assert.Contains(t, string(r.body), strconv.Quote(tc.key))
			seen, _, _ := f.listOverrides(tc.key, 10)
			assert.Equal(t, map[string]int{tc.key: 1}, seen)
			r = f.admin(http.MethodGet, protocol.PathKeysPrefix+esc, "", nil)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var ks protocol.KeyStateResponse
			require.NoError(t, json.Unmarshal(r.body, &ks))
			assert.Equal(t, tc.key, ks.Key)
			require.NotNil(t, ks.Rule)
			assert.Equal(t, leases.OverrideRuleName, ks.Rule.Name)
			r = f.admin(http.MethodDelete, protocol.PathAdminOverrides+"/"+esc, "", nil)
			require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
			_, err = db.Override(ctx, tc.key)
			require.ErrorIs(t, err, ErrNoSuchItem)
		})
	}
}

// TestRuleDBFailedWriteChangesNothing: a rule or override that does not
// validate, or that makes the set invalid, is refused with 422 naming the
// rule and field, and the database (items, version, log) is unchanged.
func TestRuleDBFailedWriteChangesNothing(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	r := f.admin(http.MethodPut, protocol.PathAdminRules+"/per-user", "", protocol.AdminRule{Match: "user:*", Limit: 100, Period: "1s"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	rdb := rs.Client(t)
	ctx := context.Background()
	dump := func() string {
		var b strings.Builder
		for _, k := range []string{"version", "setversion"} {
			v, _ := rdb.Get(ctx, DefaultRuleDBPrefix+k).Result()
			fmt.Fprintf(&b, "%s=%s\n", k, v)
		}
		for _, h := range []string{"rules", "clients", "overrides"} {
			v, err := rdb.HGetAll(ctx, DefaultRuleDBPrefix+h).Result()
			require.NoError(t, err)
			fmt.Fprintf(&b, "%s=%v\n", h, v)
		}
		l, err := rdb.LRange(ctx, DefaultRuleDBPrefix+"log", 0, -1).Result()
		require.NoError(t, err)
		fmt.Fprintf(&b, "log=%v\n", l)
		return b.String()
	}
	before := dump()

	cases := []struct {
		name, path string
		body       any
		detail     []string
	}{
		{"bad limit", protocol.PathAdminRules + "/bad", protocol.AdminRule{Match: "bad:*", Limit: -1, Period: "1s"}, []string{`rule "bad"`, "limit", "-1"}},
		{"bad period", protocol.PathAdminRules + "/bad", protocol.AdminRule{Match: "bad:*", Limit: 1, Period: "soon"}, []string{`rule "bad"`, "period", `"soon"`}},
		{"unknown algorithm", protocol.PathAdminRules + "/bad", protocol.AdminRule{Match: "bad:*", Limit: 1, Period: "1s", Algorithm: "magic"}, []string{`rule "bad"`, "algorithm", "magic"}},
		{"duplicate match", protocol.PathAdminRules + "/again", protocol.AdminRule{Match: "user:*", Limit: 1, Period: "1s"}, []string{`rule`, "match", `"user:*"`}},
		{"bad client", protocol.PathAdminClients + "/c", protocol.AdminClient{TokenSHA256: "abc", Keys: []string{"*"}}, []string{`client "c"`, "token_sha256"}},
		{"bad override", protocol.PathAdminOverrides + "/user:1", protocol.AdminOverride{Limit: 5}, []string{`override of key "user:1"`, "period"}},
	}
	for _, c := range cases {
		r := f.admin(http.MethodPut, c.path, "", c.body)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: body: %s", c.name, r.body)
		p := r.problem(t)
		assert.Equal(t, protocol.CodeInvalidRule, p.Code, c.name)
		for _, s := range c.detail {
			assert.Contains(t, p.Detail, s, c.name)
		}
	}
	// A typo in a field name is refused too.
	r = f.do(http.MethodPut, protocol.PathAdminRules+"/x", adminToken, "application/json", strings.NewReader(`{"match":"x:*","limt":5,"period":"1s"}`))
	require.Equal(t, http.StatusBadRequest, r.status)
	assert.Contains(t, r.problem(t).Detail, "limt")

	assert.Equal(t, before, dump(), "nothing was stored")
	assert.Equal(t, int64(100), f.ruleLimit("", "per-user"))
}

// TestRuleDBRuleNameRefused is the regression test of two findings about
// rule names. FuzzStoredItem found a name that is not UTF-8: the admin API
// took one from a percent-encoded path (PUT /v1/admin/rules/%FF), and every
// decision on the rule's keys then panicked (a 500) labelling the rule's
// metrics. A later fuzz pass left a name with a control character, or of
// any length: PUT /v1/admin/rules/a%0Ab stored the rule "a\nb", whose name
// then labelled metrics and went into logs. Such names are refused with
// 422 invalid_rule naming the fault, and store nothing; one written behind
// the API's back leaves the rules in force, which keep serving, /readyz
// says why, and the admin API can still read and delete it.
func TestRuleDBRuleNameRefused(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{DBCheckInterval: 50 * time.Millisecond})
	require.Equal(t, http.StatusOK, f.admin(http.MethodPut, protocol.PathAdminRules+"/ok", "", protocol.AdminRule{Match: "ok:*", Limit: 3, Period: "1s"}).status)
	rdb := rs.Client(t)
	ctx := context.Background()
	tests := []struct {
		name, path, detail string
	}{
		{"invalid byte", "%FF", "name: is not valid UTF-8"},
		{"after ASCII", "bad%FE", "name: is not valid UTF-8"},
		{"overlong", "%C0%AF", "name: is not valid UTF-8"},
		{"encoded surrogate", "%ED%A0%80", "name: is not valid UTF-8"},
		{"newline", "a%0Ab", "name: holds the control character U+000A at byte 1"},
		{"NUL", "%00", "name: holds the control character U+0000 at byte 0"},
		{"ESC", "x%1B%5B2J", "name: holds the control character U+001B at byte 1"},
		{"DEL", "x%7F", "name: holds the control character U+007F at byte 1"},
		{"C1 control", "%C2%85", "name: holds the control character U+0085 at byte 0"},
		{"too long", strings.Repeat("n", leases.MaxRuleNameBytes+1), "name: is 129 bytes; a rule name is at most 128"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.admin(http.MethodPut, protocol.PathAdminRules+"/"+tt.path, "", protocol.AdminRule{Match: "bad:*", Limit: 5, Period: "1s"})
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "body: %s", r.body)
			p := r.problem(t)
			assert.Equal(t, protocol.CodeInvalidRule, p.Code)
			assert.Contains(t, p.Detail, tt.detail)
			n, err := rdb.HLen(ctx, DefaultRuleDBPrefix+"rules").Result()
			require.NoError(t, err)
			assert.EqualValues(t, 1, n, "nothing was stored")
			c := f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"bad:1", "ok:1"}})
			require.Equal(t, http.StatusOK, c.status, "body: %s", c.body)
		})
	}
	long := strings.Repeat("n", leases.MaxRuleNameBytes)
	r := f.admin(http.MethodPut, protocol.PathAdminRules+"/"+long, "", protocol.AdminRule{Match: "long:*", Limit: 4, Period: "1s"})
	require.Equal(t, http.StatusOK, r.status, "the longest name is taken; body: %s", r.body)
	assert.Equal(t, int64(4), f.ruleLimit("", long))

	// Behind the API's back: the set is invalid, the rules in force serve.
	for _, stored := range []struct{ name, detail string }{
		{"bad\xff", "is not valid UTF-8"},
		{"bad\nname", "control character U+000A"},
	} {
		require.NoError(t, rdb.HSet(ctx, DefaultRuleDBPrefix+"rules", stored.name, `99|{"match":"bad:*","limit":5,"period":"1s"}`).Err())
		require.NoError(t, rdb.Incr(ctx, DefaultRuleDBPrefix+"setversion").Err())
		require.NoError(t, rdb.Publish(ctx, DefaultRuleDBPrefix+"changes", "x").Err())
		within(t, time.Second, "readyz detail", func() bool {
			r := f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
			return r.status == http.StatusOK && strings.Contains(string(r.body), stored.detail)
		})
		c := f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"bad:1", "ok:1"}})
		require.Equal(t, http.StatusOK, c.status, "body: %s", c.body)
		assert.Equal(t, int64(3), f.ruleLimit("", "ok"), "the rules in force still serve")
		assert.Zero(t, f.ruleLimit("", stored.name))

		path := protocol.PathAdminRules + "/" + url.PathEscape(stored.name)
		r := f.admin(http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusOK, r.status, "the admin reads it; body: %s", r.body)
		r = f.admin(http.MethodDelete, path, "", nil)
		require.Equal(t, http.StatusNoContent, r.status, "the admin deletes it; body: %s", r.body)
		within(t, time.Second, "readyz clean", func() bool {
			r := f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
			return r.status == http.StatusOK && !strings.Contains(string(r.body), stored.detail)
		})
	}
}

// TestRuleDBAdminBodyMalformed is the regression test of what
// FuzzAdminBody found: an admin PUT whose body is not UTF-8, escapes a
// lone surrogate, or holds data after its JSON value was taken (the
// pattern "user:\xff*" stored as "user:\uFFFD*"; "{...}{...}" as its
// first object). Each is refused now, 422 invalid_utf8 or 400
// invalid_json, and stores nothing; so are a field name in another case
// than its own ("LIMIT" for "limit") and a field given twice, which
// encoding/json took (the earlier fuzz pass's finding).
func TestRuleDBAdminBodyMalformed(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	rdb := rs.Client(t)
	ctx := context.Background()
	tests := []struct {
		name, path, body string
		code             protocol.Code
	}{
		{"rule pattern not UTF-8", protocol.PathAdminRules + "/r", "{\"match\":\"user:\xff*\",\"limit\":1,\"period\":\"1s\"}", protocol.CodeInvalidUTF8},
		{"rule pattern with a lone surrogate", protocol.PathAdminRules + "/r", `{"match":"user:\ud800*","limit":1,"period":"1s"}`, protocol.CodeInvalidUTF8},
		{"client keys not UTF-8", protocol.PathAdminClients + "/c", "{\"token_sha256\":\"" + sha("t") + "\",\"keys\":[\"a\xc0\xaf\"]}", protocol.CodeInvalidUTF8},
		{"override after a second object", protocol.PathAdminOverrides + "/user:1", `{"limit":1,"period":"1s"}{"limit":1000}`, protocol.CodeInvalidJSON},
		{"rule with trailing data", protocol.PathAdminRules + "/r", `{"match":"a:*","limit":1,"period":"1s"}0`, protocol.CodeInvalidJSON},
		{"settings with a stray bracket", protocol.PathAdminSettings, `{"default":"deny"}]`, protocol.CodeInvalidJSON},
		{"rule with an upper-case field", protocol.PathAdminRules + "/r", `{"match":"a:*","LIMIT":1,"period":"1s"}`, protocol.CodeInvalidJSON},
		{"rule with a field twice", protocol.PathAdminRules + "/r", `{"match":"a:*","limit":1,"period":"1s","limit":1000}`, protocol.CodeInvalidJSON},
		{"client with a capitalised field", protocol.PathAdminClients + "/c", `{"token_sha256":"` + sha("t") + `","Keys":["*"]}`, protocol.CodeInvalidJSON},
		{"override with a field twice", protocol.PathAdminOverrides + "/user:1", `{"limit":1,"period":"1s","period":"1h"}`, protocol.CodeInvalidJSON},
		{"settings with an upper-case field", protocol.PathAdminSettings, `{"DEFAULT":"deny"}`, protocol.CodeInvalidJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.do(http.MethodPut, tt.path, adminToken, "application/json", strings.NewReader(tt.body))
			require.Equal(t, tt.code.Status(), r.status, "body: %s", r.body)
			assert.Equal(t, tt.code, r.problem(t).Code)
			n, err := rdb.Exists(ctx, DefaultRuleDBPrefix+"version").Result()
			require.NoError(t, err)
			assert.Zero(t, n, "nothing was stored")
		})
	}
}

// TestRuleDBChangesQuery: GET /v1/admin/changes takes n from 1 (more
// than 1000 read as 1000); a malformed or out-of-range n gets 400
// invalid_query naming it, as the override listing's parameters do.
// Before, it got 422 invalid_request.
func TestRuleDBChangesQuery(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	for i := range 3 {
		r := f.admin(http.MethodPut, protocol.PathAdminOverrides+"/k:"+strconv.Itoa(i), "", protocol.AdminOverride{Limit: 1, Period: "1s"})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	}
	for _, tc := range []struct {
		n       string
		changes int // -1: refused
	}{
		{"abc", -1}, {"0", -1}, {"-3", -1}, {"1.5", -1}, {"", 3}, {"2", 2}, {"5000", 3},
	} {
		r := f.admin(http.MethodGet, protocol.PathAdminChanges+"?n="+tc.n, "", nil)
		if tc.changes < 0 {
			require.Equal(t, http.StatusBadRequest, r.status, "n=%s: %s", tc.n, r.body)
			p := r.problem(t)
			assert.Equal(t, protocol.CodeInvalidQuery, p.Code, "n=%s", tc.n)
			assert.Contains(t, p.Detail, fmt.Sprintf("n=%q", tc.n))
			continue
		}
		require.Equal(t, http.StatusOK, r.status, "n=%s: %s", tc.n, r.body)
		var out protocol.AdminChanges
		require.NoError(t, json.Unmarshal(r.body, &out))
		assert.Len(t, out.Changes, tc.changes, "n=%s", tc.n)
	}

	// An entry written behind the API's back is a 422 naming it, not a
	// 500 internal (found by review).
	require.NoError(t, rs.Client(t).LPush(context.Background(), DefaultRuleDBPrefix+"log", "not json").Err())
	r := f.admin(http.MethodGet, protocol.PathAdminChanges, "", nil)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "body: %s", r.body)
	assert.Contains(t, r.problem(t).Detail, `change log entry "not json" does not decode`)
}

// TestRuleDBStaleETag: with If-Match, the second of two edits from the
// same read gets 412 and changes nothing; of concurrent edits from one
// read exactly one wins.
func TestRuleDBStaleETag(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	r := f.admin(http.MethodPut, protocol.PathAdminRules+"/r", "", protocol.AdminRule{Match: "r:*", Limit: 1, Period: "1s"}, "If-None-Match", "*")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r = f.admin(http.MethodPut, protocol.PathAdminRules+"/r", "", protocol.AdminRule{Match: "r:*", Limit: 1, Period: "1s"}, "If-None-Match", "*")
	require.Equal(t, http.StatusPreconditionFailed, r.status, "create-only on an existing rule")

	get := f.admin(http.MethodGet, protocol.PathAdminRules+"/r", "", nil)
	require.Equal(t, http.StatusOK, get.status)
	etag := get.header.Get("ETag")
	require.NotEmpty(t, etag)

	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			statuses[i] = f.admin(http.MethodPut, protocol.PathAdminRules+"/r", "", protocol.AdminRule{Match: "r:*", Limit: int64(10 + i), Period: "1s"}, "If-Match", etag).status
		})
	}
	wg.Wait()
	won := 0
	for _, s := range statuses {
		if s == http.StatusOK {
			won++
		} else {
			assert.Equal(t, http.StatusPreconditionFailed, s)
		}
	}
	assert.Equal(t, 1, won, "statuses %v", statuses)

	r = f.admin(http.MethodPut, protocol.PathAdminRules+"/r", "", protocol.AdminRule{Match: "r:*", Limit: 99, Period: "1s"}, "If-Match", etag)
	require.Equal(t, http.StatusPreconditionFailed, r.status)
	assert.Equal(t, protocol.CodePreconditionFailed, r.problem(t).Code)
	r = f.admin(http.MethodDelete, protocol.PathAdminRules+"/r", "", nil, "If-Match", etag)
	require.Equal(t, http.StatusPreconditionFailed, r.status)
	got := f.admin(http.MethodGet, protocol.PathAdminRules+"/r", "", nil)
	var rule protocol.AdminRule
	require.NoError(t, json.Unmarshal(got.body, &rule))
	assert.NotEqual(t, int64(99), rule.Limit)
	assert.Equal(t, got.header.Get("ETag"), fmt.Sprintf("%q", fmt.Sprint(rule.Version)))

	// The current ETag works, for overrides too.
	r = f.admin(http.MethodDelete, protocol.PathAdminRules+"/r", "", nil, "If-Match", got.header.Get("ETag"))
	assert.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	r = f.admin(http.MethodPut, protocol.PathAdminOverrides+"/k", "", protocol.AdminOverride{Limit: 1, Period: "1s"})
	require.Equal(t, http.StatusOK, r.status)
	r2 := f.admin(http.MethodPut, protocol.PathAdminOverrides+"/k", "", protocol.AdminOverride{Limit: 2, Period: "1s"}, "If-Match", r.header.Get("ETag"))
	require.Equal(t, http.StatusOK, r2.status)
	r3 := f.admin(http.MethodPut, protocol.PathAdminOverrides+"/k", "", protocol.AdminOverride{Limit: 3, Period: "1s"}, "If-Match", r.header.Get("ETag"))
	require.Equal(t, http.StatusPreconditionFailed, r3.status)
}

// TestRuleDBAdminAuth: the admin API needs the admin token; a client's
// token gets 403, no token or an unknown one 401; a client put through the
// admin API authenticates /v1 calls.
func TestRuleDBAdminAuth(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	r := f.admin(http.MethodPut, protocol.PathAdminClients+"/alpha", "", protocol.AdminClient{TokenSHA256: sha(alphaToken), Keys: []string{"user:*"}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	r = f.admin(http.MethodGet, protocol.PathAdminRules, alphaToken, nil)
	require.Equal(t, http.StatusForbidden, r.status)
	assert.Equal(t, protocol.CodeAdminForbidden, r.problem(t).Code)
	r = f.admin(http.MethodPut, protocol.PathAdminRules+"/x", alphaToken, protocol.AdminRule{Match: "x:*", Limit: 1, Period: "1s"})
	require.Equal(t, http.StatusForbidden, r.status)
	r = f.admin(http.MethodGet, protocol.PathAdminRules, "nope", nil)
	require.Equal(t, http.StatusUnauthorized, r.status)
	r = f.do(http.MethodGet, protocol.PathAdminRules, "", "", nil)
	require.Equal(t, http.StatusUnauthorized, r.status)

	// The client is in force: /v1 now needs a token, and alpha's works.
	assert.Equal(t, http.StatusUnauthorized, f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"user:1"}}).status)
	assert.True(t, f.check(alphaToken, "user:1").Allowed)
	// The admin token is no client token.
	r = f.postJSON(protocol.PathCheck, adminToken, protocol.CheckRequest{Keys: []string{"user:1"}})
	assert.Equal(t, http.StatusUnauthorized, r.status)
	// What to change is in the rule database: there is no rules file.
	assert.Contains(t, r.problem(t).Detail, "any client of the rule database")
	r = f.postJSON(protocol.PathCheck, alphaToken, protocol.CheckRequest{Keys: []string{"api:1"}})
	require.Equal(t, http.StatusForbidden, r.status)
	assert.Contains(t, r.problem(t).Detail, "in the rule database (PUT /v1/admin/clients/alpha)")
	assert.NotContains(t, r.problem(t).Detail, "rules file")

	// The list shows the client; GET by name has an ETag.
	r = f.admin(http.MethodGet, protocol.PathAdminClients, "", nil)
	var cl protocol.AdminClients
	require.NoError(t, json.Unmarshal(r.body, &cl))
	require.Len(t, cl.Clients, 1)
	assert.Equal(t, []string{"user:*"}, cl.Clients[0].Keys)
}

// TestRuleDBAdminOff: without a rule database the admin API answers 404
// no_rule_db.
func TestRuleDBAdminOff(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	r := f.admin(http.MethodGet, protocol.PathAdminRules, "", nil)
	require.Equal(t, http.StatusNotFound, r.status)
	assert.Equal(t, protocol.CodeNoRuleDB, r.problem(t).Code)
}

// TestRuleDBSafetyNet: a change written while pub/sub is silent (here: by
// a script that publishes nothing) still reaches the server through the
// periodic version check.
func TestRuleDBSafetyNet(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{DBCheckInterval: 100 * time.Millisecond})
	rdb := rs.Client(t)
	silentWrite(t, rdb, NewRuleDB(rdb, RuleDBOptions{}), "quiet", `{"match":"q:*","limit":7,"period":"1s"}`)
	within(t, time.Second, "silent change", func() bool { return f.ruleLimit("", "quiet") == 7 })
}

// TestRuleDBInvalidStoredSet: a rule set made invalid behind the API's back
// keeps the rules in force and says so in /readyz.
func TestRuleDBInvalidStoredSet(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{DBCheckInterval: 50 * time.Millisecond})
	require.Equal(t, http.StatusOK, f.admin(http.MethodPut, protocol.PathAdminRules+"/ok", "", protocol.AdminRule{Match: "ok:*", Limit: 3, Period: "1s"}).status)
	rdb := rs.Client(t)
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, DefaultRuleDBPrefix+"rules", "broken", `99|{"match":"b:*","limit":0,"period":"1s"}`).Err())
	require.NoError(t, rdb.Incr(ctx, DefaultRuleDBPrefix+"setversion").Err())
	require.NoError(t, rdb.Publish(ctx, DefaultRuleDBPrefix+"changes", "x").Err())
	within(t, time.Second, "readyz detail", func() bool {
		r := f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
		return r.status == http.StatusOK && strings.Contains(string(r.body), `rule \"broken\"`)
	})
	assert.Equal(t, int64(3), f.ruleLimit("", "ok"), "the rules in force still serve")
}

// TestRuleDBUndecodableStoredItem: an item stored behind the API's back
// that does not decode (no version, or JSON cut short) keeps the rules in
// force, is logged at ERROR and named by /readyz; the admin API answers
// 422 invalid_rule naming it to a listing, a GET of it, and a change that
// leaves it in place, and a DELETE of it works, after which all is well.
// Before, every listing, GET and rule or client write answered 500
// internal (the DELETE of the bad rule too), the sync was logged at WARN
// as "retrying", and only redis-cli could repair the database.
// TestRuleDBCorruptOverrideLogged: an override written behind the API's
// back that does not decode, or names no valid rule, is not applied (the
// key is limited by its rule), and the server says so at ERROR, naming
// the key. It was skipped without a word (found by review).
func TestRuleDBCorruptOverrideLogged(t *testing.T) {
	for _, stored := range []string{`9|{"limit":`, `9|{"limit":5,"period":"-1s"}`} {
		t.Run(stored, func(t *testing.T) {
			rs := redistest.Start(t)
			f := newDBFixture(t, rs, Options{})
			require.Equal(t, http.StatusOK, f.admin(http.MethodPut, protocol.PathAdminRules+"/u", "", protocol.AdminRule{Match: "user:*", Limit: 3, Period: "1m"}).status)
			require.NoError(t, f.srv.SyncRuleDB(context.Background()))
			require.NoError(t, rs.Client(t).HSet(context.Background(), DefaultRuleDBPrefix+"overrides", "user:7", stored).Err())
			res := f.check("", "user:7")
			require.Len(t, res.Keys, 1)
			assert.Equal(t, int64(3), res.Keys[0].Limit, "limited by its rule")
			assert.Contains(t, f.logs.String(), `level=ERROR msg="stored override is invalid and not applied`)
			assert.Contains(t, f.logs.String(), `key=user:7`)
		})
	}
}

func TestRuleDBUndecodableStoredItem(t *testing.T) {
	for _, tc := range []struct {
		kind, hash, list, stored string
	}{
		{KindRule, "rules", protocol.PathAdminRules, `99|{"match":`},
		{KindRule, "rules", protocol.PathAdminRules, `{"match":"b:*","limit":1,"period":"1s"}`},
		{KindClient, "clients", protocol.PathAdminClients, `7|not json`},
		{KindOverride, "overrides", protocol.PathAdminOverrides, `99|{"limit":`},
	} {
		t.Run(tc.kind+" "+tc.stored, func(t *testing.T) {
			rs := redistest.Start(t)
			f := newDBFixture(t, rs, Options{})
			require.Equal(t, http.StatusOK, f.admin(http.MethodPut, protocol.PathAdminRules+"/ok", "", protocol.AdminRule{Match: "ok:*", Limit: 3, Period: "1s"}).status)
			rdb := rs.Client(t)
			ctx := context.Background()
			require.NoError(t, rdb.HSet(ctx, DefaultRuleDBPrefix+tc.hash, "broken", tc.stored).Err())
			item := tc.list + "/broken"
			named := fmt.Sprintf(`%s \"broken\"`, tc.kind)
			if tc.kind == KindOverride {
				named = `override of key \"broken\"`
			} else {
				require.NoError(t, rdb.Incr(ctx, DefaultRuleDBPrefix+"setversion").Err())
				err := f.srv.SyncRuleDB(ctx)
				require.ErrorIs(t, err, leases.ErrInvalidRules)
				require.NoError(t, rdb.Publish(ctx, DefaultRuleDBPrefix+"changes", "x").Err())
				within(t, time.Second, "readyz names the item", func() bool {
					return strings.Contains(f.readyDetail(), "broken")
				})
				within(t, time.Second, "logged at ERROR", func() bool {
					return strings.Contains(f.logs.String(), `level=ERROR msg="rule database holds invalid rules`)
				})
				assert.NotContains(t, f.logs.String(), "retrying")
				assert.Equal(t, int64(3), f.ruleLimit("", "ok"), "the rules in force still serve")
			}

			for _, rt := range []struct {
				method, path string
				body         any
			}{
				{http.MethodGet, tc.list, nil},
				{http.MethodGet, item, nil},
				{http.MethodPut, protocol.PathAdminRules + "/other", protocol.AdminRule{Match: "o:*", Limit: 1, Period: "1s"}},
			} {
				if tc.kind == KindOverride && rt.method == http.MethodPut {
					continue // overrides are not part of the rule set
				}
				r := f.admin(rt.method, rt.path, "", rt.body)
				require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s %s: %s", rt.method, rt.path, r.body)
				assert.Equal(t, protocol.CodeInvalidRule, r.problem(t).Code)
				assert.Contains(t, string(r.body), named, "%s %s", rt.method, rt.path)
				assert.Equal(t, rt.method == http.MethodPut, strings.Contains(string(r.body), "nothing was stored"))
			}

			r := f.admin(http.MethodDelete, item, "", nil)
			require.Equal(t, http.StatusNoContent, r.status, "the admin deletes the bad item; body: %s", r.body)
			r = f.admin(http.MethodGet, tc.list, "", nil)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			require.NoError(t, f.srv.SyncRuleDB(ctx))
			assert.Empty(t, f.readyDetail())
		})
	}
}

// TestRuleDBOverrideAppliesWhileStoredSetInvalid: while the stored rule
// set does not validate (written behind the API's back), an override put
// through the admin API still applies at once on the server that made the
// change and within a second on another. Before, the sync returned on the
// invalid set before it invalidated the override cache, so a key whose
// lack of an override was cached kept its rule (1000/min; 10 of 10 checks
// allowed against the override's 1/min) for the cache's TTL, a minute.
func TestRuleDBOverrideAppliesWhileStoredSetInvalid(t *testing.T) {
	rs := redistest.Start(t)
	a := newDBFixture(t, rs, Options{DBCheckInterval: time.Minute}) // only its own sync after the change
	b := newDBFixture(t, rs, Options{DBCheckInterval: 50 * time.Millisecond})
	require.Equal(t, http.StatusOK, a.admin(http.MethodPut, protocol.PathAdminRules+"/per-user", "", protocol.AdminRule{Match: "user:*", Limit: 1000, Period: "1m"}).status)
	within(t, time.Second, "rule on server b", func() bool { return b.ruleLimit("", "per-user") == 1000 })
	for _, f := range []*fixture{a, b} { // each caches the key's lack of an override
		require.Equal(t, "per-user", f.check("", "user:1").Keys[0].Rule)
		require.Equal(t, "per-user", f.check("", "user:2").Keys[0].Rule)
	}

	rdb := rs.Client(t)
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, DefaultRuleDBPrefix+"rules", "broken", `99|{"match":"b:*","limit":0,"period":"1s"}`).Err())
	require.NoError(t, rdb.Incr(ctx, DefaultRuleDBPrefix+"setversion").Err())
	within(t, time.Second, "server b sees the invalid set", func() bool { return b.srv.ReloadError() != nil })

	for _, key := range []string{"user:1", "user:2"} {
		r := a.admin(http.MethodPut, protocol.PathAdminOverrides+"/"+key, "", protocol.AdminOverride{Limit: 1, Period: "1m"})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	}
	assert.Equal(t, leases.OverrideRuleName, a.check("", "user:1").Keys[0].Rule, "in force on the server that made the change")
	assert.False(t, a.check("", "user:1").Allowed, "1 per minute")
	within(t, time.Second, "override on server b", func() bool { return b.check("", "user:2").Keys[0].Rule == leases.OverrideRuleName })
	require.Error(t, a.srv.SyncRuleDB(ctx), "the invalid set is still reported")
	assert.Equal(t, int64(1000), a.ruleLimit("", "per-user"), "the rules in force still serve")
}

// TestRuleDBSyncsRaceFree: the syncer's report of a sync (the "in sync
// again" line after a failure) and the syncs of admin requests
// (Server.changed, here RuleDB.PutOverride then SyncRuleDB) run at once
// without a data race. Before, dbSynced read the version seen after
// SyncRuleDB had released reloadMu, while an admin request's sync wrote it
// under the lock: -race reported it within a few error-to-ok
// transitions, which a rule set broken and fixed behind the API's back
// drives here.
func TestRuleDBSyncsRaceFree(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{DBCheckInterval: time.Millisecond})
	rdb := rs.Client(t)
	db := NewRuleDB(rdb, RuleDBOptions{})
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the admin API: put an override, then sync, as changed does
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := db.PutOverride(ctx, "admin", protocol.AdminOverride{Key: fmt.Sprintf("k:%d", i%10), Limit: 5, Period: "1s"}, ""); err == nil {
				_ = f.srv.SyncRuleDB(ctx)
			}
		}
	})
	for range 40 {
		require.NoError(t, rdb.HSet(ctx, DefaultRuleDBPrefix+"rules", "broken", `1|{"match":"b:*","limit":0,"period":"1s"}`).Err())
		require.NoError(t, rdb.Incr(ctx, DefaultRuleDBPrefix+"setversion").Err())
		within(t, 5*time.Second, "the syncer sees the broken set", func() bool { return f.srv.ReloadError() != nil })
		require.NoError(t, rdb.HDel(ctx, DefaultRuleDBPrefix+"rules", "broken").Err())
		require.NoError(t, rdb.Incr(ctx, DefaultRuleDBPrefix+"setversion").Err())
		within(t, 5*time.Second, "the syncer in sync again", func() bool { return f.srv.ReloadError() == nil })
	}
	close(stop)
	wg.Wait()
	assert.Contains(t, f.logs.String(), "rule database in sync again")
}

// TestRuleDBDefaultDeny: the rule set's default lives in the database
// too: put to deny, it applies on every server, and keys that match no
// rule are refused; a stale ETag on it gets 412; a bad value 422.
func TestRuleDBDefaultDeny(t *testing.T) {
	rs := redistest.Start(t)
	a := newDBFixture(t, rs, Options{})
	b := newDBFixture(t, rs, Options{})

	r := a.admin(http.MethodGet, protocol.PathAdminSettings, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	assert.JSONEq(t, `{"default":"allow"}`, string(r.body), "never stored: the default")
	assert.True(t, b.check("", "free:x").Keys[0].Unlimited)

	r = a.admin(http.MethodPut, protocol.PathAdminSettings, "", protocol.AdminSettings{Default: "deny"}, "If-None-Match", "*")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	etag := r.header.Get("ETag")
	within(t, time.Second, "default deny on server b", func() bool {
		res := b.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"free:x"}})
		return res.status == http.StatusForbidden && res.problem(t).Code == protocol.CodeNoRule
	})

	r = a.admin(http.MethodPut, protocol.PathAdminSettings, "", protocol.AdminSettings{Default: "allow"}, "If-Match", `"999"`)
	assert.Equal(t, http.StatusPreconditionFailed, r.status, "a stale ETag")
	r = a.admin(http.MethodPut, protocol.PathAdminSettings, "", protocol.AdminSettings{Default: "maybe"}, "If-Match", etag)
	assert.Equal(t, http.StatusUnprocessableEntity, r.status, "body: %s", r.body)
	assert.Contains(t, string(r.body), `default: \"maybe\" must be allow or deny`)
	r = a.admin(http.MethodPut, protocol.PathAdminSettings, "", protocol.AdminSettings{Default: "allow"}, "If-Match", etag)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	within(t, time.Second, "default allow again on server b", func() bool {
		return b.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"free:x"}}).status == http.StatusOK
	})
	assert.True(t, b.check("", "free:x").Keys[0].Unlimited)
}

// TestRuleDBSettingsETagZero: settings never stored are answered with
// ETag "0", and a PUT with If-Match "0" succeeds while nothing is stored
// and gets 412 once something is. Before, If-Match "0", the server's own
// ETag, was refused with 422 invalid_request ("not an ETag of this API").
func TestRuleDBSettingsETagZero(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	r := f.admin(http.MethodGet, protocol.PathAdminSettings, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	etag := r.header.Get("ETag")
	require.Equal(t, `"0"`, etag)

	for _, tc := range []struct {
		ifMatch string
		want    int
	}{
		{etag, http.StatusOK},                    // nothing stored: the write goes through
		{etag, http.StatusPreconditionFailed},    // stored now: "0" is stale
		{`"-1"`, http.StatusUnprocessableEntity}, // never an ETag of this API
	} {
		r = f.admin(http.MethodPut, protocol.PathAdminSettings, "", protocol.AdminSettings{Default: "deny"}, "If-Match", tc.ifMatch)
		assert.Equal(t, tc.want, r.status, "If-Match %s: %s", tc.ifMatch, r.body)
	}
	r = f.admin(http.MethodGet, protocol.PathAdminSettings, "", nil)
	assert.JSONEq(t, fmt.Sprintf(`{"default":"deny","version":%s}`, strings.Trim(r.header.Get("ETag"), `"`)), string(r.body))
}

// lateSubscriber is a Redis client whose Subscribe waits for release: a
// server whose subscription to the rule database's notices takes effect
// late.
type lateSubscriber struct {
	redis.UniversalClient
	release chan struct{}
}

func (l lateSubscriber) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	<-l.release
	return l.UniversalClient.Subscribe(ctx, channels...)
}

// TestRuleDBChangeBeforeSubscription: a change made after a server read
// the rule database but before its subscription to the change notices took
// effect applies at once, not at the next DBCheckInterval: the server
// syncs once its subscription is confirmed.
func TestRuleDBChangeBeforeSubscription(t *testing.T) {
	rs := redistest.Start(t)
	a := newDBFixture(t, rs, Options{})
	late := lateSubscriber{UniversalClient: rs.Client(t), release: make(chan struct{})}
	b := newDBFixtureOn(t, late, Options{DBCheckInterval: time.Minute})

	r := a.admin(http.MethodPut, protocol.PathAdminRules+"/api", "", protocol.AdminRule{Match: "api:*", Limit: 2, Period: "1m"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	close(late.release)
	within(t, 5*time.Second, "rule on server b", func() bool { return b.ruleLimit("", "api") == 2 })
}

// TestRuleDBDownAtNewOnExposedAddress: a server in database mode whose
// database does not answer at New, on an address that is not loopback,
// answers 503 while it waits; a rule set without clients, read once the
// database answers, is refused there (ErrInsecureListen) and the server
// goes on answering 503 rather than serving without authentication; a set
// with a client is put in force.
func TestRuleDBDownAtNewOnExposedAddress(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	rs.Stop(t)
	var logs syncBuffer
	srv, err := New(Options{
		Store:           leases.NewRedisStore(rdb, leases.RedisOptions{}),
		RuleDB:          NewRuleDB(rdb, RuleDBOptions{}),
		ListenAddr:      "0.0.0.0:8080",
		DBCheckInterval: 20 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err, "it waits for the database")
	t.Cleanup(func() { _ = srv.Close() })
	call := func(token string) int {
		req := httptest.NewRequest(http.MethodPost, protocol.PathCheck, strings.NewReader(`{"keys":["k"]}`))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, req)
		return w.Code
	}
	assert.Equal(t, http.StatusServiceUnavailable, call(""))
	assert.Contains(t, logs.String(), "rule database does not answer")

	rs.Restart(t)
	ctx := context.Background()
	require.ErrorIs(t, srv.SyncRuleDB(ctx), ErrInsecureListen, "an empty database: no clients")
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "rule set is refused on this address")
	}, 10*time.Second, 10*time.Millisecond, "the syncer logs it")
	assert.Contains(t, logs.String(), "level=ERROR")
	assert.Equal(t, http.StatusServiceUnavailable, call(""), "still waiting, never unauthenticated")
	w := httptest.NewRecorder()
	srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, protocol.PathReadyz, nil))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Contains(t, w.Body.String(), "cannot be put in force", "the database answers: its rule set is why")
	assert.NotContains(t, logs.String(), "keeping the rules in force", "there are none in force")

	db := NewRuleDB(rdb, RuleDBOptions{})
	_, err = db.PutClient(ctx, "test", protocol.AdminClient{Name: "svc", TokenSHA256: sha("svc-token"), Keys: []string{"*"}}, "", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return call("svc-token") == http.StatusOK }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, http.StatusUnauthorized, call(""))
}

// TestRuleDBRefusedAtNew: a Redis that answers but refuses the rule
// database's commands (an ACL user whose key patterns reach the buckets,
// rl:*, but not the database's keys) is a misconfiguration: logged at
// ERROR as Redis refusing, at New and by the syncer, never as a database
// that "does not answer", and answered 503 with that reason; the server
// waits for it as for a Redis down, and serves once Redis accepts.
// Before, New took the refusal for a database down: a WARN "does not
// answer" at start, another "sync failed; retrying", and 503 forever,
// where before the wait for a database down New failed on it.
func TestRuleDBRefusedAtNew(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	admin := rs.Client(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "buckets", "on", ">pw", "~rl:*", "&*", "+@all").Err())
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), Username: "buckets", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Ping(ctx).Err(), "the user may PING")

	var logs syncBuffer
	srv, err := New(Options{
		Store:           leases.NewRedisStore(rdb, leases.RedisOptions{}),
		RuleDB:          NewRuleDB(rdb, RuleDBOptions{}),
		DBCheckInterval: 20 * time.Millisecond,
		Logger:          slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	require.NoError(t, err, "it waits for Redis to accept it")
	t.Cleanup(func() { _ = srv.Close() })
	records := func() []map[string]any {
		var out []map[string]any
		for line := range strings.Lines(logs.String()) {
			var r map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &r), "%s", line)
			out = append(out, r)
		}
		return out
	}
	require.Eventually(t, func() bool { return len(records()) >= 2 }, 10*time.Second, 10*time.Millisecond,
		"New's record and the syncer's: %s", logs.String())
	refusals := 0
	for _, r := range records() {
		if strings.Contains(fmt.Sprint(r["err"]), "NOPERM") {
			refusals++
			assert.Equal(t, "ERROR", r["level"], "%v", r)
			assert.NotContains(t, r["msg"], "does not answer", "%v", r)
			assert.NotContains(t, r["msg"], "retrying", "%v", r)
			assert.Contains(t, r["msg"], "{rl:db}:*", "what the ACL must reach: %v", r)
		}
	}
	assert.Equal(t, 2, refusals, "New's and the syncer's (once), naming NOPERM: %s", logs.String())
	call := func(path string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	code, body := call(protocol.PathReadyz)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "refuses", "the reason, not a database that does not answer")
	assert.NotContains(t, body, "did not answer")

	// The operator fixes the ACL: the server reads the rules by itself.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "buckets", "~{rl:db}:*").Err())
	require.Eventually(t, func() bool { code, _ := call(protocol.PathRules); return code == http.StatusOK }, 10*time.Second, 10*time.Millisecond)
}

// TestRuleDBPendingDescribed: a server waiting for its rule database
// (pending) says so wherever it describes its rules: the status page, and
// RulesPending for rateleased's start line. Its placeholder of no rules
// read as "default allow; no rules: every key is unlimited" on /status,
// and rateleased logged rules=0 clients=0 default=allow, while every call
// was answered 503 (found by the review of the ops review's fixes).
func TestRuleDBPendingDescribed(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	rs.Stop(t)
	srv, err := New(Options{
		Store:           leases.NewRedisStore(rdb, leases.RedisOptions{}),
		RuleDB:          NewRuleDB(rdb, RuleDBOptions{}),
		ListenAddr:      "127.0.0.1:8080",
		DBCheckInterval: 20 * time.Millisecond,
		Logger:          slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err, "it waits for the database")
	t.Cleanup(func() { _ = srv.Close() })
	status := func() string {
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status", nil))
		require.Equal(t, http.StatusOK, w.Code)
		return w.Body.String()
	}
	assert.True(t, srv.RulesPending())
	page := status()
	assert.NotContains(t, page, "unlimited", "no rule set is in force yet")
	assert.NotContains(t, page, "reload of the rules file", "database mode has no rules file")
	assert.Contains(t, page, "the rule database did not answer")
	assert.Contains(t, page, `id="pending"`)

	rs.Restart(t)
	require.Eventually(t, func() bool { return !srv.RulesPending() }, 10*time.Second, 10*time.Millisecond)
	page = status()
	assert.NotContains(t, page, `id="pending"`)
	assert.Contains(t, page, "unlimited", "an empty database, default allow")
}
