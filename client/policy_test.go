package client

import (
	"context"
	"github.com/ratelease/ratelease/protocol"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// policyClient returns a client whose policy functions the tests call with
// times they choose; it never contacts its (unused) server.
func policyClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	cfg.Servers = []string{"http://127.0.0.1:9"}
	c, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// TestWantSizing: a batch is the demand over the horizon, at most half a
// lease TTL's worth, a quarter of the time the bucket takes to fill, a
// quarter of the bucket and MaxBatch.
func TestWantSizing(t *testing.T) {
	c := policyClient(t, Config{Horizon: time.Second, InitialBatch: 10, MaxBatch: 1_000})
	for _, tc := range []struct {
		name  string
		ewma  float64 // tokens/s
		ttl   time.Duration
		fill  time.Duration
		burst int64
		want  int64
	}{
		{"no history: InitialBatch", 0, 2 * time.Second, time.Second, 1000, 10},
		{"no history, small bucket: a quarter of it", 0, 2 * time.Second, time.Second, 8, 2},
		{"demand over the horizon", 100, 10 * time.Second, 100 * time.Second, 100_000, 100},
		{"half a lease TTL", 100, time.Second, 100 * time.Second, 100_000, 50},
		{"a quarter of the fill time", 100, 10 * time.Second, 2 * time.Second, 100_000, 50},
		{"a quarter of the bucket", 1000, 10 * time.Second, 100 * time.Second, 400, 100},
		{"MaxBatch", 1e6, 10 * time.Second, 100 * time.Second, 1e9, 1000},
		{"at least one", 0.001, 10 * time.Second, 100 * time.Second, 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.run.ewma = tc.ewma
			ks.leaseTTL.Store(int64(tc.ttl))
			ks.ruleFill.Store(int64(tc.fill))
			ks.ruleBurst.Store(tc.burst)
			assert.Equal(t, tc.want, c.want(ks))
		})
	}
}

// TestRoomyRenewal: a roomy key's lease is renewed at three quarters of
// its TTL at the latest, but at least eight ticks before its deadline and
// never before half its TTL; its next batch is the rate the lease was
// spent at over that time (the demand average while the lease is young),
// with the usual caps; its cushion is a sixteenth of its batch.
func TestRoomyRenewal(t *testing.T) {
	c := policyClient(t, Config{SettleInterval: 10 * time.Millisecond, MaxBatch: 100_000})
	ms := int64(time.Millisecond)
	for _, tc := range []struct {
		name string
		ttl  int64
		late int64
	}{
		{"2 s: at 1.5 s", 2000 * ms, 1500 * ms},
		{"240 ms: eight ticks before the deadline", 240 * ms, 160 * ms},
		{"100 ms: at half, as the others", 100 * ms, 50 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.late, c.lateOffset(tc.ttl)) })
	}

	newLease := func(sent, ttl, granted, used int64) *lease {
		l := &lease{granted: granted, halfway: sent + ttl/2, deadline: sent + ttl}
		l.remaining.Store(granted - used)
		return l
	}
	for _, tc := range []struct {
		name  string
		l     *lease
		now   int64
		ewma  float64
		burst int64
		want  int64
	}{
		{"the lease's rate over 1.5 s", newLease(0, 2000*ms, 3000, 1500), 750 * ms, 9999, 1e9, 3000},
		{"a young lease: the demand average", newLease(0, 2000*ms, 3000, 10), 50 * ms, 100, 1e9, 150},
		{"a quarter of the bucket", newLease(0, 2000*ms, 3000, 1500), 750 * ms, 2000, 8000, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.run.ewma = tc.ewma
			ks.leaseTTL.Store(2000 * ms)
			ks.ruleFill.Store(100_000 * ms)
			ks.ruleBurst.Store(tc.burst)
			assert.Equal(t, tc.want, c.roomyWant(ks, tc.l, tc.now))
		})
	}
	assert.Equal(t, int64(187), cushion(newLease(0, 2000*ms, 3000, 0)))
}

// TestRoomyRenewalAtCushion: past its late renewal point, a roomy key's
// lease that the pace it was spent at brings down to its cushion by its
// last renewal point (an eighth of its TTL before its deadline) is renewed
// at its cushion, not at once; one whose demand fell is renewed at once,
// and any is renewed at its last renewal point or at its cushion (or two
// ticks of demand, when that is more: then at its late renewal point, as
// waiting would not leave it with its cushion).
func TestRoomyRenewalAtCushion(t *testing.T) {
	c := policyClient(t, Config{SettleInterval: 10 * time.Millisecond, MaxBatch: 100_000})
	ms := int64(time.Millisecond)
	// A lease of 1,600 tokens asked for at 0, TTL 2 s: late renewal
	// point 1.5 s, last renewal point 1.75 s, cushion 100; two ticks of
	// demand are 20 tokens at 1,000/s, 200 at 10,000/s.
	for _, tc := range []struct {
		name  string
		ewma  float64
		used  int64
		now   int64
		renew bool
	}{
		{"late point, cushion 0.23 s away at its pace: waits", 1000, 1300, 1500 * ms, false},
		{"late point, cushion 0.29 s away: renewed", 1000, 1260, 1500 * ms, true},
		{"late point, demand fell: renewed", 1000, 400, 1500 * ms, true},
		{"last renewal point, cushion near: renewed", 1000, 1480, 1750 * ms, true},
		{"before the late point, at its cushion: renewed", 1000, 1500, 1000 * ms, true},
		{"before the late point, above its cushion: waits", 1000, 1000, 1000 * ms, false},
		{"two ticks of demand above the cushion: renewed there", 10_000, 1410, 1000 * ms, true},
		{"late point, cushion near, two ticks of demand above it: renewed", 10_000, 1300, 1500 * ms, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.run.roomy = true
			ks.run.ewma = tc.ewma
			ks.leaseTTL.Store(2000 * ms)
			ks.ruleFill.Store(100_000 * ms)
			ks.ruleBurst.Store(1e9)
			l := &lease{granted: 1600, halfway: 1000 * ms, deadline: 2000 * ms}
			l.remaining.Store(l.granted - tc.used)
			ks.active.Store(l)
			ks.run.slots[0] = l
			got, ok := c.plan(ks, tc.now, l)
			require.Equal(t, tc.renew, ok, "%+v", got)
			if tc.renew {
				require.Len(t, got, 1)
				assert.Equal(t, 1, got[0].slot, "into the other slot")
				assert.Positive(t, got[0].want)
			}
		})
	}
}

// TestPromotion: a key moves to leases once this process was admitted
// LeaseMinTokens over one lease TTL (an average decaying with the TTL), or
// half of them at twice that pace since its first admission, not before,
// and not from admissions spread thinner than that.
func TestPromotion(t *testing.T) {
	c := policyClient(t, Config{LeaseMinTokens: 8})
	sec := int64(time.Second)
	ms := int64(time.Millisecond)

	for _, tc := range []struct {
		name     string
		every    int64 // ns between admissions
		promoted int   // index of the admission that promotes
	}{
		// 100 a second, 200 per TTL: the fourth admission (half of 8)
		// shows twice the threshold's pace.
		{"dense: half the tokens at twice the pace", 10 * ms, 3},
		// 4 admissions over 450 ms: 17.8 per TTL, just over 16.
		{"150 ms apart: half at twice the pace", 150 * ms, 3},
		// 5 a second, 10 per TTL: never twice the threshold's pace; the
		// average over a TTL, Σ e^(−0.1·j) for j < n, crosses 8 at the
		// 15th admission.
		{"200 ms apart: the average over a TTL", 200 * ms, 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.leaseTTL.Store(2 * sec)
			ks.ruleBurst.Store(100)
			promoted := -1
			for i := range 40 {
				if c.admitted(ks, 1, int64(i)*tc.every) && promoted < 0 {
					promoted = i
				}
			}
			assert.Equal(t, tc.promoted, promoted)
		})
	}

	sparse := newKeyState("sparse")
	sparse.leaseTTL.Store(2 * sec)
	sparse.ruleBurst.Store(100)
	for i := range 100 {
		// One admission a second: about 2 per TTL, never 8.
		require.False(t, c.admitted(sparse, 1, int64(i)*sec), "admission %d", i)
	}

	// A key that just became hot: 9 admissions 0.5 ms apart. The average
	// over a TTL says a few a second; the admissions over their time, at
	// least 10 ms, say 900 a second, and the first batch is sized on that.
	hot := newKeyState("hot")
	hot.leaseTTL.Store(2 * sec)
	hot.ruleBurst.Store(1_000_000)
	for i := range 9 {
		c.admitted(hot, 1, int64(i)*int64(500*time.Microsecond))
	}
	assert.InDelta(t, 900, hot.directRate(4*int64(time.Millisecond)), 1, "9 tokens over the 10 ms floor")
	assert.InDelta(t, 9/0.02, hot.directRate(20*int64(time.Millisecond)), 1, "9 tokens over 20 ms")

	unknown := newKeyState("no rule learned")
	assert.False(t, c.admitted(unknown, 1000, 0), "no lease TTL known: no lease")

	small := newKeyState("small bucket")
	small.leaseTTL.Store(2 * sec)
	small.ruleBurst.Store(31)
	assert.False(t, c.admitted(small, 1000, 0), "a quarter of 31 cannot hold 8 tokens: never leased")
}

// TestDemotion: at its renewal point a lease nobody spent from is
// returned, and so is one whose key's demand over a TTL fell below half
// of LeaseMinTokens; a lease in use is kept.
func TestDemotion(t *testing.T) {
	c := policyClient(t, Config{LeaseMinTokens: 8})
	ms := int64(time.Millisecond)
	newLease := func(granted, left int64) *lease {
		l := &lease{granted: granted, halfway: 1000 * ms, deadline: 2000 * ms}
		l.remaining.Store(left)
		return l
	}
	for _, tc := range []struct {
		name   string
		l      *lease
		ewma   float64 // tokens/s
		now    int64
		demote bool
	}{
		{"before its renewal point", newLease(10, 10), 0, 999 * ms, false},
		{"unspent at its renewal point", newLease(10, 10), 100, 1000 * ms, true},
		{"in use, demand high", newLease(10, 3), 100, 1000 * ms, false},
		{"in use, demand fallen", newLease(10, 9), 1, 1000 * ms, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.leaseTTL.Store(2000 * ms)
			ks.run.ewma = tc.ewma
			assert.Equal(t, tc.demote, c.shouldDemote(ks, tc.l, tc.now))
		})
	}
}

// TestCheapToHold: a spent-out lease waits open for its key's next request
// only while the holders' leases of its size fit in a quarter of the
// bucket, so that outstanding tokens never cap a busy bucket's refill.
func TestCheapToHold(t *testing.T) {
	c := policyClient(t, Config{})
	for _, tc := range []struct {
		name     string
		burst    int64
		rate     float64 // tokens per second
		safeRate float64 // the rule's rate over the holders
		granted  int64
		cheap    bool
	}{
		{"a hot key's large bucket", 1_000_000, 100_000, 50_000, 2_000, true},
		{"saturated, small bucket, six holders", 100, 1000, 1000.0 / 6, 13, false},
		{"two holders, a quarter between them", 100, 1000, 500, 12, true},
		{"two holders, just over", 100, 1000, 500, 13, false},
		{"no safe rate known", 100, 1000, 0, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := newKeyState("k")
			ks.ruleBurst.Store(tc.burst)
			ks.ruleFill.Store(int64(float64(tc.burst) / tc.rate * float64(time.Second)))
			ks.safeRate.Store(math.Float64bits(tc.safeRate))
			assert.Equal(t, tc.cheap, c.cheapToHold(ks, &lease{granted: tc.granted}))
		})
	}
}

// TestLeaseRefusedOwned: a lease refused because a lease server owns the
// key's bucket (protocol.LeaseResult.Owned) sends the key back to direct
// decisions, which reach the owner, instead of denying it locally, and
// keeps it from leasing again for a lease TTL.
func TestLeaseRefusedOwned(t *testing.T) {
	c := policyClient(t, Config{})
	ks := newKeyState("k")
	ks.leasing.Store(true)
	now := int64(5 * time.Second)
	res := &protocol.LeaseResult{Key: "k", Owned: true, RetryAfterMillis: 100, Limit: 100, PeriodMillis: 1000, Burst: 10, TTLMillis: 2000, Rule: "r"}
	c.applyOne(pending{ks: ks, want: 5}, res, now, now)
	assert.Zero(t, ks.denyUntil.Load(), "not denied locally")
	assert.True(t, ks.run.demote, "back to direct decisions")
	assert.Equal(t, now+int64(2*time.Second), ks.directUntil.Load(), "not leased again for a lease TTL")
	assert.False(t, ks.need.Load())

	plain := newKeyState("p")
	plain.leasing.Store(true)
	res.Owned = false
	c.applyOne(pending{ks: plain, want: 5}, res, now, now)
	assert.Equal(t, now+int64(100*time.Millisecond), plain.denyUntil.Load(), "a plain refusal denies until its retry_after")
	assert.False(t, plain.run.demote)
}

// TestDenialSpread: a lease refused on a shared key is asked for again
// after its retry_after plus up to half as much again, drawn at random, so that
// the holders refused together do not all ask at the same instant (all but
// one would be refused again); a key this process alone holds asks right at
// its retry_after.
func TestDenialSpread(t *testing.T) {
	c := policyClient(t, Config{})
	now := int64(5 * time.Second)
	retry := int64(40 * time.Millisecond)
	deny := func(safeRate float64) int64 {
		ks := newKeyState("k")
		ks.leasing.Store(true)
		res := &protocol.LeaseResult{Key: "k", RetryAfterMillis: 40, Limit: 1000, PeriodMillis: 1000, Burst: 100, TTLMillis: 1000, SafeRate: safeRate, Rule: "r"}
		c.applyOne(pending{ks: ks, want: 10}, res, now, now)
		return ks.denyUntil.Load() - now
	}
	seen := map[int64]bool{}
	for range 200 {
		w := deny(1000.0 / 6) // six holders
		require.GreaterOrEqual(t, w, retry)
		require.LessOrEqual(t, w, retry+retry/2)
		seen[w] = true
	}
	assert.Greater(t, len(seen), 30, "the waits are spread")
	assert.Equal(t, retry, deny(1000), "alone on the key: the retry_after as given")
}
