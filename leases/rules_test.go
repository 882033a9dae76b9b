package leases

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/protocol"
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
	require.Len(t, r.Limits, 1)
	l := r.Limits[0]
	assert.Equal(t, TokenBucket, l.Algorithm)
	assert.EqualValues(t, 100, l.Burst, "burst defaults to limit")
	assert.Equal(t, DefaultLeaseTTL, r.LeaseTTL)
	assert.InDelta(t, 100.0, l.Rate(), 1e-12)
}

func TestPolicyErrors(t *testing.T) {
	sec := time.Second
	tests := []struct {
		name string
		rs   RuleSet
		want string
	}{
		{"zero period", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1}}}, `rule "a": period: is 0s`},
		{"negative limit", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: -5, Period: sec}}}, `rule "a": limit: is -5`},
		{"negative burst", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Burst: -1}}}, `rule "a": burst`},
		{"long ttl", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, LeaseTTL: 2 * time.Hour}}}, `rule "a": lease_ttl`},
		{"no name", RuleSet{Rules: []Rule{{Match: "x", Limit: 1, Period: sec}}}, `rule "(match \"x\")": name: is required`},
		{"override's name", RuleSet{Rules: []Rule{{Name: OverrideRuleName, Match: "x", Limit: 1, Period: sec}}}, `rule "override": name: is the name of per-key overrides`},
		{"dup name", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec}, {Name: "a", Match: "y", Limit: 1, Period: sec}}}, `rule "a": name: used by more than one rule`},
		{"unknown algorithm", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Algorithm: "magic", Limit: 1, Period: sec}}}, `rule "a": algorithm: unknown algorithm "magic"`},
		{"bad default", RuleSet{Default: "maybe"}, `default: "maybe" must be allow or deny`},
		{"both forms", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Limits: []Limit{{Limit: 1, Period: sec}}}}}, `rule "a": limits: give algorithm`},
		{"bad second limit", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limits: []Limit{{Limit: 1, Period: sec}, {Limit: 1}}}}}, `rule "a": limits[1].period: is 0s`},
		{"too many limits", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limits: make([]Limit, MaxLimitsPerRule+1)}}}, `rule "a": limits: has 9 limits`},
		{"unknown class", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Reserve: map[string]float64{"urgent": 0.1}}}}, `rule "a": reserve: names "urgent", which is not a priority class`},
		{"empty class", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Reserve: map[string]float64{"": 0.1}}}}, `rule "a": reserve: names ""`},
		{"share above 100%", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Reserve: map[string]float64{"critical": 1.5}}}}, `rule "a": reserve.critical: is 1.5 (150%)`},
		{"negative share", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Reserve: map[string]float64{"high": -0.1}}}}, `rule "a": reserve.high: is -0.1`},
		{"sum 100%", RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 1, Period: sec, Reserve: map[string]float64{"critical": 0.6, "high": 0.4}}}}, `rule "a": reserve: shares sum to 100%`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPolicy(tt.rs)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidRules)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestRuleName is the regression test of two findings about rule names.
// FuzzStoredItem found a name that is not UTF-8 (the rule database took one
// from a percent-encoded admin path, and every decision on the rule's keys
// then panicked labelling its metrics). A later fuzz pass left a name with
// a control character (a newline, a NUL, ESC, DEL, the C1 controls) or of
// any length, where a name labels metrics, goes into logs and names an
// admin API path; an invisible format character (a zero-width space, a
// bidirectional override) makes two rules look alike there. Validation
// refuses such names, naming the fault without
// echoing a long name whole, and only such names: one of MaxRuleNameBytes
// is taken.
func TestRuleName(t *testing.T) {
	tests := []struct {
		name string
		rule string
		want string // in the error; "" when valid
	}{
		{"ascii", "per-user", ""},
		{"non-ascii", "日本-ü", ""},
		{"printable", "per-user: ok é", ""},
		{"replacement character sent as such", "\uFFFD", ""},
		{"longest", strings.Repeat("é", MaxRuleNameBytes/2), ""},
		{"invalid byte", "a\xff", "name: is not valid UTF-8"},
		{"truncated sequence", "a\xe50\x7f", "name: is not valid UTF-8"},
		{"overlong", "\xc0\xaf", "name: is not valid UTF-8"},
		{"utf-8 encoded surrogate", "\xed\xa0\x80", "name: is not valid UTF-8"},
		{"beyond U+10FFFF", "\xf4\x90\x80\x80", "name: is not valid UTF-8"},
		{"newline", "a\nb", `rule "a\nb": name: holds the control character U+000A at byte 1`},
		{"carriage return", "a\r", "U+000D at byte 1"},
		{"NUL", "\x00", "U+0000 at byte 0"},
		{"tab", "a\tb", "U+0009 at byte 1"},
		{"ESC", "red\x1b[31m", "U+001B at byte 3"},
		{"DEL", "a\x7f", "U+007F at byte 1"},
		{"C1 control", "é\u0085", "U+0085 at byte 2"},
		{"zero-width space", "api\u200b", "name: holds the invisible format character U+200B at byte 3"},
		{"right-to-left override", "a\u202eb", "U+202E at byte 1"},
		{"byte order mark", "\ufeffa", "U+FEFF at byte 0"},
		{"soft hyphen", "a\u00adb", "U+00AD at byte 1"},
		{"zero-width joiner", "a\u200db", "U+200D at byte 1"},
		{"one byte too long", strings.Repeat("a", MaxRuleNameBytes+1), "name: is 129 bytes; a rule name is at most 128"},
		{"far too long", strings.Repeat("\n", 1<<20), "name: is 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPolicy(RuleSet{Rules: []Rule{{Name: tt.rule, Match: "x:*", Limit: 1, Period: time.Second}}})
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidRules)
			assert.Contains(t, err.Error(), tt.want)
			assert.Less(t, len(err.Error()), 400, "the error does not echo a long name whole")
			_, err = NewOverrideRule("k", Rule{Name: tt.rule, Limit: 1, Period: time.Second})
			assert.NoError(t, err, "an override's name is always OverrideRuleName")
		})
	}
}

func TestRuleSeveralLimits(t *testing.T) {
	p, err := NewPolicy(RuleSet{Rules: []Rule{{Name: "login", Match: "login:*", Limits: []Limit{
		{Limit: 3, Period: time.Minute},
		{Limit: 100, Period: time.Hour, Burst: 20},
	}}}})
	require.NoError(t, err)
	r, ok := p.Match("login:ann")
	require.True(t, ok)
	require.Len(t, r.Limits, 2)
	assert.Equal(t, Limit{Algorithm: TokenBucket, Limit: 3, Period: time.Minute, Burst: 3}, r.Limits[0])
	assert.Equal(t, Limit{Algorithm: TokenBucket, Limit: 100, Period: time.Hour, Burst: 20}, r.Limits[1])
	assert.Equal(t, 1, r.Binding(), "100/h is the lower rate")
	assert.Zero(t, r.Limit, "compiled rules carry their limits in Limits only")
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

func TestPolicyAlgorithms(t *testing.T) {
	// A known algorithm not implemented yet is refused as such.
	for _, a := range knownAlgorithms {
		if Implemented(a) {
			continue
		}
		_, err := NewPolicy(RuleSet{Rules: []Rule{{Name: "a", Match: "x", Algorithm: a, Limit: 1, Period: time.Second}}})
		assert.True(t, errors.Is(err, ErrAlgorithmNotImplemented), a)
	}
	// The windows have no burst: it must be left out or equal the limit.
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter, SlidingWindowLog} {
		_, err := NewPolicy(RuleSet{Rules: []Rule{{Name: "a", Match: "x", Algorithm: a, Limit: 10, Period: time.Second}}})
		require.NoError(t, err, a)
		_, err = NewPolicy(RuleSet{Rules: []Rule{{Name: "a", Match: "x", Algorithm: a, Limit: 10, Burst: 10, Period: time.Second}}})
		require.NoError(t, err, a)
		_, err = NewPolicy(RuleSet{Rules: []Rule{{Name: "a", Match: "x", Algorithm: a, Limit: 10, Burst: 20, Period: time.Second}}})
		require.ErrorIs(t, err, ErrInvalidRules, a)
		assert.Contains(t, err.Error(), "burst: is 20", a)
	}
}

func TestRuleFloor(t *testing.T) {
	r := Rule{Reserve: map[string]float64{"critical": 0.2, "high": 0.1}}
	tests := []struct {
		class    string
		capacity int64
		want     int64
	}{
		{"critical", 100, 0},
		{"high", 100, 20},
		{"normal", 100, 30},
		{"", 100, 30},
		{"low", 100, 30},
		{"bogus", 100, 30}, // an unknown class counts as normal
		{"high", 7, 2},     // ⌈1.4⌉
		{"low", 7, 3},      // ⌈2.1⌉
		{"low", 1, 1},
		{"critical", 1, 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.class, tt.capacity), func(t *testing.T) {
			assert.Equal(t, tt.want, r.Floor(tt.class, tt.capacity))
		})
	}
	assert.Zero(t, (&Rule{}).Floor("low", 100), "no reserve, no floor")
	lowOnly := Rule{Reserve: map[string]float64{"low": 0.5}}
	assert.Zero(t, lowOnly.Floor("low", 100), "a class's own reserve is not kept from it")
	p, err := NewPolicy(RuleSet{Rules: []Rule{{Name: "a", Match: "x", Limit: 10, Period: time.Second, Reserve: map[string]float64{"critical": 0.25, "normal": 0}}}})
	require.NoError(t, err)
	got := p.Rules()[0]
	assert.Equal(t, map[string]float64{"critical": 0.25, "normal": 0}, got.Reserve)
}

// TestRuleFillTime (found by the invariant review of the bounds on input):
// a token bucket that takes more than MaxFillTime to refill its burst, or
// a leaky bucket its queue, is refused. Validation took any burst at any
// rate above 10^-6 a second: 1 per day and a burst of 10^9 refill in 2.7
// million years, whose µs overflow an int64. The memory store then
// computed a wait of 0 for a deferral of 2×10^8 tokens on an empty bucket
// (1.2×10^9 admitted at one instant, the bound 10^9) and the Redis store
// failed every call on the key after writing half its state (a PEXPIRE
// out of range); a leaky bucket's slice end overflowed into its lease's
// record, which no later call could parse.
func TestRuleFillTime(t *testing.T) {
	day := 24 * time.Hour
	maxDays := int64(MaxFillTime / day) // 36,500
	tests := []struct {
		name string
		rule Rule
		want string // empty: valid
	}{
		{"token bucket of a billion at one a day", Rule{Limit: 1, Period: day, Burst: 1_000_000_000}, "burst: is 1000000000: at 1 per 24h0m0s it takes 2.74e+06 years to refill the bucket; at most 100 years"},
		{"leaky bucket of a billion at one a day", Rule{Algorithm: LeakyBucket, Limit: 1, Period: day, Burst: 1_000_000_000}, "to drain the queue"},
		{"a burst one token beyond", Rule{Limit: 1, Period: day, Burst: maxDays + 1}, "a burst of 36500 at this rate"},
		{"the longest refill", Rule{Limit: 1, Period: day, Burst: maxDays}, ""},
		{"the longest queue", Rule{Algorithm: LeakyBucket, Limit: 1, Period: day, Burst: maxDays}, ""},
		{"a second limit", Rule{Limits: []Limit{{Limit: 10, Period: time.Second}, {Limit: 1, Period: day, Burst: maxDays + 1}}}, "limits[1].burst"},
		{"soft raises the burst beyond", Rule{Limit: 1, Period: day, Burst: maxDays, Soft: 0.5}, "soft: raises limits[0]'s burst to 54750"},
		{"a window has no burst", Rule{Algorithm: FixedWindow, Limit: protocol.MaxCount, Period: day}, ""},
		{"the fastest rate", Rule{Limit: protocol.MaxCount, Period: time.Millisecond, Burst: protocol.MaxCount}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.rule.Name, tt.rule.Match = "r", "k:*"
			_, err := NewPolicy(RuleSet{Rules: []Rule{tt.rule}})
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidRules)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
