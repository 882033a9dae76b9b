package client

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestParseRetryAfter is the regression test of a Retry-After value that
// FuzzParseRetryAfter found taken as the longest wait: digits that
// overflow, then something that is not a digit ("18700000000000000000A").
// strconv.ParseUint reports the overflow before it reaches the garbage,
// and parseRetryAfter took the range error for a valid, huge delay. Such a
// value is refused now, as any malformed one is; digits alone still
// saturate.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		v    string
		want time.Duration
		ok   bool
	}{
		{"seconds", "120", 2 * time.Minute, true},
		{"seconds with spaces", " 5\t", 5 * time.Second, true},
		{"zero", "0", 0, true},
		{"largest whole seconds", "9223372036", 9223372036 * time.Second, true},
		{"too many seconds", "9223372037", math.MaxInt64, true},
		{"overflowing digits", "18446744073709551616", math.MaxInt64, true},
		{"overflowing digits then a letter", "18700000000000000000A", 0, false},
		{"overflowing digits then a space and more", "99999999999999999999 1", 0, false},
		{"overflowing digits then a dot", "99999999999999999999.5", 0, false},
		{"digits then a letter", "12s", 0, false},
		{"fraction", "1.5", 0, false},
		{"negative", "-1", 0, false},
		{"plus sign", "+5", 0, false},
		{"date", now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"date in the past", "Fri, 31 Dec 1999 23:59:59 GMT", 0, true},
		{"garbage", "soon", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := parseRetryAfter(tt.v, now)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, d)
		})
	}
}
