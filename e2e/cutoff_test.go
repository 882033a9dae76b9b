package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The cut:* rule of the harness: 100 tokens a second, a bucket of 100 and
// leases of 2 s.
const (
	cutRate  = 100.0
	cutBurst = 100
	cutTTL   = 2 * time.Second
	cutKey   = "cut:hot"
)

// TestCutOffClientExpiry: a client holding the whole bucket in a lease
// never settles it, so that the lease runs to its deadline, spent to the
// last token just before it, while the other clients wait on retry_after
// for the server to expire it. The bound burst + rate·W must hold in every
// window around that expiry, and the others must be served again after it.
//
// The SDK never leases a whole bucket (a batch is at most a quarter of it,
// and a key starts on direct takes), so the client cut off is simulated in
// the test process: it speaks the wire protocol itself, to one rateleased,
// and stands for any holder that vanishes after its grant (a partitioned
// process, a crashed one, another SDK). The others are real loadgens.
//
//  1. The simulated client ("cutoff") asks one rateleased for a lease of
//     the whole burst on a full bucket: it is granted 100 tokens, all the
//     bucket holds, so L = 0 and O = burst. It never calls again.
//  2. The others start at once, hungry (2000 requests a second each, 20
//     times the rate). The bucket's cap burst − O is 0, so their direct
//     takes are denied and told to retry when cutoff's lease expires, about
//     2 s later; they wait locally and leave the bucket untouched meanwhile
//     (a denied take writes nothing, so the bucket's refill clock stays at
//     the grant).
//  3. cutoff spends nothing until spendBefore before its deadline (the
//     moment it sent its request plus the TTL, no later than the server's
//     expiry), then all of its lease within spendOver, each admission
//     recorded on the loadgens' slot grid.
//  4. Just after the server expires the lease, the first other to ask gets
//     what the bucket truly holds: the refill since the expiry, a token or
//     two. An engine that closes the expired lease and then refills over
//     the whole time since the bucket's last update hands back the ~2 s of
//     refill that the lease held back (capped at burst: 100 tokens) at once,
//     and the others spend it within a few tens of ms.
//
// Why these parameters: the bug hands out at most burst tokens at the
// expiry (the refill held back, capped by the bucket), so a window around it
// exceeds burst + rate·W only if it also holds more than rate·W of cutoff's
// spending: cutoff must spend faster than the rate at the end of its lease,
// hence a holder that keeps its lease idle and spends it in a burst at its
// end. A rate of 100/s with a burst of 100 makes the fill time (1 s) long
// beside the shortest window checked (100 ms: 10 tokens of refill), and a
// lease TTL of 2 s, twice the fill time, lets the held-back refill reach a
// whole burst. (With the other rules of the harness, burst/rate is 100 ms:
// a second burst right after a first is then exactly at the bound of a
// 100 ms window, and no window checked can show it.) On the buggy engine the
// ~150 ms window from cutoff's burst to the others' spending holds about
// 200 admissions against a bound of about 115; with piecewise refill (to
// each expiry under the cap in force until then) it holds about 100.
func TestCutOffClientExpiry(t *testing.T) {
	c := startCluster(t)
	const (
		spendBefore = 100 * time.Millisecond
		spendOver   = 50 * time.Millisecond
		// askWithin is how soon after the expiry the others must be served:
		// a fifth of the fill time burst/rate, so that a second burst
		// handed out at the expiry would fall in one window with cutoff's
		// spending, well inside the fill time, where the bound has no room
		// for it.
		askWithin = time.Duration(float64(time.Second) * cutBurst / cutRate / 5)
	)
	origin := time.UnixMilli(time.Now().UnixMilli())
	slotOf := func(at time.Time) int64 { return int64(at.Sub(origin) / slot) }

	sentAt := time.Now()
	res := postLeases(t, c.daemons[0].URL(), &protocol.LeaseRequest{
		ClientID: "cutoff-sim",
		Leases:   []protocol.LeaseEntry{{Key: cutKey, Want: cutBurst}},
	})
	answeredAt := time.Now()
	require.Len(t, res.Leases, 1)
	granted := res.Leases[0]
	require.Nil(t, granted.Error, "cutoff's lease")
	require.Equal(t, int64(cutBurst), granted.Granted, "cutoff holds the whole bucket")
	require.Equal(t, cutTTL.Milliseconds(), granted.TTLMillis)

	// The server expires the lease at its grant time plus the TTL: between
	// the request's sending and its answer. cutoff's own deadline (send
	// time plus TTL) is no later than the first.
	ttl := time.Duration(granted.TTLMillis) * time.Millisecond
	deadline := sentAt.Add(ttl)
	expiryLo, expiryHi := deadline, answeredAt.Add(ttl)
	t.Logf("cutoff granted %d at %v–%v after the start; expiry at %v–%v (slots %d–%d)",
		granted.Granted, sentAt.Sub(origin), answeredAt.Sub(origin),
		expiryLo.Sub(origin), expiryHi.Sub(origin), slotOf(expiryLo), slotOf(expiryHi))

	othersDur := time.Until(expiryHi) + scaled(2500*time.Millisecond)
	var others []*load
	for i := range 3 {
		others = append(others, &load{name: fmt.Sprint("other", i), args: []string{
			"-servers", c.servers(i), "-key", cutKey, "-fallback", "closed",
			"-rate", "2000", "-duration", othersDur.String(),
		}})
	}
	othersFrom := time.Now()
	startLoadsOn(t, others, origin)

	cut := &load{name: "cutoff", res: spendLease(origin, cutKey, granted.Granted, deadline, spendBefore, spendOver)}
	waitLoads(t, others, othersDur+30*time.Second)
	t.Logf("cutoff spent %d of its %d tokens, from %v to %v before its deadline",
		cut.res.Admitted, granted.Granted, spendBefore, spendBefore-spendOver)

	all := append([]*load{cut}, others...)
	ss := merge(all, cutKey, allSlots)
	logTimeline(t, cut, others, slotOf(expiryLo)-25, slotOf(expiryHi)+10)
	logWindows(t, cutKey, ss, cutRate, cutBurst)
	cnt := newCounter(ss)
	near, ok := cnt.closestAround(slotOf(expiryLo), cutRate, cutBurst)
	require.True(t, ok, "a window around the expiry")
	t.Logf("worst window around the expiry: slots %d–%d (%v, from %v before the expiry), %d admitted, bound %.0f",
		near.start, near.end, time.Duration(near.end-near.start+1)*slot, time.Duration(slotOf(expiryLo)-near.start)*slot, near.count, near.allowed)
	// The bound, in every window from 100 ms to 10 s.
	checkBound(t, cutKey, ss, cutRate, cutBurst)

	// cutoff spent its whole lease just before the deadline: the worst
	// window around the expiry holds it, so the check above saw it.
	assert.Equal(t, granted.Granted, cut.res.Admitted, "cutoff spent its lease to the last token before its deadline")
	assert.GreaterOrEqual(t, near.count, granted.Granted, "the worst window around the expiry holds cutoff's spending")

	// The others waited for the expiry (nothing can be granted while
	// cutoff holds the bucket), asked promptly after it, and were served
	// again, near the rate, each a share of it: denied, each moves to
	// leases (a denial counts as demand), and the holders are served in
	// turn. (Before, the first admitted a few tokens moved to leases and
	// took most of the refill, and a process left on direct takes got a
	// few tokens or none.)
	othersTo := slotOf(othersFrom.Add(othersDur))
	var after int64
	var shares []int64       // each other's admissions after the expiry
	othersFirst := int64(-1) // the first slot any other was served in
	for _, l := range others {
		assert.Positive(t, l.res.Denied, "%s asked while cutoff held the bucket", l.name)
		assert.Zero(t, l.res.Stats.FallbackDecisions, "%s: servers answered; no fallback", l.name)
		mine := merge([]*load{l}, cutKey, allSlots)
		var served int64
		for _, s := range mine {
			assert.GreaterOrEqual(t, s.last, slotOf(expiryLo), "%s admitted in slot %d, before cutoff's lease expired", l.name, s.last)
			if s.last <= othersTo {
				served += s.n
			}
		}
		if len(mine) > 0 {
			first := mine[0].first
			for _, s := range mine {
				first = min(first, s.first)
			}
			t.Logf("%s first admitted in slot %d, %v after the expiry", l.name, first, time.Duration(first-slotOf(expiryLo))*slot)
			if othersFirst < 0 || first < othersFirst {
				othersFirst = first
			}
		}
		t.Logf("%s admitted %d after the expiry", l.name, served)
		shares = append(shares, served)
		after += served
	}
	if assert.GreaterOrEqual(t, othersFirst, int64(0), "the others were served") {
		assert.LessOrEqual(t, othersFirst, slotOf(expiryHi.Add(askWithin)), "the others were served within %v of the expiry", askWithin)
	}
	want := cutRate * (time.Duration(othersTo-slotOf(expiryHi)) * slot).Seconds()
	t.Logf("the others admitted %d after the expiry; rate·T %.0f", after, want)
	assert.GreaterOrEqual(t, float64(after), 0.7*want, "the others were served after the expiry")
	for i, n := range shares {
		assert.GreaterOrEqual(t, float64(n), 0.15*float64(after), "%s's share of what the others were served after the expiry", others[i].name)
	}
}

// postLeases sends req to the lease server at url, as a client speaking the
// wire protocol itself, and returns its answer.
func postLeases(t *testing.T, url string, req *protocol.LeaseRequest) *protocol.LeaseResponse {
	t.Helper()
	body, err := json.Marshal(req)
	require.NoError(t, err)
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Post(url+protocol.PathLeases, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "POST %s", protocol.PathLeases)
	var out protocol.LeaseResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return &out
}

// spendLease spends a lease of n tokens of key the way a holder that keeps
// it idle and spends it all at its end does: nothing until spendBefore
// before deadline, then one token at a time, evenly over spendOver, never
// at or after deadline. It waits on real time (the timing is the point)
// and returns the admissions as a loadgen's Result on the slot grid that
// starts at origin, so that merge counts them with the loadgens'.
func spendLease(origin time.Time, key string, n int64, deadline time.Time, spendBefore, spendOver time.Duration) *result {
	res := &result{StartUnixMs: origin.UnixMilli(), SlotMs: slot.Milliseconds(), Slots: map[string][][3]int64{}}
	start := deadline.Add(-spendBefore)
	perSlot := map[int64]int64{}
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * spendOver / time.Duration(n))))
		now := time.Now()
		if !now.Before(deadline) {
			break // stalled past the deadline: the rest is not spent
		}
		perSlot[int64(now.Sub(origin)/slot)]++
		res.Admitted++
	}
	for s, k := range perSlot {
		res.Slots[key] = append(res.Slots[key], [3]int64{s, s, k})
	}
	res.Requested = res.Admitted
	return res
}

// closestAround returns, among the windows from minWindow to maxWindow slots
// long that hold slot at, the one whose count comes closest to (or goes
// furthest over) burst + rate·W; ok is false when there is none.
func (c *counter) closestAround(at int64, rate float64, burst int64) (worst excess, ok bool) {
	if c.n == 0 || at < c.lo || at > c.hi {
		return excess{}, false
	}
	perSlot := rate * slot.Seconds()
	best := 0.0
	for s := max(c.lo, at-maxWindow+1); s <= at; s++ {
		for e := max(at, s+minWindow-1); e <= min(c.hi, s+maxWindow-1); e++ {
			cnt := c.count(s, e)
			allowed := float64(burst) + perSlot*float64(e-s+1)
			if over := float64(cnt) - allowed; !ok || over > best {
				best, ok = over, true
				worst = excess{start: s, end: e, count: cnt, allowed: allowed}
			}
		}
	}
	return worst, ok
}

// logTimeline logs, slot by slot from slot from to slot to, what the cut-off
// client and the others admitted (requests whose first and last slot
// differ are counted in their first).
func logTimeline(t *testing.T, cut *load, others []*load, from, to int64) {
	t.Helper()
	per := func(loads []*load) map[int64]int64 {
		m := map[int64]int64{}
		for _, s := range merge(loads, cutKey, allSlots) {
			m[s.first] += s.n
		}
		return m
	}
	a, b := per([]*load{cut}), per(others)
	var lines []string
	for s := from; s <= to; s++ {
		if a[s] != 0 || b[s] != 0 {
			lines = append(lines, fmt.Sprintf("slot %d: cutoff %d, others %d", s, a[s], b[s]))
		}
	}
	t.Logf("admitted per slot, slots %d–%d:\n%s", from, to, strings.Join(lines, "\n"))
}
