package client_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of the SDK's public API as a caller meets it: what each
// exported name's documentation promises, at its edges.

// TestLimiterInvalidDenies: a Limiter made with an invalid key, or with no
// key or too many, denies every request and says why, as Client.Limiter's
// doc promises, through each of its methods. Allow on a Limiter of one
// invalid key dereferenced the key's state, never made (found by the API
// review: a nil pointer panic, the hot path of a caller who built the key
// from a request).
func TestLimiterInvalidDenies(t *testing.T) {
	c := transportClient(t)
	tests := []struct {
		name string
		keys []string
	}{
		{"empty key", []string{""}},
		{"key one byte too long", []string{strings.Repeat("k", protocol.MaxKeyBytes+1)}},
		{"invalid UTF-8", []string{"user:\xff"}},
		{"control character", []string{"user:\n1"}},
		{"valid, then invalid", []string{"user:1", ""}},
		{"invalid, then valid", []string{"", "user:1"}},
		{"no key", nil},
		{"too many keys", manyKeys(protocol.MaxEntries + 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := c.Limiter(tt.keys...)
			require.ErrorIs(t, l.Err(), client.ErrInvalidRequest)
			require.NotPanics(t, func() { assert.False(t, l.Allow(), "Allow") })
			require.NotPanics(t, func() { assert.False(t, l.AllowN(1), "AllowN") })
			require.NotPanics(t, func() {
				d := l.Decide(context.Background(), 1)
				assert.False(t, d.Allowed)
				assert.Equal(t, client.SourceDenied, d.Source)
				assert.ErrorIs(t, d.Err, client.ErrInvalidRequest)
			})
			require.NotPanics(t, func() {
				err := l.Wait(context.Background())
				assert.ErrorIs(t, err, client.ErrInvalidRequest)
				assert.NotErrorIs(t, err, client.ErrRateLimited)
			})
		})
	}
	// The longest valid key is valid.
	l := c.Limiter(strings.Repeat("k", protocol.MaxKeyBytes))
	require.NoError(t, l.Err())
	assert.True(t, l.Allow())
}
