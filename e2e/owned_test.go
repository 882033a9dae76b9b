package e2e

// TestOwnedKeys: a few users asking at about their limit, with a burst too
// small to lease (the SDK leases no bucket under four times
// LeaseMinTokens), spread round-robin over four processes: every decision
// is a direct take, which the SDK routes by key to one server, and that
// server owns the key's bucket and decides from memory
// (leases.OwningStore, rateleased -own-keys, on by default). Mid-run the
// server that owns some of them is killed with kill -9: the clients fail
// over to the next server of each key, which the store refuses until the
// dead owner's deadline (one lease TTL), empty at that deadline.
//
// Checked:
//
//   - every user's bound burst + rate·W in every window, over the merged
//     admissions of all the processes, across the kill;
//   - no fallback decision (the other servers answer);
//   - the servers decided takes from owned buckets (their
//     ratelease_owned_takes_total before the kill), and Redis ran fewer
//     scripts than there were decisions;
//   - admissions lost against one exact bucket per user: within
//     maxOwnedLostShare, the outage of the killed owner's keys included.

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/loadgen"
)

// The own:* rule: 100/s, burst 10 (too small a bucket to lease), lease TTL
// 1 s (an ownership's life).
const (
	ownRate  = 100.0
	ownBurst = 10
	ownTTL   = time.Second
	// maxOwnedLostShare bounds the admissions lost against the exact
	// buckets: about a third of the users (the killed owner's) lose up to
	// one TTL of a run of eight seconds, plus the decisions' lag.
	maxOwnedLostShare = 0.08
)

func TestOwnedKeys(t *testing.T) {
	c := startCluster(t)
	const (
		procs     = 4
		users     = 20
		zipfS     = 1.1
		totalRate = 1200.0
		seed      = 11
		lead      = 500 * time.Millisecond
	)
	d := scaled(8 * time.Second)
	schedule := loadgen.Schedule(seed, totalRate, d, users, zipfS)
	rdb := c.redis.Client(t)
	redisBefore := redisCalls(t, rdb)

	loads := scheduleLoads(c, "own", "own:", procs, users, zipfS, totalRate, d, seed)
	origin := time.UnixMilli(time.Now().Add(lead).UnixMilli())
	startLoadsOn(t, loads, origin)

	// At 40% of the run, the servers' owned takes so far; then kill one.
	time.Sleep(time.Until(origin.Add(d * 4 / 10)))
	var owned int64
	for i, dm := range c.daemons {
		n := metric(t, dm.URL(), "ratelease_owned_takes_total")
		t.Logf("rateleased %d: %d takes decided from owned buckets, %d buckets owned", i, n, metric(t, dm.URL(), "ratelease_owned_buckets"))
		owned += n
	}
	c.daemons[0].Kill()
	killedAt := time.Since(origin)
	t.Logf("killed rateleased %s at %v", c.daemons[0].Addr(), killedAt)
	waitLoads(t, loads, lead+d+30*time.Second)
	redisAfter := redisCalls(t, rdb)

	var decisions int64
	for _, l := range loads {
		assert.Zero(t, l.res.Stats.FallbackDecisions, "%s: servers answered; no fallback", l.name)
		decisions += l.res.Requested
	}
	require.Positive(t, owned, "the servers decided takes from owned buckets")

	exact := exactAdmissions(schedule, ownRate, ownBurst)
	var exactSum, lost, extra int64
	for k := range users {
		name := "own:" + strconv.Itoa(k)
		ss := merge(loads, name, allSlots)
		checkBound(t, name, ss, ownRate, ownBurst)
		got, want := total(ss), exact[k]
		exactSum += want
		if got < want {
			lost += want - got
		} else {
			extra += got - want
		}
	}
	require.Positive(t, exactSum)
	lostShare := float64(lost) / float64(exactSum)
	t.Logf("%d arrivals; the exact buckets admit %d; the fleet lost %d (%.2f%%) and made %d extra (%.2f%%)",
		len(schedule), exactSum, lost, 100*lostShare, extra, 100*float64(extra)/float64(exactSum))
	assert.LessOrEqual(t, lostShare, maxOwnedLostShare, "admissions lost against one exact bucket per user, the kill included")

	redisSum, perCommand, summary := redisDelta(redisBefore, redisAfter)
	scripts := perCommand["evalsha"] + perCommand["eval"]
	t.Logf("Redis: %d commands, %.3f per decision; %d script calls, %.3f per decision (%s); %d takes decided from owned buckets before the kill",
		redisSum, float64(redisSum)/float64(decisions), scripts, float64(scripts)/float64(decisions), summary, owned)
	assert.Less(t, scripts, decisions/2, "most decisions cost no Redis script")
}

// metric returns the value of a counter or gauge without labels from a
// daemon's /metrics.
func metric(t *testing.T, base, name string) int64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, "%s", sc.Text())
			return int64(f)
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("%s/metrics has no %s", base, name)
	return 0
}
