package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits enforced by every server and checked by [LeaseRequest.Validate] and
// [CheckRequest.Validate].
const (
	// MaxKeyBytes is the longest key, in bytes.
	MaxKeyBytes = 256
	// MaxEntries is the most entries of a LeaseRequest, or keys of a
	// CheckRequest, in one call.
	MaxEntries = 1000
	// MaxCount is the largest want, used or cost.
	MaxCount = 1_000_000_000
	// MaxBodyBytes is the largest request body, in bytes (1 MiB).
	MaxBodyBytes = 1 << 20
	// MaxClientIDBytes is the longest client_id, in bytes.
	MaxClientIDBytes = 128
	// MaxLeaseIDBytes is the longest lease_id, in bytes.
	MaxLeaseIDBytes = 64
	// Slots is the number of leases a client may hold open per key.
	Slots = 2
	// MaxLimits is the most limits of one rule (the limits of a result).
	MaxLimits = 8
	// MaxPeriodMillis is the longest period of a limit, in ms (24 h).
	MaxPeriodMillis = 24 * 60 * 60 * 1000
	// MaxFillMillis is the longest a limit's capacity may take to refill
	// (a token bucket's burst) or to drain (a leaky bucket's queue), in ms
	// (100 years): a server refuses a rule beyond it.
	MaxFillMillis = 100 * 365 * 24 * 60 * 60 * 1000
	// MaxWaitMillis is the longest retry_after_ms or delay_ms a server may
	// answer: a refill of twice MaxFillMillis (a bucket in debt of
	// deferred grants refills the debt first) after leases or windows of
	// MaxPeriodMillis at most. A client takes a longer one for a lying
	// server's; waits beyond a day are correct answers (5 tokens of a
	// limit of 1 a day).
	MaxWaitMillis = 2*MaxFillMillis + MaxPeriodMillis
)

// ValidLeaseID reports whether id is a lease_id the protocol allows: 1 to
// MaxLeaseIDBytes bytes of printable ASCII without spaces. A client checks
// the IDs a server grants with it, as the server checks those it is sent.
func ValidLeaseID(id string) bool {
	return id != "" && validID(id, MaxLeaseIDBytes)
}

// Paths of the v1 API.
const (
	PathLeases  = "/v1/leases"
	PathCheck   = "/v1/check"
	PathRules   = "/v1/rules"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
)

// LeaseRequest is the body of POST /v1/leases.
type LeaseRequest struct {
	// ClientID names the calling process (for example "checkout-7f3a"). A
	// lease belongs to the authenticated client and this ID together: no
	// other caller can settle it.
	ClientID string `json:"client_id"`
	// Leases holds one entry per key and slot, each key and slot at most
	// once.
	Leases []LeaseEntry `json:"leases"`
	// Takes are direct decisions carried in the same call: each takes its
	// cost from every one of its keys, all or nothing, as POST /v1/check
	// does, and leaves no lease to settle. A key may appear in several
	// takes, and in Leases too; the takes are decided first, in order, so
	// a store failure answers the call before any lease entry changed
	// anything. Leases and the keys of every take together are at most
	// MaxEntries, and at least one.
	Takes []CheckRequest `json:"takes,omitempty"`
}

// LeaseEntry asks for, renews or returns the lease of one key.
type LeaseEntry struct {
	// Key is the bucket name, for example "user:42".
	Key string `json:"key"`
	// Want is the number of tokens asked for in the new lease, 0 to
	// MaxCount. The server may grant fewer.
	Want int64 `json:"want"`
	// LeaseID, when set, names the open lease of this client and key to
	// settle before granting.
	LeaseID string `json:"lease_id,omitempty"`
	// Used is how many tokens of the settled lease were spent, 0 to the
	// lease's grant. It must be 0 when LeaseID is empty.
	Used int64 `json:"used,omitempty"`
	// Slot is 0 or 1. A client may hold one open lease per key in each
	// slot, so it can take its next lease in one slot while it still spends
	// the current one in the other, and settle the current one only once it
	// has stopped spending it. That keeps the client's hot path busy during
	// a renewal without ever spending a token of a lease the server already
	// closed. Clients that do not double-buffer leave it 0.
	Slot int `json:"slot,omitempty"`
	// Priority is the class the lease is granted to: critical, high,
	// normal or low (see Priorities); empty means normal. A rule that
	// reserves shares for the classes above it grants the lease only from
	// what lies beyond their reserve.
	Priority string `json:"priority,omitempty"`
	// MaxDelayMillis, when positive, accepts a deferred grant: where a
	// token bucket would refuse the lease now (the bucket, or on a shared
	// key this client's fair share, does not yet hold the batch), the
	// server may grant the whole batch at once with DelayMillis the wait
	// before any of it may be spent, at most MaxDelayMillis and half the
	// lease's TTL. The client must spend none of it before its answer
	// arrived plus DelayMillis. 0 (the default) never defers: the lease is
	// refused with a retry_after instead. It is 0 to MaxCount.
	MaxDelayMillis int64 `json:"max_delay_ms,omitempty"`
}

// LeaseResponse is the body of a successful POST /v1/leases. Leases has one
// result per request entry, in the request's order.
type LeaseResponse struct {
	Leases []LeaseResult `json:"leases"`
	// Takes has one result per request take, in the request's order.
	Takes []CheckResponse `json:"takes,omitempty"`
}

// LeaseResult is the outcome of one LeaseEntry.
type LeaseResult struct {
	// Key and Slot repeat the entry's.
	Key  string `json:"key"`
	Slot int    `json:"slot,omitempty"`
	// LeaseID names the new lease; empty when nothing was granted.
	LeaseID string `json:"lease_id,omitempty"`
	// Granted is the number of tokens in the new lease, 0 to Want.
	Granted int64 `json:"granted"`
	// TTLMillis is the lease's time to live. The client's local deadline is
	// the moment it sent the request plus this TTL.
	TTLMillis int64 `json:"ttl_ms"`
	// RetryAfterMillis is set when Granted is 0 although tokens were wanted:
	// the time until the bucket can serve again. The client should deny the
	// key locally until then.
	RetryAfterMillis int64 `json:"retry_after_ms"`
	// Limit, PeriodMillis and Burst describe the rule that matched: Limit
	// tokens per period, bucket size Burst.
	Limit        int64 `json:"limit"`
	PeriodMillis int64 `json:"period_ms"`
	Burst        int64 `json:"burst"`
	// Remaining is the number of whole tokens left in the bucket after this
	// grant.
	Remaining int64 `json:"remaining"`
	// SafeRate is the rate, in tokens per second, this client may use on its
	// own if it loses every server: the rule's rate divided by the number of
	// clients currently holding leases on the key.
	SafeRate float64 `json:"safe_rate"`
	// Rule names the rule that matched; empty when no rule matched and the
	// server's default is allow.
	Rule string `json:"rule,omitempty"`
	// Algorithm is the algorithm of the rule's binding limit (the one
	// Limit, PeriodMillis and Burst describe). A client spends a lease of a
	// leaky_bucket rule as a schedule of slots, not as a pool: see
	// DelayMillis.
	Algorithm string `json:"algorithm,omitempty"`
	// DelayMillis, on a deferred grant of a token bucket (see
	// LeaseEntry.MaxDelayMillis), is the wait before any granted token may
	// be spent: the client spends none before its answer arrived plus
	// DelayMillis.
	//
	// DelayMillis, for a rule that shapes (leaky_bucket), is the time from
	// the server's decision until the first granted slot, rounded up to
	// whole milliseconds; slot i starts i·PeriodMillis/Limit after it, and
	// the slots end Granted·PeriodMillis/Limit after the first. The client
	// starts the schedule no earlier than its answer arrived plus
	// DelayMillis, and ends it no later than its request was sent plus
	// DelayMillis − 1 ms plus the Granted slots.
	DelayMillis int64 `json:"delay_ms,omitempty"`
	// Limits has the state of each limit of the rule after this entry, in
	// the rule's order: a request needs all of them. Limit, PeriodMillis
	// and Burst above describe the one with the lowest rate, Remaining the
	// least remaining.
	Limits []LimitStatus `json:"limits,omitempty"`
	// ShadowDenied is true when the rule runs in shadow mode and its limits
	// would have granted less than Want: Granted is Want all the same.
	ShadowDenied bool `json:"shadow_denied,omitempty"`
	// Borrowed is, for an elastic rule, the part of Granted its own limits
	// did not grant and its pool lent.
	Borrowed int64 `json:"borrowed,omitempty"`
	// Unlimited is true when no rule matched and the server's default is
	// allow: the key has no limit, and Granted equals Want.
	Unlimited bool `json:"unlimited,omitempty"`
	// Owned is true when nothing was granted because a lease server owns
	// the key's bucket, deciding its direct takes from memory: the client
	// should decide the key by direct takes meanwhile (they reach the
	// owner) rather than deny it; RetryAfterMillis is then at most 100.
	Owned bool `json:"owned,omitempty"`
	// Error, when set, says why this entry failed; the other fields are then
	// zero apart from Key.
	Error *Problem `json:"error,omitempty"`
}

// LimitStatus is the state of one limit of a key's rule after a decision,
// from the store's view (all clients together): what RateLimit headers
// carry.
type LimitStatus struct {
	// Algorithm, Limit, PeriodMillis and Burst describe the limit: Limit
	// tokens per period; Burst is a token bucket's size or a leaky bucket's
	// queue, and equals Limit for the windows.
	Algorithm    string `json:"algorithm"`
	Limit        int64  `json:"limit"`
	PeriodMillis int64  `json:"period_ms"`
	Burst        int64  `json:"burst"`
	// Remaining is what the limit would still admit now.
	Remaining int64 `json:"remaining"`
	// ResetMillis is the time until the limit is whole again if nothing
	// else happens: a token bucket's refill to its burst, a window's end.
	ResetMillis int64 `json:"reset_ms"`
	// Overage is, for a soft rule, the tokens beyond the base limit in use
	// (Remaining is then 0): the rule admits up to its soft share more.
	Overage int64 `json:"overage,omitempty"`
}

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	// Keys are the buckets to take Cost tokens from, all or nothing, at most
	// MaxEntries, each at most once.
	Keys []string `json:"keys"`
	// Cost is the number of tokens taken from each key, 0 to MaxCount. A
	// missing cost means 1.
	Cost *int64 `json:"cost,omitempty"`
	// MaxDelayMillis is, for keys of a shaping rule (leaky_bucket), the
	// longest wait for the request's slot the caller accepts: 0 takes the
	// slot only when it is now (an Allow), more lets the caller wait for
	// it. A slot further away is not taken, and the request is denied with
	// the time until one would be near enough. Absent: any slot the queue
	// holds. 0 to MaxCount. Other algorithms ignore it.
	MaxDelayMillis *int64 `json:"max_delay_ms,omitempty"`
	// Priority is the request's class: critical, high, normal or low (see
	// Priorities); empty means normal. A rule that reserves shares for the
	// classes above it admits the request only from what lies beyond
	// their reserve.
	Priority string `json:"priority,omitempty"`
}

// MaxDelay returns the request's MaxDelayMillis as a duration, nil when it
// is absent (no maximum).
func (r *CheckRequest) MaxDelay() *time.Duration {
	if r.MaxDelayMillis == nil {
		return nil
	}
	d := time.Duration(*r.MaxDelayMillis) * time.Millisecond
	return &d
}

// CostOrDefault returns the request's cost, 1 when it was not given.
func (r *CheckRequest) CostOrDefault() int64 {
	if r.Cost == nil {
		return 1
	}
	return *r.Cost
}

// CheckResponse is the body of a successful POST /v1/check.
type CheckResponse struct {
	// Allowed is true when Cost tokens were taken from every key.
	Allowed bool `json:"allowed"`
	// RetryAfterMillis is set when Allowed is false: the longest wait among
	// the keys that denied.
	RetryAfterMillis int64 `json:"retry_after_ms"`
	// DelayMillis is set when the request was allowed by a shaping
	// algorithm (leaky_bucket): the wait until its slot. The caller should
	// wait that long before acting.
	DelayMillis int64 `json:"delay_ms,omitempty"`
	// Keys has one result per requested key, in the request's order.
	Keys []CheckResult `json:"keys"`
	// ShadowDenied is true when a key of a rule in shadow mode denied and
	// the request was allowed all the same.
	ShadowDenied bool `json:"shadow_denied,omitempty"`
	// Borrowed is true when keys of elastic rules denied and their pools
	// served the request.
	Borrowed bool `json:"borrowed,omitempty"`
	// Error, in a LeaseResponse's Takes only, says why the take could not
	// be decided (a key the client may not use, a key that matches no rule
	// under default deny, a cost above a key's bucket); Allowed is then
	// false and Keys may be empty. POST /v1/check answers such a request
	// with the problem itself.
	Error *Problem `json:"error,omitempty"`
}

// CheckResult is the decision for one key of a CheckRequest.
type CheckResult struct {
	Key string `json:"key"`
	// Allowed is true when this key alone could serve the cost. When another
	// key denied, the tokens taken here were given back.
	Allowed          bool   `json:"allowed"`
	RetryAfterMillis int64  `json:"retry_after_ms"`
	Remaining        int64  `json:"remaining"`
	Limit            int64  `json:"limit"`
	PeriodMillis     int64  `json:"period_ms"`
	Burst            int64  `json:"burst"`
	Rule             string `json:"rule,omitempty"`
	Unlimited        bool   `json:"unlimited,omitempty"`
	// LeaseTTLMillis is the lease TTL of the rule: a client deciding the
	// key directly learns from it how long a lease of the key would live.
	LeaseTTLMillis int64 `json:"lease_ttl_ms,omitempty"`
	// Algorithm, DelayMillis and Limits are as in LeaseResult; Limit,
	// PeriodMillis and Burst describe the rule's binding limit. DelayMillis,
	// when Allowed and the rule shapes (leaky_bucket), is the time from the
	// server's decision until the request's slot, rounded up to whole
	// milliseconds: the request must not go ahead before it; a caller that
	// will not wait that long should drop the request.
	Algorithm   string        `json:"algorithm,omitempty"`
	DelayMillis int64         `json:"delay_ms,omitempty"`
	Limits      []LimitStatus `json:"limits,omitempty"`
	// ShadowDenied is true when the key's rule runs in shadow mode and
	// denied: Allowed is true all the same.
	ShadowDenied bool `json:"shadow_denied,omitempty"`
	// Borrowed is true when the key's own limits denied and its elastic
	// rule's pool served the request.
	Borrowed bool `json:"borrowed,omitempty"`
}

// Errors returned by ValidateKey; match them with errors.Is.
var (
	ErrKeyEmpty   = errors.New("key is empty")
	ErrKeyTooLong = fmt.Errorf("key is longer than %d bytes", MaxKeyBytes)
	ErrKeyUTF8    = errors.New("key is not valid UTF-8")
	ErrKeyControl = errors.New("key contains a control character")
)

// ValidateKey reports whether key is a valid bucket key: 1 to MaxKeyBytes
// bytes of valid UTF-8 without control characters (Unicode category Cc, which
// includes NUL, newline and DEL).
func ValidateKey(key string) error {
	if key == "" {
		return ErrKeyEmpty
	}
	if len(key) > MaxKeyBytes {
		return ErrKeyTooLong
	}
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return ErrKeyControl
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(key[i:])
		if r == utf8.RuneError && size == 1 {
			return ErrKeyUTF8
		}
		if unicode.IsControl(r) {
			return ErrKeyControl
		}
		i += size
	}
	return nil
}

// ValidateClientID returns nil when id is a client_id the servers accept:
// 1 to MaxClientIDBytes bytes of printable ASCII without spaces.
func ValidateClientID(id string) error {
	if id == "" || !validID(id, MaxClientIDBytes) {
		return fmt.Errorf("client_id %q: it must be 1 to %d bytes of printable ASCII without spaces", id, MaxClientIDBytes)
	}
	return nil
}

// validID checks a client_id or lease_id: printable ASCII without spaces,
// at most max bytes.
func validID(s string, max int) bool {
	if len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// Validate checks the request against the protocol's limits. It returns nil
// or a *Problem with status 422 (or 413 for too many entries) whose Detail
// names the offending entry and field.
func (r *LeaseRequest) Validate() error {
	if r.ClientID == "" {
		return NewProblem(CodeInvalidClientID, "client_id is required")
	}
	if !validID(r.ClientID, MaxClientIDBytes) {
		return NewProblem(CodeInvalidClientID, fmt.Sprintf("client_id must be 1 to %d bytes of printable ASCII without spaces", MaxClientIDBytes))
	}
	n := len(r.Leases)
	for _, t := range r.Takes {
		n += len(t.Keys)
	}
	if len(r.Leases) == 0 && len(r.Takes) == 0 {
		return NewProblem(CodeInvalidRequest, "leases and takes are empty: send at least one entry")
	}
	if n > MaxEntries {
		return NewProblem(CodeTooManyEntries, fmt.Sprintf("%d entries in one call (leases and the keys of takes); the most is %d: split the call", n, MaxEntries))
	}
	for i := range r.Takes {
		if err := r.Takes[i].validate(i); err != nil {
			return err
		}
	}
	type slotKey struct {
		key  string
		slot int
	}
	seen := make(map[slotKey]struct{}, len(r.Leases))
	for i, e := range r.Leases {
		if err := ValidateKey(e.Key); err != nil {
			return NewProblem(CodeInvalidKey, fmt.Sprintf("leases[%d].key: %v", i, err))
		}
		if e.Slot < 0 || e.Slot >= Slots {
			return NewProblem(CodeInvalidRequest, fmt.Sprintf("leases[%d].slot is %d; it must be 0 or 1", i, e.Slot))
		}
		if _, dup := seen[slotKey{e.Key, e.Slot}]; dup {
			return NewProblem(CodeDuplicateKey, fmt.Sprintf("leases[%d].key %q appears more than once in the call for slot %d", i, e.Key, e.Slot))
		}
		seen[slotKey{e.Key, e.Slot}] = struct{}{}
		if e.Want < 0 || e.Want > MaxCount {
			return NewProblem(CodeInvalidCount, fmt.Sprintf("leases[%d].want is %d; it must be 0 to %d", i, e.Want, MaxCount))
		}
		if e.Used < 0 || e.Used > MaxCount {
			return NewProblem(CodeInvalidCount, fmt.Sprintf("leases[%d].used is %d; it must be 0 to %d", i, e.Used, MaxCount))
		}
		if e.MaxDelayMillis < 0 || e.MaxDelayMillis > MaxCount {
			return NewProblem(CodeInvalidCount, fmt.Sprintf("leases[%d].max_delay_ms is %d; it must be 0 to %d", i, e.MaxDelayMillis, MaxCount))
		}
		if err := ValidatePriority(e.Priority); err != nil {
			return NewProblem(CodeInvalidPriority, fmt.Sprintf("leases[%d].priority: %v", i, err))
		}
		if e.LeaseID == "" {
			if e.Used != 0 {
				return NewProblem(CodeInvalidCount, fmt.Sprintf("leases[%d].used is %d without a lease_id; used reports the spending of the lease being settled", i, e.Used))
			}
		} else if !validID(e.LeaseID, MaxLeaseIDBytes) {
			return NewProblem(CodeInvalidLeaseID, fmt.Sprintf("leases[%d].lease_id must be at most %d bytes of printable ASCII without spaces", i, MaxLeaseIDBytes))
		}
	}
	return nil
}

// Validate checks the request against the protocol's limits. It returns nil
// or a *Problem whose Detail names the offending key or field.
func (r *CheckRequest) Validate() error { return r.validate(-1) }

// validate is Validate for the take at index take of a lease call, whose
// details then name it ("takes[2].cost ..."); take < 0 names none.
func (r *CheckRequest) validate(take int) error {
	// prefix is formatted only for a failure: a valid take costs no
	// allocation.
	prefix := func() string {
		if take < 0 {
			return ""
		}
		return "takes[" + strconv.Itoa(take) + "]."
	}
	if len(r.Keys) == 0 {
		return NewProblem(CodeInvalidRequest, prefix()+"keys is empty: send at least one key")
	}
	if len(r.Keys) > MaxEntries {
		return NewProblem(CodeTooManyEntries, fmt.Sprintf("%d keys in one call; the most is %d", len(r.Keys), MaxEntries))
	}
	if c := r.CostOrDefault(); c < 0 || c > MaxCount {
		return NewProblem(CodeInvalidCount, fmt.Sprintf("%scost is %d; it must be 0 to %d", prefix(), c, MaxCount))
	}
	if m := r.MaxDelayMillis; m != nil && (*m < 0 || *m > MaxCount) {
		return NewProblem(CodeInvalidCount, fmt.Sprintf("%smax_delay_ms is %d; it must be 0 to %d", prefix(), *m, MaxCount))
	}
	if err := ValidatePriority(r.Priority); err != nil {
		return NewProblem(CodeInvalidPriority, fmt.Sprintf("%spriority: %v", prefix(), err))
	}
	seen := make(map[string]struct{}, len(r.Keys))
	for i, k := range r.Keys {
		if err := ValidateKey(k); err != nil {
			return NewProblem(CodeInvalidKey, fmt.Sprintf("%skeys[%d]: %v", prefix(), i, err))
		}
		if _, dup := seen[k]; dup {
			return NewProblem(CodeDuplicateKey, fmt.Sprintf("%skeys[%d] %q appears more than once in the take", prefix(), i, k))
		}
		seen[k] = struct{}{}
	}
	return nil
}
