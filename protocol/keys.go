package protocol

// Paths of the operator's view. They are defined here rather than with the
// other paths so that the wire types of the view stay in one file.
const (
	// PathKeysPrefix is the prefix of GET /v1/keys/{key}, which returns a
	// KeyStateResponse. The key follows the prefix, percent-encoded as a
	// path segment (url.PathEscape: '/' as %2F; see the admin paths for a
	// path that is not canonical).
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
// The times (…_ms) assume that nothing happens meanwhile: no take, no
// grant, no settle, and every open lease running to its expiry unsettled.
type KeyLimitState struct {
	// Index is the limit's position in the rule's limits.
	Index int `json:"index"`
	// Algorithm, Limit, PeriodMillis and Burst are the limit's, as written
	// in the rule; a soft rule's bucket holds its overage on top.
	Algorithm    string `json:"algorithm"`
	Limit        int64  `json:"limit"`
	PeriodMillis int64  `json:"period_ms"`
	Burst        int64  `json:"burst"`
	// Level is, for a token bucket, the number of tokens in the bucket
	// now (fractional); for the windows, what the window still admits;
	// for a leaky bucket, the length of its queue in slots (fractional,
	// 0 when empty).
	Level float64 `json:"level"`
	// Free is the number of whole tokens (requests) a request could take
	// now: what a decision's RateLimit remaining would say.
	Free int64 `json:"free"`
	// Outstanding is the number of tokens granted in open leases, spent or
	// not: they are no longer in the bucket and come back (what was not
	// spent) when their leases are settled.
	Outstanding int64 `json:"outstanding"`
	// Leases is the number of open leases on the limit's bucket (a token
	// bucket's waiters, which hold nothing, included).
	Leases int `json:"leases"`
	// Holders is the number of distinct owners (a client's process: the
	// client's name and its client_id) holding at least one open lease on
	// the bucket; a process with a lease in each slot counts once.
	Holders int `json:"holders"`
	// OwnedBy names the lease server that owns the bucket, deciding its
	// takes from memory (see leases.OwningStore); empty when none does.
	// Level and the times are then what the owner reports when asked
	// (through it), or the most it can hold (through another server).
	OwnedBy string `json:"owned_by,omitempty"`
	// NextTokenMillis is the time until Free is one more than now; zero
	// when the bucket is whole (FullMillis zero). Per algorithm:
	//   - token_bucket: until the level gains its next whole token;
	//   - fixed_window: until the window ends;
	//   - sliding_window_counter: until the estimate has fallen by
	//     enough (as the previous window's weight decays);
	//   - sliding_window_log: until the oldest entry the log counts leaves
	//     the window (an open lease counts as an entry ending at its
	//     expiry);
	//   - leaky_bucket: until the next slot of the queue is free.
	NextTokenMillis int64 `json:"next_token_ms"`
	// FullMillis is the time until the bucket is whole again; zero when it
	// is. Per algorithm:
	//   - token_bucket: until it holds Burst minus Outstanding, the most
	//     it can while those leases are open (their settles give back what
	//     was not spent);
	//   - fixed_window: until the window ends;
	//   - sliding_window_counter: until the estimate is zero (the end of
	//     the next window when the current one counts anything);
	//   - sliding_window_log: until the newest entry leaves the window (at
	//     most);
	//   - leaky_bucket: until the queue is empty.
	FullMillis int64 `json:"full_ms"`
	// WindowEndMillis is, for fixed_window and sliding_window_counter, the
	// time until the current window ends and its count starts afresh (the
	// counter's becomes the previous window's); absent for the other
	// algorithms, which have no window boundary. It is not named reset:
	// a RateLimit reset is the time until the bucket is whole, FullMillis
	// here.
	WindowEndMillis *int64 `json:"window_end_ms,omitempty"`
	// AtUnixMillis is the store's clock at the snapshot, in milliseconds
	// since the Unix epoch.
	AtUnixMillis int64 `json:"at_unix_ms"`
}
