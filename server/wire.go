package server

import (
	"errors"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// This file maps between the wire (package protocol) and the engine's
// domain types (package leases): the engine knows nothing of JSON or
// problem codes, and the wire nothing of rules.

func leaseAsks(entries []protocol.LeaseEntry) []leases.LeaseAsk {
	asks := make([]leases.LeaseAsk, len(entries))
	for i, e := range entries {
		asks[i] = leases.LeaseAsk{Key: e.Key, Want: e.Want, LeaseID: e.LeaseID, Used: e.Used, Slot: e.Slot, Priority: e.Priority, MaxDelay: time.Duration(e.MaxDelayMillis) * time.Millisecond}
	}
	return asks
}

func takeAsks(reqs []protocol.CheckRequest) []leases.TakeAsk {
	asks := make([]leases.TakeAsk, len(reqs))
	for i := range reqs {
		asks[i] = leases.TakeAsk{Keys: reqs[i].Keys, Cost: reqs[i].CostOrDefault(), MaxDelay: reqs[i].MaxDelay(), Priority: reqs[i].Priority}
	}
	return asks
}

// decisionProblem maps an entry's or a take's error from the engine to its
// problem. The codes follow the sentinels; the detail is the engine's.
func decisionProblem(err error) *protocol.Problem {
	code := protocol.CodeInternal
	switch {
	case errors.Is(err, leases.ErrNoRule):
		code = protocol.CodeNoRule
	case errors.Is(err, leases.ErrCostExceedsBurst):
		code = protocol.CodeCostExceedsBurst
	case errors.Is(err, leases.ErrUnknownLease):
		code = protocol.CodeUnknownLease
	case errors.Is(err, leases.ErrUsedExceedsGranted):
		code = protocol.CodeUsedExceedsGranted
	case errors.Is(err, leases.ErrTooManyLeases):
		code = protocol.CodeTooManyLeases
	case errors.Is(err, leases.ErrStoreUnavailable):
		// The store failed for this entry's key alone (see
		// Server.storeFailedFor); its Detail names the key, not the cause.
		code = protocol.CodeStoreUnavailable
	}
	return protocol.NewProblem(code, err.Error())
}

func millis(d time.Duration) int64 { return d.Milliseconds() }

// limitStatuses maps the engine's per-limit states to the wire's.
func limitStatuses(ls []leases.LimitStatus) []protocol.LimitStatus {
	if len(ls) == 0 {
		return nil
	}
	out := make([]protocol.LimitStatus, len(ls))
	for i, l := range ls {
		out[i] = protocol.LimitStatus{Algorithm: string(l.Algorithm), Limit: l.Limit.Limit, PeriodMillis: millis(l.Period), Burst: l.Burst, Remaining: l.Remaining, ResetMillis: millis(l.Reset), Overage: l.Overage}
	}
	return out
}

// binding returns the limit of r that Limit, PeriodMillis and Burst
// describe on the wire: the one with the lowest rate, with the least burst
// of all limits, so that a client sizes leases and paces by the tightest.
func binding(r *leases.Rule) (l leases.Limit) {
	l = r.Limits[r.Binding()]
	for _, o := range r.Limits {
		l.Burst = min(l.Burst, o.Burst)
	}
	return l
}

func leaseResultWire(r *leases.LeaseResult) protocol.LeaseResult {
	out := protocol.LeaseResult{Key: r.Key, Slot: r.Slot}
	if r.Err != nil {
		out.Error = decisionProblem(r.Err)
		return out
	}
	out.LeaseID = r.LeaseID
	out.Granted = r.Granted
	out.TTLMillis = millis(r.TTL)
	out.RetryAfterMillis = millis(r.RetryAfter)
	out.Unlimited = r.Unlimited
	if r.Rule == nil {
		return out
	}
	l := binding(r.Rule)
	out.Limit, out.PeriodMillis, out.Burst, out.Algorithm = l.Limit, millis(l.Period), l.Burst, string(l.Algorithm)
	out.Remaining = r.Remaining
	out.SafeRate = r.SafeRate
	out.Rule = r.Rule.Name
	out.DelayMillis = millis(r.Delay)
	out.Limits = limitStatuses(r.Limits)
	out.ShadowDenied = r.ShadowDenied
	out.Borrowed = r.Borrowed
	out.Owned = r.Owned
	return out
}

func takeResultWire(r *leases.TakeResult) protocol.CheckResponse {
	if r.Err != nil {
		return protocol.CheckResponse{Error: decisionProblem(r.Err)}
	}
	out := protocol.CheckResponse{Allowed: r.Allowed, RetryAfterMillis: millis(r.RetryAfter), DelayMillis: millis(r.Delay), ShadowDenied: r.ShadowDenied, Borrowed: r.Borrowed, Keys: make([]protocol.CheckResult, len(r.Keys))}
	for i := range r.Keys {
		k := &r.Keys[i]
		kr := protocol.CheckResult{Key: k.Key, Allowed: k.Allowed, RetryAfterMillis: millis(k.RetryAfter), Remaining: k.Remaining, Unlimited: k.Unlimited, ShadowDenied: k.ShadowDenied, Borrowed: k.Borrowed}
		if k.Rule != nil {
			l := binding(k.Rule)
			kr.Limit, kr.PeriodMillis, kr.Burst, kr.Algorithm = l.Limit, millis(l.Period), l.Burst, string(l.Algorithm)
			kr.Rule = k.Rule.Name
			kr.LeaseTTLMillis = millis(k.Rule.LeaseTTL)
			kr.DelayMillis = millis(k.Delay)
			kr.Limits = limitStatuses(k.Limits)
		}
		out.Keys[i] = kr
	}
	return out
}
