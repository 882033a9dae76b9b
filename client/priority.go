package client

import (
	"context"

	"github.com/ratelease/ratelease/protocol"
)

// Priority classes, highest first, as protocol.Priorities names them. A
// rule on the server may reserve a share of each of its limits for the
// classes above a request's (rules file field reserve: {critical: 20%}),
// so that under saturation the lower classes are denied first and the
// higher ones keep getting tokens.
const (
	PriorityCritical = protocol.PriorityCritical
	PriorityHigh     = protocol.PriorityHigh
	PriorityNormal   = protocol.PriorityNormal
	PriorityLow      = protocol.PriorityLow
)

// priorityKey is the context key of WithPriority.
type priorityKey struct{}

// WithPriority returns a copy of ctx that carries priority class p for
// the decisions made with it (AllowN, Allow, WaitN, Wait): critical, high,
// normal or low. An unknown class is ignored (the decision takes the
// client's default, Config.Priority).
//
// A leased key's lease belongs to the client's default class, so a call
// whose class differs from the default is decided by a direct take at a
// lease server carrying its class, never from the lease: a critical call
// never spends a best-effort lease, nor a best-effort call a critical one.
// Such calls cost a round trip each (coalesced with the other decisions
// in flight) and do not count as demand for the key's lease; a denial of
// one does not deny the key's other calls locally. Give the bulk of a
// process's traffic the default class, and other classes to the calls
// that need them.
func WithPriority(ctx context.Context, p string) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFrom returns the class WithPriority put in ctx, and whether it
// put one.
func PriorityFrom(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(priorityKey{}).(string)
	return p, ok
}

// callPriority returns the wire class of a decision made with ctx, and
// whether it differs from the client's default class (the decision is
// then made directly, see WithPriority).
func (c *Client) callPriority(ctx context.Context) (string, bool) {
	p, ok := PriorityFrom(ctx)
	if !ok || protocol.ValidatePriority(p) != nil {
		return c.cfg.Priority, false
	}
	p = normalPriority(p)
	return p, p != c.cfg.Priority
}

// normalPriority returns p with the empty class spelled "normal".
func normalPriority(p string) string {
	if p == "" {
		return protocol.PriorityNormal
	}
	return p
}

// wirePriority returns the client's default class as a lease entry
// carries it: empty for normal.
func (c *Client) wirePriority() string {
	if c.cfg.Priority == protocol.PriorityNormal {
		return ""
	}
	return c.cfg.Priority
}
