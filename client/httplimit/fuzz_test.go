package httplimit

import (
	"strings"
	"testing"

	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/protocol"
)

// fill returns a value per part of t: {ip} a canonical address (the
// middleware makes it, never the caller), the others v, with i appended to
// tell parts apart.
func fill(t *keytemplate.Template, v string) []string {
	var vals []string
	for _, s := range t.Segments() {
		switch partKind(s.Kind) {
		case partLiteral:
		case partIP:
			vals = append(vals, "2001:db8::/64")
		default:
			vals = append(vals, v)
		}
	}
	return vals
}

// FuzzTemplate: any template either fails to parse or makes valid keys for
// any values, without panicking; distinct values make distinct keys.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"user:{user}", "ip:{ip}", "user:{user}|api:{method}:{route}", "key:{header:X-API-Key}", "{user}", "a{", "}", "{ip}|{ip}", "x:{header:}"} {
		f.Add(s, "1|api:x", "1")
	}
	f.Add("user:{user}", strings.Repeat("a", 300)+"1", strings.Repeat("a", 300)+"2")
	f.Add("u:{user}|k:{header:K}", "\xff\x00:", "%FF%00%3A")
	f.Fuzz(func(t *testing.T, src, a, b string) {
		tm, err := keytemplate.Parse(src, resolvePart)
		if err != nil || a == "" || b == "" {
			return // an empty value is a missing part: no key is made
		}
		ka := tm.Build(fill(tm, a))
		kb := tm.Build(fill(tm, b))
		for _, k := range []string{ka, kb} {
			if err := protocol.ValidateKey(k); err != nil {
				t.Fatalf("template %q: key %q: %v", src, k, err)
			}
		}
		if a != b && tm.Parts() > 0 && hasFreePart(tm) && ka == kb {
			t.Fatalf("template %q: values %q and %q share key %q", src, a, b, ka)
		}
	})
}

func hasFreePart(t *keytemplate.Template) bool {
	for _, s := range t.Segments() {
		if k := partKind(s.Kind); k != partLiteral && k != partIP {
			return true
		}
	}
	return false
}

// FuzzEscape: two parts, filled independently: distinct pairs make
// distinct keys, and every key is valid.
func FuzzEscape(f *testing.F) {
	f.Add("1|api:x", "y", "1", "api:x|y")
	f.Add("", "", "a", "b")
	f.Add(strings.Repeat("é", 200), "x", strings.Repeat("é", 199)+"e", "x")
	tm, err := keytemplate.Parse("user:{user}|api:{header:X}", resolvePart)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a1, b1, a2, b2 string) {
		k1 := tm.Build([]string{a1, b1})
		k2 := tm.Build([]string{a2, b2})
		if err := protocol.ValidateKey(k1); err != nil {
			t.Fatalf("key %q: %v", k1, err)
		}
		if (a1 != a2 || b1 != b2) && k1 == k2 {
			t.Fatalf("(%q, %q) and (%q, %q) share key %q", a1, b1, a2, b2, k1)
		}
		if e := keytemplate.Escape(a1); strings.ContainsAny(e, ":|{}") {
			t.Fatalf("escape(%q) = %q holds a separator", a1, e)
		}
	})
}
