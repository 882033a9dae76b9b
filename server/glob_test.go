package server

import (
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
)

func TestGlobsIntersect(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		// Literals.
		{"user:42", "user:42", true},
		{"user:42", "user:43", false},
		{"user:42", "user:4", false},
		{"a", "ab", false},
		// A star against anything.
		{"*", "*", true},
		{"*", "user:42", true},
		{"*", "?", true},
		{"**", "x", true},
		{"user:*", "user:", true},
		{"user:*", "user:42", true},
		{"user:*", "api:42", false},
		{"*:42", "user:42", true},
		{"*:42", "user:43", false},
		{"a*", "b*", false},
		{"a*", "*b", true},
		{"*a", "*b", false},
		{"*a*", "*b*", true},
		{"user:*", "*:42", true},
		{"user:*|api:*", "*|api:search", true},
		{"user:*|api:*", "*|web:*", true}, // "user:|web:|api:"
		{"user:*|api:*", "*|web:", true},  // "user:|api:|web:"
		{"user:*|api:*", "api:*|user:*", false},
		{"a*b*c", "*c*b*", true}, // "acbc"
		{"a*b", "*ba", false},
		{"ab*", "*ba", true},
		// '?' is exactly one character, a multibyte one included.
		{"?", "é", true},
		{"?", "日", true},
		{"?", "😀", true},
		{"??", "é", false},
		{"?", "éé", false},
		{"?", "ab", false},
		{"user:?", "user:é", true},
		{"user:??", "user:é", false},
		{"?é", "é?", true},
		{"?", "*", true},
		{"???", "a*", true},
		{"???", "a*b*c*d", false},
		{"?*", "*", true},
		{"*é*", "?", true},
		{"*é*", "??", true},
		{"é*", "e*", false},
		// Escapes: '\' makes the next character literal.
		{`\*`, "*", true},
		{`\*`, "a", false},
		{`\*`, `\*`, true},
		{`\*`, "?", true},
		{`a\*`, "a*", true},
		{`a\*`, "ab", false},
		{`\?`, "?", true},
		{`\?`, "x", false},
		{`\?`, `\*`, false},
		{`\\`, "?", true},
		{`\\*`, `*\\`, true},
		{`\\a`, `\a`, false}, // a literal backslash then a, against a literal a
		{`\a`, "a", true},    // an escaped ordinary character is itself
		{`\é`, "?", true},
		{`user\:*`, "user:1", true},
		// Keys hold no control characters, so a pattern that needs one
		// reaches no key.
		{"a\x01", "*", false},
		{"*\x7f*", "*", false},
		{"\u0085", "?", false},
		{"a\x01", "a\x01", false},
		{"*", "*\x00", false},
		// A key is at most 256 bytes.
		{strings.Repeat("?", 256), "*", true},
		{strings.Repeat("?", 257), "*", false},
		{strings.Repeat("é", 128), "*", true},
		{strings.Repeat("é", 129), "*", false},
		{strings.Repeat("?", 128), strings.Repeat("é", 128), true},
		{strings.Repeat("a", 200) + "*", "*" + strings.Repeat("b", 56), true},
		{strings.Repeat("a", 200) + "*", "*" + strings.Repeat("b", 57), false},
		{strings.Repeat("a", 200) + "*", "*" + strings.Repeat("a", 57), true}, // the runs overlap
		// Malformed patterns (ValidateGlob refuses them) match nothing
		// rather than panic.
		{`a\`, "*", false},
		{"\xff", "*", false},
		{"", "", false},
		{"", "*", false},
		{"", "a", false},
		// A literal no key may hold matches nothing, whatever the other
		// side's literal that decodes to the same rune (FuzzShortestCommonKey's
		// symmetry: an invalid byte decodes to U+FFFD, a lone trailing '\' to
		// '\', and one order said 3 and 1 bytes).
		{"\uFFFD", "\xff", false},
		{"*\uFFFD", "\xff*", false},
		{`a\`, `a\\`, false},
		{"\uFFFD", "\uFFFD", true},
		{"\uFFFD", "?", true},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, globsIntersect(tt.a, tt.b), "%q ∩ %q", tt.a, tt.b)
		assert.Equal(t, tt.want, globsIntersect(tt.b, tt.a), "%q ∩ %q (swapped)", tt.b, tt.a)
	}
}

// TestGlobsIntersectQuadratic: the work is the product of the lengths, not
// exponential in the stars. Two patterns of 128 stars and letters each share
// only keys that hold 128 a's and 128 b's: one pass of 258 × 258 cells finds
// that such a key has 256 bytes, the most a key may have, and that one more
// letter makes it too long.
func TestGlobsIntersectQuadratic(t *testing.T) {
	a := strings.Repeat("*a", 128) + "*"
	b := strings.Repeat("*b", 128) + "*"
	assert.True(t, globsIntersect(a, b))
	assert.False(t, globsIntersect(a+"a*", b))
	assert.False(t, globsIntersect(a+"c", b+"d"))
	assert.Equal(t, 256, shortestCommonKey(parseGlob(a), parseGlob(b)))
}

// TestGlobsIntersectBruteForce compares globsIntersect with a search of
// every key of up to 6 characters over an alphabet that holds every literal
// of the patterns and one more character, matched with leases.MatchGlob,
// for random patterns of up to 3 non-star tokens each. A shortest common
// key has at most one character per non-star token of the two patterns (a
// character both stars consume can be dropped), so 6 characters are enough,
// and its characters are literals of the patterns or free (any one, such as
// 'a'): the search is exact.
func TestGlobsIntersectBruteForce(t *testing.T) {
	alphabet := []string{"a", "é", "*", "?", `\`}
	tokens := []string{"*", "?", "a", "é", `\*`, `\?`, `\\`, `\a`}

	var keys []string
	level := []string{""}
	for range 6 {
		var nextLevel []string
		for _, k := range level {
			for _, c := range alphabet {
				nextLevel = append(nextLevel, k+c)
			}
		}
		keys = append(keys, nextLevel...)
		level = nextLevel
	}

	rng := rand.New(rand.NewPCG(7, 42))
	randomPattern := func() string {
		var b strings.Builder
		nonStar := 0
		for n := 1 + rng.IntN(5); n > 0; n-- {
			tok := tokens[rng.IntN(len(tokens))]
			if tok != "*" {
				if nonStar == 3 {
					continue
				}
				nonStar++
			}
			b.WriteString(tok)
		}
		return b.String()
	}
	seen := map[string]bool{}
	var patterns []string
	for len(patterns) < 300 {
		p := randomPattern()
		if !seen[p] {
			require.NoError(t, leases.ValidateGlob(p))
			seen[p] = true
			patterns = append(patterns, p)
		}
	}
	words := (len(keys) + 63) / 64
	matches := make([][]uint64, len(patterns))
	for i, p := range patterns {
		matches[i] = make([]uint64, words)
		for k, key := range keys {
			if leases.MatchGlob(p, key) {
				matches[i][k/64] |= 1 << (k % 64)
			}
		}
	}
	pairs, common := 0, 0
	for i := range patterns {
		for j := i; j < len(patterns); j++ {
			want := false
			for w := range words {
				if bits.OnesCount64(matches[i][w]&matches[j][w]) > 0 {
					want = true
					break
				}
			}
			got := globsIntersect(patterns[i], patterns[j])
			require.Equal(t, want, got, "%q ∩ %q", patterns[i], patterns[j])
			require.Equal(t, got, globsIntersect(patterns[j], patterns[i]), "%q ∩ %q (swapped)", patterns[j], patterns[i])
			pairs++
			if want {
				common++
			}
		}
	}
	t.Logf("%d pattern pairs over %d keys; %d have a common key", pairs, len(keys), common)
	assert.Positive(t, common)
	assert.Less(t, common, pairs)
}
