package grpclimit

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/internal/inbound"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
)

// TestMetadataUnchanged: the metadata of a decision is byte for byte what
// grpclimit sent before its RateLimit fields came from the shared cache
// (the values below are the old code's), on the first call and on cached
// ones, and what httplimit.RateLimitFields serializes afresh.
func TestMetadataUnchanged(t *testing.T) {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:1"}})
	require.NoError(t, err)
	require.NoError(t, c.Close(context.Background()))
	l, err := New(Config{Client: c})
	require.NoError(t, err)

	now := time.Unix(1_700_000_000, 250_000_000)
	for _, tc := range []struct {
		name  string
		ls    []client.LimitState
		state bool          // Decided.State: false after a wait
		deny  bool          // a denial, with retry-after
		retry time.Duration // Decided.Retry of the denial
		want  metadata.MD
	}{{
		name:  "one limit, remaining, reset ahead",
		ls:    []client.LimitState{{Limit: 5, Period: 10 * time.Second, Remaining: 3, Reset: now.Add(8200 * time.Millisecond)}},
		state: true,
		want: metadata.MD{
			"ratelimit-policy": {`"5-per-10s";q=5;w=10`},
			"ratelimit":        {`"5-per-10s";r=3;t=9`},
		},
	}, {
		name:  "one limit, denied",
		ls:    []client.LimitState{{Limit: 5, Period: 10 * time.Second, Remaining: 0, Reset: now.Add(8200 * time.Millisecond)}},
		state: true, deny: true, retry: 8200 * time.Millisecond,
		want: metadata.MD{
			"ratelimit-policy": {`"5-per-10s";q=5;w=10`},
			"ratelimit":        {`"5-per-10s";r=0;t=9`},
			"retry-after":      {"9"},
		},
	}, {
		name: "two limits, one exhausted, one reset past, retry unknown",
		ls: []client.LimitState{
			{Limit: 3, Period: time.Hour, Remaining: 0, Reset: now.Add(1199500 * time.Millisecond)},
			{Limit: 10, Period: 24 * time.Hour, Remaining: 7, Reset: now.Add(-2 * time.Second)},
		},
		state: true, deny: true,
		want: metadata.MD{
			"ratelimit-policy": {`"3-per-1h";q=3;w=3600, "10-per-24h";q=10;w=86400`},
			"ratelimit":        {`"3-per-1h";r=0;t=1200, "10-per-24h";r=7;t=0`},
			"retry-after":      {"1"},
		},
	}, {
		name: "two limits alike, after a wait: policy only",
		ls: []client.LimitState{
			{Limit: 100, Period: time.Minute, Remaining: 57, Reset: now.Add(12 * time.Second)},
			{Limit: 100, Period: time.Minute, Remaining: 0, Reset: now.Add(-time.Millisecond)},
		},
		want: metadata.MD{
			"ratelimit-policy": {`"100-per-1m";q=100;w=60, "100-per-1m-2";q=100;w=60`},
		},
	}, {
		name: "two limits, remaining negative, reset now and a nanosecond ahead",
		ls: []client.LimitState{
			{Limit: 7, Period: 1500 * time.Millisecond, Remaining: -2, Reset: now},
			{Limit: 1000, Period: 24 * time.Hour, Remaining: 999, Reset: now.Add(time.Nanosecond)},
		},
		state: true,
		want: metadata.MD{
			"ratelimit-policy": {`"7-per-1500ms";q=9;w=2, "1000-per-24h";q=1000;w=86400`}, // 7 per 1.5 s told per 2 s
			"ratelimit":        {`"7-per-1500ms";r=0;t=0, "1000-per-24h";r=999;t=1`},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			out := inbound.Decided{Decision: client.Decision{Limits: tc.ls}, Fields: true, State: tc.state, Retry: tc.retry}
			for i := range 3 { // serialized, then cached
				assert.Equal(t, tc.want, l.metadataOf(&out, now, tc.deny), "call %d", i+1)
			}
			policy, state := httplimit.RateLimitFields(tc.ls, now)
			assert.Equal(t, []string{policy}, tc.want[MetadataRateLimitPolicy])
			if tc.state {
				assert.Equal(t, []string{state}, tc.want[MetadataRateLimit])
			}
		})
	}

	// No fields: a denial has retry-after alone, an admission nothing.
	out := inbound.Decided{Retry: 2 * time.Second}
	assert.Equal(t, metadata.MD{"retry-after": {"2"}}, l.metadataOf(&out, now, true))
	assert.Nil(t, l.metadataOf(&out, now, false))
}
