package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
	"github.com/ratelease/ratelease/server"
)

const adminToken = "cli-admin-token"

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// startServer starts an in-process server in database mode over a fresh
// Redis and returns its URL.
func startServer(t *testing.T) (string, *server.Server) {
	t.Helper()
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	srv, err := server.New(server.Options{
		Store:            leases.NewRedisStore(rdb, leases.RedisOptions{}),
		RuleDB:           server.NewRuleDB(rdb, server.RuleDBOptions{}),
		AdminTokenSHA256: sha(adminToken),
	})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); _ = srv.Close() })
	return hs.URL, srv
}

// ratelease runs the CLI with the server and token from the environment,
// as a user would set them.
func ratelease(t *testing.T, url string, args ...string) (string, string, error) {
	t.Helper()
	env := map[string]string{"RATELEASE_SERVER": url, "RATELEASE_ADMIN_TOKEN": adminToken}
	var out, errb bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
	return out.String(), errb.String(), err
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

const fileV1 = `
rules:
  - name: per-user
    match: "user:*"
    limit: 100
    period: 1s
  - name: login
    match: "login:*"
    limits:
      - {limit: 3, period: 1m, algorithm: sliding_window_log}
      - {limit: 100, period: 1h}
clients:
  - name: checkout
    token_sha256: "` + "0000000000000000000000000000000000000000000000000000000000000001" + `"
    keys: ["user:*"]
`

func TestRulesApplyIsIdempotentAndDiffs(t *testing.T) {
	url, srv := startServer(t)
	path := writeFile(t, fileV1)

	out, stderr, err := ratelease(t, url, "rules", "diff", "-f", path)
	require.NoError(t, err, stderr)
	assert.Equal(t, "+ rule per-user\n+ rule login\n+ client checkout\n", out)

	out, stderr, err = ratelease(t, url, "rules", "apply", "-f", path)
	require.NoError(t, err, stderr)
	assert.Equal(t, "+ rule per-user\n+ rule login\n+ client checkout\n", out)
	require.Len(t, srv.Rules().Policy().Rules(), 2, "in force at once on the server that took the change")

	out, _, err = ratelease(t, url, "rules", "apply", "-f", path)
	require.NoError(t, err)
	assert.Equal(t, "no changes\n", out, "apply is idempotent")

	// Change one rule, drop another: diff shows it, apply without -prune
	// keeps the dropped rule, with -prune deletes it.
	v2 := strings.Replace(fileV1, "limit: 100\n    period: 1s", "limit: 200\n    period: 1s", 1)
	v2 = v2[:strings.Index(v2, "  - name: login")] + v2[strings.Index(v2, "clients:"):]
	path2 := writeFile(t, v2)
	out, _, err = ratelease(t, url, "rules", "diff", "-f", path2)
	require.NoError(t, err)
	assert.Equal(t, "~ rule per-user\n", out)
	out, _, err = ratelease(t, url, "rules", "diff", "-f", path2, "-prune")
	require.NoError(t, err)
	assert.Equal(t, "- rule login\n~ rule per-user\n", out)
	out, _, err = ratelease(t, url, "rules", "apply", "-prune", "-f", path2)
	require.NoError(t, err)
	assert.Equal(t, "- rule login\n~ rule per-user\n", out)

	out, _, err = ratelease(t, url, "rules", "list")
	require.NoError(t, err)
	assert.Contains(t, out, "1 rules, default allow")
	assert.Contains(t, out, `per-user	{"name":"per-user","match":"user:*","limit":200,"period":"1s"`)

	// A bad file is refused before any call, with the rule and field.
	bad := writeFile(t, "rules:\n  - name: x\n    match: \"x:*\"\n    limit: 0\n    period: 1s\n")
	_, stderr, err = ratelease(t, url, "rules", "apply", "-f", bad)
	require.Error(t, err)
	assert.Contains(t, stderr, `rule "x": limit`)
}

func TestOverrideCommands(t *testing.T) {
	url, _ := startServer(t)
	out, stderr, err := ratelease(t, url, "override", "set", "user:241531", "--limit", "5", "--period", "1s", "--burst", "10")
	require.NoError(t, err, stderr)
	assert.Contains(t, out, "override of user:241531: 5 per 1s")

	out, _, err = ratelease(t, url, "override", "get", "user:241531")
	require.NoError(t, err)
	assert.Contains(t, out, `"key": "user:241531"`)
	assert.Contains(t, out, `"burst": 10`)

	out, _, err = ratelease(t, url, "override", "delete", "user:241531")
	require.NoError(t, err)
	assert.Equal(t, "deleted override of user:241531\n", out)
	_, stderr, err = ratelease(t, url, "override", "get", "user:241531")
	require.ErrorIs(t, err, errCall)
	assert.Contains(t, stderr, "404 no_such_item")

	// A wrong token is reported as such.
	var o, e bytes.Buffer
	err = run(context.Background(), []string{"-server", url, "-token", "wrong", "override", "get", "k"}, func(string) string { return "" }, &o, &e)
	require.ErrorIs(t, err, errCall)
	assert.Contains(t, e.String(), "401 unauthorized")

	_, _, err = ratelease(t, url, "override", "set", "k", "--limit", "5")
	require.ErrorIs(t, err, errUsage)
}

// TestOverrideCommandsKeysWithSlashes: keys whose text holds "//", "/./"
// or "/../", and the keys "." and "..", round-trip through override set,
// get, list, key show and delete, and no other key gets an override.
// Before, the CLI sent '/' unescaped, the server answered 307 to the
// cleaned path, and the CLI followed it with the body: "override set
// path:/a/../b" reported success and stored an override for "path:/b".
func TestOverrideCommandsKeysWithSlashes(t *testing.T) {
	url, _ := startServer(t)
	for _, tc := range []struct{ key, cleaned string }{
		{"path:/a/../b", "path:/b"},
		{"url:https://example.com/x", "url:https:/example.com/x"},
		{"path:/a/./b", "path:/a/b"},
		{"..", ""},
		{".", ""},
	} {
		t.Run(tc.key, func(t *testing.T) {
			out, stderr, err := ratelease(t, url, "override", "set", tc.key, "-limit", "1", "-period", "1m")
			require.NoError(t, err, stderr)
			assert.Contains(t, out, "override of "+tc.key+": 1 per 1m")
			out, stderr, err = ratelease(t, url, "override", "get", tc.key)
			require.NoError(t, err, stderr)
			assert.Contains(t, out, fmt.Sprintf("%q: %q", "key", tc.key))
			out, stderr, err = ratelease(t, url, "override", "list", "-prefix", tc.key)
			require.NoError(t, err, stderr)
			assert.True(t, strings.HasPrefix(out, tc.key+"\t"), "listed under its key: %q", out)
			out, stderr, err = ratelease(t, url, "key", "show", tc.key)
			require.NoError(t, err, stderr)
			var ks protocol.KeyStateResponse
			require.NoError(t, json.Unmarshal([]byte(out), &ks), out)
			assert.Equal(t, tc.key, ks.Key)
			if tc.cleaned != "" {
				_, stderr, err = ratelease(t, url, "override", "get", tc.cleaned)
				require.ErrorIs(t, err, errCall, "no override stored for %q", tc.cleaned)
				assert.Contains(t, stderr, "404 no_such_item")
			}
			out, stderr, err = ratelease(t, url, "override", "delete", tc.key)
			require.NoError(t, err, stderr)
			assert.Equal(t, "deleted override of "+tc.key+"\n", out)
			_, stderr, err = ratelease(t, url, "override", "get", tc.key)
			require.ErrorIs(t, err, errCall)
			assert.Contains(t, stderr, "404 no_such_item")
		})
	}
}

// TestCallFollowsNoRedirect: a redirect answered to a PUT, DELETE or GET
// is reported as the command's error, and the CLI sends nothing, token
// included, to where it points. Before, the CLI's http.Client followed a
// 307 with the PUT's body and the admin token.
func TestCallFollowsNoRedirect(t *testing.T) {
	var followed atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/elsewhere") {
			followed.Add(1)
			return
		}
		http.Redirect(w, r, "/elsewhere"+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(hs.Close)
	for _, args := range [][]string{
		{"override", "set", "user:1", "-limit", "1", "-period", "1m"},
		{"override", "delete", "user:1"},
		{"override", "get", "user:1"},
	} {
		_, stderr, err := ratelease(t, hs.URL, args...)
		require.ErrorIs(t, err, errCall, "%v", args)
		assert.Contains(t, stderr, "redirect to "+hs.URL+"/elsewhere", "%v", args)
	}
	assert.Zero(t, followed.Load(), "requests sent to the redirect's target")
}

// TestOverrideList: override list pages through every override, or those
// of a prefix taken literally, one line each, and counts them.
func TestOverrideList(t *testing.T) {
	url, _ := startServer(t)
	keys := []string{"user:1", "user:2", "user:3", "plan*[gold]?:1", "plan*[gold]?:2", "planXgold!:3"}
	for _, k := range keys {
		_, stderr, err := ratelease(t, url, "override", "set", k, "-limit", "5", "-period", "1s")
		require.NoError(t, err, stderr)
	}
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"-limit", "2"}, keys},
		{[]string{"-prefix", "user:", "-limit", "1"}, keys[:3]},
		{[]string{"-prefix", "plan*[gold]?"}, keys[3:5]},
		{[]string{"-prefix", "nobody"}, nil},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, stderr, err := ratelease(t, url, append([]string{"override", "list"}, tt.args...)...)
			require.NoError(t, err, stderr)
			var got []string
			for line := range strings.Lines(out) {
				key, doc, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
				require.True(t, ok, line)
				assert.Contains(t, doc, `"limit":5`)
				got = append(got, key)
			}
			assert.ElementsMatch(t, tt.want, got)
			assert.Equal(t, fmt.Sprintf("%d overrides\n", len(tt.want)), stderr)
		})
	}
	_, _, err := ratelease(t, url, "override", "list", "user:1")
	require.ErrorIs(t, err, errUsage, "a KEY is no prefix")
	_, stderr, err := ratelease(t, url, "override", "list", "-limit", "0")
	require.ErrorIs(t, err, errCall)
	assert.Contains(t, stderr, "400 invalid_query")
}

// TestKeyShow: key show prints a key's state as GET /v1/keys/{key} gives
// it, holders and the times to the next token and to a whole bucket
// included.
func TestKeyShow(t *testing.T) {
	url, _ := startServer(t)
	_, stderr, err := ratelease(t, url, "rules", "apply", "-f", writeFile(t, "rules:\n  - {name: per-user, match: \"user:*\", limit: 100, period: 1s}\n"))
	require.NoError(t, err, stderr)
	// Two processes lease from user:1, one of them twice (one lease per
	// slot): three leases, two holders.
	for _, l := range []struct {
		process string
		slot    int
	}{{"p1", 0}, {"p1", 1}, {"p2", 0}} {
		body, err := json.Marshal(protocol.LeaseRequest{ClientID: l.process, Leases: []protocol.LeaseEntry{{Key: "user:1", Want: 10, Slot: l.slot}}})
		require.NoError(t, err)
		resp, err := http.Post(url+protocol.PathLeases, "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, resp.Body.Close())
	}
	out, stderr, err := ratelease(t, url, "key", "show", "user:1")
	require.NoError(t, err, stderr)
	var ks protocol.KeyStateResponse
	require.NoError(t, json.Unmarshal([]byte(out), &ks), out)
	assert.Equal(t, "user:1", ks.Key)
	require.Len(t, ks.Limits, 1)
	assert.Equal(t, 3, ks.Limits[0].Leases)
	assert.Equal(t, 2, ks.Limits[0].Holders)
	for _, field := range []string{`"holders": 2`, `"next_token_ms": `, `"full_ms": `} {
		assert.Contains(t, out, field)
	}

	// A key with an override shows the override, as its decisions use it
	// (it showed the per-user rule, a bucket of 100 for a key limited to
	// 10).
	_, stderr, err = ratelease(t, url, "override", "set", "user:2", "--limit", "5", "--period", "1s", "--burst", "10")
	require.NoError(t, err, stderr)
	out, stderr, err = ratelease(t, url, "key", "show", "user:2")
	require.NoError(t, err, stderr)
	ks = protocol.KeyStateResponse{}
	require.NoError(t, json.Unmarshal([]byte(out), &ks), out)
	require.NotNil(t, ks.Rule, out)
	assert.Equal(t, "override", ks.Rule.Name)
	require.Len(t, ks.Limits, 1)
	assert.EqualValues(t, 5, ks.Limits[0].Limit)
	assert.EqualValues(t, 10, ks.Limits[0].Burst)
}

// TestUsageHidesToken: the usage text, printed on -h, after a bad flag and
// after a bad command, never shows the admin token of
// RATELEASE_ADMIN_TOKEN (flag prints a flag's default, which the
// environment supplies), and the variable still applies.
func TestUsageHidesToken(t *testing.T) {
	const secret = "admin-secret-0123"
	env := map[string]string{"RATELEASE_ADMIN_TOKEN": secret}
	for _, args := range [][]string{{"-h"}, {"-nope"}, {"rules"}, {"frobnicate", "all"}} {
		var out, errb bytes.Buffer
		err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
		require.Error(t, err, "%v", args)
		assert.Contains(t, errb.String(), "RATELEASE_ADMIN_TOKEN", "%v: the usage is printed", args)
		for _, l := range strings.Split(out.String()+errb.String(), "\n") {
			assert.NotContains(t, l, secret, "%v: the token is printed", args)
		}
	}

	var got atomic.Value
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"version":1,"rules":[],"default":"allow"}`)
	}))
	t.Cleanup(hs.Close)
	env["RATELEASE_SERVER"] = hs.URL
	require.NoError(t, run(context.Background(), []string{"rules", "list"}, func(k string) string { return env[k] }, &bytes.Buffer{}, &bytes.Buffer{}))
	assert.Equal(t, "Bearer "+secret, got.Load(), "the environment applies")
	require.NoError(t, run(context.Background(), []string{"-token", "other", "rules", "list"}, func(k string) string { return env[k] }, &bytes.Buffer{}, &bytes.Buffer{}))
	assert.Equal(t, "Bearer other", got.Load(), "the flag wins")
}

// TestRulesApplyWritesDefault: apply stores the file's default, as the
// package docs and the README say: a file with default: deny makes the
// servers in database mode refuse keys that match no rule, and a file
// without one (allow) puts allow back.
func TestRulesApplyWritesDefault(t *testing.T) {
	url, srv := startServer(t)
	deny := writeFile(t, "default: deny\n"+fileV1)
	out, stderr, err := ratelease(t, url, "rules", "apply", "-f", deny)
	require.NoError(t, err, stderr)
	assert.Contains(t, out, "~ settings default deny")
	assert.Equal(t, leases.DefaultDeny, srv.Rules().Policy().Default())

	out, _, err = ratelease(t, url, "rules", "apply", "-f", writeFile(t, fileV1))
	require.NoError(t, err)
	assert.Equal(t, "~ settings default allow\n", out)
	assert.Equal(t, leases.DefaultAllow, srv.Rules().Policy().Default())
}
