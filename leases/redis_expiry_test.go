package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRedisTakeStateExpiry asserts the expiry that server.Options'
// MaxKeysPerClient states for the state a direct take creates in Redis,
// per algorithm: the time until its bucket is full again (for a token
// bucket; a take through an OwningStore, as rateleased's -own-keys makes
// every forwarded take, keeps the record of its taker a lease TTL, and the
// bucket with it), the window's end for fixed_window, two windows after
// the take's window starts for sliding_window_counter, a window after the
// take for sliding_window_log (the log keeps its entries' ends in steps of
// 1/64 of the window), the drained queue for leaky_bucket; each
// plus a second. Every key the take wrote expires, and none lives longer.
// That expiry is what bounds the state takes keep (takes are not capped by
// MaxKeysPerClient), and what the README's memory figure for 100 million
// users is computed from.
func TestRedisTakeStateExpiry(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	const p = time.Second
	windowStart := func(at int64) time.Duration { // µs of the take's window elapsed
		return time.Duration(at%p.Microseconds()) * time.Microsecond
	}
	for _, tc := range []struct {
		name   string
		alg    leases.Algorithm
		cost   int64
		server string
		// keeps returns how long the state lives after a take at µs at,
		// before Redis's second of slack.
		keeps func(at int64) time.Duration
	}{
		{"token bucket, one token back in 100 ms", leases.TokenBucket, 1, "", func(int64) time.Duration { return 100 * time.Millisecond }},
		{"token bucket, the whole bucket back in burst/rate", leases.TokenBucket, 10, "", func(int64) time.Duration { return time.Second }},
		{"token bucket taken through an owning server: a lease TTL", leases.TokenBucket, 1, "server-0123456789abcdef", func(int64) time.Duration { return 2 * time.Second }},
		{"fixed window: the window's end", leases.FixedWindow, 1, "", func(at int64) time.Duration { return p - windowStart(at) }},
		{"sliding window counter: two windows after the take's window starts", leases.SlidingWindowCounter, 1, "", func(at int64) time.Duration { return 2*p - windowStart(at) }},
		{"sliding window log: a window after the take, its end rounded up to the log's 1/64 of a window", leases.SlidingWindowLog, 1, "", func(at int64) time.Duration {
			q := p.Microseconds() / 64
			return p + time.Duration((q-at%q)%q)*time.Microsecond
		}},
		{"leaky bucket: the queue drained", leases.LeakyBucket, 3, "", func(int64) time.Duration { return 300 * time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, rdb.FlushDB(ctx).Err())
			b := leases.Bucket{Algorithm: tc.alg, Limit: 10, Period: p, Burst: 10, LeaseTTL: 2 * time.Second}
			before := time.Now()
			out, err := s.Take(ctx, []leases.TakeOp{{Key: "user:42", Bucket: b, Cost: tc.cost, Server: tc.server}})
			require.NoError(t, err)
			require.True(t, out[0].Taken, "%+v", out[0])
			bound := tc.keeps(out[0].At) + time.Second
			keys, err := rdb.Keys(ctx, "*").Result()
			require.NoError(t, err)
			require.NotEmpty(t, keys)
			elapsed := time.Since(before)
			for _, k := range keys {
				d, err := rdb.PTTL(ctx, k).Result()
				require.NoError(t, err)
				assert.Positive(t, d, "%s expires", k)
				// A millisecond for the expiry's rounding up.
				assert.LessOrEqual(t, d, bound+time.Millisecond, "%s lives no longer than stated", k)
				// Rounding down by the time the check took, and a
				// millisecond: the bound is what the state lives, not a
				// loose ceiling.
				assert.GreaterOrEqual(t, d, bound-elapsed-time.Millisecond, "%s lives as long as stated", k)
			}
		})
	}
}
