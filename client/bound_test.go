package client_test

import (
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

// hammer runs workers goroutines per client that ask for key as fast as a
// 50 µs pause allows, for d, and returns the moments (since start) of every
// allowed request, sorted.
func hammer(t *testing.T, clients []*client.Client, key string, workers int, d time.Duration) []time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for _, c := range clients {
		l := c.Limiter(key)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for n := 0; n < 1_000_000 && time.Now().Before(deadline); n++ {
					if l.Allow() {
						mine = append(mine, time.Since(start))
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
	slices.Sort(all)
	return all
}

// checkBound asserts that for every window length w, the allowed requests
// in any window [t, t+w] are at most burst + rate·w. Moments are taken just
// after Allow returned, up to slack late; the bound gets rate·slack + 1.
func checkBound(t *testing.T, at []time.Duration, rate float64, burst int, slack time.Duration) {
	t.Helper()
	for _, w := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, time.Second, 10 * time.Second} {
		bound := float64(burst) + rate*(w+slack).Seconds() + 1
		worst, j := 0, 0
		for i := range at {
			for at[i]-at[j] > w {
				j++
			}
			worst = max(worst, i-j+1)
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
	checkBound(t, at, 200, 20, 2*time.Millisecond)
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
	checkBound(t, at, 200, 20, 2*time.Millisecond)
	require.NotEmpty(t, at)
}
