package server

import (
	"unicode"
	"unicode/utf8"

	"github.com/ratelease/ratelease/protocol"
)

// This file decides whether two glob patterns (the syntax of
// leases.ValidateGlob: '*' any run of characters, '?' exactly one
// character, '\' makes the next character literal) can match a common key.
// GET /v1/rules uses it to show a client only the rules its key patterns
// can reach. It reimplements the parsing of package leases rather than
// exporting it from there, so that the engine's matcher stays free to
// change its representation.

// globToken is one element of a parsed pattern: a star, a '?' or a literal
// character.
type globToken struct {
	kind globKind
	r    rune // the literal character of a globLiteral
	size int  // bytes of r in UTF-8; 0 when no key can contain r
}

type globKind uint8

const (
	globStar    globKind = iota // '*': any run of characters, the empty run too
	globAny                     // '?': exactly one character
	globLiteral                 // one character, itself
)

// parseGlob splits pattern into tokens; consecutive stars become one. A
// literal that no valid key can contain (a control character, a byte that is
// not UTF-8, a lone trailing '\') gets size 0: nothing can match it, so a
// pattern with one matches no key, as leases.MatchGlob never lets it match a
// valid key either.
func parseGlob(pattern string) []globToken {
	toks := make([]globToken, 0, len(pattern))
	for i := 0; i < len(pattern); {
		c := pattern[i]
		switch c {
		case '*':
			if n := len(toks); n == 0 || toks[n-1].kind != globStar {
				toks = append(toks, globToken{kind: globStar})
			}
			i++
			continue
		case '?':
			toks = append(toks, globToken{kind: globAny})
			i++
			continue
		case '\\':
			i++
			if i == len(pattern) { // a lone '\' at the end matches nothing
				toks = append(toks, globToken{kind: globLiteral, r: '\\'})
				continue
			}
		}
		r, size := utf8.DecodeRuneInString(pattern[i:])
		i += size
		t := globToken{kind: globLiteral, r: r, size: size}
		if (r == utf8.RuneError && size == 1) || unicode.IsControl(r) {
			t.size = 0 // not in any valid key (protocol.ValidateKey)
		}
		toks = append(toks, t)
	}
	return toks
}

// noKey is larger than any key's length: "no common key".
const noKey = protocol.MaxKeyBytes + 1

// shortestCommonKey returns the length in bytes of the shortest key of at
// least one character, valid UTF-8 and without control characters, that
// matches both parsed patterns, or noKey when there is none or it would be
// longer than protocol.MaxKeyBytes.
//
// It is a dynamic program over pairs of positions (i in a, j in b): cost(i,
// j) is the fewest bytes of a string that takes a[i:] and b[j:] both to
// their end. A string matched by both patterns consumes each of its
// characters with one token of each; a character that both sides consume
// with a star can be dropped and the rest still matches both, so a shortest
// common string has none, and each of its characters moves at least one
// side past a non-star token. Hence the moves from (i, j):
//
//   - a[i] is a star: it matches the empty run, to (i+1, j) at no cost, or
//     consumes the character of a non-star b[j], to (i, j+1);
//   - the same with the sides swapped;
//   - neither is a star: both consume one common character, to (i+1, j+1),
//     if there is one: two literals must be equal, a literal and '?' give the
//     literal, two '?' give any character (one byte, say 'a').
//
// A character a literal consumes costs its UTF-8 length; one consumed by a
// '?' or a star against a '?' costs one byte. Every move increases i + j, so
// the table is filled backwards row by row in O(len(a) × len(b)) time and
// O(len(b)) space. When both patterns are only stars, the empty string is the
// shortest, and then a one-byte key matches both (unless a pattern is empty:
// it matches the empty string alone, which is no key).
func shortestCommonKey(a, b []globToken) int {
	if len(a) == 0 || len(b) == 0 {
		return noKey
	}
	next := make([]int, len(b)+1) // row i+1
	cur := make([]int, len(b)+1)  // row i
	for i := len(a); i >= 0; i-- {
		for j := len(b); j >= 0; j-- {
			best := noKey
			if i == len(a) && j == len(b) {
				best = 0
			}
			var ta, tb *globToken
			if i < len(a) {
				ta = &a[i]
			}
			if j < len(b) {
				tb = &b[j]
			}
			if ta != nil && ta.kind == globStar {
				best = min(best, next[j])
				if tb != nil && tb.kind != globStar {
					best = min(best, charCost(tb)+cur[j+1])
				}
			}
			if tb != nil && tb.kind == globStar {
				best = min(best, cur[j+1])
				if ta != nil && ta.kind != globStar {
					best = min(best, charCost(ta)+next[j])
				}
			}
			if ta != nil && tb != nil && ta.kind != globStar && tb.kind != globStar {
				best = min(best, commonCharCost(ta, tb)+next[j+1])
			}
			cur[j] = min(best, noKey)
		}
		next, cur = cur, next
	}
	return max(next[0], 1)
}

// charCost returns the bytes of the fewest-byte character that the non-star
// token t matches, or noKey when it matches none that a key may hold.
func charCost(t *globToken) int {
	switch {
	case t.kind == globAny:
		return 1
	case t.size == 0:
		return noKey
	default:
		return t.size
	}
}

// commonCharCost returns the bytes of the fewest-byte character that both
// non-star tokens match, or noKey when they match no common character.
func commonCharCost(a, b *globToken) int {
	switch {
	case a.kind == globAny:
		return charCost(b)
	case b.kind == globAny:
		return charCost(a)
	case a.r == b.r:
		// Both must match the character: a literal no key may hold
		// matches none, whatever the other's (an invalid byte decodes to
		// U+FFFD as a valid U+FFFD does, a lone trailing '\' to '\' as an
		// escaped one does).
		return max(charCost(a), charCost(b))
	default:
		return noKey
	}
}

// globsIntersect reports whether some valid key (see protocol.ValidateKey)
// matches both glob patterns, with the semantics of leases.MatchGlob. It runs
// in O(len(a) × len(b)) time.
func globsIntersect(a, b string) bool {
	return shortestCommonKey(parseGlob(a), parseGlob(b)) <= protocol.MaxKeyBytes
}
