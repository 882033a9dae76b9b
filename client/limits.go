package client

import (
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// LimitState is one limit of a key's rule as the lease servers last saw it,
// for all clients together: what RateLimit response headers carry. A rule
// may hold several limits ("3 per minute and 100 per hour"); a request
// needs all of them.
//
// The state is as of the latest answer about the key: for a key decided
// directly, the answer to this decision; for a leased key, the answer that
// granted its lease (its global Remaining then, not what is left in this
// process's lease, which Decision.Remaining says).
type LimitState struct {
	// Algorithm names the limit's algorithm ("token_bucket",
	// "fixed_window", ...).
	Algorithm string
	// Limit is the number of requests (tokens) the limit admits per
	// Period.
	Limit int64
	// Period is the limit's period (a token bucket's refill of Limit, a
	// window's length).
	Period time.Duration
	// Burst is a token bucket's size or a leaky bucket's queue; for the
	// windows it equals Limit.
	Burst int64
	// Remaining is what the limit still admitted, fleet-wide, at the
	// answer.
	Remaining int64
	// Reset is when the limit is whole again if nothing else is admitted:
	// a token bucket full, a window ended.
	Reset time.Time
	// Overage is, for a soft rule, the tokens beyond the base limit in use
	// (Remaining is then 0).
	Overage int64
}

// limitStates converts a server's per-limit states, answered at client
// clock at, into the immutable slice a key keeps and decisions share. It
// returns nil when the answer had none.
func (c *Client) limitStates(ls []protocol.LimitStatus, at int64) *[]LimitState {
	if len(ls) == 0 {
		return nil
	}
	out := make([]LimitState, len(ls))
	base := c.start.Add(time.Duration(at))
	for i, l := range ls {
		out[i] = LimitState{
			Algorithm: l.Algorithm,
			Limit:     l.Limit,
			Period:    time.Duration(l.PeriodMillis) * time.Millisecond,
			Burst:     l.Burst,
			Remaining: l.Remaining,
			Reset:     base.Add(time.Duration(l.ResetMillis) * time.Millisecond),
			Overage:   l.Overage,
		}
	}
	return &out
}

// limitsView returns the key's latest per-limit states, shared and
// read-only; nil before any answer carried them.
func (ks *keyState) limitsView() []LimitState {
	if p := ks.limits.Load(); p != nil {
		return *p
	}
	return nil
}

// room returns the least Remaining over the key's limits at the latest
// answer about it: what the bucket could still admit then, fleet-wide. 0
// before any answer carried them.
func (ks *keyState) room() int64 {
	ls := ks.limitsView()
	if len(ls) == 0 {
		return 0
	}
	r := ls[0].Remaining
	for _, l := range ls[1:] {
		r = min(r, l.Remaining)
	}
	return max(r, 0)
}
