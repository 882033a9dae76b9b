package compare

import (
	"math"
	"slices"
	"sort"
	"time"
)

// exactBucket is the reference: one exact token bucket of a rule, fed each
// arrival at its scheduled time. It starts full, as rateleased's and
// redis_rate's buckets do.
type exactBucket struct {
	level   float64
	last    time.Duration
	started bool
}

// exactEpsilon absorbs float rounding in the refill (10 tokens/s × 0.1 s
// may come out a hair under 1 token).
const exactEpsilon = 1e-9

// take refills the bucket up to at and takes one token if it holds one.
// Arrivals must come in time order.
func (b *exactBucket) take(r rule, at time.Duration) bool {
	if !b.started {
		b.started, b.level, b.last = true, float64(r.burst), at
	}
	if at > b.last {
		b.level = math.Min(float64(r.burst), b.level+r.perSecond()*(at-b.last).Seconds())
		b.last = at
	}
	if b.level >= 1-exactEpsilon {
		b.level--
		return true
	}
	return false
}

// exactDecisions returns, for each arrival (in time order), whether one
// exact token bucket per key would admit it.
func exactDecisions(arr []arrival, r rule) []bool {
	buckets := make(map[int32]*exactBucket)
	out := make([]bool, len(arr))
	for i, a := range arr {
		b := buckets[a.key]
		if b == nil {
			b = new(exactBucket)
			buckets[a.key] = b
		}
		out[i] = b.take(r, a.at)
	}
	return out
}

// decision is what a system did with one arrival: when the decision began
// and ended (since the start of the run) and whether it admitted.
type decision struct {
	start, end time.Duration
	allowed    bool
	failed     bool  // an error (not a denial): counted as not admitted
	source     uint8 // the SDK's client.Source; 0 for the other systems
}

// The window check counts admissions in slots of windowSlot and looks at
// every window of minWindow or more.
const (
	windowSlot = 10 * time.Millisecond
	minWindow  = 100 * time.Millisecond
)

// window is the worst window of a run against the bound: the admissions
// certainly inside it and burst + rate·length.
type window struct {
	key      int32
	start    time.Duration
	length   time.Duration
	admitted int64
	bound    float64
}

// excess is admitted − bound: above 0, the bound did not hold.
func (w window) excess() float64 { return float64(w.admitted) - w.bound }

// span is one admission's decision, as slot numbers: it happened at some
// moment between the start of slot s0 and the end of slot s1.
type span struct{ s0, s1 int32 }

// worstWindow returns, for one key's admissions, the window of at least
// minWindow (in whole slots) where admitted − (burst + rate·length) is
// largest. An admission counts in a window only if its whole decision
// (start to end) lies inside, so that a window is never charged an
// admission it may not have held; a window shorter than minWindow is
// charged as minWindow, which only lowers its excess. Only windows that
// begin at an admission's first slot and end at one's last need be looked
// at (any other window has no more admissions than one of those and is no
// shorter), so the work is at most (distinct first slots) × (distinct last
// slots).
func worstWindow(adm []span, r rule) (w window, ok bool) {
	if len(adm) == 0 {
		return window{}, false
	}
	adm = slices.Clone(adm)
	sort.Slice(adm, func(i, j int) bool { return adm[i].s0 < adm[j].s0 })
	ends := make([]int32, len(adm))
	for i, a := range adm {
		ends[i] = a.s1
	}
	slices.Sort(ends)
	ends = slices.Compact(ends)
	cnt := make([]int64, len(ends))
	minSlots := int32(minWindow / windowSlot)
	best := math.Inf(-1)
	j := len(adm) - 1
	for j >= 0 {
		s := adm[j].s0
		// Admissions starting at s or later are counted from here on.
		for j >= 0 && adm[j].s0 == s {
			e, _ := slices.BinarySearch(ends, adm[j].s1)
			cnt[e]++
			j--
		}
		first, _ := slices.BinarySearch(ends, s)
		var run int64
		for ei := first; ei < len(ends); ei++ {
			if cnt[ei] == 0 {
				continue
			}
			run += cnt[ei]
			slots := max(ends[ei]-s+1, minSlots)
			length := time.Duration(slots) * windowSlot
			bound := r.bound(length)
			if ex := float64(run) - bound; ex > best {
				best = ex
				w = window{start: time.Duration(s) * windowSlot, length: length, admitted: run, bound: bound}
			}
		}
	}
	return w, true
}

// slotOf returns the slot of moment t.
func slotOf(t time.Duration) int32 { return int32(t / windowSlot) }

// score is how one system did on one run against the exact reference.
type score struct {
	arrivals      int
	exactAdmitted int64
	admitted      int64
	failed        int64
	// lost sums, over keys, the admissions of the exact bucket the system
	// did not make (max(0, exact − system) per key); extra the admissions
	// it made beyond the exact bucket's (max(0, system − exact) per key).
	lost, extra int64
	worst       window
	hasWorst    bool
}

// lostPct and extraPct are lost and extra as a percentage of the exact
// bucket's admissions.
func (s score) lostPct() float64  { return pct(s.lost, s.exactAdmitted) }
func (s score) extraPct() float64 { return pct(s.extra, s.exactAdmitted) }

// held reports whether the bound held in every window of every key.
func (s score) held() bool { return !s.hasWorst || s.worst.excess() <= 0 }

func pct(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// scoreRun compares a system's decisions (one per arrival, same order)
// with the exact decisions and finds the worst window of every key.
func scoreRun(arr []arrival, exact []bool, ds []decision, r rule) score {
	s := score{arrivals: len(arr)}
	type perKey struct {
		exact, sys int64
		adm        []span
	}
	keys := make(map[int32]*perKey)
	for i, a := range arr {
		k := keys[a.key]
		if k == nil {
			k = new(perKey)
			keys[a.key] = k
		}
		if exact[i] {
			k.exact++
			s.exactAdmitted++
		}
		d := ds[i]
		if d.failed {
			s.failed++
		}
		if d.allowed {
			k.sys++
			s.admitted++
			k.adm = append(k.adm, span{slotOf(d.start), slotOf(d.end)})
		}
	}
	ids := make([]int32, 0, len(keys))
	for id := range keys {
		ids = append(ids, id)
	}
	slices.Sort(ids) // deterministic choice among equal windows
	for _, id := range ids {
		k := keys[id]
		s.lost += max(0, k.exact-k.sys)
		s.extra += max(0, k.sys-k.exact)
		if w, ok := worstWindow(k.adm, r); ok && (!s.hasWorst || w.excess() > s.worst.excess()) {
			w.key = id
			s.worst, s.hasWorst = w, true
		}
	}
	return s
}

// quantiles returns the q-quantiles of vs (nearest rank), 0 for none.
func quantiles(vs []time.Duration, qs ...float64) []time.Duration {
	out := make([]time.Duration, len(qs))
	if len(vs) == 0 {
		return out
	}
	sorted := slices.Clone(vs)
	slices.Sort(sorted)
	for i, q := range qs {
		rank := int(math.Ceil(q*float64(len(sorted)))) - 1
		out[i] = sorted[min(max(rank, 0), len(sorted)-1)]
	}
	return out
}
