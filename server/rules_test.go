package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
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
	c := &client{name: "a", keys: []string{"user:*", "api:createURL", `lit\*`}}
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
