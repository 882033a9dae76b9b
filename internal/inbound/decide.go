package inbound

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ratelease/ratelease/client"
)

// Outcome is what a limiter did with a request.
type Outcome uint8

// The outcomes. They are untyped, so that httplimit.Outcome's constants,
// which grpclimit shares, can be these very values.
const (
	// OutcomeAllowed: the limit allowed the request at once.
	OutcomeAllowed = iota
	// OutcomeDenied: the request was denied.
	OutcomeDenied
	// OutcomeShadow: the limit denied the request, and Shadow admitted it.
	OutcomeShadow
	// OutcomeWaited: the request waited in the queue and was admitted.
	OutcomeWaited
	// OutcomeUnidentified: no key could be made for the request.
	OutcomeUnidentified
	// OutcomeRefused: the lease servers refused the request's keys or
	// the service (Decided.Err says why): a misconfiguration, not a rate
	// limit. Answered as unavailable, or admitted in shadow mode.
	OutcomeRefused
)

// Verdict is what a limiter must answer to a request Decide decided.
type Verdict uint8

const (
	// VerdictAdmit: let the request through. Decided.Outcome is
	// OutcomeAllowed, OutcomeShadow or OutcomeWaited.
	VerdictAdmit Verdict = iota
	// VerdictDeny: the limit denies the request (a 429, a
	// ResourceExhausted); retry after Decided.Retry.
	VerdictDeny
	// VerdictRefused: the lease servers refused this service, or the
	// request could not be decided (Decided.Err: a *client.RefusedError,
	// client.ErrCostExceedsBurst, client.ErrInvalidRequest): a
	// misconfiguration, not a rate limit, to be answered as one the
	// caller must not retry.
	VerdictRefused
	// VerdictClosing: the client is closing or closed (Decided.Err is
	// client.ErrClosed): not a rate limit either.
	VerdictClosing
	// VerdictEnded: the request's context ended before a lease server
	// decided its first decision, or while it waited (Decided.Err says
	// how): no limit judged it. Decided.Retry and Decided.Fields are set
	// as for VerdictDeny, for a limiter that answers it as a denial.
	VerdictEnded
)

// Decided is Decide's answer: what it decided, for the limiter's Result
// (whose fields of the same names mean the same), and what to answer.
type Decided struct {
	// Verdict is what to answer.
	Verdict Verdict
	// Outcome says what happened.
	Outcome Outcome
	// Decision is the client's first decision on the request (for a
	// request that waited, the denial that sent it to the queue).
	Decision client.Decision
	// Waited is how long the request spent in the queue.
	Waited time.Duration
	// QueueFull is true for a denial because the queue was full.
	QueueFull bool
	// Err is why the request was refused, or ended without tokens (a
	// wait that did, or a context that ended before a server decided):
	// an error wrapping a *client.RefusedError or matching
	// client.ErrCostExceedsBurst or client.ErrInvalidRequest
	// (OutcomeRefused), client.ErrRateLimited, the request's context
	// error, or client.ErrClosed.
	Err error
	// Retry is the delay of a denial (VerdictDeny, VerdictEnded): the
	// Retry-After to send.
	Retry time.Duration
	// Fields says to write the RateLimit fields of Decision.Limits: the
	// header mode wants them on this answer, and there are some.
	Fields bool
	// State says to write the RateLimit field as well as
	// RateLimit-Policy: false for a request that waited, whose first
	// decision's state is stale.
	State bool
}

// Decide takes cost tokens of keys for one request, counts the outcome
// (Stats), and says what to answer. It neither logs nor reports: the
// limiter logs a shadow denial and calls its hook with the Result. A
// denial is admitted in shadow mode, and otherwise waits in the queue
// (Config.MaxWait, under a deadline and ctx) when waiting can serve it:
// not a key the servers refuse, not a closed client, not one whose
// retry-after is beyond MaxWait, not when the queue is full.
//
// A refusal of the lease servers (a wrong token, a key the service may
// not use, a cost beyond the rule's burst) is a misconfiguration, never a
// rate limit: VerdictRefused, whether the first decision or the wait
// found it, and in shadow mode admitted as OutcomeRefused, not counted
// as a shadow denial. So is a closed client: VerdictClosing. A request
// whose context ended before a lease server decided it (the decision's
// Err is the context's error) is VerdictEnded, as one whose context ends
// while it waits: no limit judged it (in shadow mode it is admitted, as a
// closed client's is).
func (l *Limiter) Decide(ctx context.Context, keys []string, cost int64) (out Decided) {
	d := l.c.AllowN(ctx, cost, keys...)
	out.Decision = d
	// ended: the context ended before a server decided (the client's
	// decision carries the context's error): no limit judged the request.
	ended := d.Err != nil && ctx.Err() != nil && errors.Is(d.Err, ctx.Err())
	switch {
	case d.Allowed:
		l.allowed.Add(1)
		l.admit(&out, OutcomeAllowed, true)
		return out
	case ended && !l.shadow:
		// The request's end, as when the context ends while it waits in the
		// queue; it was VerdictDeny without a queue, a rate limit by
		// every sign (grpclimit answered ResourceExhausted, found by
		// review). Shadow mode admits it, as it admits a closed client's.
		l.denied.Add(1)
		out.Outcome, out.Verdict, out.Err, out.Retry = OutcomeDenied, VerdictEnded, d.Err, d.RetryAfter
		out.Fields = l.headers != HeadersNone && len(d.Limits) > 0
		out.State = true
		return out
	case d.Err != nil && d.Source != client.SourceClosed && !ended:
		// (A closed client's decision carries ErrClosed: it goes on
		// below, as a closing; in shadow mode, so does one whose context
		// ended before a server decided it.)
		// The lease servers refused this service (a wrong token, a key it
		// may not use): a misconfiguration, not a rate limit. Shadow mode
		// admits it, as it admits every request, but does not count or
		// report it as one the limit would have denied.
		l.refused.Add(1)
		out.Err = d.Err
		if l.shadow {
			l.admit(&out, OutcomeRefused, true)
			return out
		}
		l.denied.Add(1)
		out.Outcome, out.Verdict = OutcomeRefused, VerdictRefused
		return out
	case d.Source == client.SourceClosed && !l.shadow:
		l.denied.Add(1)
		out.Outcome, out.Err, out.Verdict = OutcomeDenied, client.ErrClosed, VerdictClosing
		return out
	case l.shadow:
		l.shadowed.Add(1)
		l.admit(&out, OutcomeShadow, true)
		return out
	}
	retry := d.RetryAfter
	verdict := VerdictDeny
	if l.queue != nil && d.RetryAfter <= l.maxWait {
		select {
		case l.queue <- struct{}{}:
			start := time.Now()
			// MaxWait bounds a shaping rule's slot too, not the client's
			// Config.MaxWait (1 s by default): a request whose slot was
			// 2 s away was answered 429 at once under a MaxWait of 10 s
			// (found by review).
			wctx, cancel := context.WithTimeout(client.WithMaxWait(ctx, l.maxWait), l.maxWait)
			err := l.c.WaitN(wctx, cost, keys...)
			cancel()
			<-l.queue
			out.Waited = time.Since(start)
			if err == nil {
				l.waited.Add(1)
				// No decision came with the tokens: the first one's state
				// would be stale.
				l.admit(&out, OutcomeWaited, false)
				return out
			}
			out.Err = err
			rl, limited := errors.AsType[*client.RateLimitedError](err)
			if limited && rl.RetryAfter > 0 {
				retry = rl.RetryAfter
			} else {
				// The first decision's delay, less the wait it has
				// covered already.
				retry = max(retry-out.Waited, 0)
			}
			switch {
			case errors.Is(err, client.ErrClosed):
				l.denied.Add(1)
				out.Outcome, out.Verdict = OutcomeDenied, VerdictClosing
				return out
			case ctx.Err() != nil:
				// The caller gave up (or its deadline passed) while it
				// waited.
				verdict = VerdictEnded
			case !limited && !errors.Is(err, context.DeadlineExceeded):
				// Not the limit, nor MaxWait running out: the servers
				// refused a key while the request waited (the first
				// decision was a local denial, which asks no server).
				// Answered as a rate limit, the misconfiguration sent the
				// caller to retry (found by review: a 429 where the first
				// decision's refusal is a 503).
				l.refused.Add(1)
				l.denied.Add(1)
				out.Outcome, out.Verdict = OutcomeRefused, VerdictRefused
				return out
			}
		default:
			out.QueueFull = true
			l.full.Add(1)
		}
	}
	l.denied.Add(1)
	out.Outcome, out.Verdict, out.Retry = OutcomeDenied, verdict, retry
	out.Fields = l.headers != HeadersNone && len(d.Limits) > 0
	// After a wait the first decision's state (what remained, when the
	// limit is whole) is stale, as for a request admitted after one: the
	// policy only.
	out.State = out.Waited == 0
	return out
}

// admit makes out an admission with outcome o; state says whether its
// decision's state is fresh.
func (l *Limiter) admit(out *Decided, o Outcome, state bool) {
	out.Outcome, out.Verdict = o, VerdictAdmit
	out.Fields = l.headers == HeadersAll && len(out.Decision.Limits) > 0
	out.State = state
}

// Unidentified counts a request no key could be made for.
func (l *Limiter) Unidentified() {
	l.unident.Add(1)
}

// CeilSeconds rounds d up to whole seconds; 0 for d ≤ 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfterSeconds is the Retry-After of a wait of d: whole seconds,
// rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(CeilSeconds(d), 1), 10)
}
