package leases

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
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
	// operation ("lease", "take", "refund"), its duration and its error: a
	// call that failed for some keys only is given the first of their
	// errors. The server uses it for the store latency histogram.
	OnStoreCall func(op string, elapsed time.Duration, err error)
	// Overrides, when set, supplies per-key rules consulted before the
	// Policy (see Overrides); OnStoreCall also sees its lookups, as
	// operation "overrides".
	Overrides Overrides
}

// Engine applies the rules to lease and take requests: it matches each key
// to its rule, handles keys that match none, runs each of the rule's
// limits in the store and combines their answers. It is immutable and safe
// for concurrent use. To change the rules, build a new Engine over the same
// Store (package server does so on every reload): buckets live in the
// store, so they keep their state, and a changed rule applies to a key from
// its next operation on.
//
// The Engine speaks in domain terms (LeaseAsk, LeaseResult, TakeAsk,
// TakeResult, errors wrapping this package's sentinels); package server
// maps them to the wire.
type Engine struct {
	store  Store
	policy *Policy
	limits LeaseLimits
	onCall func(string, time.Duration, error)
	// overrides are consulted before policy; nil when none.
	overrides Overrides
	// idKey authenticates the lease IDs of shadow and elastic rules when
	// the store keeps no key for them (see IDKeyStore).
	idKey []byte
}

// NewEngine returns an Engine. It panics if opts.Store is nil, which is a
// programming error.
func NewEngine(opts EngineOptions) *Engine {
	if opts.Store == nil {
		panic("leases: NewEngine with nil Store")
	}
	e := &Engine{store: opts.Store, policy: opts.Policy, limits: opts.Limits, onCall: opts.OnStoreCall, overrides: opts.Overrides}
	if _, ok := opts.Store.(IDKeyStore); !ok {
		e.idKey = newIDKey()
	}
	if e.policy == nil {
		e.policy, _ = NewPolicy(RuleSet{})
	}
	return e
}

// Policy returns the engine's rules.
func (e *Engine) Policy() *Policy { return e.policy }

// Errors of a decision, in LeaseResult.Err and TakeResult.Err, besides the
// Store's per-operation errors (ErrUnknownLease, ErrUsedExceedsGranted,
// ErrTooManyLeases). Each comes wrapped in a *DecisionError that says what
// was asked.
var (
	// ErrNoRule: the key matches no rule and the policy's default is deny.
	ErrNoRule = errors.New("no rule matches the key")
	// ErrCostExceedsBurst: a take's cost is larger than a limit of the
	// key's rule can ever hold.
	ErrCostExceedsBurst = errors.New("cost exceeds the limit's burst")
)

// DecisionError is the error of one entry or take: a sentinel of this
// package (Err) and a sentence for the caller (Detail).
type DecisionError struct {
	Err    error
	Detail string
}

func (e *DecisionError) Error() string { return e.Detail }

// Unwrap returns the sentinel.
func (e *DecisionError) Unwrap() error { return e.Err }

func decisionErr(err error, format string, args ...any) error {
	return &DecisionError{Err: err, Detail: fmt.Sprintf(format, args...)}
}

// storeFailedFor is the error of an entry or take whose store operation
// failed alone (cause wraps ErrStoreUnavailable): the store answered for
// the call's other keys. Its Detail, for the caller, names the key (what
// names it: format and args) and not the cause, which errors.Unwrap
// returns for the server's log.
func storeFailedFor(cause error, format string, args ...any) error {
	return &DecisionError{Err: cause, Detail: fmt.Sprintf("the store did not answer for "+format+
		" (a Redis Cluster node down, most likely), while it answered for other keys: nothing was granted or taken for it; decide it as when no server answers, and ask again later", args...)}
}

// firstStoreErr returns the first error of outs (errOf) that wraps
// ErrStoreUnavailable, or nil: an op's failure alone, observed as the
// call's (EngineOptions.OnStoreCall), so that the store's errors count it.
func firstStoreErr[T any](outs []T, errOf func(*T) error) error {
	for i := range outs {
		if err := errOf(&outs[i]); errors.Is(err, ErrStoreUnavailable) {
			return err
		}
	}
	return nil
}

// Report counts what one call did, for metrics.
type Report struct {
	Grants   int // entries granted at least one token
	Denials  int // entries that wanted tokens and got none
	Settles  int // leases settled
	Expiries int // leases found expired (or replaced) and closed without credit
	// ShadowDenials counts entries and takes of shadow rules that were
	// admitted although their limits would have denied them (in part, for
	// a lease).
	ShadowDenials int
	// Borrows counts entries and takes of elastic rules that their pools
	// served beyond their own limits.
	Borrows int
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

// limitKey returns the store key of limit i of key's rule: the key itself
// for the first limit (so a rule's first limit keeps its state when more
// are added) and key, a unit separator and i for the others. Keys never
// contain control characters, so no key collides with another's limit.
func limitKey(key string, i int) string {
	if i == 0 {
		return key
	}
	return key + "\x1f" + strconv.Itoa(i)
}

// LeaseAsk asks for, renews or returns the lease of one key (see
// protocol.LeaseEntry, which the server decodes into it).
type LeaseAsk struct {
	Key     string
	Want    int64
	LeaseID string
	Used    int64
	Slot    int
	// Priority is the class the lease is granted to (protocol.Priorities;
	// empty is normal): each limit grants only from what lies above the
	// class's floor (Rule.Floor).
	Priority string
	// MaxDelay, when positive, accepts a deferred grant: tokens that may
	// be spent only after LeaseResult.Delay, at most MaxDelay, given where
	// the key's token bucket would refuse now (see LeaseOp.MaxDelay). The
	// limits of a shadow or elastic rule, and a class with a floor, never
	// defer.
	MaxDelay time.Duration
}

// LimitStatus is the state of one limit of a key's rule after a decision,
// enough to write RateLimit headers.
type LimitStatus struct {
	Limit
	// Remaining is what the limit would still admit now.
	Remaining int64
	// Reset is the time until the limit is whole again if nothing else
	// happens (see LeaseOutcome.Reset).
	Reset time.Duration
	// Overage is, for a soft rule, the tokens of the overage beyond the
	// base limit in use: Remaining is then 0. Zero for a hard rule.
	Overage int64
}

// limitStatus reports limit i of r from its store outcome: the base limit,
// what remains of it, and a soft rule's overage in use.
func limitStatus(r *Rule, i int, remaining int64, reset time.Duration) LimitStatus {
	l := r.Limits[i]
	st := LimitStatus{Limit: l, Remaining: remaining, Reset: reset}
	if extra := r.overage(l.Burst); extra > 0 {
		st.Remaining = max(0, remaining-extra)
		st.Overage = max(0, extra-remaining)
	}
	return st
}

// LeaseResult is the outcome of one LeaseAsk.
type LeaseResult struct {
	// Key and Slot repeat the ask's.
	Key  string
	Slot int
	// Err says why the entry failed: a *DecisionError wrapping ErrNoRule,
	// ErrUnknownLease, ErrUsedExceedsGranted or ErrTooManyLeases. The other
	// fields are then zero.
	Err error
	// Granted tokens are in the new lease LeaseID, valid for TTL.
	Granted int64
	LeaseID string
	TTL     time.Duration
	// RetryAfter is set when tokens were wanted and none granted.
	RetryAfter time.Duration
	// Delay is the wait before the first granted token may be spent: a
	// leaky_bucket's first slot, or a deferred grant's wait (see
	// LeaseAsk.MaxDelay); zero otherwise.
	Delay time.Duration
	// Rule is the rule that matched; nil when the key is unlimited.
	Rule *Rule
	// Unlimited is true when no rule matched and the default is allow:
	// Granted equals Want.
	Unlimited bool
	// Remaining is the least over the limits of what each would still
	// admit.
	Remaining int64
	// SafeRate is the rate, in tokens per second, the owner may use on its
	// own if it loses every server: the least over the limits of the
	// limit's rate over the key's holders.
	SafeRate float64
	// Limits has the state of each of the rule's limits, in order.
	Limits []LimitStatus
	// ShadowDenied is true when the rule is in shadow mode and its limits
	// would have granted less than Want: Granted is Want all the same.
	ShadowDenied bool
	// Owned is true when nothing was granted because a lease server owns
	// the bucket of one of the limits (LeaseOutcome.Owned): the key's
	// requests are best decided by direct takes until it hands it back.
	Owned bool

	// Borrowed is, for an elastic rule, the part of Granted taken from
	// the rule's pool because its own limits granted less than Want.
	Borrowed int64

	settled      bool  // a shadow lease of nothing was settled without a store call
	storeSettled bool  // the own limits settled the entry's lease in this call
	shadow       bool  // a shadow rule's lease: LeaseID is the store's, to be signed with shadowOwn
	shadowOwn    int64 // what a shadow rule's limits granted
}

// idSecret fetches, once per call, the key of the lease IDs of shadow and
// elastic rules (see leaseid.go), only when a call needs it.
type idSecret struct {
	e   *Engine
	ctx context.Context
	key []byte
}

func (s *idSecret) get() ([]byte, error) {
	if s.key == nil {
		k, err := s.e.secret(s.ctx)
		if err != nil {
			return nil, err
		}
		s.key = k
	}
	return s.key, nil
}

// secret returns the key of the lease IDs of shadow and elastic rules: the
// store's (see IDKeyStore), or the engine's own.
func (e *Engine) secret(ctx context.Context) ([]byte, error) {
	if s, ok := e.store.(IDKeyStore); ok {
		return s.IDKey(ctx)
	}
	return e.idKey, nil
}

// parsedAt returns parsed[i], or the zero parts when parsed is nil.
func parsedAt(parsed []leaseIDParts, i int) leaseIDParts {
	if parsed == nil {
		return leaseIDParts{}
	}
	return parsed[i]
}

// Lease runs asks for owner and returns one result per ask, in order. Asks
// must be valid (see protocol.LeaseRequest.Validate). A store failure
// fails the whole call with an error wrapping ErrStoreUnavailable; the
// per-entry errors are in the results' Err, a store that failed for some
// keys only (a Redis Cluster node down) included: their entries fail with
// a *DecisionError wrapping the store's error, hence ErrStoreUnavailable,
// and the others are decided. Any other per-operation error
// of the store fails the whole call with an error that names the key and
// wraps it.
//
// A rule with several limits leases from each, with one lease ID: the
// grant is the least of their grants, and a settle credits each what the
// owner did not use of its own grant. A limit that granted more than
// another keeps the difference reserved until the settle, which costs
// utilization, never the bound; when any limit grants nothing, the others'
// grants are returned at once (a second store call).
func (e *Engine) Lease(ctx context.Context, owner Owner, asks []LeaseAsk) ([]LeaseResult, Report, error) {
	p := e.policy
	over, overFailed, err := e.leaseOverrides(ctx, asks)
	if err != nil {
		return nil, Report{}, err
	}
	results := make([]LeaseResult, len(asks))
	var ops []LeaseOp
	var at []int // the ask of each op
	var rep Report
	ids := &idSecret{e: e, ctx: ctx}
	// parsed holds what the verified lease IDs of shadow and elastic
	// rules remember, by ask; nil while there is none.
	var parsed []leaseIDParts
	for i := range asks {
		a := &asks[i]
		res := &results[i]
		res.Key, res.Slot = a.Key, a.Slot
		if cause := overFailed[a.Key]; cause != nil {
			res.Err = storeFailedFor(cause, "key %q", a.Key)
			continue
		}
		r, ok := matchKey(p, over, a.Key)
		if !ok {
			if p.Default() == DefaultDeny {
				res.Err = decisionErr(ErrNoRule, "key %q matches no rule and the server's default is deny", a.Key)
				continue
			}
			// Unlimited. A lease_id is accepted and ignored: a lease of a
			// key whose rule was removed just expires by its TTL.
			res.Granted = a.Want
			res.TTL = DefaultLeaseTTL
			res.Unlimited = true
			if a.Want > 0 {
				rep.Grants++
			}
			continue
		}
		res.Rule = r
		if r.Shadow || r.Elastic != "" {
			// Its lease ID is signed after the store grants: fetch the
			// key first, so that a store that cannot give it fails the
			// call before anything is granted.
			if _, err := ids.get(); err != nil {
				return nil, Report{}, err
			}
		}
		id := NewLeaseID()
		settleID, used := a.LeaseID, a.Used
		if strings.Contains(a.LeaseID, leaseIDSep) {
			secret, err := ids.get()
			if err != nil {
				return nil, Report{}, err
			}
			if lp, ok := parseLeaseID(secret, owner.Client, a.Key, a.LeaseID); ok {
				if parsed == nil {
					parsed = make([]leaseIDParts, len(asks))
				}
				parsed[i] = lp
			}
		}
		if lp := parsedAt(parsed, i); lp.storeID != "" {
			// A shadow or elastic rule's lease: the limits granted g of
			// what the owner was given, so at most g of what it used is
			// theirs (the rest was the pool's, see elastic.go).
			settleID, used = lp.storeID, min(used, lp.own)
			if g := lp.own; g == 0 {
				// The limits granted nothing: nothing to settle.
				res.settled = true
				if a.Want == 0 {
					continue
				}
				settleID, used = "", 0
			}
		}
		maxDelay := a.MaxDelay
		if r.Shadow || r.Elastic != "" {
			// A shadow rule admits at once whatever its limits say, and
			// an elastic one borrows from its pool what they refuse.
			maxDelay = 0
		}
		for li := range r.Limits {
			b := r.bucket(li)
			ops = append(ops, LeaseOp{Key: limitKey(a.Key, li), Bucket: b, Want: a.Want, LeaseID: settleID, Used: used, NewLeaseID: id, Slot: a.Slot, Limits: e.limits, Floor: r.Floor(a.Priority, b.Burst), MaxDelay: maxDelay})
			at = append(at, i)
		}
	}
	for i := range results {
		if results[i].settled {
			rep.Settles++
		}
	}
	if len(ops) == 0 {
		return results, rep, nil
	}
	start := time.Now()
	outs, err := e.store.Lease(ctx, owner, ops)
	e.observe("lease", start, cmp.Or(err, firstStoreErr(outs, func(o *LeaseOutcome) error { return o.Err })))
	if err != nil {
		return nil, Report{}, err
	}
	// Combine the outcomes of each ask's limits.
	for j := 0; j < len(outs); {
		i := at[j]
		n := 1
		for j+n < len(outs) && at[j+n] == i {
			n++
		}
		if err := e.combineLease(&results[i], &asks[i], ops[j:j+n], outs[j:j+n], &rep); err != nil {
			return nil, Report{}, err
		}
		j += n
	}
	// Give back the grants of limits whose ask was denied or failed.
	var giveBack []LeaseOp
	for j, o := range outs {
		if res := &results[at[j]]; o.Err == nil && o.Granted > 0 && res.Granted == 0 {
			op := ops[j]
			op.Want, op.LeaseID, op.Used, op.NewLeaseID = 0, o.LeaseID, 0, ""
			giveBack = append(giveBack, op)
		}
	}
	if len(giveBack) > 0 {
		// The ask is denied either way; tokens not given back only cost
		// utilization until the lease expires, so a failure here is not
		// reported.
		start := time.Now()
		_, err := e.store.Lease(ctx, owner, giveBack)
		e.observe("lease", start, err)
	}
	for i := range results {
		if res := &results[i]; res.shadow {
			secret, err := ids.get()
			if err != nil {
				return nil, Report{}, err
			}
			res.LeaseID = leaseIDParts{storeID: res.LeaseID, own: res.shadowOwn}.format(secret, owner.Client, res.Key)
		}
	}
	if err := e.borrowLeases(ctx, owner, ids, asks, results, &rep); err != nil {
		return nil, Report{}, err
	}
	if refunds := e.poolRefunds(parsed, asks, results); len(refunds) > 0 {
		// What a settled elastic lease borrowed and did not use goes back
		// to its pool; a failure only costs the pool's utilization.
		start := time.Now()
		err := e.store.Refund(ctx, refunds)
		e.observe("refund", start, err)
	}
	return results, rep, nil
}

// combineLease fills res from the outcomes of ask a's limits.
func (e *Engine) combineLease(res *LeaseResult, a *LeaseAsk, ops []LeaseOp, outs []LeaseOutcome, rep *Report) error {
	r := res.Rule
	for k, o := range outs {
		rep.Expiries += o.Expired
		switch {
		case o.Err == nil:
			continue
		case errors.Is(o.Err, ErrUnknownLease):
			res.Err = decisionErr(ErrUnknownLease, "lease %q of key %q is not open for this client: it expired, was settled already, or was never this client's; nothing was settled or granted: ask again without lease_id", a.LeaseID, a.Key)
		case errors.Is(o.Err, ErrUsedExceedsGranted):
			res.Err = decisionErr(ErrUsedExceedsGranted, "used %d for lease %q of key %q is more than it granted; nothing changed", a.Used, a.LeaseID, a.Key)
		case errors.Is(o.Err, ErrTooManyLeases):
			res.Err = decisionErr(ErrTooManyLeases, "key %q already has the most open leases the server allows (per key, or per client on the key); nothing was granted: take tokens directly for this key, or ask the operator to raise the cap", a.Key)
		case errors.Is(o.Err, ErrStoreUnavailable):
			// The store failed for this key alone (its Redis Cluster
			// node is down) while it answered for others.
			res.Err = storeFailedFor(o.Err, "key %q", a.Key)
		default:
			// A failure the store does not document per operation: the
			// outcome of the call is unknown, so it fails whole, with the
			// cause, for the caller to log.
			return fmt.Errorf("lease %q (limit %d of rule %q): %w", a.Key, k, r.Name, o.Err)
		}
		// One limit failed: the entry fails, and the other limits' grants
		// are given back (see Lease).
		*res = LeaseResult{Key: res.Key, Slot: res.Slot, Err: res.Err}
		return nil
	}
	res.Limits = make([]LimitStatus, len(outs))
	settled := false
	for k, o := range outs {
		l := &r.Limits[k]
		res.Limits[k] = limitStatus(r, k, o.Remaining, o.Reset)
		settled = settled || o.Settled
		safe := l.Rate() / float64(max(1, o.Holders))
		if k == 0 {
			res.Granted, res.TTL, res.SafeRate = o.Granted, o.TTL, safe
		} else {
			res.Granted = min(res.Granted, o.Granted)
			res.SafeRate = min(res.SafeRate, safe)
			if o.TTL > 0 && (res.TTL == 0 || o.TTL < res.TTL) {
				res.TTL = o.TTL
			}
		}
		retry := o.RetryAfter
		if retry < 0 {
			// The class's floor leaves this limit nothing to grant, ever,
			// under the rule as it stands: ask again a period later (the
			// rule may have changed).
			retry = l.Period
		}
		res.RetryAfter = max(res.RetryAfter, retry)
		res.Delay = max(res.Delay, o.Delay)
		res.Owned = res.Owned || o.Owned
	}
	for i := range res.Limits {
		if i == 0 || res.Limits[i].Remaining < res.Remaining {
			res.Remaining = res.Limits[i].Remaining
		}
	}
	if settled {
		rep.Settles++
	}
	res.storeSettled = settled
	if res.Granted > 0 {
		res.LeaseID = ops[0].NewLeaseID
		res.RetryAfter = 0
		res.Owned = false
	} else {
		res.LeaseID, res.TTL, res.Delay = "", 0, 0
	}
	if r.Shadow && a.Want > 0 {
		// Admitted whatever the limits say; the ID remembers what they
		// granted, for the settle.
		if res.Granted < a.Want {
			res.ShadowDenied = true
			rep.ShadowDenials++
		}
		// Lease signs the ID (see leaseid.go).
		res.LeaseID, res.shadow, res.shadowOwn = ops[0].NewLeaseID, true, res.Granted
		if res.TTL == 0 {
			res.TTL = r.LeaseTTL
		}
		res.Granted, res.RetryAfter, res.Delay, res.Owned = a.Want, 0, 0, false
	}
	if a.Want > 0 {
		if res.Granted > 0 {
			rep.Grants++
		} else {
			rep.Denials++
		}
	}
	return nil
}

// TakeAsk takes Cost tokens from every one of Keys, all or nothing (see
// protocol.CheckRequest, which the server decodes into it).
type TakeAsk struct {
	Keys []string
	Cost int64
	// MaxDelay is the longest wait for a shaping rule's slot (see
	// TakeOp.MaxDelay); nil means no maximum.
	MaxDelay *time.Duration
	// Priority is the take's class (protocol.Priorities; empty is
	// normal): each limit admits it only while it leaves the class's floor
	// free (Rule.Floor).
	Priority string
}

// KeyResult is the outcome of a take for one of its keys.
type KeyResult struct {
	Key string
	// Allowed is true when every limit of the key's rule had Cost tokens
	// (or the key is unlimited).
	Allowed bool
	// Unlimited is true when no rule matched and the default is allow.
	Unlimited bool
	// Rule is the rule that matched; nil when Unlimited.
	Rule *Rule
	// Remaining is the least over the limits of what each would still
	// admit.
	Remaining int64
	// RetryAfter is set when the key denied.
	RetryAfter time.Duration
	// Delay is the wait until the request's slot (leaky_bucket).
	Delay time.Duration
	// Limits has the state of each of the rule's limits, in order.
	Limits []LimitStatus
	// ShadowDenied is true when the key's rule is in shadow mode and its
	// limits denied: Allowed is true all the same.
	ShadowDenied bool
	// Borrowed is true when the key's own limits denied and its elastic
	// rule's pool served the take.
	Borrowed bool
}

// TakeResult is the outcome of one TakeAsk.
type TakeResult struct {
	// Allowed is true when every key allowed.
	Allowed bool
	// RetryAfter is the longest RetryAfter of the keys that denied.
	RetryAfter time.Duration
	// Delay is the longest Delay of the keys.
	Delay time.Duration
	// Keys has one result per key, in order.
	Keys []KeyResult
	// ShadowDenied is true when a key of a shadow rule denied and the take
	// was allowed all the same.
	ShadowDenied bool
	// Borrowed is true when keys of elastic rules denied and their pools
	// served the take.
	Borrowed bool
	// Err says why the take could not be decided: a *DecisionError
	// wrapping ErrNoRule or ErrCostExceedsBurst. Nothing was taken and
	// the other fields are zero.
	Err error
}

// Check takes cost tokens from every key, all or nothing: when any key (or
// any limit of a key's rule) denies, the tokens taken from the others are
// given back. It returns the take's error (a *DecisionError) for a key that
// matches no rule under default deny or whose limit is smaller than cost,
// and an error wrapping ErrStoreUnavailable when the store fails.
//
// Giving back is not atomic with taking, so a concurrent request may be
// denied by tokens that are about to be given back; it can never be allowed
// by tokens it should not have had. Check errs on the side of the limit.
//
// A key of a shaping rule (leaky_bucket) takes any slot its queue holds;
// use Take with TakeAsk.MaxDelay to bound the wait.
func (e *Engine) Check(ctx context.Context, keys []string, cost int64) (TakeResult, Report, error) {
	resps, rep, err := e.Take(ctx, []TakeAsk{{Keys: keys, Cost: cost}})
	if err != nil {
		return TakeResult{}, Report{}, err
	}
	if err := resps[0].Err; err != nil {
		return TakeResult{}, rep, err
	}
	return resps[0], rep, nil
}

// Take decides many takes at once, each as Check decides it (all or
// nothing across its keys and their rules' limits), in one store call plus
// one to give back the tokens of the takes that were denied. A take that
// cannot be decided (a key that matches no rule under default deny, a cost
// above a limit's burst) gets its error in Err and takes nothing; the
// others are decided. So does a take one of whose keys the store failed for
// alone (a Redis Cluster node down): its Err wraps ErrStoreUnavailable, and
// its other keys give back what they took. Only a store failure for every
// key fails the whole call. The same
// key may appear in several takes: they are decided in order.
func (e *Engine) Take(ctx context.Context, takes []TakeAsk) ([]TakeResult, Report, error) {
	p := e.policy
	over, overFailed, err := e.takeOverrides(ctx, takes)
	if err != nil {
		return nil, Report{}, err
	}
	resps := make([]TakeResult, len(takes))
	var ops []TakeOp
	var at [][3]int // take, key and limit index of each op
	var rep Report
	for ti := range takes {
		t := &takes[ti]
		resp := &resps[ti]
		resp.Allowed = true
		resp.Keys = make([]KeyResult, len(t.Keys))
		first := len(ops)
		for i, k := range t.Keys {
			res := &resp.Keys[i]
			res.Key = k
			if cause := overFailed[k]; cause != nil {
				resp.Err = storeFailedFor(cause, "keys[%d] %q", i, k)
				break
			}
			r, ok := matchKey(p, over, k)
			if !ok {
				if p.Default() == DefaultDeny {
					resp.Err = decisionErr(ErrNoRule, "keys[%d] %q matches no rule and the server's default is deny", i, k)
					break
				}
				res.Allowed = true
				res.Unlimited = true
				continue
			}
			res.Rule = r
			res.Allowed = true
			res.Limits = make([]LimitStatus, len(r.Limits))
			for li := range r.Limits {
				l := &r.Limits[li]
				b := r.bucket(li)
				if t.Cost > b.Burst {
					resp.Err = decisionErr(ErrCostExceedsBurst, "cost %d exceeds burst %d of rule %q for keys[%d] %q: it can never be allowed", t.Cost, b.Burst, r.Name, i, k)
					break
				}
				floor := r.Floor(t.Priority, b.Burst)
				if t.Cost+floor > b.Burst {
					resp.Err = decisionErr(ErrCostExceedsBurst, "cost %d exceeds the %d of burst %d that rule %q leaves priority %q beyond the reserve of the classes above it, for keys[%d] %q: it can never be allowed at this priority", t.Cost, b.Burst-floor, b.Burst, r.Name, priorityName(t.Priority), i, k)
					break
				}
				res.Limits[li].Limit = *l
				ops = append(ops, TakeOp{Key: limitKey(k, li), Bucket: b, Cost: t.Cost, MaxDelay: t.MaxDelay, Floor: floor})
				at = append(at, [3]int{ti, i, li})
			}
			if resp.Err != nil {
				break
			}
		}
		if resp.Err != nil {
			ops, at = ops[:first], at[:first]
			*resp = TakeResult{Err: resp.Err}
		}
	}
	if len(ops) > 0 {
		start := time.Now()
		outs, err := e.store.Take(ctx, ops)
		e.observe("take", start, cmp.Or(err, firstStoreErr(outs, func(o *TakeOutcome) error { return o.Err })))
		if err != nil {
			return nil, Report{}, err
		}
		for j, o := range outs {
			resp := &resps[at[j][0]]
			res := &resp.Keys[at[j][1]]
			li := at[j][2]
			if o.Err != nil {
				// The store failed for this key alone: the take fails,
				// and its other keys and limits give back what they
				// took (below).
				if resp.Err == nil {
					resp.Err = storeFailedFor(o.Err, "keys[%d] %q", at[j][1], res.Key)
				}
				continue
			}
			rep.Expiries += o.Expired
			res.Limits[li] = limitStatus(res.Rule, li, o.Remaining, o.Reset)
			if li == 0 || res.Limits[li].Remaining < res.Remaining {
				res.Remaining = res.Limits[li].Remaining
			}
			res.Delay = max(res.Delay, o.Delay)
			resp.Delay = max(resp.Delay, o.Delay)
			if !o.Taken && res.Rule.Shadow {
				// Decided and reported, but admitted.
				res.ShadowDenied = true
				resp.ShadowDenied = true
				res.RetryAfter = max(res.RetryAfter, o.RetryAfter)
				continue
			}
			if !o.Taken {
				res.Allowed = false
				resp.Allowed = false
				res.RetryAfter = max(res.RetryAfter, o.RetryAfter)
				resp.RetryAfter = max(resp.RetryAfter, o.RetryAfter)
			}
		}
		if err := e.borrowTakes(ctx, takes, resps, &rep); err != nil {
			return nil, Report{}, err
		}
		// Give back what the denied takes took from their other keys and
		// limits. The request is denied either way; tokens not given back
		// only cost utilization, never accuracy, so a failure here is not
		// reported.
		var giveBack []TakeOp
		for j, o := range outs {
			if resp := &resps[at[j][0]]; o.Taken && (!resp.Allowed || resp.Err != nil) && ops[j].Cost > 0 {
				op := ops[j]
				op.At = o.At
				giveBack = append(giveBack, op)
				// Report the limit as it stands once given back.
				k := &resp.Keys[at[j][1]]
				li := at[j][2]
				b := ops[j].Bucket
				k.Limits[li] = limitStatus(k.Rule, li, min(o.Remaining+ops[j].Cost, b.Burst), k.Limits[li].Reset)
			}
		}
		for _, resp := range resps {
			for i := range resp.Keys {
				if k := &resp.Keys[i]; !resp.Allowed && len(k.Limits) > 0 {
					k.Remaining = k.Limits[0].Remaining
					for _, ls := range k.Limits[1:] {
						k.Remaining = min(k.Remaining, ls.Remaining)
					}
				}
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
		case resps[i].Err != nil:
			resps[i] = TakeResult{Err: resps[i].Err}
		case resps[i].Allowed:
			rep.Grants++
			if resps[i].ShadowDenied {
				rep.ShadowDenials++
			}
		default:
			resps[i].Delay = 0
			rep.Denials++
		}
	}
	return resps, rep, nil
}

// priorityName returns p, or "normal" for the empty class.
func priorityName(p string) string {
	if p == "" {
		return protocol.PriorityNormal
	}
	return p
}

// wireAlgorithm returns a rule's algorithm as the protocol carries it:
// empty for token_bucket.
func wireAlgorithm(a Algorithm) string {
	if a == TokenBucket {
		return ""
	}
	return string(a)
}
