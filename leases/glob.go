package leases

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// A glob pattern matches keys. '*' matches any run of characters, the empty
// run included (unlike path.Match it also matches '/', because keys are
// opaque); '?' matches exactly one character; '\' makes the next character
// literal. Everything else matches itself.
//
// validGlob reports whether pattern is well formed: valid UTF-8, not empty,
// no trailing lone '\'.
func validGlob(pattern string) error {
	if pattern == "" {
		return errors.New("pattern is empty")
	}
	if !utf8.ValidString(pattern) {
		return errors.New("pattern is not valid UTF-8")
	}
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == '\\' {
			if i == len(pattern)-1 {
				return errors.New(`pattern ends with a lone '\'`)
			}
			i++
		}
	}
	return nil
}

// isLiteralGlob reports whether pattern has no wildcard, and returns the
// literal it matches.
func isLiteralGlob(pattern string) (string, bool) {
	if !strings.ContainsAny(pattern, `*?\`) {
		return pattern, true
	}
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '*', '?':
			return "", false
		case '\\':
			i++
			b.WriteByte(pattern[i])
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// globSpecificity ranks patterns: more literal bytes is more specific, and
// at equal literal bytes fewer '*' is more specific.
func globSpecificity(pattern string) (literals, stars int) {
	for i := 0; i < len(pattern); i++ {
		switch pattern[i] {
		case '*':
			stars++
		case '?':
		case '\\':
			i++
			literals++
		default:
			literals++
		}
	}
	return literals, stars
}

// globMatch reports whether s matches pattern. It runs in O(len(pattern) ×
// len(s)) time at worst and does not allocate.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	starP, starI := -1, 0
	for i < len(s) {
		if p < len(pattern) {
			switch c := pattern[p]; c {
			case '*':
				starP, starI = p, i
				p++
				continue
			case '?':
				_, size := utf8.DecodeRuneInString(s[i:])
				p++
				i += size
				continue
			case '\\':
				if p+1 < len(pattern) && pattern[p+1] == s[i] {
					p += 2
					i++
					continue
				}
			default:
				if c == s[i] {
					p++
					i++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		// Backtrack: let the last '*' swallow one more character.
		_, size := utf8.DecodeRuneInString(s[starI:])
		starI += size
		p, i = starP+1, starI
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// ValidateGlob reports whether pattern is a well-formed glob pattern as
// rules and client key patterns use them: '*' matches any run of
// characters, '/' included, '?' matches one character, and '\' makes the
// next character literal. A pattern must be valid UTF-8, not empty, and must
// not end with a lone '\'.
func ValidateGlob(pattern string) error { return validGlob(pattern) }

// MatchGlob reports whether key matches pattern, with the semantics
// described at ValidateGlob. The result for a pattern that ValidateGlob
// refuses is unspecified. MatchGlob does not allocate.
func MatchGlob(pattern, key string) bool { return globMatch(pattern, key) }
