package leases

import (
	"fmt"
	"time"
)

// An algorithm is one rate-limiting algorithm with leases. Its math is
// written once in Go (newState's keyState, which the memory store runs) and
// once in Lua (script, which the Redis store runs), the two performing the
// same operations in the same order so that both stores give the same
// answers; a differential test per algorithm (TestStoresAgree and its
// siblings) holds them to it.
//
// Every algorithm keeps the contract of Store: a lease grants tokens until a
// deadline, is settled by its owner with the tokens it used (the rest are
// credited back where the algorithm allows it), and expires unsettled as if
// fully spent; a take decides one request outright; a refund gives back a
// take. What an algorithm guarantees, and what leasing costs it, is stated
// in the package documentation.
type algorithm struct {
	// newState returns the state of a key not seen before (or last seen
	// under another algorithm), at now (µs).
	newState func(b *Bucket, now int64) keyState
	// script is the Lua source the Redis store runs for this algorithm. It
	// takes the keys of RedisKeys and the arguments described in
	// scripts/token_bucket.lua, and answers in the same shapes.
	script string
	// tag names the algorithm in its Redis keys (see RedisKeys), so that
	// a rule that changes algorithm starts its keys afresh instead of
	// reading another algorithm's state; empty for token_bucket, whose
	// keys predate the others.
	tag string
	// validate checks the parameters of a bucket beyond what every
	// algorithm requires (limit, period, burst and lease TTL in range); nil
	// accepts them. Its error names the field at fault, as "burst: ...".
	validate func(b *Bucket) error
}

// keyState is one key's state under one algorithm, owned by the memory
// store's shard lock. Times are µs on the store's clock; b is the key's
// parameters at this call (a rule may change between calls).
type keyState interface {
	// algorithm names the algorithm this state belongs to: a call under
	// another one starts the key afresh.
	algorithm() Algorithm
	lease(b *Bucket, owner Owner, op *LeaseOp, now int64) LeaseOutcome
	// take takes cost tokens at now, leaving at least floor of the
	// limit's capacity free (see TakeOp.Floor); a shaping algorithm takes
	// no slot further than maxDelay away (negative: no maximum).
	take(b *Bucket, cost, floor int64, maxDelay time.Duration, now int64) TakeOutcome
	// refund gives back cost tokens of a take made at at (µs).
	refund(b *Bucket, cost int64, at int64, now int64)
	// idle reports whether the state is the same as no state at now, so
	// the store may drop it.
	idle(now int64) bool
	snapshot(b *Bucket, now int64) BucketState
}

// algorithms is the table of implemented algorithms. An algorithm absent
// from it is refused by rule validation (ErrAlgorithmNotImplemented when
// its name is known).
var algorithms = map[Algorithm]*algorithm{
	TokenBucket: {
		newState: func(b *Bucket, now int64) keyState { return newTBState(b, now) },
		script:   leaseCommonLua + tokenBucketLua,
	},
	FixedWindow: {
		newState: func(b *Bucket, now int64) keyState { return newFWState(b, now, false) },
		script:   leaseCommonLua + windowLeasesLua + "local COUNTER = false\n" + fixedWindowLua,
		tag:      "fw",
		validate: validateWindow,
	},
	SlidingWindowCounter: {
		newState: func(b *Bucket, now int64) keyState { return newFWState(b, now, true) },
		script:   leaseCommonLua + windowLeasesLua + "local COUNTER = true\n" + fixedWindowLua,
		tag:      "swc",
		validate: validateWindow,
	},
	SlidingWindowLog: {
		newState: func(b *Bucket, now int64) keyState { return newSWLState(b) },
		script:   leaseCommonLua + windowLeasesLua + slidingWindowLogLua,
		tag:      "swl",
		validate: validateWindow,
	},
	LeakyBucket: {
		newState: func(b *Bucket, now int64) keyState { return newLBState(b, now) },
		script:   leaseCommonLua + leakyBucketLua,
		tag:      "lb",
		validate: validateLeaky,
	},
}

// algorithmOf returns the implementation of b's algorithm, token_bucket
// when b names none.
func algorithmOf(b *Bucket) (*algorithm, error) {
	name := b.Algorithm
	if name == "" {
		name = TokenBucket
	}
	a, ok := algorithms[name]
	if !ok {
		return nil, fmt.Errorf("leases: algorithm %q: %w", name, ErrAlgorithmNotImplemented)
	}
	return a, nil
}

// Implemented returns whether the store implements algorithm a.
func Implemented(a Algorithm) bool { return algorithms[a] != nil }

// resetAfter returns the wait, rounded up to whole milliseconds, until
// tokens more are back at ratePerMicro.
func resetAfter(tokens, ratePerMicro float64) time.Duration {
	if tokens <= epsilon {
		return 0
	}
	return microsToRetry(microsCeil(tokens, ratePerMicro))
}
