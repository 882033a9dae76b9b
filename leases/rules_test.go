package leases

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, key string
		want         bool
	}{
		{"user:*", "user:42", true},
		{"user:*", "user:", true},
		{"user:*", "user", false},
		{"user:*", "xuser:1", false},
		{"*", "", true},
		{"*", "anything/with/slashes", true},
		{"api:createURL", "api:createURL", true},
		{"api:createURL", "api:createURLx", false},
		{"user:?", "user:7", true},
		{"user:?", "user:42", false},
		{"user:?", "user:日", true},
		{"*|api:*", "user:42|api:search", true},
		{"*|api:*", "user:42|svc:x", false},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"a**", "a", true},
		{`lit\*`, "lit*", true},
		{`lit\*`, "litX", false},
		{`q\?`, "q?", true},
		{"*x", strings.Repeat("a", 256), false},
		{"*a*a*a*a*b", strings.Repeat("a", 256), false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, globMatch(tt.pattern, tt.key), "%q ~ %q", tt.pattern, tt.key)
	}
}

func TestValidGlob(t *testing.T) {
	require.NoError(t, validGlob("user:*"))
	require.Error(t, validGlob(""))
	require.Error(t, validGlob(`trailing\`))
	require.Error(t, validGlob("bad\xffutf8"))
}

func TestPolicyMatchMostSpecific(t *testing.T) {
	p, err := NewPolicy(RuleSet{Rules: []Rule{
		{Name: "all", Match: "*", Limit: 1, Period: time.Second},
		{Name: "users", Match: "user:*", Limit: 2, Period: time.Second},
		{Name: "vip", Match: "user:4?", Limit: 3, Period: time.Second},
		{Name: "one", Match: "user:42", Limit: 4, Period: time.Second},
		{Name: "pair", Match: "user:*|api:*", Limit: 5, Period: time.Second},
	}})
	require.NoError(t, err)
	for key, want := range map[string]string{
		"user:42":            "one",
		"user:43":            "vip",
		"user:430":           "users",
		"user:1":             "users",
		"svc:x":              "all",
		"user:1|api:search":  "pair",
		"user:42|api:search": "pair",
	} {
		r, ok := p.Match(key)
		require.True(t, ok, key)
		assert.Equal(t, want, r.Name, key)
	}
	assert.Equal(t, DefaultAllow, p.Default())
}

func TestPolicyNoMatch(t *testing.T) {
	p, err := NewPolicy(RuleSet{Default: DefaultDeny, Rules: []Rule{{Name: "u", Match: "user:*", Limit: 1, Period: time.Second}}})
	require.NoError(t, err)
	_, ok := p.Match("svc:x")
	assert.False(t, ok)
	assert.Equal(t, DefaultDeny, p.Default())
}

func TestRuleDefaults(t *testing.T) {
	p, err := NewPolicy(RuleSet{Rules: []Rule{{Name: "u", Match: "user:*", Limit: 100, Period: time.Second}}})
	require.NoError(t, err)
	r := p.Rules()[0]
	assert.Equal(t, TokenBucket, r.Algorithm)
	assert.EqualValues(t, 100, r.Burst, "burst defaults to limit")
	assert.Equal(t, DefaultLeaseTTL, r.LeaseTTL)
	assert.InDelta(t, 100.0, r.Rate(), 1e-12)
}

func TestParseRuleSetErrors(t *testing.T) {
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
		{"empty match", "rules:\n- {name: a, match: '', limit: 1, period: 1s}", `rule "a": match: pattern is empty`},
		{"dup name", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s}\n- {name: a, match: 'y', limit: 1, period: 1s}", `rule "a": name: used by more than one rule`},
		{"dup match", "rules:\n- {name: a, match: 'x', limit: 1, period: 1s}\n- {name: b, match: 'x', limit: 1, period: 1s}", `rule "b": match`},
		{"unknown algorithm", "rules:\n- {name: a, match: 'x', algorithm: magic, limit: 1, period: 1s}", `rule "a": algorithm: unknown algorithm "magic"`},
		{"not implemented", "rules:\n- {name: a, match: 'x', algorithm: sliding_window_log, limit: 1, period: 1s}", "not implemented yet"},
		{"bad default", "default: maybe", `default: "maybe" must be allow or deny`},
		{"typo field", "rules:\n- {name: a, match: 'x', limt: 1, period: 1s}", "field limt not found"},
		{"bad duration", "rules:\n- {name: a, match: 'x', limit: 1, period: soon}", "invalid rules"},
		{"not yaml", "rules: [", "invalid rules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := ParseRuleSet([]byte(tt.yaml))
			if err == nil {
				_, err = NewPolicy(rs)
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidRules)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	_, err := NewPolicy(RuleSet{Rules: []Rule{{Name: "a", Match: "x", Algorithm: FixedWindow, Limit: 1, Period: time.Second}}})
	assert.True(t, errors.Is(err, ErrAlgorithmNotImplemented))
}

func TestLoadPolicy(t *testing.T) {
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
	p, err := LoadPolicy(path)
	require.NoError(t, err)
	assert.Equal(t, DefaultDeny, p.Default())
	r, ok := p.Match("api:createURL")
	require.True(t, ok)
	assert.Equal(t, time.Minute, r.Period)
	assert.EqualValues(t, 1000, r.Burst)
	r, ok = p.Match("user:9")
	require.True(t, ok)
	assert.EqualValues(t, 150, r.Burst)

	_, err = LoadPolicy(filepath.Join(dir, "missing.yaml"))
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrInvalidRules)

	// An empty file is no rules and default allow.
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	p, err = LoadPolicy(path)
	require.NoError(t, err)
	assert.Equal(t, DefaultAllow, p.Default())
	assert.Empty(t, p.Rules())
}

func FuzzGlobMatch(f *testing.F) {
	f.Add("user:*", "user:42")
	f.Add("*a*?b", "xxaYb")
	f.Add(`\*?*`, "*日x")
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if validGlob(pattern) != nil {
			return
		}
		got := globMatch(pattern, key)
		if lit, ok := isLiteralGlob(pattern); ok && got != (lit == key) {
			t.Fatalf("literal %q vs %q: %v", pattern, key, got)
		}
		if pattern == "*" && !got {
			t.Fatalf("* must match %q", key)
		}
	})
}
