package protocol

// Paths of the operator's view. They are defined here rather than with the
// other paths so that the wire types of the view stay in one file.
const (
	// PathKeysPrefix is the prefix of GET /v1/keys/{key}, which returns a
	// KeyStateResponse. The key follows the prefix, percent-encoded as a
	// path segment (url.PathEscape).
	PathKeysPrefix = "/v1/keys/"
	// PathStatus is the server's status page (HTML, for people).
	PathStatus = "/status"
)

// KeyStateResponse is the body of GET /v1/keys/{key}: what the server knows
// of one key right now. It is a snapshot for operators, not a decision: it
// takes nothing and opens no lease.
type KeyStateResponse struct {
	// Key is the key asked about.
	Key string `json:"key"`
	// Rule is the rule that matches the key; absent when none does.
	Rule *RuleInfo `json:"rule,omitempty"`
	// Unlimited is true when no rule matches and the default is allow;
	// when no rule matches and the default is deny, Rule is absent and
	// Unlimited false: every call on the key is refused (no_rule).
	Unlimited bool `json:"unlimited,omitempty"`
	// Default is what happens to keys that match no rule: "allow" or
	// "deny".
	Default string `json:"default"`
	// Version is the version of the rules in force (see RulesResponse).
	Version string `json:"version"`
	// Limits has the state of each of the rule's limits, in order; empty
	// when Rule is absent.
	Limits []KeyLimitState `json:"limits"`
}

// KeyLimitState is the state of one limit of a key's rule in its bucket.
type KeyLimitState struct {
	// Index is the limit's position in the rule's limits.
	Index int `json:"index"`
	// Algorithm, Limit, PeriodMillis and Burst are the limit's, as written
	// in the rule; a soft rule's bucket holds its overage on top.
	Algorithm    string `json:"algorithm"`
	Limit        int64  `json:"limit"`
	PeriodMillis int64  `json:"period_ms"`
	Burst        int64  `json:"burst"`
	// Level is the number of tokens in the bucket now (for the windows,
	// what the window still admits), fractional for a token bucket.
	Level float64 `json:"level"`
	// Free is the whole tokens a request could take now: Level rounded
	// down.
	Free int64 `json:"free"`
	// Outstanding is the number of tokens granted in open leases, spent or
	// not: they are no longer in the bucket and come back (what was not
	// spent) when their leases are settled.
	Outstanding int64 `json:"outstanding"`
	// Leases is the number of open leases on the limit's bucket.
	Leases int `json:"leases"`
	// Holders is the number of distinct owners holding open leases, when
	// the store reports it; absent when it does not (the stores report
	// Leases, which counts each owner's slots).
	Holders *int `json:"holders,omitempty"`
	// NextTokenMillis is, for a token bucket that is not full, the time
	// until its level gains the next whole token; FullMillis the time
	// until it is full again if nothing is taken: holds Burst minus
	// Outstanding, the most it can while those leases are open (their
	// settles give back what was not spent). Both are absent for the other algorithms, whose
	// window boundaries the snapshot does not carry, and zero for a full
	// bucket.
	NextTokenMillis *int64 `json:"next_token_ms,omitempty"`
	FullMillis      *int64 `json:"full_ms,omitempty"`
	// AtUnixMillis is the store's clock at the snapshot, in milliseconds
	// since the Unix epoch.
	AtUnixMillis int64 `json:"at_unix_ms"`
}
