package keytemplate_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/protocol"
)

// rawValues are {ip} values as the middlewares make them: canonical
// addresses and prefixes, never chosen by the caller.
var rawValues = []string{"192.0.2.1", "192.0.2.0/24", "2001:db8::/64", "2001:db8::1", "::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}

// FuzzParse feeds arbitrary template sources to Parse, with a resolver of
// a raw part ({ip}) and escaped ones ({user}, {md:name}), and fills what
// parses with two sets of values, distinct or not. Parse must never
// panic; a template it accepts must be its source again, segment by
// segment, with literal text that is printable UTF-8 without a brace or
// '%', and no two parts touching. Its keys must be valid keys of at most
// protocol.MaxKeyBytes for any values, and distinct values must make
// distinct keys (each value is escaped or hashed, and the separators keep
// the parts apart): no caller reaches another's bucket. Expand reports a
// missing part as a *MissingPartError naming it.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"user:{user}", "ip:{ip}", "u:{user}|ip:{ip}|k:{md:X-Key}", "{user}:{md:k}", "{user}|{ip}", "{ip}|{ip}",
		"static", "", "{", "}", "{}", "{nope}", "a{", "{user}{ip}", "{user}:{ip}", "{user}x{md:k}", "100%:{user}",
		"x\x01:{user}", "\xff:{user}", "{ip}1|{user}", "a:{ip}|{user}:x", "{user}|" + strings.Repeat("x", 200),
		strings.Repeat("{user}:", 5) + "{user}", "{md:}", "{md:a:b}", "{ip}|:{user}",
	} {
		f.Add(s, "alice", "bob", "a|b:c", "%41", uint8(0), uint8(1))
	}
	f.Add("u:{user}|k:{md:k}", strings.Repeat("é", 200), "x", strings.Repeat("é", 199)+"e", "x", uint8(2), uint8(2))
	f.Fuzz(func(t *testing.T, src, a1, a2, b1, b2 string, ipA, ipB uint8) {
		tm, err := keytemplate.Parse(src, resolve)
		if err != nil {
			if tm != nil || err.Error() == "" {
				t.Fatalf("Parse(%q) = %v, %v", src, tm, err)
			}
			return
		}
		if tm.String() != src {
			t.Fatalf("Parse(%q).String() = %q", src, tm.String())
		}
		var back strings.Builder
		parts := 0
		for i, s := range tm.Segments() {
			if !s.IsPart() {
				if s.Text == "" || strings.ContainsAny(s.Text, "{}%") || !utf8.ValidString(s.Text) || strings.ContainsFunc(s.Text, func(r rune) bool { return !unicode.IsPrint(r) }) {
					t.Fatalf("Parse(%q): literal %q", src, s.Text)
				}
				back.WriteString(s.Text)
				continue
			}
			parts++
			if i > 0 && tm.Segments()[i-1].IsPart() {
				t.Fatalf("Parse(%q): parts %s and %s touch", src, tm.Segments()[i-1].Written, s.Written)
			}
			back.WriteString(s.Written)
		}
		if back.String() != src || parts != tm.Parts() {
			t.Fatalf("Parse(%q): the segments are %q, %d parts of %d", src, back.String(), parts, tm.Parts())
		}

		// Fill: escaped parts alternate between the two values given, raw
		// parts get an address.
		fill := func(x, y string, ip uint8) []string {
			var vals []string
			for _, s := range tm.Segments() {
				switch {
				case !s.IsPart():
				case s.Raw:
					vals = append(vals, rawValues[int(ip)%len(rawValues)])
					ip /= 3
				default:
					vals = append(vals, x)
					x, y = y, x
				}
			}
			return vals
		}
		for _, v := range []string{a1, a2, b1, b2} {
			if v == "" {
				return // an empty value is a missing part: no key is made
			}
		}
		va, vb := fill(a1, a2, ipA), fill(b1, b2, ipB)
		ka, kb := tm.Build(va), tm.Build(vb)
		for _, k := range []string{ka, kb} {
			if err := protocol.ValidateKey(k); err != nil {
				t.Fatalf("template %q: key %q: %v", src, k, err)
			}
		}
		if ka == kb && !slices.Equal(va, vb) {
			t.Fatalf("template %q: values %q and %q share the key %q", src, va, vb, ka)
		}
		i := 0
		k, err := tm.Expand(func(keytemplate.Segment) (string, bool) { i++; return va[i-1], true })
		if err != nil || k != ka {
			t.Fatalf("template %q: Expand = %q, %v; Build = %q", src, k, err, ka)
		}
		if tm.Parts() > 0 {
			_, err := tm.Expand(func(keytemplate.Segment) (string, bool) { return "", false })
			var mp *keytemplate.MissingPartError
			if !errors.As(err, &mp) || !mp.Segment.IsPart() || mp.Template != src {
				t.Fatalf("template %q: a missing part gives %v", src, err)
			}
		}
	})
}

// FuzzParseNodeAddr feeds arbitrary forwarded entries and peer addresses
// to ParseNodeAddr and ParsePeer: neither may panic, and what they take is
// a valid, normalized address (no zone, IPv4 not mapped). Every address,
// as X-Forwarded-For and Forwarded write it (bare, bracketed, with a
// port), parses as itself, normalized.
func FuzzParseNodeAddr(f *testing.F) {
	for _, s := range []string{"192.0.2.1", "192.0.2.1:80", "2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:80", "[192.0.2.1]",
		"::ffff:192.0.2.1", "[::ffff:192.0.2.1]:443", "fe80::1%eth0", "[fe80::1%eth0]:80", "[", "]", "[]", "[::1", "[::1]x",
		"[::1]:", "[::1]:99999", "192.0.2.1:", "unknown", "_hidden", "", "1.2.3.4.5", "01.2.3.4"} {
		f.Add(s, []byte{192, 0, 2, 1}, uint16(80))
	}
	f.Fuzz(func(t *testing.T, s string, raw []byte, port uint16) {
		for name, parse := range map[string]func(string) (netip.Addr, bool){"ParseNodeAddr": keytemplate.ParseNodeAddr, "ParsePeer": keytemplate.ParsePeer} {
			if a, ok := parse(s); ok && (!a.IsValid() || a != keytemplate.NormalizeAddr(a) || a.Zone() != "" || a.Is4In6()) {
				t.Fatalf("%s(%q) = %v", name, s, a)
			}
		}
		a, ok := netip.AddrFromSlice(raw)
		if !ok {
			return
		}
		want := keytemplate.NormalizeAddr(a)
		forms := []string{a.String(), netip.AddrPortFrom(a, port).String()}
		if a.Is6() {
			forms = append(forms, "["+a.String()+"]")
		}
		for _, form := range forms {
			if got, ok := keytemplate.ParseNodeAddr(form); !ok || got != want {
				t.Fatalf("ParseNodeAddr(%q) = %v, %v; want %v", form, got, ok, want)
			}
		}
		if got, ok := keytemplate.ParsePeer(netip.AddrPortFrom(a, port).String()); !ok || got != want {
			t.Fatalf("ParsePeer of %v port %d = %v, %v", a, port, got, ok)
		}
	})
}
