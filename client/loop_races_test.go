package client

// Decisions racing the settle loop: each test steps in at the moment the
// race needs (a driven clock, a hook at a clock read, a gate holding a
// call), and failed on the code before its fix. Most were found by an
// adversarial review of the decisions' races with the loop.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// bigRules is a rules file of one rule, "big:*", of a billion tokens a
// second: its limit never binds.
const bigRules = `
rules:
  - {name: big, match: "big:*", limit: 1000000000, period: 1s, burst: 1000000000, lease_ttl: 2s}
`

// bigClient starts a client on clk, leasing from the first decision (with
// a first batch of initialBatch), to a lease server of bigRules.
func bigClient(t *testing.T, clk clock, initialBatch int64) *Client {
	t.Helper()
	srv := leasetest.Start(t, bigRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	return clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: initialBatch}, clk)
}

// condClock is a testClock whose nanos runs hook, while armed, at every
// read by any goroutine (not re-entered) until hook returns true: a test
// steps in at the first clock read after a condition holds.
type condClock struct {
	*testClock
	hook atomic.Pointer[func() bool]
	in   atomic.Bool
}

func (k *condClock) nanos() int64 {
	if h := k.hook.Load(); h != nil && k.in.CompareAndSwap(false, true) {
		if (*h)() {
			k.hook.CompareAndSwap(h, nil)
		}
		k.in.Store(false)
	}
	return k.testClock.nanos()
}

// holdWant holds the lease calls that ask for tokens while hold is set.
func holdWant(hold *atomic.Bool) func(*protocol.LeaseRequest) bool {
	return func(req *protocol.LeaseRequest) bool {
		if !hold.Load() {
			return false
		}
		for _, e := range req.Leases {
			if e.Want > 0 {
				return true
			}
		}
		return false
	}
}

// renewalHeld starts a client on clk (tc: the testClock under it) through
// a gate to a lease server of sRules, leases "s:k", spends its lease out
// and moves the clock a tick: the loop settles the lease and asks for the
// next, and the gate holds that call (hold is set; g.open answers it).
func renewalHeld(t *testing.T, clk clock, tc *testClock) (*Client, *keyState, *gate, *atomic.Bool) {
	t.Helper()
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	hold := new(atomic.Bool)
	g := newGate(t, srv.URL(), holdWant(hold))
	c := clockedClient(t, Config{Servers: []string{g.url}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ks, l := leaseOnClock(t, c, "s:k")
	hold.Store(true)
	for l.left() > 0 {
		require.True(t, c.Allow(context.Background(), "s:k").Allowed)
	}
	tc.advance(t, 20*time.Millisecond)
	select {
	case <-g.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal asked for")
	}
	return c, ks, g, hold
}

// TestLateLeaseNotSpentPastDeadline: a lease whose answer arrives after
// its client deadline (sent + TTL: a slow call, retries) is dead on
// arrival. Before, applyOne installed it as it was, not strict, and
// decisions spent from it without reading the clock (one spend in eight
// does) until the loop's next scan closed it: a decision stepping in at
// the loop's first clock read after the install spent 5 tokens of a lease
// 100 ms past its deadline, which the server may have expired already.
// Now it is not installed, and the loop asks again.
func TestLateLeaseNotSpentPastDeadline(t *testing.T) {
	clk := &condClock{testClock: newTestClock()}
	c, ks, g, _ := renewalHeld(t, clk, clk.testClock)
	sent := clk.nanos()
	// The answer comes after the lease's deadline, sent + 2 s.
	clk.move(2100 * time.Millisecond)

	var spent atomic.Int64
	var fired atomic.Bool
	var installed *lease
	hook := func() bool {
		a := ks.active.Load()
		if a == nil { // the spent-out lease was closed to ask for the next
			return false
		}
		installed = a
		if a.deadline > clk.nanos() {
			fired.Store(true)
			return true // a lease asked for again after the late one: live
		}
		for range 16 {
			if !a.spend(1, c) { // a decision's first step (Client.decide, Limiter.Allow)
				break
			}
			spent.Add(1)
		}
		fired.Store(true)
		return true
	}
	clk.hook.Store(&hook)
	answers := ks.answers.Load()
	// Granted 13 (not a multiple of 8, so the sampled clock read does
	// not come at the first spend), a TTL of 2 s, as the server would.
	g.open(func(w http.ResponseWriter, _ *http.Request, body []byte) {
		var req protocol.LeaseRequest
		_ = json.Unmarshal(body, &req)
		var out protocol.LeaseResponse
		for _, e := range req.Leases {
			r := protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Limit: 1000, PeriodMillis: 1000, Burst: 1000, Remaining: 900, SafeRate: 1000}
			if e.Want > 0 {
				r.LeaseID, r.Granted, r.TTLMillis = "late", min(e.Want, 13), 2000
			}
			out.Leases = append(out.Leases, r)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	// The late answer is not installed: the loop asks again, at its next
	// tick, and installs a live lease (before the fix: the late one, spent
	// from past its deadline).
	require.Eventually(t, func() bool { return ks.answers.Load() > answers }, 5*time.Second, time.Millisecond, "the late answer applied")
	for until := time.Now().Add(5 * time.Second); !fired.Load(); {
		require.True(t, time.Now().Before(until), "no lease installed after the late answer")
		clk.advance(t, 10*time.Millisecond)
		time.Sleep(time.Millisecond) // the call asked again is answered on real time
	}
	assert.Zero(t, spent.Load(), "tokens spent from a lease %v past its client deadline (sent at %v)", time.Duration(clk.nanos()-installed.deadline), time.Duration(sent))
	assert.Greater(t, installed.deadline, clk.nanos(), "the lease installed is live")
}

// TestDenyForNotShortenedByLeaseAnswer: DenyFor extends the denial, never
// shortens it; nor does a lease answer. Before, applyOne stored denyUntil
// from the answer: a renewal in flight when DenyFor was called, answered
// with nothing granted and a retry_after of 20 ms, cut a DenyFor of a
// minute to 20 ms; the decision after it cleared paused (a DenyFor "that
// has run out"), the loop asked again, and the lease it got was not
// paused: the key was served from it 100 ms into the minute. The DenyFor's
// end is now kept apart (keyState.denyForUntil), and a server's denial is
// never set before it (setDenial).
func TestDenyForNotShortenedByLeaseAnswer(t *testing.T) {
	clk := newTestClock()
	c, ks, g, hold := renewalHeld(t, clk, clk)
	ctx := context.Background()
	// An upstream said 429, Retry-After one minute.
	c.DenyFor(time.Minute, "s:k")
	until := clk.nanos() + int64(time.Minute)

	answers := ks.answers.Load()
	hold.Store(false) // later calls pass to the server
	g.open(entryAnswer(protocol.LeaseResult{TTLMillis: 2000, RetryAfterMillis: 20, Limit: 1000, PeriodMillis: 1000, Burst: 1000}))
	require.Eventually(t, func() bool { return ks.answers.Load() != answers }, 5*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, ks.denyUntil.Load(), until, "DenyFor's minute was cut to %v", time.Duration(ks.denyUntil.Load()-clk.nanos()))

	// 100 ms into the minute.
	clk.move(100 * time.Millisecond)
	done := make(chan Decision, 1)
	go func() { done <- c.Allow(ctx, "s:k") }()
	var d Decision
	select {
	case d = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no decision")
	}
	if !d.Allowed {
		// Denied this time: the loop asks meanwhile; try again after a tick.
		clk.advance(t, 20*time.Millisecond)
		clk.advance(t, 0)
		d = c.Allow(ctx, "s:k")
	}
	assert.False(t, d.Allowed, "allowed %v into a DenyFor of a minute: %+v", time.Duration(clk.nanos()-(until-int64(time.Minute))), d)
}

// TestRenewalAfterFailedSpendServes: the window TestRenewalSwapDeniesNothing's
// fix left open. A decision finds the key's lease spent out; spendAgain
// finds it still active and gives up; the loop then installs the renewal
// and closes the spent lease (here at the decision's next clock read, in
// decide right after spendAgain). Before, decide then read the active
// lease again for its "ran out?" test, took the renewal, full, for a live
// lease with fewer tokens than the decision wanted, and denied it
// (SourceLease, RetryAfter a tick) on a bucket of a billion.
func TestRenewalAfterFailedSpendServes(t *testing.T) {
	clk := &hookClock{testClock: newTestClock()}
	c := bigClient(t, clk, 40)
	ctx := context.Background()
	ks, old := leaseOnClock(t, c, "big:k")
	for old.left() > 0 {
		require.True(t, c.Allow(ctx, "big:k").Allowed)
	}

	decideAcrossRenewal(t, c, clk, ks, old)
}

// decideAcrossRenewal makes a decision on ks ("big:k") during which the
// settle loop's install of a renewal of old (a full lease of 500 tokens,
// in the other slot) happens, as the loop makes it (setActive, then
// closeLease), at the decision's first clock read; and requires that the
// decision was allowed from the renewal.
func decideAcrossRenewal(t *testing.T, c *Client, clk *hookClock, ks *keyState, old *lease) {
	t.Helper()
	renewal := &lease{id: "renewal", slot: 1 - old.slot, granted: 500, halfway: old.halfway, deadline: old.deadline}
	renewal.remaining.Store(500)
	swap := func() {
		if prev := c.setActive(ks, renewal); prev != nil {
			ks.closeLease(prev)
		}
	}
	clk.onNanos.Store(&swap)
	d := c.Allow(context.Background(), "big:k")
	require.Nil(t, clk.onNanos.Load(), "the decision read the clock")
	assert.True(t, d.Allowed, "denied with a full renewal installed: %+v", d)
	assert.Equal(t, SourceLease, d.Source)
	assert.Equal(t, int64(499), renewal.left(), "spent from the renewal")
}

// TestOversizeSpendDeniesNoSmallOne: lease.spend subtracted first and
// added back when the result was negative, so a spend of more than the
// lease held (an AllowN of a large cost) drove remaining below zero for a
// moment, and a concurrent Allow(1) then failed on a lease with hundreds
// of thousands of tokens left: decide denied it (the lease live, not run
// out: SourceLease, RetryAfter a tick). The loop is idle (driven clock):
// every denial here is a lost admission. spend now checks before it
// subtracts.
func TestOversizeSpendDeniesNoSmallOne(t *testing.T) {
	clk := newTestClock()
	c := bigClient(t, clk, 1_000_000)
	ctx := context.Background()
	_, l := leaseOnClock(t, c, "big:k")
	require.Greater(t, l.left(), int64(100_000))

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // AllowN of more than the lease holds: always denied
		defer wg.Done()
		for !stop.Load() {
			c.AllowN(ctx, protocol.MaxCount, "big:k")
		}
	}()
	denied, tried := 0, 0
	var last Decision
	deadline := time.Now().Add(3 * time.Second)
	for denied == 0 && tried < 100_000 && time.Now().Before(deadline) {
		tried++
		if d := c.Allow(ctx, "big:k"); !d.Allowed {
			denied++
			last = d
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Greater(t, l.left(), int64(0))
	assert.Zero(t, denied, "Allow denied on a lease with %d tokens left (after %d tries): %+v", l.left(), tried, last)
}

// hookClock is a testClock whose nanos runs onNanos once, when armed: a
// test steps in at the moment a decision reads the clock.
type hookClock struct {
	*testClock
	onNanos atomic.Pointer[func()]
}

func (k *hookClock) nanos() int64 {
	if f := k.onNanos.Swap(nil); f != nil {
		(*f)()
	}
	return k.testClock.nanos()
}

// TestRenewalSwapDeniesNothing: the settle loop installs a key's renewal,
// then closes the lease it replaced, while decisions spend from it. A
// decision that read the old lease before the swap and spent from it
// after the close found it closed, and took the new lease, full, for one
// not run out: it was denied (SourceLease, RetryAfter a tick) on a bucket
// of a billion tokens. Found by make bench: one decision denied in 73 M in
// the closed-loop hot-path run, on a lease installed a moment before with
// 27,479,776 of its 27,480,019 tokens left. Here the swap is made at the
// decision's clock read inside the spend of a strict lease (one past its
// late renewal point), as the loop does it: setActive, then closeLease.
func TestRenewalSwapDeniesNothing(t *testing.T) {
	clk := &hookClock{testClock: newTestClock()}
	c := bigClient(t, clk, 1000)
	ctx := context.Background()
	ks, old := leaseOnClock(t, c, "big:k")
	require.Equal(t, SourceLease, c.Allow(ctx, "big:k").Source)

	// The renewal is installed when the decision reads the clock in
	// old.spend (old is strict).
	old.strict.Store(true)
	decideAcrossRenewal(t, c, clk, ks, old)
}

// TestDemotingKeyDecidedDirectly: a leased key whose lease was not spent
// from by half its TTL is demoted: the loop returns the lease (returnAll
// clears it) and sets leasing false only at its next plan after the
// answer. Before, a decision in between found leasing set, a deadline and
// no lease, "its lease ran out", and was denied (or, roomy, waited for the
// loop's answer, the return's, and was then denied), though the key was on
// its way back to direct decisions and its bucket was full: an idle key's
// first request after half a TTL was denied. Now it is taken directly.
func TestDemotingKeyDecidedDirectly(t *testing.T) {
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	var hold atomic.Bool
	g := newGate(t, srv.URL(), func(req *protocol.LeaseRequest) bool {
		return hold.Load() && len(req.Leases) > 0 && req.Leases[0].Want == 0 && req.Leases[0].LeaseID != ""
	})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{g.url}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ctx := context.Background()
	ks, _ := leaseOnClock(t, c, "s:k")

	hold.Store(true)
	clk.advance(t, time.Second) // half its TTL, unspent: demoted, returned (held)
	select {
	case <-g.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle lease was not returned")
	}
	require.True(t, ks.leasing.Load())
	require.Nil(t, ks.active.Load())

	done := make(chan Decision, 1)
	go func() { done <- c.Allow(ctx, "s:k") }()
	var d Decision
	select {
	case d = <-done:
	case <-time.After(300 * time.Millisecond):
		// Roomy: it waits for the loop's answer, the return's.
		g.open(g.pass)
		select {
		case d = <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the decision still waits after the return was answered")
		}
	}
	g.open(g.pass)
	assert.True(t, d.Allowed, "the first request on an idle key being demoted, its bucket full, was denied: %+v", d)
	assert.Equal(t, SourceDirect, d.Source)
}

// TestEvictedKeyLeasesReturned: makeRoom evicts a key (MaxKeys) whose
// renewal is in flight in the other call: its lease is closed and it is
// marked forget, to be returned at its next plan. Before, the renewal's
// answer came first and applyOne forgot the key at once (forgetKey drops
// it from the loop's set), froze the new grant in its slot, and returned:
// neither the evicted lease nor the new one was ever returned, and the
// server held both (26 tokens here) as outstanding until they expired.
func TestEvictedKeyLeasesReturned(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: store})
	var hold atomic.Bool
	g := newGate(t, srv.URL(), func(req *protocol.LeaseRequest) bool {
		return hold.Load() && len(req.Leases) > 0 && req.Leases[0].Key == "s:a" && req.Leases[0].Want > 0
	})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{g.url}, LeaseMinTokens: 1, InitialBatch: 50, MaxKeys: 1}, clk)
	ctx := context.Background()
	outstanding := func() int64 { return sState(t, store, "s:a").Outstanding }
	a, la := leaseOnClock(t, c, "s:a")
	require.True(t, c.Allow(ctx, "s:a").Allowed) // spent from: not idle

	// At its late renewal point (a roomy key) the loop asks for a's
	// renewal: held.
	hold.Store(true)
	clk.advance(t, time.Duration(c.lateAt(la)-clk.nanos()))
	select {
	case <-g.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal of s:a asked for")
	}
	// s:b is promoted; its first lease, in the other call, evicts s:a.
	require.True(t, c.Allow(ctx, "s:b").Allowed)
	require.Eventually(t, func() bool { return a.active.Load() == nil && c.state("s:b").active.Load() != nil }, 5*time.Second, time.Millisecond, "s:a evicted")
	// s:a's renewal is answered now.
	g.open(g.pass)
	require.Eventually(t, func() bool { return a.dead.Load() }, 5*time.Second, time.Millisecond, "s:a forgotten")
	for range 20 {
		clk.advance(t, 20*time.Millisecond)
	}
	// Returns are answered at once; give them real time too.
	time.Sleep(100 * time.Millisecond)
	clk.advance(t, 20*time.Millisecond)
	assert.Zero(t, outstanding(), "s:a's evicted lease and its renewal are still outstanding at the server, never returned")
}

// TestCostBeyondBatchTakenDirectly: a leased key's batches are at most a
// quarter of its bucket (batchOf). A decision for more tokens than its
// batch holds (AllowN(300) on a bucket of 1,000) is taken directly. Before,
// no lease served it and decide denied it as one its lease ran short for
// (SourceLease, a tick), for as long as the key stayed leased: 20 of 20
// denied in 400 ms while the bucket held the tokens.
func TestCostBeyondBatchTakenDirectly(t *testing.T) {
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ctx := context.Background()
	ks, _ := leaseOnClock(t, c, "s:k")

	// The bucket (1,000) holds three takes of 300 beside the key's lease;
	// then the server denies them: a denial by the lease would say
	// SourceLease.
	allowed := 0
	for range 20 {
		d := c.AllowN(ctx, 300, "s:k")
		if d.Allowed {
			allowed++
		}
		assert.NotEqual(t, SourceLease, d.Source, "denied by the lease: %+v", d)
		clk.advance(t, 20*time.Millisecond)
		clk.advance(t, 0)
	}
	require.True(t, ks.leasing.Load(), "still leased")
	assert.GreaterOrEqual(t, allowed, 3, "AllowN(300) on a leased key (batches of %d at most), the bucket holding 1,000", c.batchOf(ks, 1e12, time.Hour))
}

// answerTakes answers req's takes as a lying server: each allowed when
// allow(its cost) holds, else denied with a retry_after of retryMillis;
// every key's result carries rule's fields.
func answerTakes(req *protocol.LeaseRequest, allow func(cost int64) bool, retryMillis int64, rule protocol.CheckResult) []protocol.CheckResponse {
	var out []protocol.CheckResponse
	for _, tk := range req.Takes {
		cost := int64(1)
		if tk.Cost != nil {
			cost = *tk.Cost
		}
		cr := protocol.CheckResponse{Allowed: allow(cost)}
		if !cr.Allowed {
			cr.RetryAfterMillis = retryMillis
		}
		for _, k := range tk.Keys {
			kr := rule
			kr.Key, kr.Allowed, kr.RetryAfterMillis = k, cr.Allowed, cr.RetryAfterMillis
			cr.Keys = append(cr.Keys, kr)
		}
		out = append(out, cr)
	}
	return out
}

// leasedFrom starts a client on a driven clock to the lying server at url,
// leasing from the first decision (first batches of 10), and leases "s:k"
// (leaseOnClock).
func leasedFrom(t *testing.T, url string) (*Client, *keyState, *lease, *testClock) {
	t.Helper()
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{url}, LeaseMinTokens: 1, InitialBatch: 10}, clk)
	ks, l := leaseOnClock(t, c, "s:k")
	return c, ks, l, clk
}

// deferredBatch starts a client on a driven clock with a lying server
// whose bucket is saturated: its first take is allowed (the key is
// promoted), the others denied; its first lease is granted, and every
// other one deferred by delay ms (min(want, 10) tokens, a TTL of ttl ms). The
// key "s:k" spends its first lease out, and the loop asks for the next,
// deferred: it returns once that batch is active, paused. leaseCalls
// counts the lease entries that asked for tokens.
func deferredBatch(t *testing.T, delay, ttl int64) (c *Client, ks *keyState, clk *testClock, leaseCalls *atomic.Int64) {
	t.Helper()
	leaseCalls = new(atomic.Int64)
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		var out protocol.LeaseResponse
		out.Takes = answerTakes(req, func(int64) bool { return leaseCalls.Load() == 0 }, 100,
			protocol.CheckResult{Limit: 1000, PeriodMillis: 1000, Burst: 1000, LeaseTTLMillis: ttl})
		for _, e := range req.Leases {
			r := protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Limit: 1000, PeriodMillis: 1000, Burst: 1000, SafeRate: 100}
			if e.Want > 0 {
				n := leaseCalls.Add(1)
				r.LeaseID, r.Granted, r.TTLMillis = fmt.Sprintf("L%d", n), min(e.Want, 10), ttl
				if n > 1 {
					r.DelayMillis = delay
				}
			}
			out.Leases = append(out.Leases, r)
		}
		return http.StatusOK, out
	})
	c, ks, l1, clk := leasedFrom(t, url)
	for l1.left() > 0 {
		require.True(t, c.Allow(context.Background(), "s:k").Allowed)
	}
	clk.advance(t, 20*time.Millisecond) // settle and ask, deferrable: deferred
	require.Eventually(t, func() bool { l := ks.active.Load(); return l != nil && l != l1 }, 5*time.Second, time.Millisecond)
	require.Greater(t, ks.active.Load().pausedUntil.Load(), clk.nanos(), "a deferred batch")
	return c, ks, clk, leaseCalls
}

// TestDeferredBatchNotIdle: a key at a saturated bucket asks for its next
// batch accepting a deferral; the server grants it with a wait of 990 ms
// (within max_delay and half the TTL). The batch may be spent from sent +
// 990 ms; before, its "unspent by half its TTL" check counted from sent:
// at sent + 1 s, spendable for 10 ms and unspent, it was returned as idle
// and the key demoted, its turn at the saturated bucket given up, and the
// decision 1 ms later denied.
func TestDeferredBatchNotIdle(t *testing.T) {
	c, ks, clk, _ := deferredBatch(t, 990, 2000)
	ctx := context.Background()
	next := ks.active.Load()
	d := c.Allow(ctx, "s:k")
	require.False(t, d.Allowed, "denied until the deferral ends")

	// The deferral ends at sent + 990 ms; the loop's tick at sent + 1 s.
	clk.move(time.Duration(next.pausedUntil.Load()-clk.nanos()) + 5*time.Millisecond)
	// (One Allow here, a spend in those 10 ms, and the batch is kept.)
	clk.advance(t, time.Duration(next.halfway-clk.nanos()))
	clk.advance(t, 0)
	d = c.Allow(ctx, "s:k")
	assert.True(t, ks.active.Load() == next, "the deferred batch, spendable for 10 ms, was returned as idle (active lease now %p, want %p)", ks.active.Load(), next)
	assert.True(t, d.Allowed, "the decision after the deferral was denied: %+v", d)
}

// TestShapedWaitBeyondLeaseNoBusyLoop: a leased leaky_bucket key's lease
// holds at most a quarter of its queue in slots (10 here). WaitN(15) is
// never served by it. Before, waitShaped found the slots did not fit and
// fell to decide, which denied it with RetryAfter max(due, 1) = 1 ns when
// the next slot was due; WaitN slept 1 ns and asked again: a busy loop,
// 37,791 denials in 300 ms, until its context ended. It is now taken
// directly (the queue holds 40), as TestCostBeyondBatchTakenDirectly's
// decision is, and a lease's due slot that the decision's slots do not
// fit is judged as a lease run out (a tick), not 1 ns.
func TestShapedWaitBeyondLeaseNoBusyLoop(t *testing.T) {
	srv := leasetest.Start(t, shapeRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 10}, nil)
	require.True(t, c.Allow(context.Background(), "lb:a").Allowed)
	ks := c.state("lb:a")
	require.Eventually(t, func() bool { return ks.active.Load() != nil }, 5*time.Second, time.Millisecond)
	require.NotNil(t, ks.active.Load().shape)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := c.waitDenials.Load()
	err := c.WaitN(ctx, 15, "lb:a")
	denials := c.waitDenials.Load() - before
	assert.NoError(t, err, "WaitN(15) on a queue of 40")
	assert.Less(t, denials, int64(100), "WaitN(15) was denied %d times in 300 ms: a busy loop", denials)
}

// slowRules: 100 a second, a bucket of 1,000 (it fills in 10 s): the
// server's real-time refill during a test is small beside the numbers.
const slowRules = `
rules:
  - {name: s, match: "s:*", limit: 100, period: 1s, burst: 1000, lease_ttl: 2s}
`

// TestBeyondLeasesDenialSparesLease: a decision for more tokens than the
// key's batch (beyondLeases) is taken directly; the server denies it (the
// bucket holds ~250, not 400) with a retry_after of ~1.5 s. Before,
// applyDirect set the key's local denial from it: the leased key's small
// decisions, which its next batch (50) would serve, were denied
// (SourceRetryAfter) once the lease ran out, and plan did not renew it
// while the key was denied: one oversized request starved the key's
// leased traffic for 1.5 s (found by review of TestCostBeyondBatchTakenDirectly's fix).
func TestBeyondLeasesDenialSparesLease(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, slowRules, leasetest.Options{Store: store})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ctx := context.Background()
	ks, l := leaseOnClock(t, c, "s:k")
	require.Less(t, l.granted, int64(250))

	// Another process takes what leaves the bucket about 250.
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Second, Burst: 1000, LeaseTTL: 2 * time.Second}
	res, err := store.Take(ctx, []leases.TakeOp{{Key: "s:k", Bucket: b, Cost: 1000 - 1 - l.granted - 250}})
	require.NoError(t, err)
	require.True(t, res[0].Taken)

	// One request for 400: beyond the batch, taken directly, denied.
	d := c.AllowN(ctx, 400, "s:k")
	require.False(t, d.Allowed)
	require.Equal(t, SourceDirect, d.Source)
	t.Logf("AllowN(400) denied, RetryAfter %v; key denied locally for %v", d.RetryAfter, time.Duration(ks.denyUntil.Load()-clk.nanos()))

	// The key's leased traffic of one token a request goes on.
	for l.left() > 0 {
		require.True(t, c.Allow(ctx, "s:k").Allowed)
	}
	var last Decision
	for range 10 { // 200 ms of the client's clock, ten ticks
		clk.advance(t, 20*time.Millisecond)
		clk.advance(t, 0)
		time.Sleep(5 * time.Millisecond) // a renewal is answered on real time
		if last = c.Allow(ctx, "s:k"); last.Allowed {
			break
		}
	}
	st, err := store.State(ctx, "s:k", b)
	require.NoError(t, err)
	assert.True(t, last.Allowed, "Allow(1) on a leased key still denied 200 ms after one AllowN(400) was denied, the bucket holding %.0f: %+v", st.Level, last)
}

// TestDenyForSurvivesForgetting: DenyFor's end lived on the key's state,
// and a key its callers leave alone while it is denied (they obey the
// upstream's 429) is forgotten: a direct key by sweepDirect after
// IdleTimeout, a leased one by plan (idle) or evict (MaxKeys: the least
// recently active first). Before, its next decision made a fresh state
// and was allowed 10 s into a DenyFor of two minutes; the client now
// keeps the DenyFor ends apart (Client.denyFor).
func TestDenyForSurvivesForgetting(t *testing.T) {
	for _, leased := range []bool{false, true} {
		name := "direct"
		if leased {
			name = "leased"
		}
		t.Run(name, func(t *testing.T) {
			srv := leasetest.Start(t, sRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
			clk := newTestClock()
			minTokens := int64(1000) // direct: never promoted
			if leased {
				minTokens = 1
			}
			c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: minTokens, InitialBatch: 50, IdleTimeout: 3 * time.Second}, clk)
			ctx := context.Background()
			if leased {
				leaseOnClock(t, c, "s:k")
			} else {
				require.True(t, c.Allow(ctx, "s:k").Allowed)
				require.False(t, c.state("s:k").leasing.Load())
			}
			// An upstream said 429, Retry-After two minutes; the callers
			// obey it.
			c.DenyFor(2*time.Minute, "s:k")
			start := clk.nanos()
			for range 10 {
				clk.advance(t, time.Second)
				time.Sleep(2 * time.Millisecond) // a return is answered on real time
				clk.advance(t, 0)
			}
			d := c.Allow(ctx, "s:k")
			assert.False(t, d.Allowed, "allowed %v into a DenyFor of two minutes: %+v", time.Duration(clk.nanos()-start), d)
		})
	}
}

// TestIdleDeferredKeyDemoted: at a saturated bucket the server defers a
// key's batch (here by 100 ms, and by half the TTL, its cap). With
// TestDeferredBatchNotIdle's fix alone, shouldDemote counted a batch's
// idleness from max(halfway, pausedUntil + TTL/2), and plan renewed a
// bound key's lease at halfway, so a batch nobody spent from was never
// found idle: each was replaced by the next deferred one, and a key whose
// demand stopped asked for 9 or 10 batches in 10 s, its turn at the
// saturated bucket each time, until IdleTimeout forgot it (found by
// review). Now a bound key's unspent lease is not renewed, and it is
// judged idle by its late renewal point at the latest.
func TestIdleDeferredKeyDemoted(t *testing.T) {
	for _, delay := range []int64{100, 1000} {
		t.Run(fmt.Sprintf("deferred %d ms", delay), func(t *testing.T) { idleDeferredKeyDemoted(t, delay) })
	}
}

func idleDeferredKeyDemoted(t *testing.T, delay int64) {
	_, ks, clk, leaseCalls := deferredBatch(t, delay, 2000)
	asked := leaseCalls.Load()

	// The demand is gone: nobody decides on the key again. Ten seconds.
	for range 500 {
		clk.advance(t, 20*time.Millisecond)
		time.Sleep(200 * time.Microsecond) // calls are answered on real time
	}
	clk.advance(t, 0)
	more := leaseCalls.Load() - asked
	assert.LessOrEqual(t, more, int64(1), "an idle key asked for %d more batches in 10 s (still leased: %v)", more, ks.leasing.Load())
}

// TestDeferredBatchLongDeferralNotIdle: the server defers a saturated key's
// batch by half its TTL (the server's cap). With TestIdleDeferredKeyDemoted's
// first fix, shouldDemote judged it idle by min(pausedUntil + TTL/2,
// lateAt) (found by a third review):
//
//   - at a TTL of 2 s, deferred 1 s, at sent + 1.5 s: a decision 600 ms
//     after the batch became spendable found it returned, the key demoted,
//     its turn at the saturated bucket given up, and was denied;
//   - at a TTL of 200 ms (ticks of 10 ms), deferred 100 ms, the late
//     renewal point is 120 ms after the ask: the batch was returned two
//     ticks after it became spendable, and a decision 30 ms after the
//     deferral ended denied.
//
// It is judged by frozenMargin before its deadline now.
func TestDeferredBatchLongDeferralNotIdle(t *testing.T) {
	for _, tt := range []struct {
		delay, ttl  int64 // ms
		after, tick time.Duration
	}{
		{1000, 2000, 600 * time.Millisecond, 20 * time.Millisecond},
		{100, 200, 30 * time.Millisecond, 10 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("TTL %d ms", tt.ttl), func(t *testing.T) {
			c, ks, clk, _ := deferredBatch(t, tt.delay, tt.ttl)
			ctx := context.Background()
			next := ks.active.Load()
			require.False(t, c.Allow(ctx, "s:k").Allowed, "denied until the deferral ends")
			spendable := next.pausedUntil.Load()
			for clk.nanos() < spendable+int64(tt.after) {
				clk.advance(t, tt.tick)
			}
			clk.advance(t, 0)
			require.Less(t, clk.nanos(), next.deadline)
			d := c.Allow(ctx, "s:k")
			assert.True(t, ks.active.Load() == next, "the deferred batch, spendable for %v of its %v, was returned as idle (demoting %v)",
				time.Duration(clk.nanos()-spendable), time.Duration(next.deadline-spendable), ks.leaving.Load())
			assert.True(t, d.Allowed, "the decision %v after the deferral ended, %v before the batch's deadline, was denied: %+v",
				time.Duration(clk.nanos()-spendable), time.Duration(next.deadline-clk.nanos()), d)
		})
	}
}

// TestBeyondLeasesWaitNSleepsRetryAfter: WaitN(100) on a leased key whose
// batches hold 10 is taken directly (beyondLeases); the server denies it,
// retry_after 1.5 s. With TestBeyondLeasesDenialSparesLease's fix alone
// the denial was kept nowhere, and WaitN, which waits for the RetryAfter
// or the key's next change, was woken by every lease answer of the key
// and sent the take again: 51 takes in 1 s (found by a third review).
// Takes of at least that cost are denied locally until then now
// (keyState.beyondUntil).
func TestBeyondLeasesWaitNSleepsRetryAfter(t *testing.T) {
	var bigTakes, leaseCalls atomic.Int64
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		var out protocol.LeaseResponse
		out.Takes = answerTakes(req, func(cost int64) bool {
			if cost > 10 {
				bigTakes.Add(1)
				return false
			}
			return true
		}, 1500, protocol.CheckResult{Limit: 100, PeriodMillis: 1000, Burst: 1000, LeaseTTLMillis: 2000, Remaining: 5})
		for _, e := range req.Leases {
			r := protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Limit: 100, PeriodMillis: 1000, Burst: 1000, SafeRate: 100, Remaining: 5}
			if e.Want > 0 {
				n := leaseCalls.Add(1)
				r.LeaseID, r.Granted, r.TTLMillis = fmt.Sprintf("L%d", n), min(e.Want, 10), 2000
			}
			out.Leases = append(out.Leases, r)
		}
		return http.StatusOK, out
	})
	c, ks, _, clk := leasedFrom(t, url)
	ctx := context.Background()
	require.Equal(t, int64(10), ks.lastGrant.Load())

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.WaitN(wctx, 100, "s:k") }()
	require.Eventually(t, func() bool { return bigTakes.Load() == 1 }, 5*time.Second, time.Millisecond)

	// One second of the client's clock (less than the RetryAfter): the
	// key's small requests spend each batch out; the loop renews it.
	for range 50 {
		for a := ks.active.Load(); a != nil && a.left() > 0; {
			if !c.Allow(ctx, "s:k").Allowed {
				break
			}
		}
		clk.advance(t, 20*time.Millisecond)
		time.Sleep(2 * time.Millisecond) // the renewal is answered on real time
	}
	cancel()
	<-done
	t.Logf("lease calls %d, Stats %+v", leaseCalls.Load(), c.Stats())
	assert.LessOrEqual(t, bigTakes.Load(), int64(2), "WaitN(100) sent %d direct takes in 1 s of a RetryAfter of 1.5 s", bigTakes.Load())
}

// TestDeferredBatchSpentFromAskedAtSpendOut: at a saturated bucket a bound
// key's batches are deferred (1 s, half the TTL), so each becomes
// spendable at its halfway point. Before, its first spend past halfway
// made plan renew it at once, by a request that accepted no deferral; the
// server refused it with a retry_after (900 ms), which became the key's
// denial, and once the batch was spent out the loop did not ask for the
// next one (deferrable) while the key was denied: each batch's turn came
// 900 ms late (found by a third review). A bound key is not renewed early
// now: spent out or near its deadline, it settles and asks in one entry
// that accepts a deferral.
func TestDeferredBatchSpentFromAskedAtSpendOut(t *testing.T) {
	var leaseCalls, deferrable, refused atomic.Int64
	url, _ := lyingServer(t, func(req *protocol.LeaseRequest) (int, any) {
		var out protocol.LeaseResponse
		out.Takes = answerTakes(req, func(int64) bool { return leaseCalls.Load() == 0 }, 100,
			protocol.CheckResult{Limit: 1000, PeriodMillis: 1000, Burst: 1000, LeaseTTLMillis: 2000})
		for _, e := range req.Leases {
			r := protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Limit: 1000, PeriodMillis: 1000, Burst: 1000, SafeRate: 100, TTLMillis: 2000}
			if e.Want > 0 {
				switch {
				case leaseCalls.Load() == 0:
					n := leaseCalls.Add(1)
					r.LeaseID, r.Granted = fmt.Sprintf("L%d", n), min(e.Want, 10)
				case e.MaxDelayMillis > 0: // the level in debt: deferred
					n := leaseCalls.Add(1)
					deferrable.Add(1)
					r.LeaseID, r.Granted, r.DelayMillis = fmt.Sprintf("L%d", n), min(e.Want, 10), 1000
				default: // no deferral accepted: refused until the debt is paid
					refused.Add(1)
					r.RetryAfterMillis = 900
				}
			}
			out.Leases = append(out.Leases, r)
		}
		return http.StatusOK, out
	})
	c, ks, l1, clk := leasedFrom(t, url)
	ctx := context.Background()
	for l1.left() > 0 {
		require.True(t, c.Allow(ctx, "s:k").Allowed)
	}
	clk.advance(t, 20*time.Millisecond) // settle and ask, deferrable: deferred
	require.Eventually(t, func() bool { l := ks.active.Load(); return l != nil && l != l1 }, 5*time.Second, time.Millisecond)
	l2 := ks.active.Load()
	require.Equal(t, int64(1), deferrable.Load())

	// The deferral ends at its halfway point; the key's requests spend it.
	for clk.nanos() < l2.pausedUntil.Load() {
		clk.advance(t, 10*time.Millisecond)
	}
	require.True(t, c.Allow(ctx, "s:k").Allowed, "served by the deferred batch")
	clk.advance(t, 10*time.Millisecond) // plan sees it spent from past halfway
	time.Sleep(5 * time.Millisecond)    // answered on real time
	clk.advance(t, 0)
	for l2.left() > 0 {
		require.True(t, c.Allow(ctx, "s:k").Allowed)
	}
	spentOut := clk.nanos()
	// Spent out: the next batch is asked for, deferrable, within a few
	// ticks.
	for range 5 {
		clk.advance(t, 10*time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	clk.advance(t, 0)
	t.Logf("refused renewals %d; key denied for %v more", refused.Load(), time.Duration(ks.denyUntil.Load()-clk.nanos()))
	assert.Equal(t, int64(2), deferrable.Load(), "no batch asked for %v after the bound key's batch was spent out (a non-deferrable renewal at halfway refused %d times, the key denied until then)",
		time.Duration(clk.nanos()-spentOut), refused.Load())
}

// TestDenyForForeverDenies: DenyFor computed until = nanos() + d, which
// overflowed for a d near math.MaxInt64 ("deny until further notice"): the
// end was negative, and nothing was denied (found by a third review).
func TestDenyForForeverDenies(t *testing.T) {
	clk := newTestClock()
	c := bigClient(t, clk, 100)
	clk.move(time.Second)
	c.DenyFor(time.Duration(math.MaxInt64), "big:k")
	d := c.Allow(context.Background(), "big:k")
	assert.False(t, d.Allowed, "allowed after DenyFor(MaxInt64): %+v", d)
}

// TestBoundShortTTLServed: a bound key's deferred batch at a short lease
// TTL (70 ms, ticks of 10 ms: frozenMargin 40 ms), deferred by 30 ms
// (less than half its TTL, the server's cap). With a bound key settled
// near its end (TestDeferredBatchSpentFromAskedAtSpendOut's fix), its
// near-end point, deadline - frozenMargin, came at the tick the batch
// became spendable: it was settled unspent and asked for again, deferred
// again, and the key was allowed 0 of 100 decisions in a second (found by
// a fourth review). A batch is now near its end two ticks after it became
// spendable at the earliest. At a TTL of 60 ms and deferrals of 28 ms the
// batch became spendable two milliseconds before its halfway point, where
// shouldDemote judged it idle, unspent: the key was demoted at every
// batch and allowed 0 of 100 decisions. It is now judged idle two ticks
// after it became spendable at the earliest too.
func TestBoundShortTTLServed(t *testing.T) {
	for _, tc := range []struct{ delay, ttl int64 }{{30, 70}, {28, 60}, {20, 50}} {
		t.Run(fmt.Sprintf("TTL %d ms deferred %d ms", tc.ttl, tc.delay), func(t *testing.T) { boundShortTTLServed(t, tc.delay, tc.ttl) })
	}
}

func boundShortTTLServed(t *testing.T, delay, ttl int64) {
	c, ks, clk, leaseCalls := deferredBatch(t, delay, ttl)
	ctx := context.Background()
	next := ks.active.Load()
	spendable := next.pausedUntil.Load()
	for clk.nanos() < spendable {
		clk.advance(t, 10*time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	clk.advance(t, 0)
	d := c.Allow(ctx, "s:k")
	assert.True(t, ks.active.Load() == next, "the deferred batch was settled before it became spendable (deadline-frozenMargin %v before pausedUntil)",
		time.Duration(spendable-(next.deadline-c.frozenMargin())))
	assert.True(t, d.Allowed, "the decision at the deferred batch's spendable point was denied: %+v", d)

	// One second more of a hot key's demand: one decision a tick.
	asked := leaseCalls.Load()
	allowed := 0
	for range 100 {
		if c.Allow(ctx, "s:k").Allowed {
			allowed++
		}
		clk.advance(t, 10*time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("lease calls %d, Stats %+v", leaseCalls.Load()-asked, c.Stats())
	assert.Greater(t, allowed, 10, "a bound key with a %d ms TTL was allowed %d of 100 decisions in 1 s (batches of 10 deferred %d ms each: %d asked)", ttl, allowed, delay, leaseCalls.Load()-asked)
}

// TestDenyForReturnsLeaseItOutlasts: DenyFor pauses a leased key's lease,
// whose tokens, its docs say, are kept and returned at settle as usual.
// A DenyFor outlasting the lease was not settled at all: the loop renews
// no lease of a denied key, the callers' denied decisions kept its demand
// up so that it was not returned as idle either, and the lease expired at
// the server with all but one of its tokens unspent, counted as spent,
// lost to every process for a lease TTL (25 tokens outstanding at the
// server past the client's deadline). Now a lease that DenyFor pauses to
// within frozenMargin of its deadline is returned at once.
func TestDenyForReturnsLeaseItOutlasts(t *testing.T) {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	srv := leasetest.Start(t, sRules, leasetest.Options{Store: store})
	clk := newTestClock()
	c := clockedClient(t, Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1, InitialBatch: 50}, clk)
	ctx := context.Background()
	state := func() leases.BucketState { return sState(t, store, "s:k") }
	ks, l := leaseOnClock(t, c, "s:k")
	require.True(t, c.Allow(ctx, "s:k").Allowed) // one token spent from the lease
	require.Equal(t, l.granted, state().Outstanding)

	// An upstream said 429, Retry-After a minute; the callers keep asking
	// (and are denied) once a tick until the lease's deadline has passed.
	c.DenyFor(time.Minute, "s:k")
	for clk.nanos() <= l.deadline+int64(c.cfg.SettleInterval) {
		require.False(t, c.Allow(ctx, "s:k").Allowed)
		clk.advance(t, c.cfg.SettleInterval)
	}
	// The server runs on real time: its lease lives on (2 s) unless
	// returned. A return is answered on real time too.
	require.Eventually(t, func() bool {
		clk.advance(t, 0)
		return state().Outstanding == 0
	}, time.Second, 5*time.Millisecond, "the lease DenyFor outlasted was never returned: %d tokens outstanding at the server", state().Outstanding)
	assert.Zero(t, state().Leases)
	assert.Nil(t, ks.active.Load())
	assert.False(t, c.Allow(ctx, "s:k").Allowed, "DenyFor ended early")
}
