package leases

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// EngineOptions configure an Engine.
type EngineOptions struct {
	// Store keeps the buckets. Required.
	Store Store
	// Policy is the initial rules; nil means no rules and default allow.
	Policy *Policy
	// Limits cap the open leases of each key; the zero value applies the
	// defaults (see LeaseLimits).
	Limits LeaseLimits
	// OnStoreCall, when set, is called after every store call with the
	// operation ("lease", "take", "refund"), its duration and its error.
	// The server uses it for the store latency histogram.
	OnStoreCall func(op string, elapsed time.Duration, err error)
}

// Engine applies the rules to lease and check requests: it matches each key
// to its rule, handles keys that match none, and runs the store. It is
// immutable and safe for concurrent use. To change the rules, build a new
// Engine over the same Store (package server does so on every reload):
// buckets live in the store, so they keep their state, and a changed rule
// applies to a key from its next operation on.
type Engine struct {
	store  Store
	policy *Policy
	limits LeaseLimits
	onCall func(string, time.Duration, error)
}

// NewEngine returns an Engine. It panics if opts.Store is nil, which is a
// programming error.
func NewEngine(opts EngineOptions) *Engine {
	if opts.Store == nil {
		panic("leases: NewEngine with nil Store")
	}
	e := &Engine{store: opts.Store, policy: opts.Policy, limits: opts.Limits, onCall: opts.OnStoreCall}
	if e.policy == nil {
		e.policy, _ = NewPolicy(RuleSet{})
	}
	return e
}

// Policy returns the engine's rules.
func (e *Engine) Policy() *Policy { return e.policy }

// Report counts what one call did, for metrics.
type Report struct {
	Grants   int // entries granted at least one token
	Denials  int // entries that wanted tokens and got none
	Settles  int // leases settled
	Expiries int // leases found expired (or replaced) and closed without credit
}

// NewLeaseID returns a fresh lease ID: 16 hex digits from a random 64-bit
// number. Lease IDs need to be unique per owner and key only (the store
// checks the owner), so a collision is harmless as well as improbable.
func NewLeaseID() string {
	var buf [16]byte
	b := strconv.AppendUint(buf[:0], rand.Uint64()|1<<63, 16)
	return string(b)
}

func (e *Engine) observe(op string, start time.Time, err error) {
	if e.onCall != nil {
		e.onCall(op, time.Since(start), err)
	}
}

// Lease runs the entries of a lease request for owner and returns one
// result per entry, in order. Entries must be valid (see
// protocol.LeaseRequest.Validate). A store failure fails the whole call with
// an error wrapping ErrStoreUnavailable. The per-operation errors of a Store,
// ErrUnknownLease and ErrUsedExceedsGranted, fail their entry alone: they
// are in the results' Error, and so is ErrTooManyLeases. Any other
// per-operation error fails the whole call with an error that names the key
// and wraps it.
func (e *Engine) Lease(ctx context.Context, owner Owner, entries []protocol.LeaseEntry) ([]protocol.LeaseResult, Report, error) {
	p := e.policy
	results := make([]protocol.LeaseResult, len(entries))
	ops := make([]LeaseOp, 0, len(entries))
	idx := make([]int, 0, len(entries))
	rules := make([]*Rule, 0, len(entries))
	var rep Report
	for i := range entries {
		en := &entries[i]
		results[i].Key = en.Key
		results[i].Slot = en.Slot
		r, ok := p.Match(en.Key)
		if !ok {
			if p.Default() == DefaultDeny {
				results[i].Error = protocol.NewProblem(protocol.CodeNoRule, fmt.Sprintf("key %q matches no rule and the server's default is deny", en.Key))
				continue
			}
			// Unlimited. A lease_id is accepted and ignored: a lease of a
			// key whose rule was removed just expires by its TTL.
			results[i].Granted = en.Want
			results[i].TTLMillis = DefaultLeaseTTL.Milliseconds()
			results[i].Unlimited = true
			if en.Want > 0 {
				rep.Grants++
			}
			continue
		}
		ops = append(ops, LeaseOp{Key: en.Key, Bucket: r.Bucket(), Want: en.Want, LeaseID: en.LeaseID, Used: en.Used, NewLeaseID: NewLeaseID(), Slot: en.Slot, Limits: e.limits})
		idx = append(idx, i)
		rules = append(rules, r)
	}
	if len(ops) == 0 {
		return results, rep, nil
	}
	start := time.Now()
	outs, err := e.store.Lease(ctx, owner, ops)
	e.observe("lease", start, err)
	if err != nil {
		return nil, Report{}, err
	}
	for j, o := range outs {
		i, r, en := idx[j], rules[j], &entries[idx[j]]
		rep.Expiries += o.Expired
		res := &results[i]
		switch o.Err {
		case nil:
		case ErrUnknownLease:
			res.Error = protocol.NewProblem(protocol.CodeUnknownLease, fmt.Sprintf("lease %q of key %q is not open for this client: it expired, was settled already, or was never this client's; nothing was settled or granted: ask again without lease_id", en.LeaseID, en.Key))
			continue
		case ErrUsedExceedsGranted:
			res.Error = protocol.NewProblem(protocol.CodeUsedExceedsGranted, fmt.Sprintf("used %d for lease %q of key %q is more than it granted; nothing changed", en.Used, en.LeaseID, en.Key))
			continue
		case ErrTooManyLeases:
			res.Error = protocol.NewProblem(protocol.CodeTooManyLeases, fmt.Sprintf("key %q already has the most open leases the server allows (per key, or per client on the key); nothing was granted: take tokens directly for this key (POST %s), or ask the operator to raise the cap", en.Key, protocol.PathCheck))
			continue
		default:
			// A failure the store does not document per operation: the
			// outcome of the call is unknown, so it fails whole, with the
			// cause, for the caller to log.
			return nil, Report{}, fmt.Errorf("lease %q: %w", en.Key, o.Err)
		}
		if o.Settled {
			rep.Settles++
		}
		if en.Want > 0 {
			if o.Granted > 0 {
				rep.Grants++
			} else {
				rep.Denials++
			}
		}
		res.LeaseID = o.LeaseID
		res.Granted = o.Granted
		res.TTLMillis = o.TTL.Milliseconds()
		res.RetryAfterMillis = o.RetryAfter.Milliseconds()
		res.Limit = r.Limit
		res.PeriodMillis = r.Period.Milliseconds()
		res.Burst = r.Burst
		res.Remaining = o.Remaining
		res.SafeRate = r.Rate() / float64(max(1, o.Holders))
		res.Rule = r.Name
		res.Algorithm = wireAlgorithm(r.Algorithm)
		res.DelayMillis = o.Delay.Milliseconds()
	}
	return results, rep, nil
}

// Check takes cost tokens from every key, all or nothing: when any key
// denies, the tokens taken from the others are given back. It returns a
// *protocol.Problem for a key that matches no rule under default deny or
// whose bucket is smaller than cost, and an error wrapping
// ErrStoreUnavailable when the store fails.
//
// Giving back is not atomic with taking, so a concurrent request may be
// denied by tokens that are about to be given back; it can never be allowed
// by tokens it should not have had. Check errs on the side of the limit.
func (e *Engine) Check(ctx context.Context, keys []string, cost int64) (protocol.CheckResponse, Report, error) {
	resps, rep, err := e.Take(ctx, []protocol.CheckRequest{{Keys: keys, Cost: &cost}})
	if err != nil {
		return protocol.CheckResponse{}, Report{}, err
	}
	if p := resps[0].Error; p != nil {
		return protocol.CheckResponse{}, rep, p
	}
	return resps[0], rep, nil
}

// Take decides many takes at once, each as Check decides it (all or
// nothing across its keys), in one store call plus one to give back the
// tokens of the takes that were denied. A take that cannot be decided (a
// key that matches no rule under default deny, a cost above a key's
// bucket) gets its problem in its Error and takes nothing; the others are
// decided. Only a store failure fails the whole call. The same key may
// appear in several takes: they are decided in order.
func (e *Engine) Take(ctx context.Context, takes []protocol.CheckRequest) ([]protocol.CheckResponse, Report, error) {
	p := e.policy
	resps := make([]protocol.CheckResponse, len(takes))
	var ops []TakeOp
	var at [][2]int // take and key index of each op
	var rep Report
	for ti := range takes {
		t := &takes[ti]
		resp := &resps[ti]
		cost := t.CostOrDefault()
		resp.Allowed = true
		resp.Keys = make([]protocol.CheckResult, len(t.Keys))
		first := len(ops)
		for i, k := range t.Keys {
			res := &resp.Keys[i]
			res.Key = k
			r, ok := p.Match(k)
			if !ok {
				if p.Default() == DefaultDeny {
					resp.Error = protocol.NewProblem(protocol.CodeNoRule, fmt.Sprintf("keys[%d] %q matches no rule and the server's default is deny", i, k))
					break
				}
				res.Allowed = true
				res.Unlimited = true
				continue
			}
			if cost > r.Burst {
				resp.Error = protocol.NewProblem(protocol.CodeCostExceedsBurst, fmt.Sprintf("cost %d exceeds burst %d of rule %q for keys[%d] %q: it can never be allowed", cost, r.Burst, r.Name, i, k))
				break
			}
			res.Limit, res.PeriodMillis, res.Burst, res.Rule = r.Limit, r.Period.Milliseconds(), r.Burst, r.Name
			res.LeaseTTLMillis = r.LeaseTTL.Milliseconds()
			res.Algorithm = wireAlgorithm(r.Algorithm)
			ops = append(ops, TakeOp{Key: k, Bucket: r.Bucket(), Cost: cost})
			at = append(at, [2]int{ti, i})
		}
		if resp.Error != nil {
			ops, at = ops[:first], at[:first]
			*resp = protocol.CheckResponse{Error: resp.Error}
		}
	}
	if len(ops) > 0 {
		start := time.Now()
		outs, err := e.store.Take(ctx, ops)
		e.observe("take", start, err)
		if err != nil {
			return nil, Report{}, err
		}
		for j, o := range outs {
			resp := &resps[at[j][0]]
			res := &resp.Keys[at[j][1]]
			rep.Expiries += o.Expired
			res.Allowed = o.Taken
			res.Remaining = o.Remaining
			res.DelayMillis = o.Delay.Milliseconds()
			if !o.Taken {
				resp.Allowed = false
				res.RetryAfterMillis = o.RetryAfter.Milliseconds()
				resp.RetryAfterMillis = max(resp.RetryAfterMillis, res.RetryAfterMillis)
			}
		}
		// Give back what the denied takes took from their other keys. The
		// request is denied either way; tokens not given back only cost
		// utilization, never accuracy, so a failure here is not reported.
		var giveBack []TakeOp
		for j, o := range outs {
			if o.Taken && !resps[at[j][0]].Allowed && ops[j].Cost > 0 {
				giveBack = append(giveBack, ops[j])
			}
		}
		if len(giveBack) > 0 {
			start := time.Now()
			err := e.store.Refund(ctx, giveBack)
			e.observe("refund", start, err)
		}
	}
	for i := range resps {
		switch {
		case resps[i].Error != nil:
		case resps[i].Allowed:
			rep.Grants++
		default:
			rep.Denials++
		}
	}
	return resps, rep, nil
}

// wireAlgorithm returns a rule's algorithm as the protocol carries it:
// empty for token_bucket.
func wireAlgorithm(a Algorithm) string {
	if a == TokenBucket {
		return ""
	}
	return string(a)
}
