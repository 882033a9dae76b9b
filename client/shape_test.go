package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One slot every 10 ms, a queue of 40: a lease is at most 10 slots.
const shapeRules = `
rules:
  - {name: shape, match: "lb:*", algorithm: leaky_bucket, limit: 100, period: 1s, burst: 40, lease_ttl: 1s}
`

const slotT = 10 * time.Millisecond

// shapedClient starts a server over a memory store (on real time) and a
// client on a driven clock.
func shapedClient(t *testing.T, cfg Config) (*Client, *testClock) {
	t.Helper()
	srv := leasetest.Start(t, shapeRules, leasetest.Options{Store: leases.NewMemoryStore(leases.MemoryOptions{})})
	clk := newTestClock()
	cfg.Servers = []string{srv.URL()}
	return clockedClient(t, cfg, clk), clk
}

// shapedClientDriven is shapedClient with the store on the client's
// driven clock too: the server's slots then move only when the test moves
// the clock, however slowly the test runs.
func shapedClientDriven(t *testing.T, cfg Config) (*Client, *testClock) {
	t.Helper()
	clk := newTestClock()
	base := time.Now()
	store := leases.NewMemoryStore(leases.MemoryOptions{Now: func() time.Time { return base.Add(time.Duration(clk.ns.Load())) }})
	srv := leasetest.Start(t, shapeRules, leasetest.Options{Store: store})
	cfg.Servers = []string{srv.URL()}
	return clockedClient(t, cfg, clk), clk
}

// leaseShaped decides key once (direct, which promotes it) and gives the
// loop a tick, then waits for the key's lease, a schedule of slots.
func leaseShaped(t *testing.T, c *Client, clk *testClock, key string) *lease {
	t.Helper()
	require.True(t, c.Allow(context.Background(), key).Allowed)
	clk.advance(t, 0)
	ks := c.state(key)
	require.Eventually(t, func() bool { return ks.active.Load() != nil }, 5*time.Second, time.Millisecond)
	l := ks.active.Load()
	require.NotNil(t, l.shape, "a lease of a leaky_bucket rule is a schedule")
	return l
}

// TestShapedAllowSpacing: Allow on a leased leaky key admits only at its
// slots: requests asked every millisecond go ahead one every 10 ms.
func TestShapedAllowSpacing(t *testing.T) {
	c, clk := shapedClient(t, Config{LeaseMinTokens: 1, InitialBatch: 10})
	l := leaseShaped(t, c, clk, "lb:a")
	require.EqualValues(t, 10, l.granted)
	var admitted []int64
	for range 150 {
		for range 3 {
			if c.Allow(context.Background(), "lb:a").Allowed {
				admitted = append(admitted, clk.nanos())
			}
		}
		clk.move(time.Millisecond) // no tick: the loop renews nothing
	}
	require.NotEmpty(t, admitted)
	for i := 1; i < len(admitted); i++ {
		assert.GreaterOrEqual(t, admitted[i]-admitted[i-1], int64(slotT), "requests %d and %d", i-1, i)
	}
	assert.LessOrEqual(t, int64(len(admitted)), l.granted, "no more than the lease's slots")
	assert.GreaterOrEqual(t, len(admitted), int(l.granted)-2, "the slice's tolerance costs a slot or two")
	assert.LessOrEqual(t, admitted[len(admitted)-1]+int64(slotT), l.shape.end, "every request inside the slice")
	t.Logf("%d of %d slots used", len(admitted), l.granted)
}

// TestShapedWaitFIFO: waiters on a leased leaky key go ahead in the order
// they called, one per slot; a Wait whose slot is beyond MaxWait fails at
// once and takes no slot.
func TestShapedWaitFIFO(t *testing.T) {
	c, clk := shapedClient(t, Config{LeaseMinTokens: 1, InitialBatch: 10, MaxWait: 45 * time.Millisecond})
	l := leaseShaped(t, c, clk, "lb:w")
	ks := c.state("lb:w")
	// Take the first slot now, so that every waiter has a slot ahead.
	clk.move(time.Duration(l.shape.due(clk.nanos())))
	require.True(t, c.Allow(context.Background(), "lb:w").Allowed)
	start := clk.nanos()

	const waiters = 4
	done := make(chan int, waiters)
	for i := range waiters {
		go func() {
			assert.NoError(t, c.Wait(context.Background(), "lb:w"))
			done <- i
		}()
		// The next waiter calls once this one sleeps for its slot.
		require.Eventually(t, func() bool { return clk.waiting() == i+1 }, 5*time.Second, time.Millisecond)
	}
	// The fifth slot is 50 ms away, beyond MaxWait: it fails at once and
	// takes nothing.
	left := l.left()
	err := c.Wait(context.Background(), "lb:w")
	var rl *RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.ErrorIs(t, err, ErrRateLimited)
	assert.Equal(t, 5*slotT, rl.RetryAfter)
	assert.Equal(t, left, l.left(), "the failed Wait took no slot")
	// A context whose deadline comes first fails as well.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Wait(ctx, "lb:w"), ErrRateLimited)
	assert.Equal(t, left, l.left())

	for i := range waiters {
		clk.move(slotT - time.Millisecond)
		select {
		case w := <-done:
			t.Fatalf("waiter %d went ahead 1 ms before slot %d", w, i+1)
		default:
		}
		clk.move(time.Millisecond)
		select {
		case w := <-done:
			assert.Equal(t, i, w, "waiters go ahead in the order they called")
			assert.Equal(t, start+int64(i+1)*int64(slotT), clk.nanos())
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d never went ahead", i)
		}
	}
	// The slot the failed Wait did not take is the next one.
	clk.move(slotT)
	require.NoError(t, c.Wait(context.Background(), "lb:w"), "its slot is now")
	assert.Equal(t, l, ks.active.Load())
}

// TestShapedDirect: a leaky key decided directly is given a slot that may
// start later: Allow denies it (the slot is lost), Wait sleeps until it.
// The server's store runs on the test's clock: on real time, a test slowed
// down by a loaded machine found the next slot less than MaxWait away,
// and its last Wait waited on the driven clock for ever (a make test
// under load hung here for six minutes).
func TestShapedDirect(t *testing.T) {
	c, clk := shapedClientDriven(t, Config{LeaseMinTokens: 1000})
	ctx := context.Background()
	d := c.Allow(ctx, "lb:d")
	require.True(t, d.Allowed, "the queue is empty: the slot is now")
	require.Equal(t, SourceDirect, d.Source)
	d = c.Allow(ctx, "lb:d")
	assert.False(t, d.Allowed, "the next slot is ~10 ms away: Allow does not wait")
	assert.Equal(t, SourceDirect, d.Source)
	assert.Positive(t, d.RetryAfter)
	assert.LessOrEqual(t, d.RetryAfter, 2*slotT)

	errc := make(chan error, 1)
	go func() { errc <- c.Wait(ctx, "lb:d") }()
	require.Eventually(t, func() bool { return clk.waiting() == 1 }, 5*time.Second, time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("Wait returned before its slot: %v", err)
	default:
	}
	clk.move(3 * slotT)
	select {
	case err := <-errc:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait never returned")
	}

	// A slot beyond MaxWait: Wait fails at once.
	c2, _ := shapedClientDriven(t, Config{LeaseMinTokens: 1000, MaxWait: time.Millisecond})
	require.True(t, c2.Allow(ctx, "lb:e").Allowed)
	err := c2.Wait(ctx, "lb:e")
	require.True(t, errors.Is(err, ErrRateLimited), "%v", err)
}
