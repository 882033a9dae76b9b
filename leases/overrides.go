package leases

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Overrides supplies per-key rules that take precedence over every rule of
// the Policy: an override of key K is a rule that matches exactly K.
//
// # Why a layer, not a Policy rebuild
//
// A Policy's exact-match map already gives a literal pattern precedence over
// every glob, so an override could be a literal rule added to the
// RuleSet. But overrides come by the million (a plan per customer) and
// change one at a time: rebuilding and re-validating a Policy per change,
// and holding every override in each server's memory, would not scale. So
// the Engine consults Overrides first, for the keys of a call, and falls
// back to Policy.Match for keys without one. An implementation caches what
// it looked up (package server's keeps an LRU with a TTL over the Redis
// rule database), so that a key already seen costs a map lookup.
//
// The bucket of a key is its store key whatever rule governs it, so a key
// moved to or from an override keeps its state, as it does when a glob rule
// changes.
type Overrides interface {
	// Lookup returns the overrides of those keys that have one, by key;
	// keys without one are absent (a nil map when none has one). The rules
	// must have been built by NewOverrideRule (validated, with defaults).
	// An error fails the whole call, as a store error does: wrap
	// ErrStoreUnavailable when the source of overrides does not answer.
	// But an *OverridesUnavailableError, returned with the overrides of
	// the other keys, fails only the entries and takes of its Keys, while
	// the store serves other keys (a Redis Cluster whose node that holds
	// the overrides is down; see RedisStore.ServesOthers).
	Lookup(ctx context.Context, keys []string) (map[string]*Rule, error)
}

// OverridesUnavailableError is the error of an Overrides.Lookup that could
// not tell whether Keys have an override (its source did not answer) and
// answered for the call's other keys. Err wraps ErrStoreUnavailable.
type OverridesUnavailableError struct {
	Keys []string
	Err  error
}

func (e *OverridesUnavailableError) Error() string {
	return fmt.Sprintf("the overrides of %d keys: %v", len(e.Keys), e.Err)
}

// Unwrap returns Err.
func (e *OverridesUnavailableError) Unwrap() error { return e.Err }

// servesOthers is implemented by the stores that can fail some keys alone
// and say whether they serve the others (RedisStore on a cluster).
type servesOthers interface {
	ServesOthers(ctx context.Context) bool
}

// OverrideRuleName is the Name of every rule NewOverrideRule builds. It is
// the same for every key so that metrics and logs labelled by rule name
// keep a bounded cardinality however many overrides there are.
const OverrideRuleName = "override"

// NewOverrideRule validates the limits of an override for key (r's Name
// and Match are ignored and set: Name to OverrideRuleName, Match to key
// with its glob characters escaped) and returns the rule with defaults
// filled in, as a Policy holds its rules. Errors wrap ErrInvalidRules and
// name the field at fault, as NewPolicy's do.
func NewOverrideRule(key string, r Rule) (*Rule, error) {
	r.Name = OverrideRuleName
	r.Match = EscapeGlob(key)
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("override of key %q: %w", key, err)
	}
	d := r.withDefaults()
	return &d, nil
}

// EscapeGlob returns the glob pattern that matches s and nothing else: s
// with '*', '?' and '\' escaped by a backslash.
func EscapeGlob(s string) string {
	if !strings.ContainsAny(s, `*?\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 4)
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// leaseOverrides returns the overrides of the asks' keys, nil when the
// engine has no Overrides or no key has one, and the keys whose overrides
// could not be looked up while the store serves others (see
// lookupOverrides).
func (e *Engine) leaseOverrides(ctx context.Context, asks []LeaseAsk) (map[string]*Rule, map[string]error, error) {
	if e.overrides == nil || len(asks) == 0 {
		return nil, nil, nil
	}
	keys := make([]string, len(asks))
	for i := range asks {
		keys[i] = asks[i].Key
	}
	return e.lookupOverrides(ctx, keys)
}

// takeOverrides is leaseOverrides for the takes' keys.
func (e *Engine) takeOverrides(ctx context.Context, takes []TakeAsk) (map[string]*Rule, map[string]error, error) {
	if e.overrides == nil || len(takes) == 0 {
		return nil, nil, nil
	}
	var keys []string
	for i := range takes {
		keys = append(keys, takes[i].Keys...)
	}
	return e.lookupOverrides(ctx, keys)
}

// lookupOverrides looks keys' overrides up. When the lookup failed for some
// keys alone (an *OverridesUnavailableError) and the store serves other
// keys, it returns those keys with the cause: their entries and takes fail
// alone, as when the store fails for them (storeFailedFor), and the others
// are decided. Otherwise a failure fails the call.
func (e *Engine) lookupOverrides(ctx context.Context, keys []string) (map[string]*Rule, map[string]error, error) {
	start := time.Now()
	m, err := e.overrides.Lookup(ctx, keys)
	e.observe("overrides", start, err)
	if err == nil {
		return m, nil, nil
	}
	if ou, ok := errors.AsType[*OverridesUnavailableError](err); ok && errors.Is(err, ErrStoreUnavailable) {
		if so, ok := e.store.(servesOthers); ok && so.ServesOthers(ctx) {
			failed := make(map[string]error, len(ou.Keys))
			for _, k := range ou.Keys {
				failed[k] = fmt.Errorf("look up the override: %w", ou.Err)
			}
			return m, failed, nil
		}
	}
	return nil, nil, fmt.Errorf("look up overrides: %w", err)
}

// matchKey returns the rule of key: its override when it has one, else the
// policy's match.
func matchKey(p *Policy, over map[string]*Rule, key string) (*Rule, bool) {
	if r := over[key]; r != nil {
		return r, true
	}
	return p.Match(key)
}
