package server

import (
	"testing"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// FuzzShortestCommonKey feeds arbitrary pairs of patterns, and a key, to
// shortestCommonKey (GET /v1/rules decides with it which rules a client's
// key patterns reach). It promises the length in bytes of the shortest
// valid key (protocol.ValidateKey: 1 to MaxKeyBytes bytes of UTF-8 without
// control characters) that matches both patterns, or noKey when there is
// none. So, for any two strings, well-formed patterns or not:
//
//   - it never panics, answers 1 to noKey, and the same for (a, b) as for
//     (b, a);
//   - a key that matches both is never shorter than its answer: no common
//     key is missed;
//   - it is no shorter than the answer for each pattern against "*" (a key
//     common to both matches each), which is the sum over the pattern's
//     tokens of the bytes of the fewest-byte character each matches (at
//     least 1), or noKey when that is more than MaxKeyBytes;
//   - against the pattern that matches the key alone (leases.EscapeGlob),
//     it is exact: the key's length when the key is valid and matches the
//     other pattern (leases.MatchGlob, for a pattern ValidateGlob takes),
//     noKey otherwise.
func FuzzShortestCommonKey(f *testing.F) {
	for _, s := range [][3]string{
		{"user:*", "*:42", "user:42"},
		{"user:*|api:*", "*|web:*", "user:|web:|api:"},
		{"a*b*c", "*c*b*", "acbc"},
		{"?", "é", "é"},
		{"?é", "é?", "éé"},
		{`\*`, "?", "*"},
		{`\\*`, `*\\`, `\`},
		{"*é*", "??", "éa"},
		{"a\x01", "*", "a"},
		{"\u0085", "?", "\u0085"},
		{`a\`, "*", `a\`},
		{"", "*", ""},
		{"*a*a*a*a*a*a*a*a", "*b*b*b*b*b*b*b*b", "abababababababab"},
		{"????????????????????????????????????????????????????????????????", "*", "x"},
		{"日本*", "*語", "日本語"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, a, b, key string) {
		if len(a) > 2*protocol.MaxKeyBytes || len(b) > 2*protocol.MaxKeyBytes {
			return // GET /v1/rules's patterns are short; the work is len(a) × len(b)
		}
		pa, pb := parseGlob(a), parseGlob(b)
		n := shortestCommonKey(pa, pb)
		if n < 1 || n > noKey {
			t.Fatalf("shortestCommonKey(%q, %q) = %d", a, b, n)
		}
		if m := shortestCommonKey(pb, pa); m != n {
			t.Fatalf("shortestCommonKey(%q, %q) = %d but (%q, %q) = %d", a, b, n, b, a, m)
		}
		sides := []struct {
			pattern string
			toks    []globToken
		}{{a, pa}, {b, pb}}
		star := parseGlob("*")
		for _, p := range sides {
			alone := shortestCommonKey(p.toks, star)
			if want := shortestKey(p.toks); alone != want {
				t.Fatalf("shortestCommonKey(%q, \"*\") = %d, want %d", p.pattern, alone, want)
			}
			if n < alone {
				t.Fatalf("shortestCommonKey(%q, %q) = %d, shorter than %d for %q alone", a, b, n, alone, p.pattern)
			}
		}

		valid := protocol.ValidateKey(key) == nil
		if valid && leases.ValidateGlob(a) == nil && leases.ValidateGlob(b) == nil &&
			leases.MatchGlob(a, key) && leases.MatchGlob(b, key) && n > len(key) {
			t.Fatalf("%q matches %q and %q, but shortestCommonKey = %d", key, a, b, n)
		}
		lit := parseGlob(leases.EscapeGlob(key))
		for _, p := range sides {
			if leases.ValidateGlob(p.pattern) != nil {
				continue
			}
			want := noKey
			if valid && leases.MatchGlob(p.pattern, key) {
				want = len(key)
			}
			if got := shortestCommonKey(p.toks, lit); got != want {
				t.Fatalf("shortestCommonKey(%q, the literal %q) = %d, want %d", p.pattern, key, got, want)
			}
		}
	})
}

// shortestKey is the length of the shortest key that matches the parsed
// pattern toks alone, or noKey: a character per token that is not a star,
// the fewest bytes each ('?' one byte, a literal its own, none for a
// literal no key may hold), at least one byte, at most MaxKeyBytes.
func shortestKey(toks []globToken) int {
	if len(toks) == 0 {
		return noKey
	}
	n := 0
	for _, tok := range toks {
		switch {
		case tok.kind == globStar:
		case tok.kind == globAny:
			n++
		case tok.size == 0:
			return noKey
		default:
			n += tok.size
		}
	}
	if n > protocol.MaxKeyBytes {
		return noKey
	}
	return max(n, 1)
}
