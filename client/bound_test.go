package client_test

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// admission is an allowed request: it was decided somewhere between the
// moments (since start) before and after its Allow call. A moment read
// after Allow alone can be late by however long the goroutine was
// descheduled, which under -race and a loaded machine makes admissions
// look bunched that were not.
type admission struct{ before, after time.Duration }

// hammer runs workers goroutines per client that ask for key as fast as a
// 50 µs pause allows, for d, and returns every allowed request, sorted by
// before.
func hammer(t *testing.T, clients []*client.Client, key string, workers int, d time.Duration) []admission {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	var mu sync.Mutex
	var all []admission
	var wg sync.WaitGroup
	for _, c := range clients {
		l := c.Limiter(key)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []admission
				for n := 0; n < 1_000_000 && time.Now().Before(deadline); n++ {
					before := time.Since(start)
					if l.Allow() {
						mine = append(mine, admission{before, time.Since(start)})
					}
					time.Sleep(50 * time.Microsecond)
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	slices.SortFunc(all, func(a, b admission) int { return cmp.Compare(a.before, b.before) })
	return all
}

// checkBound asserts that for every window length w, the requests surely
// allowed in any window [t, t+w] (decided after t began and before it
// ended) are at most burst + rate·w, plus one for rounding. Counting only
// those never charges a window with an admission it did not hold, so the
// check cannot fail a run that kept the bound, whatever the scheduling.
func checkBound(t *testing.T, at []admission, rate float64, burst int) {
	t.Helper()
	for _, w := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, time.Second, 10 * time.Second} {
		bound := float64(burst) + rate*w.Seconds() + 1
		worst := 0
		for i := range at {
			// Windows starting at an admission's before are the tightest.
			end := at[i].before + w
			n := 0
			for j := i; j < len(at) && at[j].before <= end; j++ {
				if at[j].after <= end {
					n++
				}
			}
			worst = max(worst, n)
		}
		assert.LessOrEqual(t, float64(worst), bound, "window %v", w)
		t.Logf("window %6v: worst %4d allowed, bound %.0f", w, worst, bound)
	}
}

const boundRules = `
rules:
  - {name: hot, match: "hot:*", limit: 200, period: 1s, burst: 20, lease_ttl: 500ms}
`

func testGlobalLimit(t *testing.T, store leases.Store) {
	srv := leasetest.Start(t, boundRules, leasetest.Options{Store: store})
	var clients []*client.Client
	for i := range 4 {
		clients = append(clients, newClient(t, client.Config{Servers: []string{srv.URL()}, ClientID: fmt.Sprint("bound-", i), Fallback: client.FallbackClosed}))
	}
	const d = 3 * time.Second
	at := hammer(t, clients, "hot:key", 4, d)
	checkBound(t, at, 200, 20)
	capacity := 20 + 200*d.Seconds()
	t.Logf("allowed %d of a capacity of %.0f (%.0f%%)", len(at), capacity, 100*float64(len(at))/capacity)
	assert.Greater(t, float64(len(at)), 0.8*capacity, "utilization")
	for _, c := range clients {
		assert.Zero(t, c.Stats().FallbackDecisions, "the servers answered: no fallback")
	}
}

// TestGlobalLimitMemory: four Clients hammer one key through one server;
// the key's bound holds for every window.
func TestGlobalLimitMemory(t *testing.T) {
	testGlobalLimit(t, leases.NewMemoryStore(leases.MemoryOptions{}))
}

// TestGlobalLimitRedis: the same through a real redis-server.
func TestGlobalLimitRedis(t *testing.T) {
	r := redistest.Start(t)
	testGlobalLimit(t, leases.NewRedisStore(r.Client(t), leases.RedisOptions{}))
}

// TestGlobalLimitTwoServers: two servers share one Redis; two clients use
// one server each.
func TestGlobalLimitTwoServers(t *testing.T) {
	r := redistest.Start(t)
	a := leasetest.Start(t, boundRules, leasetest.Options{Store: leases.NewRedisStore(r.Client(t), leases.RedisOptions{})})
	b := leasetest.Start(t, boundRules, leasetest.Options{Store: leases.NewRedisStore(r.Client(t), leases.RedisOptions{})})
	ca := newClient(t, client.Config{Servers: []string{a.URL(), b.URL()}, ClientID: "two-a", Fallback: client.FallbackClosed})
	cb := newClient(t, client.Config{Servers: []string{b.URL(), a.URL()}, ClientID: "two-b", Fallback: client.FallbackClosed})
	at := hammer(t, []*client.Client{ca, cb}, "hot:two", 4, 2*time.Second)
	checkBound(t, at, 200, 20)
	require.NotEmpty(t, at)
}
