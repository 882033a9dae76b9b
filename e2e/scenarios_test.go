package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	rate  = 1000.0 // acc:*, fair:*, fault:* tokens per second
	burst = 100
)

// hotLoads returns n loadgens that each ask for key at perClient requests
// per second for d, spread over the cluster's servers.
func hotLoads(c *cluster, name, key string, n int, perClient float64, d time.Duration, fallback string) []*load {
	var loads []*load
	for i := range n {
		loads = append(loads, &load{name: fmt.Sprint(name, i), args: []string{"-servers", c.servers(i % 3), "-key", key, "-rate", fmt.Sprint(perClient), "-duration", d.String(), "-fallback", fallback}})
	}
	return loads
}

// TestAccuracy: 6 clients spread over the 3 servers ask for one key at 3x
// its rate. For every window from 100 ms to 10 s the admitted requests stay
// within burst + rate·W, and at least 97% of rate·T is used.
func TestAccuracy(t *testing.T) {
	c := startCluster(t)
	d := scaled(10 * time.Second)
	loads := hotLoads(c, "acc", "acc:hot", 6, 500, d, "closed")
	startLoads(t, loads)
	waitLoads(t, loads, d+30*time.Second)

	ss := merge(loads, "acc:hot", allSlots)
	logWindows(t, "acc:hot", ss, rate, burst)
	checkBound(t, "acc:hot", ss, rate, burst)
	admitted := total(ss)
	want := 0.97 * rate * d.Seconds()
	t.Logf("admitted %d of rate·T %.0f (%.1f%%)", admitted, rate*d.Seconds(), 100*float64(admitted)/(rate*d.Seconds()))
	assert.GreaterOrEqual(t, float64(admitted), want, "utilization")
	for _, l := range loads {
		assert.Zero(t, l.res.Stats.FallbackDecisions, "%s: servers answered; no fallback", l.name)
	}
}

// TestFairness: 4 clients whose demands are 10%, 20%, 50% and 300% of the
// rate. Those below their fair share (rate/4) get at least 95% of their
// demand, the hungry one gets the rest, and the total is at least 97% of
// the rate.
func TestFairness(t *testing.T) {
	c := startCluster(t)
	d := scaled(10 * time.Second)
	demands := []float64{0.1, 0.2, 0.5, 3}
	var loads []*load
	for i, f := range demands {
		loads = append(loads, &load{name: fmt.Sprintf("fair%.0f%%", f*100), args: []string{"-servers", c.servers(i % 3), "-key", "fair:hot", "-rate", fmt.Sprint(f * rate), "-duration", d.String(), "-fallback", "closed"}})
	}
	startLoads(t, loads)
	waitLoads(t, loads, d+30*time.Second)

	var sum int64
	for i, l := range loads {
		share := float64(l.res.Admitted) / float64(max(1, l.res.Requested))
		t.Logf("%s: %d of %d asked (%.1f%%)", l.name, l.res.Admitted, l.res.Requested, 100*share)
		if demands[i]*rate < rate/float64(len(demands)) {
			assert.GreaterOrEqual(t, share, 0.95, "%s is below its fair share and must get 95%% of its demand", l.name)
		}
		sum += l.res.Admitted
	}
	hungry := loads[len(loads)-1].res.Admitted
	t.Logf("total %d of rate·T %.0f (%.1f%%); hungry client %d", sum, rate*d.Seconds(), 100*float64(sum)/(rate*d.Seconds()), hungry)
	assert.GreaterOrEqual(t, float64(sum), 0.97*rate*d.Seconds(), "total utilization")
	checkBound(t, "fair:hot", merge(loads, "fair:hot", allSlots), rate, burst)
}

// TestManyKeys: 10,000 many:* keys with Zipf-distributed demand from 4
// clients that may each hold at most 1,000 keys. Every key's bound holds,
// and no client ever holds more than MaxKeys keys.
func TestManyKeys(t *testing.T) {
	c := startCluster(t)
	d := scaled(10 * time.Second)
	const maxKeys = 1000
	var loads []*load
	for i := range 4 {
		loads = append(loads, &load{name: fmt.Sprint("zipf", i), args: []string{"-servers", c.servers(i % 3), "-keys", "10000", "-prefix", "many:", "-zipf-s", "1.1", "-rate", "1500", "-duration", d.String(), "-max-keys", fmt.Sprint(maxKeys), "-seed", fmt.Sprint(i + 1), "-fallback", "closed", "-workers", "8"}})
	}
	startLoads(t, loads)
	waitLoads(t, loads, d+60*time.Second)

	keys := map[string]bool{}
	for _, l := range loads {
		for k := range l.res.Slots {
			keys[k] = true
		}
		assert.LessOrEqual(t, l.res.Stats.MaxKeysHeld, maxKeys, "%s held more than MaxKeys keys", l.name)
		assert.Positive(t, l.res.Stats.MaxKeysHeld)
	}
	t.Logf("%d distinct keys admitted", len(keys))
	require.Greater(t, len(keys), 1000, "the demand reached many keys")
	hot := ""
	var hotN int64
	for k := range keys {
		ss := merge(loads, k, allSlots)
		checkBound(t, k, ss, manyRate, manyBurst)
		if n := total(ss); n > hotN {
			hot, hotN = k, n
		}
	}
	logWindows(t, "hottest key "+hot, merge(loads, hot, allSlots), manyRate, manyBurst)
	// The hottest key is limited, not starved.
	assert.GreaterOrEqual(t, float64(hotN), 0.9*manyRate*d.Seconds())
}

// TestKillServer: kill -9 one of the three servers mid-run. No caller sees
// an error (no fallback decision: the clients fail over) and the bound
// holds throughout.
func TestKillServer(t *testing.T) {
	c := startCluster(t)
	d := scaled(10 * time.Second)
	loads := hotLoads(c, "kill", "fault:kill", 6, 500, d, "closed")
	startLoads(t, loads)
	time.Sleep(d * 4 / 10)
	c.daemons[0].Kill()
	t.Logf("killed rateleased %s", c.daemons[0].Addr())
	waitLoads(t, loads, d+30*time.Second)

	ss := merge(loads, "fault:kill", allSlots)
	logWindows(t, "fault:kill", ss, rate, burst)
	checkBound(t, "fault:kill", ss, rate, burst)
	for _, l := range loads {
		assert.Zero(t, l.res.Stats.FallbackDecisions, "%s: a caller saw the outage", l.name)
	}
	assert.GreaterOrEqual(t, float64(total(ss)), 0.9*rate*d.Seconds(), "utilization")
}

// fallbackBurst is the local burst of one client's safe-rate fallback: a
// tenth of a second of its safe rate, at least one request.
func fallbackBurst(clients int) float64 { return max(1, rate/float64(clients)/10) }

// TestAllServersDown: every server is stopped for 5 s. The clients fall
// back to their safe rates; the fallback admits no more than the documented
// allowance, the leased part keeps the bound, and leases resume when the
// servers return.
func TestAllServersDown(t *testing.T) {
	c := startCluster(t)
	outage := scaled(5 * time.Second)
	d := outage + scaled(8*time.Second)
	loads := hotLoads(c, "down", "fault:down", 4, 500, d, "safe_rate")
	origin := startLoads(t, loads)
	time.Sleep(scaled(3 * time.Second))
	for _, dm := range c.daemons {
		dm.Term()
	}
	down := time.Now()
	time.Sleep(outage)
	for _, dm := range c.daemons {
		dm.Restart()
	}
	up := time.Now()
	t.Logf("servers down from %v to %v after the start", down.Sub(origin), up.Sub(origin))
	waitLoads(t, loads, d+30*time.Second)

	checkOutage(t, loads, "fault:down", origin, down, up, 2*time.Second)
}

// TestRedisDown: Redis is stopped for 5 s, then restarted. The servers
// answer 503 meanwhile and recover by themselves; the clients are back on
// leases within 2x the lease TTL of Redis's return.
func TestRedisDown(t *testing.T) {
	c := startCluster(t)
	outage := scaled(5 * time.Second)
	d := outage + scaled(8*time.Second)
	loads := hotLoads(c, "redis", "fault:redis", 4, 500, d, "safe_rate")
	origin := startLoads(t, loads)
	time.Sleep(scaled(3 * time.Second))
	c.redis.Stop(t)
	down := time.Now()
	time.Sleep(outage / 2)
	probed := time.Now()
	for _, dm := range c.daemons {
		assert.Equal(t, 503, get(dm.URL()+"/readyz"), "readyz while Redis is down")
		assert.Equal(t, 503, postLease(dm.URL(), "fault:probe"), "a lease while Redis is down")
		assert.Equal(t, 200, get(dm.URL()+"/healthz"), "alive while Redis is down")
	}
	t.Logf("probing the servers took %v", time.Since(probed))
	time.Sleep(outage - time.Since(down))
	c.redis.Restart(t)
	up := time.Now()
	for _, dm := range c.daemons {
		require.Eventually(t, func() bool { return get(dm.URL()+"/readyz") == 200 }, 5*time.Second, 20*time.Millisecond, "server recovers by itself")
	}
	t.Logf("Redis down from %v to %v after the start; servers ready %v after", down.Sub(origin), up.Sub(origin), time.Since(up))
	waitLoads(t, loads, d+30*time.Second)

	const ttl = time.Second
	checkOutage(t, loads, "fault:redis", origin, down, up, 2*ttl)
}

// checkOutage checks a key through an outage from down to up, as the
// README documents it:
//   - the fallback admitted something, in all at most rate·D plus each
//     client's fallback burst, and each client at most its safe rate
//     (rate/clients) · D plus its burst;
//   - the leased part keeps the plain bound in every window;
//   - a window that overlaps the outage (and the time back leases take)
//     keeps burst + rate·W + rate·overlap + the fallback bursts + one burst
//     (the server's bucket, which did not see the fallback's requests, is
//     full again when the servers return); any other window the plain
//     bound;
//   - every client was admitted by a lease again within back of the end.
func checkOutage(t *testing.T, loads []*load, key string, origin, down, up time.Time, back time.Duration) {
	t.Helper()
	d := up.Sub(down)
	n := len(loads)
	all := merge(loads, key, allSlots)
	fb := merge(loads, key, fallbackSlots)
	limit := rate*d.Seconds() + float64(n)*fallbackBurst(n)
	t.Logf("fallback admitted %d; documented allowance rate·D + Σ bursts = %.0f", total(fb), limit)
	require.Positive(t, total(fb), "the clients fell back during the outage")
	assert.LessOrEqual(t, float64(total(fb)), limit, "the fallback admitted more than the documented allowance")
	for _, l := range loads {
		mine := total(merge([]*load{l}, key, fallbackSlots))
		own := rate/float64(n)*d.Seconds() + fallbackBurst(n)
		assert.LessOrEqual(t, float64(mine), own, "%s: more than its safe rate during the outage", l.name)
	}
	checkBound(t, key+" leased", subtract(all, fb), rate, burst)
	downSlot := int64(down.Sub(origin) / slot)
	upSlot := int64(up.Sub(origin) / slot)
	backSlot := upSlot + int64(back/slot)
	checkBoundWith(t, key+" total", all, rate, burst, func(s, e int64) float64 {
		if e < downSlot || s > backSlot {
			return 0
		}
		overlap := min(e, backSlot) - max(s, downSlot) + 1
		return rate*(time.Duration(overlap)*slot).Seconds() + float64(n)*fallbackBurst(n) + burst
	})
	t.Logf("last fallback decision %v after the outage ended", time.Duration(lastSlot(fb)-upSlot)*slot)
	assert.LessOrEqual(t, lastSlot(fb), backSlot, "no fallback decision later than %v after the outage", back)
	for _, l := range loads {
		leased := subtract(merge([]*load{l}, key, allSlots), merge([]*load{l}, key, fallbackSlots))
		back := false
		for _, sp := range leased {
			if sp.first > upSlot && sp.last <= backSlot {
				back = true
				break
			}
		}
		assert.True(t, back, "%s was not admitted by a lease within %v of the outage's end", l.name, time.Duration(backSlot-upSlot)*slot)
	}
}

// expiredLeaseAllowance is the most tokens of a key's expired lease a
// client may spend after being paused across the lease's deadline: in a
// lease's first half, one spend in eight reads the clock (see
// client/lease.go), so at most seven get through before one notices.
const expiredLeaseAllowance = 7

// TestPausedClient: one client is SIGSTOPped for 10 s, then continued. The
// others get its share while it is stopped, the bound holds throughout, and
// after it continues it spends at most expiredLeaseAllowance tokens of its
// expired lease. To tell those apart from a fresh lease's, it talks to a
// server of its own, killed while it is stopped, and its fallback is
// closed: after it continues, nothing but the expired lease can admit.
func TestPausedClient(t *testing.T) {
	c := startCluster(t)
	pause := scaled(10 * time.Second)
	d := pause + scaled(6*time.Second)
	loads := hotLoads(c, "stop", "fault:stop", 4, 500, d, "closed")
	loads[0].args = append(loads[0].args, "-servers", c.daemons[0].URL())
	for _, l := range loads[1:] {
		l.args = append(l.args, "-servers", c.daemons[1].URL()+","+c.daemons[2].URL())
	}
	origin := startLoads(t, loads)
	time.Sleep(scaled(3 * time.Second))
	require.NoError(t, loads[0].proc.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	c.daemons[0].Kill()
	time.Sleep(pause)
	require.NoError(t, loads[0].proc.Signal(syscall.SIGCONT))
	cont := time.Now()
	t.Logf("client stopped from %v to %v after the start", stopped.Sub(origin), cont.Sub(origin))
	waitLoads(t, loads, d+pause+30*time.Second)

	all := merge(loads, "fault:stop", allSlots)
	logWindows(t, "fault:stop", all, rate, burst)
	checkBound(t, "fault:stop", all, rate, burst)

	// While it was stopped (after its lease ended), the others used the
	// whole rate.
	from := int64(stopped.Add(2*time.Second).Sub(origin) / slot)
	to := int64(cont.Sub(origin) / slot)
	var others int64
	for _, s := range merge(loads[1:], "fault:stop", allSlots) {
		if s.first >= from && s.last < to {
			others += s.n
		}
	}
	want := rate * (time.Duration(to-from) * slot).Seconds()
	t.Logf("others admitted %d while it was stopped; rate·T %.0f", others, want)
	assert.GreaterOrEqual(t, float64(others), 0.95*want, "the others got its share")

	// After it continued: requests it began after the stop (its clock
	// reads before Allow came after SIGCONT) could only use the expired
	// lease.
	stopSlot := int64(stopped.Sub(origin) / slot)
	var stale int64
	for _, s := range merge(loads[:1], "fault:stop", allSlots) {
		if s.first > stopSlot {
			stale += s.n
		}
	}
	t.Logf("the paused client spent %d tokens of its expired lease after it continued (allowance %d)", stale, expiredLeaseAllowance)
	assert.LessOrEqual(t, stale, int64(expiredLeaseAllowance))
}

// subtract removes the spans of b from a (b ⊆ a, span by span).
func subtract(a, b []span) []span {
	type k struct{ f, l int64 }
	m := map[k]int64{}
	for _, s := range a {
		m[k{s.first, s.last}] += s.n
	}
	for _, s := range b {
		m[k{s.first, s.last}] -= s.n
	}
	var out []span
	for key, n := range m {
		if n > 0 {
			out = append(out, span{key.f, key.l, n})
		}
	}
	return out
}

func lastSlot(ss []span) int64 {
	var last int64
	for _, s := range ss {
		last = max(last, s.last)
	}
	return last
}
