package protocol

// RulesResponse is the body of GET /v1/rules: the rules in force that the
// caller can reach, and what the caller may do. It never carries the
// clients' token hashes.
//
// Rules are filtered by the caller's key patterns: a rule is listed only
// when some valid key (see ValidateKey) matches both the rule's pattern and
// one of the caller's, so a client does not learn the patterns and limits
// of keys it may not use. A client whose patterns include "*" (and the
// anonymous caller of a server without clients) sees every rule that can
// match a key at all.
type RulesResponse struct {
	// Version is the hex SHA-256 of the rules file in force; it changes
	// with every reload.
	Version string `json:"version"`
	// Default says what happens to keys that match no rule: "allow" or
	// "deny".
	Default string `json:"default"`
	// Rules are the rules the caller's key patterns can reach (see above),
	// in file order, with defaults filled in.
	Rules []RuleInfo `json:"rules"`
	// Client is the caller's client name, "anonymous" when the server has
	// no clients configured.
	Client string `json:"client"`
	// Keys are the glob patterns of the keys the caller may use.
	Keys []string `json:"keys"`
}

// RuleInfo describes one rule in a RulesResponse. Durations are given both
// as Go duration strings ("1s", "1m") and in milliseconds.
type RuleInfo struct {
	// Name identifies the rule.
	Name string `json:"name"`
	// Match is the rule's glob pattern.
	Match string `json:"match"`
	// Algorithm, Limit, Period and Burst describe the rule's first limit
	// (its only one, for most rules); Limits lists them all.
	Algorithm string `json:"algorithm"`
	// Limit tokens per Period.
	Limit int64 `json:"limit"`
	// Period is the refill period or window, as "1s"; PeriodMillis in
	// milliseconds.
	Period       string `json:"period"`
	PeriodMillis int64  `json:"period_ms"`
	// Burst is the bucket (or queue) size.
	Burst int64 `json:"burst"`
	// Limits are the rule's limits, in order; a request needs all of them.
	Limits []LimitInfo `json:"limits"`
	// LeaseTTL is the lifetime of a lease, as "2s"; LeaseTTLMillis in
	// milliseconds.
	LeaseTTL       string `json:"lease_ttl"`
	LeaseTTLMillis int64  `json:"lease_ttl_ms"`
	// Soft is the soft overage as a fraction (0.05 for 5%); 0 for a hard
	// rule.
	Soft float64 `json:"soft,omitempty"`
	// Shadow is true for a rule in shadow mode: decided and counted, but
	// every request is admitted.
	Shadow bool `json:"shadow,omitempty"`
	// Elastic is the pool key a rule's denied requests may borrow from.
	Elastic string `json:"elastic,omitempty"`
	// Reserve is the share of each limit kept for the priority classes
	// above a request's, per class, as fractions (see Priorities).
	Reserve map[string]float64 `json:"reserve,omitempty"`
}

// LimitInfo describes one limit of a rule in a RuleInfo.
type LimitInfo struct {
	Algorithm    string `json:"algorithm"`
	Limit        int64  `json:"limit"`
	Period       string `json:"period"`
	PeriodMillis int64  `json:"period_ms"`
	Burst        int64  `json:"burst"`
}
