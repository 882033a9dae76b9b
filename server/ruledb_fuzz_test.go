package server

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// FuzzStoredItem feeds arbitrary hash values and field names to the rule
// database's reading, as a corrupt or lying Redis could return them: a
// rule, a client, the settings or an override. Reading must never panic;
// an item that is not "<version>|<JSON>" is an error, and a version is the
// number before the '|'. An item read must either be refused by
// validation (an error wrapping leases.ErrInvalidRules) or compile to
// rules within their documented bounds (checkPolicy): never a negative
// limit, a zero period, a name that is not UTF-8, holds a control
// character or is longer than leases.MaxRuleNameBytes. An override must be
// refused or be a rule within the same bounds that matches its key and
// no other.
func FuzzStoredItem(f *testing.F) {
	h := sha("t")
	for _, s := range []struct{ name, v string }{
		{"r", `3|{"name":"r","match":"a:*","limit":10,"period":"1s"}`},
		{"r", `3|{"match":"a:*","limits":[{"limit":3,"period":"1m","algorithm":"sliding_window_log"},{"limit":100,"period":"1h"}]}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"1s","burst":20,"lease_ttl":"1h","soft":0.05,"shadow":true,"reserve":{"critical":0.2}}`},
		{"r", `3|{"match":"a:*","limit":-1,"period":"1s"}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"0s"}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"-1s"}`},
		{"r", `3|{"match":"a:*","limit":10}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"1s","lease_ttl":"-1ms"}`},
		{"r", `3|{"match":"a:*","limit":99999999999999999999,"period":"1s"}`},
		{"r", `3|{"match":"a:*","limit":1e3,"period":"1s"}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"9223372036854775807ns"}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"1s","soft":1e309}`},
		{"r", `3|{"match":"a:*","limit":10,"period":"1s","reserve":{"critical":-0.5,"nope":2}}`},
		{"\xff", `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{"", `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{"a\nb", `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{"\x00", `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{"\x1b[2J\u0085", `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{strings.Repeat("n", leases.MaxRuleNameBytes), `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{strings.Repeat("n", leases.MaxRuleNameBytes+1), `3|{"match":"a:*","limit":10,"period":"1s"}`},
		{"r", "3|{\"match\":\"a:\xff*\",\"limit\":10,\"period\":\"1s\"}"},
		{"r", `3|{"match":"a:\ud800*","limit":10,"period":"1s"}`},
		{"c", `3|{"token_sha256":"` + h + `","keys":["*"]}`},
		{"c", `3|{"token_sha256":"` + h + `","keys":[],"admin":true}`},
		{"c d", `3|{"token_sha256":"` + h + `","keys":["*"]}`},
		{"user:1", `3|{"limit":5,"period":"1s"}`},
		{"user:*", `3|{"limit":5,"period":"1s"}`},
		{"user:\\", `3|{"limits":[{"limit":5,"period":"1s"}]}`},
		{"user:1", `3|{"default":"deny"}`},
		{"user:1", `3|{"default":"maybe"}`},
		{"r", `3|null`},
		{"r", `3|`},
		{"r", `3`},
		{"r", `|{}`},
		{"r", `-3|{}`},
		{"r", `+3|{}`},
		{"r", `99999999999999999999|{}`},
		{"r", `3|{} {}`},
		{"r", `3|[]`},
		{"r", `-5|{}`}, // a negative version: refused (it was served as an ETag If-Match refused)
		{"r", `3|"x"`},
	} {
		f.Add(s.name, s.v)
	}
	f.Fuzz(func(t *testing.T, name, v string) {
		checkVersion := func(version int64) {
			t.Helper()
			num, _, _ := strings.Cut(v, "|")
			if want, err := strconv.ParseInt(num, 10, 64); err != nil || want != version || version < 0 {
				t.Fatalf("item %q read with version %d", v, version)
			}
		}
		checkCompiled := func(what string, s *ruleSetSnapshot) {
			t.Helper()
			r, err := s.compile()
			if err != nil {
				if !errors.Is(err, leases.ErrInvalidRules) {
					t.Fatalf("%s %q = %q: error %v does not wrap ErrInvalidRules", what, name, v, err)
				}
				return
			}
			checkPolicy(t, r)
		}

		var rule protocol.AdminRule
		if err := decodeItem(v, &rule, &rule.Version); err == nil {
			checkVersion(rule.Version)
			rule.Name = name
			checkCompiled("rule", &ruleSetSnapshot{rules: []protocol.AdminRule{rule}})
		}
		var c protocol.AdminClient
		if err := decodeItem(v, &c, &c.Version); err == nil {
			checkVersion(c.Version)
			c.Name = name
			checkCompiled("client", &ruleSetSnapshot{clients: []protocol.AdminClient{c}})
		}
		var st protocol.AdminSettings
		if err := decodeItem(v, &st, &st.Version); err == nil {
			checkVersion(st.Version)
			checkCompiled("settings", &ruleSetSnapshot{settings: st})
		}
		var o protocol.AdminOverride
		if err := decodeItem(v, &o, &o.Version); err != nil {
			if err.Error() == "" {
				t.Fatalf("item %q: empty error", v)
			}
			return
		}
		checkVersion(o.Version)
		o.Key = name
		r, err := overrideRule(&o)
		if err != nil {
			if !errors.Is(err, leases.ErrInvalidRules) {
				t.Fatalf("override of %q = %q: error %v does not wrap ErrInvalidRules", name, v, err)
			}
			return
		}
		if err := protocol.ValidateKey(name); err != nil {
			t.Fatalf("override of invalid key %q accepted: %v", name, err)
		}
		if r.Name != leases.OverrideRuleName {
			t.Fatalf("override rule named %q", r.Name)
		}
		// Compiled as a policy's rule (renamed: a policy's rule may not
		// take the overrides' name), to check what it matches.
		asRule := *r
		asRule.Name = "as-a-rule"
		p, err := leases.NewPolicy(leases.RuleSet{Default: leases.DefaultDeny, Rules: []leases.Rule{asRule}})
		if err != nil {
			t.Fatalf("override rule %+v does not compile: %v", r, err)
		}
		checkPolicy(t, &Rules{policy: p})
		if got, ok := p.Match(name); !ok || got.Match != r.Match {
			t.Fatalf("override of %q does not match its key", name)
		}
		for _, other := range []string{name + "x", "x" + name, name[:len(name)-1]} {
			if _, ok := p.Match(other); ok && other != name {
				t.Fatalf("override of %q matches %q", name, other)
			}
		}
	})
}

// FuzzParseDuration feeds arbitrary wire durations (admin API bodies, rule
// database items) to parseDuration: it must never panic, must refuse what
// time.ParseDuration refuses with an error that quotes it, and what it
// accepts must be written back by formatDuration (GET /v1/rules, the
// admin API, the CLI) as text that parses to the same duration.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"", "0", "0s", "1s", "1m", "1h", "1m30s", "1h0m0s", "1.5h", "-1s", "-0", "+2ms",
		"1ns", "1us", "1µs", "1μs", ".5s", "5.s", "2562047h47m16.854775807s", "2562047h47m16.854775808s",
		"-2562047h47m16.854775808s", "9223372036854775807ns", "1e3s", "1", "s", "1d", "1s ", " 1s", "1h-1m", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDuration(s)
		want, wantErr := time.ParseDuration(s)
		switch {
		case s == "":
			if err != nil || d != 0 {
				t.Fatalf("parseDuration(\"\") = %v, %v; want 0", d, err)
			}
			return
		case err != nil:
			if wantErr == nil {
				t.Fatalf("parseDuration(%q) refuses what time.ParseDuration takes: %v", s, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("parseDuration(%q): error %q does not quote the input", s, err)
			}
			return
		case wantErr != nil || d != want:
			t.Fatalf("parseDuration(%q) = %v; time.ParseDuration: %v, %v", s, d, want, wantErr)
		}
		text := formatDuration(d)
		back, err := parseDuration(text)
		if err != nil || back != d {
			t.Fatalf("%q parses to %v, written %q, which parses to %v, %v", s, d, text, back, err)
		}
	})
}
