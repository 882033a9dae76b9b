package storetest

import (
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The algorithms a rule can switch between.
var allAlgorithms = []leases.Algorithm{leases.TokenBucket, leases.FixedWindow, leases.SlidingWindowCounter, leases.SlidingWindowLog, leases.LeakyBucket}

// RunRuleChange checks what a rule change (a reload) does to the leases
// open under the old rule, against the stores newStore returns: they stay
// counted until they end, whatever the new rule says. Each case is a
// finding of a review that a store got wrong, and each checks the store's
// own answers against the bound: a lease of the whole capacity leaves
// nothing to grant or take beside it, and a window admits at most its
// limit counting the tokens of the leases that may still be spent in it.
// Run includes it; a test can run it alone (to compare two stores' answers
// case by case, for example).
//
// The suite's clock starts on a minute boundary, so the cases' windows are
// aligned to their start.
func RunRuleChange(t *testing.T, newStore Factory) {
	for _, from := range allAlgorithms {
		for _, to := range allAlgorithms {
			if from != to {
				t.Run("AlgorithmSwitchKeepsOpenLeases/"+string(from)+"/"+string(to), func(t *testing.T) {
					testSwitchKeepsLeases(t, newFixture(t, newStore), from, to)
				})
			}
		}
	}
	for _, a := range windowAlgorithms {
		for _, c := range []struct {
			name string
			test func(t *testing.T, f *fixture, a leases.Algorithm)
		}{
			{"ShorterWindowCountsOpenLeases", testShorterWindow},
			{"LongerWindowCountsOpenLeases", testLongerWindow},
			{"CarrySurvivesDeniedTake", testCarryAfterDenial},
		} {
			t.Run(string(a)+"/"+c.name, func(t *testing.T) { c.test(t, newFixture(t, newStore), a) })
		}
	}
}

// at moves the clock to d after the suite's start.
func (f *fixture) at(d time.Duration) {
	f.t.Helper()
	require.False(f.t, f.clock.Now().After(epoch.Add(d)), "the clock does not go back to %v", d)
	f.clock.Advance(epoch.Add(d).Sub(f.clock.Now()))
}

// admitted takes one token at a time under b until a take is denied, and
// returns how many were taken: what key admits now by direct takes (at
// most b.Burst + 1 tries, which a store keeping its bound never reaches).
func (f *fixture) admitted(key string, b leases.Bucket) int64 {
	f.t.Helper()
	var n int64
	for n <= b.Burst && f.take(key, b, 1).Taken {
		n++
	}
	return n
}

// checkHeld checks that key, under b (a token bucket or a window),
// counts its open leases: its level (what it still admits) and the tokens
// of its open leases together are at most its capacity.
func (f *fixture) checkHeld(key string, b leases.Bucket, open int, what string) {
	f.t.Helper()
	st := f.state(key, b)
	require.Equal(f.t, open, st.Leases, "open leases: %s", what)
	assert.LessOrEqual(f.t, st.Level+float64(st.Outstanding), float64(b.Burst)+1e-9,
		"level %v + outstanding %d ≤ %d: %s", st.Level, st.Outstanding, b.Burst, what)
}

// leaseMinute opens a/1's lease of the whole limit of a rule of algorithm
// a, 100 per minute with lease TTL ttl, on key k at the current time, and
// returns the lease and the rule reloaded to 100 per second.
func (f *fixture) leaseMinute(a leases.Algorithm, ttl time.Duration) (leases.LeaseOutcome, leases.Bucket) {
	f.t.Helper()
	minute := window(a, 100, time.Minute, ttl)
	l := f.lease("a/1", "k", minute, 100, "", 0)
	require.NoError(f.t, l.Err)
	require.EqualValues(f.t, 100, l.Granted, "a leases the minute's whole limit")
	second := minute
	second.Period = time.Second
	return l, second
}

// testSwitchKeepsLeases: a token bucket with an open lease of its whole
// burst; a reload switches the rule to fixed_window and a second switches
// it back. The memory store dropped the token bucket's state at the first
// switch and, at the second, started a full bucket while the lease it
// forgot was still open and spendable: it granted the burst again. Redis
// keeps each algorithm's state under keys of its own, and so does the
// memory store now. Every algorithm switches here to every other and back:
// capacity 100 (a burst, a window's limit, a queue), lease TTL an hour, so
// that nothing refills, rolls or drains a whole token in the 2 ms the case
// lasts.
func testSwitchKeepsLeases(t *testing.T, f *fixture, from, to leases.Algorithm) {
	b := leases.Bucket{Algorithm: from, Limit: 100, Period: time.Minute, Burst: 100, LeaseTTL: time.Hour}
	other := b
	other.Algorithm = to
	a := f.lease("a/1", "k", b, 100, "", 0)
	require.NoError(t, a.Err)
	require.EqualValues(t, 100, a.Granted, "a leases the whole capacity of %s", from)
	f.clock.Advance(time.Millisecond)
	require.True(t, f.take("k", other, 1).Taken, "the rule is %s now: its own state admits", to)
	f.clock.Advance(time.Millisecond)
	// The rule is back to from, with a's lease still open.
	o := f.lease("b/1", "k", b, 100, "", 0)
	require.NoError(t, o.Err)
	n := f.admitted("k", b)
	assert.LessOrEqual(t, a.Granted+o.Granted+n, b.Burst,
		"back to %s with a's lease of the whole capacity open: b was granted %d, takes admitted %d", from, o.Granted, n)
}

// testShorterWindow: fixed_window (and the counter) 100 per minute; a
// client holds a lease of all 100 (deadline 30 s, inside its window). A
// reload shortens the period to one second. At the next call the window
// rolled to a count of 0 while the lease, of the old window, stayed open
// and spendable until its deadline: the new window admitted 100 by takes
// besides, 200 in one second. (In Redis the keys also lived for the
// one-second window only, 28.5 s less than the lease; package leases
// checks the keys' TTL in TestRuleChangeShorterWindowKeysOutliveLease.)
// The roll now carries the open leases' tokens, and the keys live until
// the latest of them ends.
func testShorterWindow(t *testing.T, f *fixture, a leases.Algorithm) {
	l, second := f.leaseMinute(a, 30*time.Second)
	f.at(1500 * time.Millisecond) // the reload happened meanwhile
	f.checkHeld("k", second, 1, "a's lease of 100 is open until 30 s")
	// a may spend its lease's 100 in [1 s, 2 s) as well.
	n := f.admitted("k", second)
	assert.LessOrEqual(t, l.Granted+n, second.Limit, "a window of 1 s admitted %d by takes beside a lease of 100 open in it", n)
	// Once the lease has ended and a whole window has passed, the key
	// admits its limit again.
	f.at(31500 * time.Millisecond)
	assert.Equal(t, second.Limit, f.admitted("k", second), "after the lease")
}

// testLongerWindow: fixed_window 10 per 500 ms, reloaded to 10 per second.
// The key's window started at 0.5 s under the old period and stays there
// (a start that ⌊now/W⌋·W does not pass), so a lease granted at 0.7 s,
// under the new rule, gets the deadline start + W = 1.5 s; but the window
// rolls at the next aligned boundary, 1.0 s. The roll used to start from
// zero, and the aligned window [1 s, 2 s) admitted its 10 beside the
// lease's 9 still open in it.
func testLongerWindow(t *testing.T, f *fixture, a leases.Algorithm) {
	half := window(a, 10, 500*time.Millisecond, time.Second)
	full := half
	full.Period = time.Second
	f.at(600 * time.Millisecond)
	require.True(t, f.take("k", half, 1).Taken, "window [0.5 s, 1 s) of the old rule")
	f.at(700 * time.Millisecond) // the rule is 10 per second now
	l := f.lease("a/1", "k", full, 9, "", 0)
	require.NoError(t, l.Err)
	require.EqualValues(t, 9, l.Granted)
	t.Logf("lease granted at 0.7 s: deadline in %v", l.TTL)
	f.at(1100 * time.Millisecond)
	f.checkHeld("k", full, 1, "the lease of 9 is still open at 1.1 s")
	n := f.admitted("k", full)
	assert.LessOrEqual(t, l.Granted+n, full.Limit,
		"the aligned window [1 s, 2 s) admitted %d by takes while a lease of 9, granted under this rule, may still be spent in it", n)
	f.at(3500 * time.Millisecond)
	assert.Equal(t, full.Limit, f.admitted("k", full), "after the lease")
}

// testCarryAfterDenial (found by the final review of the rule-change fix):
// a roll that carries an open lease's tokens cannot be recomputed once the
// lease has ended; a denied take did not save it in Redis, and the next
// call rolled again from the old window, carrying nothing: Redis then
// admitted a take of 100 beside the lease, the memory store did not.
func testCarryAfterDenial(t *testing.T, f *fixture, a leases.Algorithm) {
	l, second := f.leaseMinute(a, 1600*time.Millisecond)
	f.at(1200 * time.Millisecond) // reload; window [1 s, 2 s); the lease is open until 1.6 s
	require.False(t, f.take("k", second, 1).Taken, "a lease of 100 is open in this window")
	f.at(1800 * time.Millisecond) // the lease has ended, in this window
	n := f.admitted("k", second)
	assert.LessOrEqual(t, l.Granted+n, second.Limit, "window [1 s, 2 s) admitted %d by takes beside the lease of 100 open in it until 1.6 s", n)
	f.at(3500 * time.Millisecond)
	assert.Equal(t, second.Limit, f.admitted("k", second), "after the lease")
}
