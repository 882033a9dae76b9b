package leases

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// This file is elastic throttling: a rule that names a pool key
// (Rule.Elastic) lets a request its own limits deny borrow from the pool's
// bucket, so that callers exceed their own limit only while the pool has
// room. The pool is a key like any other, governed by its own rule (one
// limit, not itself elastic, nor a leaky_bucket: a shaper's slots come with
// a wait that a borrowed request, admitted at once, would not keep); only
// borrowed requests take from it, so size it to the headroom the
// protected backend has beyond what the callers' own limits admit.
//
// A take (direct decision) denied only by elastic keys takes its cost from
// each such key's pool, all or nothing, in one more store call, leaving
// the floor the pool's rule keeps from the take's class (Rule.Reserve);
// if a pool cannot serve, what the others gave is refunded and the take
// stays denied. A lease entry whose own limits granted less than it wanted
// takes the shortfall from the pool outright, above the same floor (a
// take, not a lease: the pool is shared by every caller of every key of
// the rule), and is granted the sum. Its
// lease ID remembers both parts and the take's stamp, authenticated (see
// leaseid.go), so that its settle charges the own limits with at most what
// they granted and gives the pool back what was borrowed and not used, and
// no more whatever the client sends. When the own limits
// granted nothing there is no own lease to prove the settle is the first,
// so the pool's unused tokens are not given back: they count as spent, a
// cost in the pool's utilization, never in a bound.
//
// Bound: each key admits at most its own limits' bound plus what it
// borrowed, and all the keys of all elastic rules together borrow at most
// the pool's bound.

// validateElastic checks the pool of every elastic rule of p: a valid key
// that a rule of one limit, not itself elastic, governs.
func validateElastic(p *Policy) error {
	for i := range p.rules {
		r := &p.rules[i]
		if r.Elastic == "" {
			continue
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("%w: rule %q: elastic: %s", ErrInvalidRules, r.Name, fmt.Sprintf(format, args...))
		}
		if err := protocol.ValidateKey(r.Elastic); err != nil {
			return fail("pool key %q: %v", r.Elastic, err)
		}
		if r.Shadow {
			return fail("a rule in shadow mode admits everything; it has nothing to borrow")
		}
		pool, ok := p.Match(r.Elastic)
		switch {
		case !ok:
			return fail("no rule matches the pool key %q: give it one (for example limit: <the headroom the backend has>)", r.Elastic)
		case pool.Elastic != "":
			return fail("the pool key %q is governed by rule %q, which is elastic itself", r.Elastic, pool.Name)
		case len(pool.Limits) != 1:
			return fail("the pool key %q is governed by rule %q, which has %d limits; a pool has one", r.Elastic, pool.Name, len(pool.Limits))
		case pool.Match == r.Match:
			return fail("the pool key %q is governed by the rule itself", r.Elastic)
		case pool.Limits[0].Algorithm == LeakyBucket:
			// A shaper hands out slots, each with its wait: a borrowed
			// take was admitted at once (ten borrows of a pool of 10/s
			// in one instant, its slots 100 ms apart), and a lease's
			// shortfall, taken outright, has no slots to spend by.
			return fail("the pool key %q is governed by rule %q, a leaky_bucket, which shapes requests into slots that a borrowed request would not wait for; govern the pool by a token bucket or a window", r.Elastic, pool.Name)
		}
	}
	return nil
}

// poolOp returns the take of cost tokens from rule r's pool by a request
// of class priority, which leaves the floor of the pool's rule for that
// class (Rule.Floor): a borrower takes no more of the reserve of the
// classes above it than a take of the pool key itself would.
func (e *Engine) poolOp(r *Rule, cost int64, priority string) (TakeOp, bool) {
	pool, ok := e.policy.Match(r.Elastic)
	if !ok || len(pool.Limits) != 1 {
		return TakeOp{}, false // validation forbids it; a pool without rule lends nothing
	}
	b := pool.bucket(0)
	return TakeOp{Key: r.Elastic, Bucket: b, Cost: cost, Floor: pool.Floor(priority, b.Burst)}, true
}

// borrowTakes lets the denied takes whose every denying key is elastic
// borrow from their pools, in one store call; it refunds what the pools of
// a take that could not borrow gave. It marks the takes that borrowed
// allowed.
func (e *Engine) borrowTakes(ctx context.Context, takes []TakeAsk, resps []TakeResult, rep *Report) error {
	var ops []TakeOp
	var at [][2]int // take and key of each op
	for ti := range resps {
		resp := &resps[ti]
		if resp.Allowed || resp.Err != nil {
			continue
		}
		first := len(ops)
		eligible := true
		for ki := range resp.Keys {
			k := &resp.Keys[ki]
			if k.Allowed || k.ShadowDenied {
				continue
			}
			op, ok := TakeOp{}, k.Rule != nil && k.Rule.Elastic != ""
			if ok {
				op, ok = e.poolOp(k.Rule, takes[ti].Cost, takes[ti].Priority)
			}
			if !ok {
				eligible = false
				break
			}
			ops = append(ops, op)
			at = append(at, [2]int{ti, ki})
		}
		if !eligible {
			ops, at = ops[:first], at[:first]
		}
	}
	if len(ops) == 0 {
		return nil
	}
	start := time.Now()
	// A pool op that failed alone (its Redis Cluster node down) lends
	// nothing: the limits' own answer stands.
	outs, err := e.store.Take(ctx, ops)
	e.observe("take", start, cmp.Or(err, firstStoreErr(outs, func(o *TakeOutcome) error { return o.Err })))
	if err != nil {
		return err
	}
	ok := map[int]bool{}
	for j, o := range outs {
		ti := at[j][0]
		if _, seen := ok[ti]; !seen {
			ok[ti] = true
		}
		ok[ti] = ok[ti] && o.Taken
	}
	var refund []TakeOp
	for j, o := range outs {
		ti, ki := at[j][0], at[j][1]
		if ok[ti] {
			k := &resps[ti].Keys[ki]
			k.Allowed, k.Borrowed, k.RetryAfter = true, true, 0
			continue
		}
		if o.Taken && ops[j].Cost > 0 {
			op := ops[j]
			op.At = o.At
			refund = append(refund, op)
		}
	}
	for ti, borrowed := range ok {
		if borrowed {
			resps[ti].Allowed, resps[ti].RetryAfter, resps[ti].Borrowed = true, 0, true
			rep.Borrows++
		}
	}
	if len(refund) > 0 {
		start := time.Now()
		err := e.store.Refund(ctx, refund)
		e.observe("refund", start, err)
	}
	return nil
}

// borrowLeases lets the entries of elastic rules whose own limits granted
// less than they wanted take the shortfall from their pools, in one store
// call, and names their leases so that the settle can split what was used.
func (e *Engine) borrowLeases(ctx context.Context, owner Owner, ids *idSecret, asks []LeaseAsk, results []LeaseResult, rep *Report) error {
	var ops []TakeOp
	var idx []int
	for i := range results {
		res, a := &results[i], &asks[i]
		if res.Err != nil || res.Rule == nil || res.Rule.Elastic == "" || a.Want <= res.Granted {
			continue
		}
		op, ok := e.poolOp(res.Rule, a.Want-res.Granted, a.Priority)
		if !ok {
			continue
		}
		ops = append(ops, op)
		idx = append(idx, i)
	}
	if len(ops) == 0 {
		return nil
	}
	start := time.Now()
	// A pool op that failed alone (its Redis Cluster node down) lends
	// nothing: the limits' own answer stands.
	outs, err := e.store.Take(ctx, ops)
	e.observe("take", start, cmp.Or(err, firstStoreErr(outs, func(o *TakeOutcome) error { return o.Err })))
	if err != nil {
		return err
	}
	for j, o := range outs {
		if !o.Taken {
			continue
		}
		res := &results[idx[j]]
		own := res.Granted
		storeID := res.LeaseID
		if storeID == "" {
			storeID = NewLeaseID()
			res.TTL = res.Rule.LeaseTTL
			rep.Denials--
			rep.Grants++
		}
		secret, err := ids.get()
		if err != nil {
			return err
		}
		res.LeaseID = leaseIDParts{storeID: storeID, own: own, borrowed: ops[j].Cost, stamp: o.At, elastic: true}.format(secret, owner.Client, res.Key)
		res.Granted += ops[j].Cost
		res.Borrowed = ops[j].Cost
		res.RetryAfter = 0
		rep.Borrows++
	}
	return nil
}

// poolRefunds returns the refunds of the pool tokens that settled elastic
// leases borrowed and did not use: only for leases whose own limits granted
// something and settled now (their settle is then known to be the first),
// and whose IDs verified (parsed holds what they remember, see Lease; nil
// when none did).
func (e *Engine) poolRefunds(parsed []leaseIDParts, asks []LeaseAsk, results []LeaseResult) []TakeOp {
	if parsed == nil {
		return nil
	}
	var out []TakeOp
	for i := range asks {
		res := &results[i]
		p := parsed[i]
		if !p.elastic || p.borrowed == 0 || p.own == 0 || !res.storeSettled || res.Rule == nil || res.Rule.Elastic == "" {
			continue
		}
		usedPool := max(0, asks[i].Used-p.own)
		if unused := p.borrowed - min(usedPool, p.borrowed); unused > 0 {
			if op, ok := e.poolOp(res.Rule, unused, asks[i].Priority); ok {
				op.At = p.stamp
				out = append(out, op)
			}
		}
	}
	return out
}
