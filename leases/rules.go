package leases

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ratelease/ratelease/protocol"
	"go.yaml.in/yaml/v3"
)

// Algorithm names a rate-limiting algorithm of a rule.
type Algorithm string

// The algorithms a rule may name. TokenBucket and the three windows are
// implemented (see the package documentation for each one's bound);
// LeakyBucket is a reserved name: it shares the lease contract (a grant, a
// deadline, a settle) and will not change the wire protocol when it is
// added, but a rule that names it is refused today with
// ErrAlgorithmNotImplemented.
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

// ErrInvalidRules is wrapped by every error of ParseRuleSet and
// NewPolicy, so callers can tell a bad rules file from an I/O error.
var ErrInvalidRules = errors.New("invalid rules")

// Limits on rule fields.
const (
	// DefaultLeaseTTL is the lease TTL of a rule that sets none.
	DefaultLeaseTTL = 2 * time.Second
	// MaxLeaseTTL is the longest lease TTL a rule may set.
	MaxLeaseTTL = time.Hour
	// MaxPeriod is the longest period a rule may set.
	MaxPeriod = 24 * time.Hour
	// MinPeriod is the shortest period a rule may set.
	MinPeriod = time.Millisecond
)

// Rule is one limit of the rules file. A rule matches keys by a glob
// pattern; among the rules that match a key, the most specific wins (see
// Policy.Match).
type Rule struct {
	// Name identifies the rule in responses, metrics and errors. Required
	// and unique.
	Name string `yaml:"name" json:"name"`
	// Match is the glob pattern of the keys this rule governs: '*' matches
	// any run of characters, '?' one character, '\' escapes. Required and
	// unique.
	Match string `yaml:"match" json:"match"`
	// Algorithm defaults to token_bucket.
	Algorithm Algorithm `yaml:"algorithm" json:"algorithm"`
	// Limit is the number of tokens added per Period: 1 to
	// protocol.MaxCount.
	Limit int64 `yaml:"limit" json:"limit"`
	// Period is the refill period: MinPeriod to MaxPeriod.
	Period time.Duration `yaml:"period" json:"-"`
	// Burst is the bucket size: 1 to protocol.MaxCount; 0 means Limit.
	Burst int64 `yaml:"burst" json:"burst"`
	// LeaseTTL is how long a lease lives before it expires unsettled:
	// up to MaxLeaseTTL; 0 means DefaultLeaseTTL.
	LeaseTTL time.Duration `yaml:"lease_ttl" json:"-"`
}

// Rate returns the rule's refill rate in tokens per second.
func (r *Rule) Rate() float64 {
	return float64(r.Limit) / r.Period.Seconds()
}

// Bucket returns the parameters a Store needs to run this rule.
func (r *Rule) Bucket() Bucket {
	return Bucket{Algorithm: r.Algorithm, Limit: r.Limit, Period: r.Period, Burst: r.Burst, LeaseTTL: r.LeaseTTL}
}

// withDefaults fills the zero fields that have defaults.
func (r Rule) withDefaults() Rule {
	if r.Algorithm == "" {
		r.Algorithm = TokenBucket
	}
	if r.Burst == 0 {
		r.Burst = r.Limit
	}
	if r.LeaseTTL == 0 {
		r.LeaseTTL = DefaultLeaseTTL
	}
	return r
}

// Validate checks a rule, after defaults, and returns an error that names
// the rule and the field.
func (r *Rule) Validate() error {
	name := r.Name
	if name == "" {
		name = fmt.Sprintf("(match %q)", r.Match)
	}
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: rule %q: %s: %s", ErrInvalidRules, name, field, fmt.Sprintf(format, args...))
	}
	if r.Name == "" {
		return fail("name", "is required")
	}
	if err := validGlob(r.Match); err != nil {
		return fail("match", "%v", err)
	}
	alg, implemented := algorithms[r.Algorithm]
	switch {
	case implemented:
	case slices.Contains(knownAlgorithms, r.Algorithm):
		return fmt.Errorf("%w: rule %q: algorithm: %q: %w (supported: %s)", ErrInvalidRules, name, r.Algorithm, ErrAlgorithmNotImplemented, supported())
	default:
		return fail("algorithm", "unknown algorithm %q (supported: %s)", r.Algorithm, supported())
	}
	if r.Limit <= 0 || r.Limit > protocol.MaxCount {
		return fail("limit", "is %d; it must be 1 to %d", r.Limit, protocol.MaxCount)
	}
	if r.Period < MinPeriod || r.Period > MaxPeriod {
		return fail("period", "is %v; it must be %v to %v", r.Period, MinPeriod, MaxPeriod)
	}
	if r.Burst <= 0 || r.Burst > protocol.MaxCount {
		return fail("burst", "is %d; it must be 1 to %d (or left out to default to limit)", r.Burst, protocol.MaxCount)
	}
	if r.LeaseTTL < time.Millisecond || r.LeaseTTL > MaxLeaseTTL {
		return fail("lease_ttl", "is %v; it must be 1ms to %v (or left out for %v)", r.LeaseTTL, MaxLeaseTTL, DefaultLeaseTTL)
	}
	if rate := r.Rate(); rate*1e-6 < 1e-12 || math.IsInf(rate, 0) {
		return fail("limit", "rate %g tokens/s is out of range", rate)
	}
	if alg.validate != nil {
		b := r.Bucket()
		if err := alg.validate(&b); err != nil {
			return fmt.Errorf("%w: rule %q: %w", ErrInvalidRules, name, err)
		}
	}
	return nil
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

// RuleSet is the rules part of a rules file, as written. Server-side
// sections (clients) are decoded by package server, which embeds RuleSet.
type RuleSet struct {
	// Default applies to keys that match no rule; empty means allow.
	Default Default `yaml:"default"`
	// Rules in file order.
	Rules []Rule `yaml:"rules"`
}

// ParseRuleSet decodes YAML rules. Unknown fields are an error, so a typo
// ("limt") is reported rather than silently ignored. It does not validate:
// NewPolicy does.
func ParseRuleSet(data []byte) (RuleSet, error) {
	var rs RuleSet
	if err := DecodeYAMLStrict(data, &rs); err != nil {
		return RuleSet{}, err
	}
	return rs, nil
}

// DecodeYAMLStrict decodes one YAML document into v, refusing unknown fields.
// An empty document decodes to the zero value. Errors wrap ErrInvalidRules.
func DecodeYAMLStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", ErrInvalidRules, err)
	}
	return nil
}

// LoadPolicy reads a rules file and compiles it.
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read rules: %w", err)
	}
	rs, err := ParseRuleSet(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p, err := NewPolicy(rs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
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
		r = r.withDefaults()
		if err := r.Validate(); err != nil {
			return nil, err
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
