package inbound

import (
	"hash/maphash"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/ratelease/ratelease/client"
)

// PolicyName names a limit in the RateLimit fields: "<limit>-per-<period>",
// the period in the largest unit that divides it (h, m, s or ms).
// httplimit.PolicyName documents it.
func PolicyName(l client.LimitState) string {
	return strconv.FormatInt(l.Limit, 10) + "-per-" + formatPeriod(l.Period)
}

func formatPeriod(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// policyNames returns the names of the limits, made unique: the second
// limit of a name gets "-2", the third "-3", and so on.
func policyNames(ls []client.LimitState) []string {
	names := make([]string, len(ls))
	for i, l := range ls {
		n := PolicyName(l)
		dup := 1
		for j := range i {
			if PolicyName(ls[j]) == n {
				dup++
			}
		}
		if dup > 1 {
			n += "-" + strconv.Itoa(dup)
		}
		names[i] = n
	}
	return names
}

// RateLimitFields returns the RateLimit-Policy and RateLimit field values
// for the limits at now, serialized afresh: one list item per limit,
//
//	RateLimit-Policy: "100-per-1m";q=100;w=60
//	RateLimit: "100-per-1m";r=57;t=12
//
// q is the limit, w its period in seconds, r what the limit still admits
// fleet-wide (at least 0, at most q), t the seconds until it is whole again
// (rounded up, at least 0). w is a whole number of seconds, at least 1: a
// period that is not is rounded up and q scaled with it (5 per 100 ms is
// q=50;w=1, not the tenth of it that q=5;w=1 would say). A token bucket
// that holds more than a period's worth (a burst above the limit) is
// described by its size and the time it takes to fill (10 per minute,
// burst 100: q=100;w=600), so that r, up to the burst, never exceeds q and
// q/w is still the rate. Both are "" when ls is empty or a
// value cannot be serialized. Limiter.Fields is the cached form the
// limiters use on every request.
func RateLimitFields(ls []client.LimitState, now time.Time) (policy, state string) {
	if len(ls) == 0 {
		return "", ""
	}
	names := policyNames(ls)
	pl := make(httpsfv.List, len(ls))
	sl := make(httpsfv.List, len(ls))
	for i, l := range ls {
		q, w := policyWindow(l)
		p := httpsfv.NewItem(names[i])
		p.Params.Add("q", q)
		p.Params.Add("w", w)
		pl[i] = p
		s := httpsfv.NewItem(names[i])
		s.Params.Add("r", min(max(l.Remaining, 0), q))
		s.Params.Add("t", CeilSeconds(l.Reset.Sub(now)))
		sl[i] = s
	}
	policy, err := httpsfv.Marshal(pl)
	if err != nil {
		return "", ""
	}
	state, err = httpsfv.Marshal(sl)
	if err != nil {
		return "", ""
	}
	return policy, state
}

// policyWindow returns the quota q and the window w (whole seconds, at
// least 1) of RateLimit-Policy for l (see RateLimitFields).
func policyWindow(l client.LimitState) (q, w int64) {
	q, span := max(l.Limit, 0), l.Period
	if l.Burst > q && q > 0 {
		// A bucket bigger than a period's worth: its size, over its fill.
		span = time.Duration(float64(l.Period) * float64(l.Burst) / float64(q))
		q = l.Burst
	}
	w = max(CeilSeconds(span), 1)
	if span > 0 && time.Duration(w)*time.Second != span {
		// Rounded up to whole seconds: q over the longer window.
		q = max(int64(float64(q)*float64(time.Duration(w)*time.Second)/float64(span)), 1)
	}
	return q, w
}

// fieldCache keeps the serialized RateLimit fields of recent Limits
// slices. A decision's Limits slice is shared and immutable, and a leased
// key answers every decision with the slice of its lease's answer; its
// fields change only when t, whole seconds, does. So the hot path
// serializes once per key per second. Direct-mapped, bounded, lock-free:
// a slot lost to another slice is serialized again, nothing worse. An
// entry holds its slice, so that no other slice can take its address
// while the entry lives.
type fieldCache struct {
	seed  maphash.Seed
	slots [64]atomic.Pointer[fieldEntry]
}

type fieldEntry struct {
	first         *client.LimitState // identifies the slice
	n             int
	ts            [maxCachedLimits]int64
	policy, state string
}

func newFieldCache() *fieldCache { return &fieldCache{seed: maphash.MakeSeed()} }

// maxCachedLimits is the most limits a cached slice has; a decision with
// more is serialized every time.
const maxCachedLimits = 8

// fields returns the RateLimit-Policy and RateLimit values of ls at now:
// RateLimitFields', from the cache while no t has changed.
func (fc *fieldCache) fields(ls []client.LimitState, now time.Time) (policy, state string) {
	if len(ls) == 0 || len(ls) > maxCachedLimits {
		return RateLimitFields(ls, now)
	}
	var ts [maxCachedLimits]int64
	for i, l := range ls {
		ts[i] = CeilSeconds(l.Reset.Sub(now))
	}
	first := &ls[0]
	slot := &fc.slots[maphash.Comparable(fc.seed, first)%uint64(len(fc.slots))]
	if e := slot.Load(); e != nil && e.first == first && e.n == len(ls) && e.ts == ts {
		return e.policy, e.state
	}
	policy, state = RateLimitFields(ls, now)
	slot.Store(&fieldEntry{first: first, n: len(ls), ts: ts, policy: policy, state: state})
	return policy, state
}

// Fields returns the RateLimit-Policy and RateLimit values to write on the
// answer to out at now: both "" unless out.Fields, the RateLimit one ""
// unless out.State as well. They are RateLimitFields' of the decision's
// limits, cached: a leased key's are serialized once a second, not on
// every request.
func (l *Limiter) Fields(out *Decided, now time.Time) (policy, state string) {
	if !out.Fields {
		return "", ""
	}
	policy, state = l.fields.fields(out.Decision.Limits, now)
	if !out.State {
		state = ""
	}
	return policy, state
}

// SetValues puts each non-empty value of the key-value pairs kv under its
// key in m, replacing what was there, and leaves the keys of empty values
// alone. m is a response's header fields (http.Header, its keys
// canonical) or gRPC metadata (metadata.MD, its keys lower case): the keys
// are used as given. All the values take one allocation; each is a slice
// of capacity one, so that appending to one never touches another.
func SetValues(m map[string][]string, kv ...string) {
	n := 0
	for i := 1; i < len(kv); i += 2 {
		if kv[i] != "" {
			n++
		}
	}
	if n == 0 {
		return
	}
	vals := make([]string, 0, n)
	for i := 1; i < len(kv); i += 2 {
		if v := kv[i]; v != "" {
			vals = append(vals, v)
			m[kv[i-1]] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
}
