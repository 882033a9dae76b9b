package leases

import (
	"context"
	"fmt"
)

// KeyState is a snapshot of one key for operators: the rule that governs it
// and the state of each of the rule's limits in the store.
type KeyState struct {
	// Key is the key asked about.
	Key string
	// Rule is the rule that matches the key; nil when none does.
	Rule *Rule
	// Unlimited is true when no rule matches and the policy's default is
	// allow: the key keeps no state.
	Unlimited bool
	// Limits has one entry per limit of Rule, in order; empty when Rule is
	// nil.
	Limits []LimitState
}

// LimitState is the state of one limit of a key's rule.
type LimitState struct {
	// Limit is the rule's limit, as written.
	Limit Limit
	// Bucket is what the store runs for the limit: the limit with a soft
	// rule's overage added, and the rule's lease TTL.
	Bucket Bucket
	// StoreKey is the key of the limit's bucket in the store.
	StoreKey string
	// State is the store's snapshot of the bucket.
	State BucketState
}

// KeyState returns a snapshot of key: its rule (its override when it has
// one, as Lease and Take decide it) and, for each of the rule's limits, the
// store's BucketState. It changes nothing. A key that matches no rule has
// no limits (Unlimited tells whether the default allows it). A failure of
// the store or of the overrides' lookup returns an error wrapping theirs
// (ErrStoreUnavailable, ErrClosed).
func (e *Engine) KeyState(ctx context.Context, key string) (KeyState, error) {
	out := KeyState{Key: key}
	var over map[string]*Rule
	if e.overrides != nil {
		var failed map[string]error
		var err error
		if over, failed, err = e.lookupOverrides(ctx, []string{key}); err == nil {
			err = failed[key]
		}
		if err != nil {
			return KeyState{}, fmt.Errorf("leases: state of key %q: %w", key, err)
		}
	}
	r, ok := matchKey(e.policy, over, key)
	if !ok {
		out.Unlimited = e.policy.Default() == DefaultAllow
		return out, nil
	}
	out.Rule = r
	out.Limits = make([]LimitState, len(r.Limits))
	for i := range r.Limits {
		b := r.bucket(i)
		sk := limitKey(key, i)
		st, err := e.store.State(ctx, sk, b)
		if err != nil {
			return KeyState{}, fmt.Errorf("leases: state of key %q, limit %d: %w", key, i, err)
		}
		out.Limits[i] = LimitState{Limit: r.Limits[i], Bucket: b, StoreKey: sk, State: st}
	}
	return out, nil
}
