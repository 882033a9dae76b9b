package httplimit

import (
	"encoding/json"
	"hash/maphash"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/internal/inbound"
)

// Header names of draft-ietf-httpapi-ratelimit-headers.
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
)

var (
	canonPolicy = http.CanonicalHeaderKey(HeaderRateLimitPolicy)
	canonState  = http.CanonicalHeaderKey(HeaderRateLimit)
)

// ProblemTypeQuotaExceeded is the type of the default 429 problem body.
const ProblemTypeQuotaExceeded = "https://ratelease.dev/problems/quota-exceeded"

// PolicyName names a limit in the RateLimit fields: "<limit>-per-<period>",
// such as "100-per-1m" or "5-per-10s" (the period in the largest unit that
// divides it: h, m, s or ms). The name describes the limit itself, so that
// every process of the fleet, and every rule with the same limit, names it
// alike; the rule's name is not in client.Decision. Two limits of one rule
// with the same limit and period would share a name: the second gets
// "-2", the third "-3", and so on.
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

// policyNames returns the names of the limits, made unique.
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

// rateLimitFields returns the RateLimit-Policy and RateLimit field values
// for the limits at now: one list item per limit,
//
//	RateLimit-Policy: "100-per-1m";q=100;w=60
//	RateLimit: "100-per-1m";r=57;t=12
//
// q is the limit, w its period in seconds (rounded up), r what the limit
// still admits fleet-wide, t the seconds until it is whole again (rounded
// up). withState false leaves RateLimit out ("").
func rateLimitFields(ls []client.LimitState, now time.Time, withState bool) (policy, state string) {
	if len(ls) == 0 {
		return "", ""
	}
	names := policyNames(ls)
	pl := make(httpsfv.List, len(ls))
	sl := make(httpsfv.List, len(ls))
	for i, l := range ls {
		p := httpsfv.NewItem(names[i])
		p.Params.Add("q", max(l.Limit, 0))
		p.Params.Add("w", max(inbound.CeilSeconds(l.Period), 1))
		pl[i] = p
		s := httpsfv.NewItem(names[i])
		s.Params.Add("r", max(l.Remaining, 0))
		s.Params.Add("t", inbound.CeilSeconds(l.Reset.Sub(now)))
		sl[i] = s
	}
	policy, err := httpsfv.Marshal(pl)
	if err != nil {
		return "", ""
	}
	if !withState {
		return policy, ""
	}
	state, err = httpsfv.Marshal(sl)
	if err != nil {
		return "", ""
	}
	return policy, state
}

// RateLimitFields returns the RateLimit-Policy and RateLimit field values
// (structured-field lists, as the middleware writes them) for the limits
// of a decision at now; "" for both when ls is empty. For other transports:
// the grpclimit module sends them as gRPC response metadata.
func RateLimitFields(ls []client.LimitState, now time.Time) (policy, state string) {
	return rateLimitFields(ls, now, true)
}

// fieldCache keeps the serialized RateLimit fields of recent Limits
// slices. A decision's Limits slice is shared and immutable, and a leased
// key answers every decision with the slice of its lease's answer; its
// fields change only when t, whole seconds, does. So the hot path
// serializes once per key per second. Direct-mapped, bounded, lock-free:
// a slot lost to another slice is serialized again, nothing worse.
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

const maxCachedLimits = 8

func newFieldCache() *fieldCache { return &fieldCache{seed: maphash.MakeSeed()} }

// fields returns the RateLimit-Policy and RateLimit values of ls at now.
func (fc *fieldCache) fields(ls []client.LimitState, now time.Time) (policy, state string) {
	if len(ls) == 0 || len(ls) > maxCachedLimits {
		return rateLimitFields(ls, now, true)
	}
	var ts [maxCachedLimits]int64
	for i, l := range ls {
		ts[i] = inbound.CeilSeconds(l.Reset.Sub(now))
	}
	first := &ls[0]
	slot := &fc.slots[maphash.Comparable(fc.seed, first)%uint64(len(fc.slots))]
	if e := slot.Load(); e != nil && e.first == first && e.n == len(ls) && e.ts == ts {
		return e.policy, e.state
	}
	policy, state = rateLimitFields(ls, now, true)
	slot.Store(&fieldEntry{first: first, n: len(ls), ts: ts, policy: policy, state: state})
	return policy, state
}

// setRateLimit writes the RateLimit fields of ls on h; without state, only
// RateLimit-Policy.
func (fc *fieldCache) setRateLimit(h http.Header, ls []client.LimitState, now time.Time, withState bool) {
	policy, state := fc.fields(ls, now)
	if !withState {
		state = ""
	}
	// Canonical keys set directly: Header.Set would canonicalize (and
	// allocate) on every request.
	if policy != "" {
		h[canonPolicy] = []string{policy}
	}
	if state != "" {
		h[canonState] = []string{state}
	}
}

// problem is an RFC 9457 problem body.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail,omitempty"`
	RetryAfter int64  `json:"retry_after,omitempty"`
}

func writeProblem(w http.ResponseWriter, p problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// defaultDeny writes the default 429: a problem+json body of type
// ProblemTypeQuotaExceeded. The middleware has set Retry-After and the
// RateLimit fields already.
func defaultDeny(w http.ResponseWriter, r *http.Request) {
	res, _ := ResultFrom(r.Context())
	retry, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	detail := "Too many requests: the rate limit is exhausted. Retry after " + strconv.FormatInt(retry, 10) + " s."
	if res.QueueFull {
		detail = "Too many requests are waiting for this rate limit. Retry after " + strconv.FormatInt(retry, 10) + " s."
	}
	writeProblem(w, problem{
		Type:       ProblemTypeQuotaExceeded,
		Title:      "Quota exceeded",
		Status:     http.StatusTooManyRequests,
		Detail:     detail,
		RetryAfter: retry,
	})
}
