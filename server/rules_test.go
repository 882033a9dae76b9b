package server

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

func TestParseRules(t *testing.T) {
	rules, err := ParseRules([]byte(authRulesYAML()))
	require.NoError(t, err)
	assert.Equal(t, []string{"alpha", "beta"}, rules.Clients())
	assert.Len(t, rules.Policy().Rules(), 2)

	a := rules.authenticate(alphaToken)
	require.NotNil(t, a)
	assert.Equal(t, "alpha", a.name)
	b := rules.authenticate(betaToken)
	require.NotNil(t, b)
	assert.Equal(t, "beta", b.name)
	assert.Nil(t, rules.authenticate("alpha-token "))
	assert.Nil(t, rules.authenticate(""))

	empty, err := ParseRules(nil)
	require.NoError(t, err)
	assert.Empty(t, empty.Clients())
	assert.Equal(t, leases.DefaultAllow, empty.Policy().Default())
}

func TestParseRulesErrors(t *testing.T) {
	h := sha("x")
	client := func(body string) string { return "clients:\n" + body }
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"unknown top-level field", "clinets: []\n", []string{"clinets"}},
		{"unknown client field", client("  - name: a\n    token: x\n    token_sha256: \"" + h + "\"\n    keys: [\"*\"]\n"), []string{"token"}},
		{"bad rule", "rules:\n  - name: per-user\n    match: \"user:*\"\n    limit: -5\n    period: 1s\n", []string{`rule "per-user"`, "limit"}},
		{"bad rule period", "rules:\n  - name: per-user\n    match: \"user:*\"\n    limit: 5\n", []string{`rule "per-user"`, "period"}},
		{"client without name", client("  - token_sha256: \"" + h + "\"\n    keys: [\"*\"]\n"), []string{"clients[0]", "name", "required"}},
		{"client name with slash", client("  - name: a/b\n    token_sha256: \"" + h + "\"\n    keys: [\"*\"]\n"), []string{`client "a/b"`, "name"}},
		{"duplicate client name", client("  - name: a\n    token_sha256: \"" + h + "\"\n    keys: [\"*\"]\n  - name: a\n    token_sha256: \"" + sha("y") + "\"\n    keys: [\"*\"]\n"), []string{`client "a"`, "name", "more than one"}},
		{"short hash", client("  - name: a\n    token_sha256: \"abc\"\n    keys: [\"*\"]\n"), []string{`client "a"`, "token_sha256", "64", "sha256sum"}},
		{"non-hex hash", client("  - name: a\n    token_sha256: \"" + strings.Repeat("z", 64) + "\"\n    keys: [\"*\"]\n"), []string{`client "a"`, "token_sha256", "hex"}},
		{"shared token", client("  - name: a\n    token_sha256: \"" + h + "\"\n    keys: [\"*\"]\n  - name: b\n    token_sha256: \"" + h + "\"\n    keys: [\"*\"]\n"), []string{`client "b"`, "token_sha256", `"a"`}},
		{"no keys", client("  - name: a\n    token_sha256: \"" + h + "\"\n"), []string{`client "a"`, "keys", "empty"}},
		{"bad key glob", client("  - name: a\n    token_sha256: \"" + h + "\"\n    keys: [\"ok:*\", \"bad\\\\\"]\n"), []string{`client "a"`, "keys[1]"}},
		{"empty key glob", client("  - name: a\n    token_sha256: \"" + h + "\"\n    keys: [\"\"]\n"), []string{`client "a"`, "keys[0]", "empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRules([]byte(tt.yaml))
			require.Error(t, err)
			assert.True(t, errors.Is(err, leases.ErrInvalidRules), "wraps ErrInvalidRules: %v", err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestLoadRules(t *testing.T) {
	_, err := LoadRules(filepath.Join(t.TempDir(), "missing.yaml"))
	require.Error(t, err)
	assert.True(t, errors.Is(err, os.ErrNotExist))

	path := writeTemp(t, "rules:\n  - name: r\n    match: \"a\"\n    limit: 0\n    period: 1s\n")
	_, err = LoadRules(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), `rule "r"`)

	for _, ex := range []string{"../examples/rules.yaml", "../examples/rules-auth.yaml"} {
		r, err := LoadRules(ex)
		require.NoError(t, err, ex)
		assert.NotEmpty(t, r.Policy().Rules(), ex)
	}
	r, err := LoadRules("../examples/rules-auth.yaml")
	require.NoError(t, err)
	c := r.authenticate("dev-token-change-me")
	require.NotNil(t, c, "the example's hash is the documented token's")
	assert.Equal(t, "checkout", c.name)
	// checkout may use the keys of both examples, and they have rules.
	for _, key := range []string{"user:42", "api:createURL", "svc:payments", "host:127.0.0.1"} {
		assert.True(t, c.may(key), key)
		_, ok := r.Policy().Match(key)
		assert.True(t, ok, "a rule of rules-auth.yaml matches %s", key)
	}
}

func TestClientMay(t *testing.T) {
	c := &principal{name: "a", keys: []string{"user:*", "api:createURL", `lit\*`}}
	for key, want := range map[string]bool{
		"user:1":        true,
		"user:1/x":      true, // '*' crosses '/'
		"user":          false,
		"api:createURL": true,
		"api:createUR":  false,
		"lit*":          true,
		"litx":          false,
	} {
		assert.Equal(t, want, c.may(key), key)
	}
	assert.True(t, anonymous.may("anything"))
	assert.Equal(t, AnonymousClient, anonymous.name)
}

func TestExposure(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080":     true,
		"127.8.9.10:1":       true,
		"localhost:8080":     true,
		"LOCALHOST:8080":     true,
		"[::1]:8080":         true,
		"::1":                true,
		"127.0.0.1":          true,
		":8080":              false,
		"0.0.0.0:8080":       false,
		"[::]:8080":          false,
		"10.0.0.1:8080":      false,
		"192.168.1.2:80":     false,
		"example.com:8080":   false,
		"localhost.evil:80":  false,
		"":                   false,
		"[fe80::1%eth0]:80":  false,
		"128.0.0.1:8080":     false,
		"::ffff:127.0.0.1":   true,
		"[::ffff:10.0.0.1]:": false,
	} {
		assert.Equal(t, want, isLoopback(addr), addr)
	}

	open, err := ParseRules(nil)
	require.NoError(t, err)
	authed, err := ParseRules([]byte(authRulesYAML()))
	require.NoError(t, err)
	tests := []struct {
		addr     string
		rules    *Rules
		insecure bool
		wantErr  bool
	}{
		{"127.0.0.1:8080", open, false, false},
		{"0.0.0.0:8080", open, false, true},
		{":8080", open, false, true},
		{"0.0.0.0:8080", open, true, false},
		{"0.0.0.0:8080", authed, false, false},
		{"10.1.2.3:8080", authed, true, false},
	}
	for _, tt := range tests {
		err := checkExposure(tt.addr, tt.rules, tt.insecure)
		if !tt.wantErr {
			assert.NoError(t, err, tt.addr)
			continue
		}
		require.Error(t, err, tt.addr)
		assert.ErrorIs(t, err, ErrInsecureListen)
		assert.Contains(t, err.Error(), "clients section")
		assert.Contains(t, err.Error(), "-insecure")
	}
}

func TestNewRefusesExposure(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() })

	_, err := New(Options{Store: store, ListenAddr: "0.0.0.0:8080"})
	require.ErrorIs(t, err, ErrInsecureListen)

	s, err := New(Options{Store: store, ListenAddr: "0.0.0.0:8080", Insecure: true})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s, err = New(Options{Store: store, ListenAddr: "0.0.0.0:8080", RulesPath: writeTemp(t, authRulesYAML())})
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

func TestNewErrors(t *testing.T) {
	_, err := New(Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Store")

	store := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = store.Close() })
	_, err = New(Options{Store: store, RulesPath: filepath.Join(t.TempDir(), "nope.yaml")})
	require.ErrorIs(t, err, os.ErrNotExist)

	path := writeTemp(t, "rules:\n  - name: per-user\n    match: \"user:*\"\n    limit: 10\n    period: 1s\n    burst: -1\n")
	_, err = New(Options{Store: store, RulesPath: path})
	require.ErrorIs(t, err, leases.ErrInvalidRules)
	assert.Contains(t, err.Error(), `rule "per-user"`)
	assert.Contains(t, err.Error(), "burst")
}

func TestParseRulesRuleErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"zero period", "rules:\n- {name: a, match: 'x', limit: 1, period: 0s}", `rule "a": period: is 0s`},
		{"missing period", "rules:\n- {name: a, match: 'x', limit: 1}", `rule "a": period`},
		{"negative limit", "rules:\n- {name: a, match: 'x', limit: -5, period: 1s}", `rule "a": limit: is -5`},
		{"huge limit", "rules:\n- {name: a, match: 'x', limit: 2000000000, period: 1s}", `rule "a": limit`},
		{"negative burst", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s, burst: -1}", `rule "a": burst`},
		{"long ttl", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s, lease_ttl: 2h}", `rule "a": lease_ttl`},
		{"no name", "rules:\n- {match: 'x', limit: 1, period: 1s}", `rule "(match \"x\")": name: is required`},
		{"newline in name", "rules:\n- {name: \"a\\nb\", match: 'x', limit: 1, period: 1s}", `rule "a\nb": name: holds the control character U+000A at byte 1`},
		{"NUL in name", "rules:\n- {name: \"\\0\", match: 'x', limit: 1, period: 1s}", `name: holds the control character U+0000 at byte 0`},
		{"ESC in name", "rules:\n- {name: \"a\\e[2J\", match: 'x', limit: 1, period: 1s}", `name: holds the control character U+001B at byte 1`},
		{"long name", "rules:\n- {name: " + strings.Repeat("a", 129) + ", match: 'x', limit: 1, period: 1s}", `name: is 129 bytes; a rule name is at most 128`},
		{"empty match", "rules:\n- {name: a, match: '', limit: 1, period: 1s}", `rule "a": match: pattern is empty`},
		{"dup name", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s}\n- {name: a, match: 'y', limit: 1, period: 1s}", `rule "a": name: used by more than one rule`},
		{"dup match", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s}\n- {name: b, match: 'x', limit: 1, period: 1s}", `rule "b": match`},
		{"unknown algorithm", "rules:\n- {name: a, match: 'x', algorithm: magic, limit: 1, period: 1s}", `rule "a": algorithm: unknown algorithm "magic"`},
		{"both forms", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s, limits: [{limit: 2, period: 1m}]}", `rule "a": limits: give algorithm`},
		{"bad limit of several", "rules:\n- {name: a, match: 'x', limits: [{limit: 2, period: 1m}, {limit: 0, period: 1h}]}", `rule "a": limits[1].limit: is 0`},
		{"typo in limits", "rules:\n- {name: a, match: 'x', limits: [{limt: 2, period: 1m}]}", "field limt not found"},
		{"bad default", "default: maybe", `default: "maybe" must be allow or deny`},
		{"typo field", "rules:\n- {name: a, match: 'x', limt: 1, period: 1s}", "field limt not found"},
		{"bad duration", "rules:\n- {name: a, match: 'x', limit: 1, period: soon}", "invalid rules"},
		{"not yaml", "rules: [", "invalid rules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRules([]byte(tt.yaml))
			require.Error(t, err)
			assert.ErrorIs(t, err, leases.ErrInvalidRules)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestLoadRulesPolicy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
default: deny
rules:
  - name: per-user
    match: "user:*"
    algorithm: token_bucket
    limit: 100
    period: 1s
    burst: 150
    lease_ttl: 2s
  - name: create-url
    match: "api:createURL"
    limit: 1000
    period: 1m
`), 0o600))
	rules, err := LoadRules(path)
	require.NoError(t, err)
	p := rules.Policy()
	assert.Equal(t, leases.DefaultDeny, p.Default())
	r, ok := p.Match("api:createURL")
	require.True(t, ok)
	assert.Equal(t, time.Minute, r.Limits[0].Period)
	assert.EqualValues(t, 1000, r.Limits[0].Burst)
	r, ok = p.Match("user:9")
	require.True(t, ok)
	assert.EqualValues(t, 150, r.Limits[0].Burst)

	_, err = LoadRules(filepath.Join(dir, "missing.yaml"))
	require.Error(t, err)
	assert.NotErrorIs(t, err, leases.ErrInvalidRules)

	// An empty file is no rules and default allow.
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	rules, err = LoadRules(path)
	require.NoError(t, err)
	assert.Equal(t, leases.DefaultAllow, rules.Policy().Default())
	assert.Empty(t, rules.Policy().Rules())
}

func TestParseRulesSeveralLimits(t *testing.T) {
	rules, err := ParseRules([]byte(`
rules:
  - name: login
    match: "login:*"
    limits:
      - {limit: 3, period: 1m}
      - {limit: 100, period: 1h, burst: 20}
`))
	require.NoError(t, err)
	r, ok := rules.Policy().Match("login:ann")
	require.True(t, ok)
	assert.Equal(t, []leases.Limit{
		{Algorithm: leases.TokenBucket, Limit: 3, Period: time.Minute, Burst: 3},
		{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Hour, Burst: 20},
	}, r.Limits)
}

func TestParseRulesThrottlingModes(t *testing.T) {
	rules, err := ParseRules([]byte(`
rules:
  - {name: soft, match: "s:*", limit: 500, period: 1m, soft: 5%}
  - {name: frac, match: "f:*", limit: 500, period: 1m, soft: 0.1}
  - {name: shadow, match: "x:*", limit: 5, period: 1s, shadow: true}
`))
	require.NoError(t, err)
	r, _ := rules.Policy().Match("s:1")
	assert.InDelta(t, 0.05, r.Soft, 1e-12)
	assert.EqualValues(t, 525, r.Buckets()[0].Limit, "500/min + 5% admits 525")
	r, _ = rules.Policy().Match("f:1")
	assert.InDelta(t, 0.1, r.Soft, 1e-12)
	r, _ = rules.Policy().Match("x:1")
	assert.True(t, r.Shadow)

	for _, tc := range []struct{ yaml, want string }{
		{"rules:\n- {name: a, match: x, limit: 1, period: 1s, soft: lots}", `"lots" is not a percentage`},
		{"rules:\n- {name: a, match: x, limit: 1, period: 1s, soft: -5%}", `rule "a": soft: is -0.05`},
		{"rules:\n- {name: a, match: x, limit: 1, period: 1s, soft: 2000%}", `rule "a": soft: is 20`},
	} {
		_, err := ParseRules([]byte(tc.yaml))
		require.ErrorIs(t, err, leases.ErrInvalidRules, tc.yaml)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// TestParseRulesTypeErrorsNameRuleAndField: a value of the wrong type, or
// an unknown field, is reported with the rule and field, not a line alone.
func TestParseRulesTypeErrorsNameRuleAndField(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"rules:\n- name: a\n  match: x\n  limit: 1\n  period: soon\n", `rule "a": period: cannot unmarshal !!str ` + "`soon`" + ` into time.Duration (line 5)`},
		{"rules:\n- {name: a, match: x, limit: 1, period: 1s}\n- {name: b, match: y, limt: 1, period: 1s}\n", `rule "b": limt: field limt not found`},
		{"rules:\n- name: c\n  match: x\n  limits:\n  - {limit: 1, period: 1s}\n  - {limit: many, period: 1s}\n", `rule "c": limits[1].limit: cannot unmarshal`},
		{"rules:\n- match: x\n  limit: [1]\n", `rule "rules[0]": limit: cannot unmarshal`},
		{"clients:\n- name: svc\n  keys: 5\n", `client "svc": keys: cannot unmarshal`},
	} {
		_, err := ParseRules([]byte(tc.yaml))
		require.ErrorIs(t, err, leases.ErrInvalidRules, tc.yaml)
		assert.Contains(t, err.Error(), tc.want, tc.yaml)
	}
}

// TestParseRulesOneDocument: a rules file is one YAML document. A second
// one that holds anything is refused, naming its line: it was ignored
// without a word, so a file whose clients followed a "---" (two files
// concatenated, say) loaded without them, authentication off; empty
// documents around the one are fine. A reload of such a file keeps the
// rules in force.
func TestParseRulesOneDocument(t *testing.T) {
	clients := strings.TrimPrefix(authRulesYAML(), rulesYAML)
	for _, tt := range []struct {
		name, file string
		line       int // of the second document's content; 0: valid
	}{
		{"clients in a second document", rulesYAML + "---\n" + clients, 16},
		{"garbage in a second document", rulesYAML + "---\ngarbage: [\n", 15},
		{"rules in a second document", "---\n# none yet\n---\n" + rulesYAML, 5},
		{"a third document", rulesYAML + "---\n---\nrules: []\n", 16},
		{"leading marker", "---\n" + rulesYAML, 0},
		{"trailing marker", rulesYAML + "---\n", 0},
		{"trailing end marker", rulesYAML + "...\n", 0},
		{"trailing comment document", rulesYAML + "---\n# the end\n", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRules([]byte(tt.file))
			if tt.line == 0 {
				require.NoError(t, err)
				assert.Len(t, r.Policy().Rules(), 2)
				return
			}
			require.ErrorIs(t, err, leases.ErrInvalidRules)
			assert.Contains(t, err.Error(), "more than one YAML document")
			if tt.name != "garbage in a second document" {
				assert.Contains(t, err.Error(), fmt.Sprintf("line %d", tt.line))
			}
			_, err = ReadRulesFile([]byte(tt.file))
			require.ErrorIs(t, err, leases.ErrInvalidRules, "the CLI's rules apply refuses it too")
		})
	}

	f := newFixture(t, authRulesYAML(), nil, Options{ReloadInterval: -1})
	require.NoError(t, os.WriteFile(f.path, []byte(rulesYAML+"---\n"+clients), 0o600))
	require.ErrorIs(t, f.srv.Reload(), leases.ErrInvalidRules)
	assert.Equal(t, []string{"alpha", "beta"}, f.srv.Rules().Clients(), "the rules in force are kept")
	assert.Equal(t, http.StatusUnauthorized, f.do(http.MethodGet, protocol.PathRules, "", "", nil).status, "authentication stays on")
}
