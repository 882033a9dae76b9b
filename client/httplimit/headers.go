package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/internal/inbound"
)

// Header names of draft-ietf-httpapi-ratelimit-headers.
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
)

// The header names in canonical form: the middleware sets them directly,
// since Header.Set would canonicalize (and allocate) on every request.
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
	return inbound.PolicyName(l)
}

// RateLimitFields returns the RateLimit-Policy and RateLimit field values
// (structured-field lists, as the middleware writes them) for the limits
// of a decision at now; "" for both when ls is empty. For other transports:
// the grpclimit module sends them as gRPC response metadata.
//
//	RateLimit-Policy: "100-per-1m";q=100;w=60
//	RateLimit: "100-per-1m";r=57;t=12
//
// q is the limit, w its period in seconds (rounded up), r what the limit
// still admits fleet-wide, t the seconds until it is whole again (rounded
// up).
func RateLimitFields(ls []client.LimitState, now time.Time) (policy, state string) {
	return inbound.RateLimitFields(ls, now)
}

// setFields writes the RateLimit fields of out on h, as the shared limiter
// says (inbound.Limiter.Fields: from its cache).
func (m *Middleware) setFields(h http.Header, out *inbound.Decided) {
	policy, state := m.core.Fields(out, time.Now())
	inbound.SetValues(h, canonPolicy, policy, canonState, state)
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
