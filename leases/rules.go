package leases

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ratelease/ratelease/protocol"
)

// Algorithm names a rate-limiting algorithm of a rule.
type Algorithm string

// The algorithms a limit may name. A name the stores do not implement is
// refused by validation with ErrAlgorithmNotImplemented (see Implemented).
const (
	TokenBucket          Algorithm = "token_bucket"
	FixedWindow          Algorithm = "fixed_window"
	SlidingWindowCounter Algorithm = "sliding_window_counter"
	SlidingWindowLog     Algorithm = "sliding_window_log"
	LeakyBucket          Algorithm = "leaky_bucket"
)

// ErrAlgorithmNotImplemented is wrapped by the validation error of a rule
// that names a known but not yet implemented algorithm.
var ErrAlgorithmNotImplemented = errors.New("algorithm not implemented yet")

// ErrInvalidRules is wrapped by every error of NewPolicy and
// Rule.Validate, so callers can tell bad rules from an I/O error.
var ErrInvalidRules = errors.New("invalid rules")

// Limits on rule fields.
const (
	// DefaultLeaseTTL is the lease TTL of a rule that sets none.
	DefaultLeaseTTL = 2 * time.Second
	// MaxLeaseTTL is the longest lease TTL a rule may set.
	MaxLeaseTTL = time.Hour
	// MaxPeriod is the longest period a rule may set (the protocol's, which
	// clients check answers against).
	MaxPeriod = protocol.MaxPeriodMillis * time.Millisecond
	// MinPeriod is the shortest period a rule may set.
	MinPeriod = time.Millisecond
)

// MaxRuleNameBytes is the longest rule name, in bytes.
const MaxRuleNameBytes = 128

// MaxLimitsPerRule is the most limits one rule may hold (the protocol's,
// which clients check answers against).
const MaxLimitsPerRule = protocol.MaxLimits

// Limit is one limit of a rule: Limit tokens per Period under Algorithm.
// A request needs every limit of its rule ("3 per minute and 100 per
// hour").
type Limit struct {
	// Algorithm defaults to token_bucket.
	Algorithm Algorithm
	// Limit is the number of tokens per Period: for a token bucket and a
	// leaky bucket its refill (outflow) rate, for a window the most
	// admitted per window. 1 to protocol.MaxCount.
	Limit int64
	// Period is the refill period or the window: MinPeriod to MaxPeriod.
	Period time.Duration
	// Burst is the bucket size of a token bucket and the queue size of a
	// leaky bucket: 1 to protocol.MaxCount, and no more than the rate
	// refills (or drains) in MaxFillTime; 0 means Limit. The windows
	// take no burst (it is their Limit).
	Burst int64
}

// Rate returns the limit's rate in tokens per second.
func (l *Limit) Rate() float64 {
	return float64(l.Limit) / l.Period.Seconds()
}

// Bucket returns the parameters a Store needs to run this limit with
// leases of lifetime ttl.
func (l *Limit) Bucket(ttl time.Duration) Bucket {
	return Bucket{Algorithm: l.Algorithm, Limit: l.Limit, Period: l.Period, Burst: l.Burst, LeaseTTL: ttl}
}

// Rule is one rule of a rule set. A rule matches keys by a glob pattern;
// among the rules that match a key, the most specific wins (see
// Policy.Match).
//
// A rule holds one limit or several: a rule with one may give it in the
// shorthand fields (Algorithm, Limit, Period, Burst) instead of Limits. The
// rules of a Policy always carry their limits in Limits, with defaults
// filled in, and the shorthand fields zero.
type Rule struct {
	// Name identifies the rule in responses, metrics, logs, errors and the
	// admin API's paths. Required and unique: 1 to MaxRuleNameBytes (128)
	// bytes of UTF-8 without control characters (Unicode category Cc: NUL,
	// tab, newline, ESC, DEL, U+0080 to U+009F), as keys are, nor
	// invisible format characters (category Cf: U+200B zero-width space,
	// U+202E right-to-left override, U+FEFF, …). A Policy's rule may not
	// be named OverrideRuleName.
	Name string
	// Match is the glob pattern of the keys this rule governs: '*' matches
	// any run of characters, '?' one character, '\' escapes. Required and
	// unique.
	Match string

	// Algorithm, Limit, Period and Burst are the shorthand of a rule with
	// one limit (see Limit); leave them zero when Limits is set.
	Algorithm Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64

	// Limits are the rule's limits, 1 to MaxLimitsPerRule.
	Limits []Limit
	// LeaseTTL is how long a lease lives before it expires unsettled:
	// up to MaxLeaseTTL; 0 means DefaultLeaseTTL. A window's lease ends at
	// the latest with its window.
	LeaseTTL time.Duration

	// Soft is soft throttling: each limit admits up to its Limit and Burst
	// times 1 + Soft (0.05 for "5%": 500/min admits 525), 0 to MaxSoft.
	// Responses report the base limit, what remains of it, and the
	// overage in use (LimitStatus.Overage). Zero is hard throttling.
	Soft float64
	// Shadow runs the rule in shadow mode: every request is decided,
	// counted and reported, but admitted. A lease grants what was asked,
	// though the limits grant what they would; Report.ShadowDenials counts
	// what they would have denied. For rolling a new rule out safely.
	Shadow bool
	// Elastic names a pool key: a request this rule's own limits deny may
	// borrow from the pool's bucket (governed by its own rule, of one
	// limit), so that callers exceed their limit only while the pool has
	// room. See elastic.go for the bound. Empty is no borrowing.
	Elastic string
	// Reserve keeps shares of each limit for the priority classes (see
	// protocol.Priorities, highest first): Reserve["critical"] = 0.2 keeps
	// 20% of each limit's capacity from every class below critical. A
	// request of class c may not take a limit below its floor, the
	// capacity times the sum of the shares of the classes above c,
	// rounded up (see Floor). Shares are fractions, 0 to 1, summing to
	// less than 1; the keys are class names. Nil reserves nothing.
	Reserve map[string]float64
}

// Floor returns what a request of class priority must leave free of a
// limit of capacity tokens (a token bucket's burst, a window's limit, a
// leaky bucket's queue): ⌈capacity × Σ Reserve[k]⌉ over the classes k
// above priority. An empty or unknown class counts as normal. The sum runs
// in the order of protocol.Priorities, so every server computes the same
// floor.
func (r *Rule) Floor(priority string, capacity int64) int64 {
	if len(r.Reserve) == 0 {
		return 0
	}
	rank, ok := protocol.PriorityRank(priority)
	if !ok {
		rank, _ = protocol.PriorityRank(protocol.PriorityNormal)
	}
	sum := 0.0
	for _, c := range protocol.Priorities[:rank] {
		sum += r.Reserve[c]
	}
	if sum <= 0 {
		return 0
	}
	// The margin keeps 100 × 0.3 (30.000000000000004) at 30.
	return min(capacity, int64(math.Ceil(float64(capacity)*sum-1e-9)))
}

// MaxSoft is the largest Rule.Soft: a soft limit admits at most 11 times
// its base.
const MaxSoft = 10.0

// Buckets returns the parameters a Store needs to run each of the rule's
// limits, in order: with a soft rule's overage added.
func (r *Rule) Buckets() []Bucket {
	out := make([]Bucket, len(r.Limits))
	for i := range r.Limits {
		out[i] = r.bucket(i)
	}
	return out
}

// bucket returns the store parameters of limit i: its Limit and Burst
// raised by the soft overage.
func (r *Rule) bucket(i int) Bucket {
	b := r.Limits[i].Bucket(r.LeaseTTL)
	b.Limit += r.overage(b.Limit)
	b.Burst += r.overage(b.Burst)
	return b
}

// overage returns the tokens a soft rule admits beyond n.
func (r *Rule) overage(n int64) int64 {
	if r.Soft <= 0 {
		return 0
	}
	return int64(math.Floor(float64(n) * r.Soft))
}

// Binding returns the index of the limit with the lowest rate, which binds
// first under steady demand; clients pace by it.
func (r *Rule) Binding() int {
	best := 0
	for i := range r.Limits {
		if r.Limits[i].Rate() < r.Limits[best].Rate() {
			best = i
		}
	}
	return best
}

// shorthand reports whether any of the one-limit shorthand fields is set.
func (r *Rule) shorthand() bool {
	return r.Algorithm != "" || r.Limit != 0 || r.Period != 0 || r.Burst != 0
}

// withDefaults returns the rule with its limits in Limits and the zero
// fields that have defaults filled in. The Limits slice is a copy.
func (r Rule) withDefaults() Rule {
	if len(r.Limits) == 0 {
		r.Limits = []Limit{{Algorithm: r.Algorithm, Limit: r.Limit, Period: r.Period, Burst: r.Burst}}
		r.Algorithm, r.Limit, r.Period, r.Burst = "", 0, 0, 0
	} else {
		r.Limits = append([]Limit(nil), r.Limits...)
	}
	if len(r.Reserve) > 0 {
		res := make(map[string]float64, len(r.Reserve))
		for c, v := range r.Reserve {
			res[c] = v
		}
		r.Reserve = res
	}
	for i := range r.Limits {
		l := &r.Limits[i]
		if l.Algorithm == "" {
			l.Algorithm = TokenBucket
		}
		if l.Burst == 0 {
			l.Burst = l.Limit
		}
	}
	if r.LeaseTTL == 0 {
		r.LeaseTTL = DefaultLeaseTTL
	}
	return r
}

// isFormat reports whether c is a Unicode format character (category Cf:
// zero-width spaces and joiners, bidirectional marks, overrides and
// isolates, the byte order mark, the soft hyphen, …).
func isFormat(c rune) bool { return unicode.Is(unicode.Cf, c) }

// Validate checks a rule, after defaults (the rules of a Policy have them;
// a Rule written by hand is checked as NewPolicy would check it), and
// returns an error that names the rule and the field.
func (r *Rule) Validate() error {
	name := r.Name
	switch {
	case name == "":
		name = fmt.Sprintf("(match %q)", r.Match)
	case len(name) > MaxRuleNameBytes:
		name = fmt.Sprintf("%.32s...", name) // not echoed whole: it may be megabytes
	}
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: rule %q: %s: %s", ErrInvalidRules, name, field, fmt.Sprintf(format, args...))
	}
	if r.Name == "" {
		return fail("name", "is required")
	}
	if !utf8.ValidString(r.Name) {
		// A name labels metrics, which take UTF-8 only: a rule of the rule
		// database may come from a percent-encoded path or from Redis.
		return fail("name", "is not valid UTF-8")
	}
	if len(r.Name) > MaxRuleNameBytes {
		return fail("name", "is %d bytes; a rule name is at most %d", len(r.Name), MaxRuleNameBytes)
	}
	if i := strings.IndexFunc(r.Name, unicode.IsControl); i >= 0 {
		// A name labels metrics, goes into logs and names an admin API
		// path: a newline, a NUL or an escape sequence has no place there.
		c, _ := utf8.DecodeRuneInString(r.Name[i:])
		return fail("name", "holds the control character %U at byte %d; a rule name is printable text", c, i)
	}
	if i := strings.IndexFunc(r.Name, isFormat); i >= 0 {
		// Nor an invisible format character (a zero-width space, a
		// bidirectional override): "api" and "api​" would be two
		// rules that look alike in metrics, logs and the status page, and
		// an override reorders what a log line shows.
		c, _ := utf8.DecodeRuneInString(r.Name[i:])
		return fail("name", "holds the invisible format character %U at byte %d; a rule name is printable text", c, i)
	}
	if err := validGlob(r.Match); err != nil {
		return fail("match", "%v", err)
	}
	if len(r.Limits) > 0 && r.shorthand() {
		return fail("limits", "give algorithm, limit, period and burst either on the rule (one limit) or in limits, not both")
	}
	d := r.withDefaults()
	if len(d.Limits) > MaxLimitsPerRule {
		return fail("limits", "has %d limits; a rule holds at most %d", len(d.Limits), MaxLimitsPerRule)
	}
	for i := range d.Limits {
		prefix := ""
		if len(r.Limits) > 0 {
			prefix = fmt.Sprintf("limits[%d].", i)
		}
		if err := d.Limits[i].validate(); err != nil {
			return fmt.Errorf("%w: rule %q: %s%w", ErrInvalidRules, name, prefix, err)
		}
		if d.Limits[i].Algorithm == LeakyBucket && len(d.Limits) > 1 {
			return fail(prefix+"algorithm", "leaky_bucket shapes requests into a schedule of its own and must be the rule's only limit")
		}
	}
	if d.LeaseTTL < time.Millisecond || d.LeaseTTL > MaxLeaseTTL {
		return fail("lease_ttl", "is %v; it must be 1ms to %v (or left out for %v)", d.LeaseTTL, MaxLeaseTTL, DefaultLeaseTTL)
	}
	if !(r.Soft >= 0 && r.Soft <= MaxSoft) {
		return fail("soft", "is %g; it must be 0 to %g (0%% to %g%%)", r.Soft, MaxSoft, MaxSoft*100)
	}
	for i := range d.Limits {
		if b := d.bucket(i); b.Limit > protocol.MaxCount || b.Burst > protocol.MaxCount {
			return fail("soft", "raises limits[%d] above %d", i, protocol.MaxCount)
		} else if fillTime(&b) > float64(MaxFillTime) {
			return fail("soft", "raises limits[%d]'s burst to %d, which takes %s to %s; at most 100 years", i, b.Burst, fillYears(&b), fillWhat(&b))
		}
	}
	return r.validateReserve(fail)
}

// validateReserve checks Reserve: known classes, shares 0 to 1, a sum
// below 1.
func (r *Rule) validateReserve(fail func(field, format string, args ...any) error) error {
	sum := 0.0
	for _, c := range protocol.Priorities {
		v, ok := r.Reserve[c]
		if !ok {
			continue
		}
		if !(v >= 0 && v <= 1) {
			return fail("reserve."+c, "is %g (%g%%); a share must be 0%% to 100%%", v, v*100)
		}
		sum += v
	}
	for c := range r.Reserve {
		if _, ok := protocol.PriorityRank(c); !ok || c == "" {
			return fail("reserve", "names %q, which is not a priority class (critical, high, normal or low)", c)
		}
	}
	if sum >= 1-1e-9 {
		return fail("reserve", "shares sum to %g%%; they must sum to less than 100%% so that the lowest class can take something", sum*100)
	}
	return nil
}

// fieldError is a limit's validation error: the field, then what is wrong.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// validate checks one limit, after defaults.
func (l *Limit) validate() error {
	fail := func(field, format string, args ...any) error {
		return &fieldError{field, fmt.Sprintf(format, args...)}
	}
	alg, implemented := algorithms[l.Algorithm]
	switch {
	case implemented:
	case slices.Contains(knownAlgorithms, l.Algorithm):
		return fmt.Errorf("algorithm: %q: %w (supported: %s)", l.Algorithm, ErrAlgorithmNotImplemented, supported())
	default:
		return fail("algorithm", "unknown algorithm %q (supported: %s)", l.Algorithm, supported())
	}
	if l.Limit <= 0 || l.Limit > protocol.MaxCount {
		return fail("limit", "is %d; it must be 1 to %d", l.Limit, protocol.MaxCount)
	}
	if l.Period < MinPeriod || l.Period > MaxPeriod {
		return fail("period", "is %v; it must be %v to %v", l.Period, MinPeriod, MaxPeriod)
	}
	if l.Burst <= 0 || l.Burst > protocol.MaxCount {
		return fail("burst", "is %d; it must be 1 to %d (or left out to default to limit)", l.Burst, protocol.MaxCount)
	}
	if rate := l.Rate(); rate*1e-6 < 1e-12 || math.IsInf(rate, 0) {
		return fail("limit", "rate %g tokens/s is out of range", rate)
	}
	if alg.validate != nil {
		b := l.Bucket(DefaultLeaseTTL)
		if err := alg.validate(&b); err != nil {
			return err
		}
	}
	if b := l.Bucket(DefaultLeaseTTL); fillTime(&b) > float64(MaxFillTime) {
		return fail("burst", "is %d: at %d per %v it takes %s to %s; at most 100 years (a burst of %d at this rate)",
			l.Burst, l.Limit, l.Period, fillYears(&b), fillWhat(&b), maxBurst(&b))
	}
	return nil
}

// MaxFillTime is the longest a token bucket may take to refill its burst,
// and a leaky bucket to drain its queue (Burst × Period / Limit): a
// hundred years. Beyond it the stores' waits and deadlines, µs in an
// int64 and a time.Duration, in Lua a double, lose precision and then
// overflow: a bucket of 1 per day and a burst of 10^9 (2.7 million years)
// deferred a grant of 2×10^8 tokens with a delay of 0 on an empty bucket,
// 1.2×10^9 admitted at one instant in the memory store, and failed every
// call on its key in Redis, after writing half its state.
const MaxFillTime = protocol.MaxFillMillis * time.Millisecond

// fillTime returns the time b's capacity takes to refill (or drain), in
// ns, 0 for the windows, which have no burst.
func fillTime(b *Bucket) float64 {
	if a := algName(b); a != TokenBucket && a != LeakyBucket {
		return 0
	}
	return float64(b.Burst) * float64(b.Period) / float64(b.Limit)
}

// fillYears returns fillTime in years, for an error message.
func fillYears(b *Bucket) string {
	return fmt.Sprintf("%.3g years", fillTime(b)/float64(365*24*time.Hour))
}

// fillWhat says what fillTime measures, for an error message.
func fillWhat(b *Bucket) string {
	if algName(b) == LeakyBucket {
		return "drain the queue"
	}
	return "refill the bucket"
}

// maxBurst returns the largest burst b's rate refills within MaxFillTime.
func maxBurst(b *Bucket) int64 {
	return int64(math.Floor(float64(MaxFillTime) * float64(b.Limit) / float64(b.Period)))
}

// knownAlgorithms are the algorithm names a rule may give, implemented or
// not, in the order error messages list them.
var knownAlgorithms = []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket}

// supported lists the implemented algorithms, for error messages.
func supported() string {
	var names []string
	for _, a := range knownAlgorithms {
		if algorithms[a] != nil {
			names = append(names, string(a))
		}
	}
	return strings.Join(names, ", ")
}

// Default says what happens to a key that matches no rule.
type Default string

const (
	// DefaultAllow lets a key that matches no rule through without limit.
	DefaultAllow Default = "allow"
	// DefaultDeny refuses a key that matches no rule (protocol.CodeNoRule).
	DefaultDeny Default = "deny"
)

// RuleSet is a set of rules as written, before validation. Package server
// reads it from a rules file.
type RuleSet struct {
	// Default applies to keys that match no rule; empty means allow.
	Default Default
	// Rules in order.
	Rules []Rule
}

// Policy is a validated, compiled RuleSet. It is immutable and safe for
// concurrent use; a reload builds a new Policy.
type Policy struct {
	def     Default
	rules   []Rule           // validated, with defaults, file order
	exact   map[string]*Rule // literal patterns
	ordered []*Rule          // wildcard patterns, most specific first
}

// NewPolicy validates rs and compiles it. Errors name the rule and field at
// fault and wrap ErrInvalidRules.
func NewPolicy(rs RuleSet) (*Policy, error) {
	p := &Policy{def: rs.Default, exact: map[string]*Rule{}}
	switch p.def {
	case "":
		p.def = DefaultAllow
	case DefaultAllow, DefaultDeny:
	default:
		return nil, fmt.Errorf("%w: default: %q must be allow or deny", ErrInvalidRules, rs.Default)
	}
	p.rules = make([]Rule, len(rs.Rules))
	names := map[string]bool{}
	matches := map[string]string{}
	for i, r := range rs.Rules {
		if err := r.Validate(); err != nil {
			return nil, err
		}
		r = r.withDefaults()
		if r.Name == OverrideRuleName {
			// The name of every per-key override (see NewOverrideRule):
			// a rule by that name would share their metrics and look like
			// one in every answer.
			return nil, fmt.Errorf("%w: rule %q: name: is the name of per-key overrides; choose another", ErrInvalidRules, r.Name)
		}
		if names[r.Name] {
			return nil, fmt.Errorf("%w: rule %q: name: used by more than one rule", ErrInvalidRules, r.Name)
		}
		names[r.Name] = true
		if other, dup := matches[r.Match]; dup {
			return nil, fmt.Errorf("%w: rule %q: match: %q is also the match of rule %q", ErrInvalidRules, r.Name, r.Match, other)
		}
		matches[r.Match] = r.Name
		p.rules[i] = r
	}
	for i := range p.rules {
		r := &p.rules[i]
		if lit, ok := isLiteralGlob(r.Match); ok {
			p.exact[lit] = r
			continue
		}
		p.ordered = append(p.ordered, r)
	}
	sort.SliceStable(p.ordered, func(a, b int) bool {
		la, sa := globSpecificity(p.ordered[a].Match)
		lb, sb := globSpecificity(p.ordered[b].Match)
		if la != lb {
			return la > lb
		}
		return sa < sb
	})
	if err := validateElastic(p); err != nil {
		return nil, err
	}
	return p, nil
}

// Default returns what happens to keys that match no rule.
func (p *Policy) Default() Default { return p.def }

// Rules returns the rules in file order, with defaults filled in. The slice
// is a copy.
func (p *Policy) Rules() []Rule { return append([]Rule(nil), p.rules...) }

// Match returns the rule that governs key: a rule whose pattern is the key
// itself wins; otherwise the matching pattern with the most literal
// characters, then the fewest '*', then the earliest in the file. It returns
// false when no rule matches. Match does not allocate.
func (p *Policy) Match(key string) (*Rule, bool) {
	if r, ok := p.exact[key]; ok {
		return r, true
	}
	for _, r := range p.ordered {
		if globMatch(r.Match, key) {
			return r, true
		}
	}
	return nil, false
}
