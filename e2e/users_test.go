package e2e

// TestPerUserFleet: per-user limits behind a load balancer, the workload
// the SDK's direct decisions are for. P loadgen processes stand for the app
// servers behind a round-robin load balancer; one global arrival schedule
// (Poisson arrivals at a total rate the two-core machine sustains beside the
// servers and Redis, each for a user drawn from a Zipf distribution over a
// few thousand users, from a fixed seed) is dealt out arrival by arrival,
// arrival i to process i mod P. Every process generates the same schedule
// and issues only its share, at its scheduled times on the common slot grid
// (loadgen -schedule-seed -procs -proc), so that each user's requests reach
// every process, a few a second to each, and each user's bucket (the user:*
// rule) is shared by all of them.
//
// Checked:
//
//   - every user's bound burst + rate·W, in every window from 100 ms to
//     10 s, over the merged admissions of all the processes;
//   - lost admissions: the test replays the same schedule (by scheduled
//     time) against one exact token bucket per user with the same rule;
//     the admissions the system lost against it, summed over the users,
//     are at most maxLostShare of the exact bucket's, and the ones it made
//     beyond it at most maxExtraShare (only the decisions' lag behind their
//     scheduled times can make any);
//   - no fallback decision, since the servers stay healthy throughout;
//   - and, for the record, Redis commands per decision (INFO commandstats,
//     the sum of calls, over the run) and lease-server calls per decision
//     (the loadgens' Stats).

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/loadgen"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	// maxLostShare is the most admissions, as a share of the exact
	// bucket's, the fleet may lose against one exact bucket per user.
	maxLostShare = 0.05
	// maxExtraShare is the most admissions, as a share of the exact
	// bucket's, the fleet may make beyond it. A decision is made a little
	// after its scheduled time (the lag the loadgens report), so a token
	// that refilled meanwhile can admit a request the exact bucket denied;
	// the bound burst + rate·W holds regardless.
	maxExtraShare = 0.01
)

// TestPerUserFleet is the per-user scenario described at the top of this
// file.
func TestPerUserFleet(t *testing.T) {
	c := startCluster(t)
	const (
		procs     = 4
		users     = 2000
		zipfS     = 1.1
		totalRate = 1200.0 // arrivals a second, over all the processes
		seed      = 7
		// lead is how long before the schedule's start the loadgens are
		// launched, so that each is running before its first arrival.
		lead = 500 * time.Millisecond
	)
	d := scaled(8 * time.Second)
	schedule := loadgen.Schedule(seed, totalRate, d, users, zipfS)
	names := make([]string, users)
	for i := range names {
		names[i] = "user:" + strconv.Itoa(i)
	}

	rdb := c.redis.Client(t)
	redisBefore := redisCalls(t, rdb)

	loads := scheduleLoads(c, "app", "user:", procs, users, zipfS, totalRate, d, seed)
	origin := time.UnixMilli(time.Now().Add(lead).UnixMilli())
	startLoadsOn(t, loads, origin)
	waitLoads(t, loads, lead+d+30*time.Second)
	redisAfter := redisCalls(t, rdb)

	// Every process generated the same schedule and decided its whole
	// share of it.
	var decisions, calls, directs int64
	for i, l := range loads {
		sr := l.res.Schedule
		require.NotNil(t, sr, "%s reports its schedule", l.name)
		require.Equal(t, loadgen.Digest(schedule), sr.Digest, "%s generated the test's schedule", l.name)
		require.Equal(t, len(schedule), sr.Arrivals)
		require.Len(t, loadgen.Share(schedule, procs, i), sr.Share)
		require.Equal(t, int64(sr.Share), l.res.Requested, "%s decided its whole share", l.name)
		t.Logf("%s: %d arrivals; ready %v before the schedule began; decisions began after their scheduled times by p50 %v, p99 %v, max %v",
			l.name, sr.Share, -sr.Ready, sr.LagP50, sr.LagP99, sr.LagMax)
		// No fallback while the servers are healthy.
		assert.Zero(t, l.res.Stats.FallbackDecisions, "%s: servers answered; no fallback", l.name)
		assert.Zero(t, l.res.BySource["fallback"], "%s: nothing admitted by the fallback", l.name)
		decisions += l.res.Requested
		calls += l.res.Stats.ServerCalls
		directs += l.res.Stats.DirectDecisions
	}

	// The exact buckets, fed the same arrivals at their scheduled times.
	exact := exactAdmissions(schedule, userRate, userBurst)
	var exactSum, systemSum, lost, extra int64
	var lossy, extraKeys []string
	hot, hotN := "", int64(-1)
	for k, name := range names {
		ss := merge(loads, name, allSlots)
		// The per-user bound, over every process's admissions.
		checkBound(t, name, ss, userRate, userBurst)
		got, want := total(ss), exact[k]
		exactSum += want
		systemSum += got
		if got < want {
			lost += want - got
			lossy = append(lossy, fmt.Sprintf("%s %d/%d", name, got, want))
		} else if got > want {
			extra += got - want
			extraKeys = append(extraKeys, fmt.Sprintf("%s %d/%d", name, got, want))
		}
		if got > hotN {
			hot, hotN = name, got
		}
	}
	logWindows(t, "hottest user "+hot, merge(loads, hot, allSlots), userRate, userBurst)
	require.Positive(t, exactSum)
	lostShare, extraShare := float64(lost)/float64(exactSum), float64(extra)/float64(exactSum)
	t.Logf("%d arrivals for %d users; the exact buckets admit %d, the fleet %d: %d lost (%.2f%%) on %d users, %d extra (%.2f%%) on %d users",
		len(schedule), len(exact), exactSum, systemSum, lost, 100*lostShare, len(lossy), extra, 100*extraShare, len(extraKeys))
	if len(lossy) > 0 {
		t.Logf("users with lost admissions (fleet/exact), first %d: %s", min(10, len(lossy)), strings.Join(lossy[:min(10, len(lossy))], ", "))
	}
	if len(extraKeys) > 0 {
		t.Logf("users with extra admissions (fleet/exact), first %d: %s", min(10, len(extraKeys)), strings.Join(extraKeys[:min(10, len(extraKeys))], ", "))
	}
	assert.LessOrEqual(t, lostShare, maxLostShare, "admissions lost against one exact bucket per user")
	assert.LessOrEqual(t, extraShare, maxExtraShare, "admissions beyond one exact bucket per user")

	// The cost, for the record: commands counted by Redis (a script's
	// own commands included) and, of them, script calls (one round trip
	// each).
	redisSum, perCommand, summary := redisDelta(redisBefore, redisAfter)
	scripts := perCommand["evalsha"] + perCommand["eval"] + perCommand["evalsha_ro"] + perCommand["eval_ro"] + perCommand["fcall"] + perCommand["fcall_ro"]
	t.Logf("Redis: %d commands over the run, %.3f per decision; %d script calls, %.3f per decision (%s)",
		redisSum, float64(redisSum)/float64(decisions), scripts, float64(scripts)/float64(decisions), summary)
	t.Logf("lease-server calls: %d, %.3f per decision; direct decisions %d (%.1f%% of %d decisions; the rest denied locally until retry_after)",
		calls, float64(calls)/float64(decisions), directs, 100*float64(directs)/float64(decisions), decisions)
}

// scheduleLoads returns procs loadgens (named name0, name1, …) that deal
// out one Poisson schedule of totalRate arrivals a second over d, for keys
// prefix0…prefix<users−1> drawn from a Zipf distribution of exponent
// zipfS, from seed, arrival i to process i mod procs, as a round-robin
// load balancer would; process i lists the servers from the i-th on.
func scheduleLoads(c *cluster, name, prefix string, procs, users int, zipfS, totalRate float64, d time.Duration, seed uint64) []*load {
	var loads []*load
	for i := range procs {
		loads = append(loads, &load{name: fmt.Sprint(name, i), args: []string{
			"-servers", c.servers(i % len(c.daemons)),
			"-keys", fmt.Sprint(users), "-prefix", prefix, "-zipf-s", fmt.Sprint(zipfS),
			"-rate", fmt.Sprint(totalRate), "-duration", d.String(),
			"-schedule-seed", fmt.Sprint(seed), "-procs", fmt.Sprint(procs), "-proc", fmt.Sprint(i),
			"-workers", "16",
		}})
	}
	return loads
}

// exactAdmissions feeds arrivals, in order, to one exact token bucket per
// key, full at the key's first arrival, of rate tokens a second and burst
// tokens, and returns how many each admits.
func exactAdmissions(arrivals []loadgen.Arrival, rate float64, burst int64) map[int]int64 {
	type bucket struct {
		level float64
		last  time.Duration
	}
	buckets := map[int]*bucket{}
	out := map[int]int64{}
	for _, a := range arrivals {
		b := buckets[a.Key]
		if b == nil {
			b = &bucket{level: float64(burst), last: a.At}
			buckets[a.Key] = b
		}
		b.level = min(float64(burst), b.level+rate*(a.At-b.last).Seconds())
		b.last = a.At
		if b.level >= 1-1e-9 {
			b.level--
			out[a.Key]++
		}
	}
	return out
}

// redisCalls returns the calls Redis has served per command since it
// started (INFO commandstats).
func redisCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err, "INFO commandstats: %q", line)
				out[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	require.NotEmpty(t, out, "INFO commandstats lists commands")
	return out
}

// redisDelta returns the calls Redis served between two redisCalls, over
// every command but INFO (the test's own): their sum, the calls per
// command, and a summary, most called first.
func redisDelta(before, after map[string]int64) (sum int64, perCommand map[string]int64, summary string) {
	type cmd struct {
		name string
		n    int64
	}
	var cmds []cmd
	perCommand = map[string]int64{}
	for name, n := range after {
		if name == "info" {
			continue
		}
		if d := n - before[name]; d > 0 {
			cmds = append(cmds, cmd{name, d})
			perCommand[name] = d
			sum += d
		}
	}
	slices.SortFunc(cmds, func(a, b cmd) int {
		if a.n != b.n {
			return int(b.n - a.n)
		}
		return strings.Compare(a.name, b.name)
	})
	parts := make([]string, len(cmds))
	for i, c := range cmds {
		parts[i] = fmt.Sprintf("%s %d", c.name, c.n)
	}
	return sum, perCommand, strings.Join(parts, ", ")
}
