package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// maxDirectCalls is the most calls carrying direct takes in flight at once.
// A decision that finds them all busy joins the next call, sent as soon as
// one returns, with every decision that arrived meanwhile: the calls
// coalesce decisions under load, and a decision alone is sent at once.
//
// Routed by key (see Config.NoKeyRouting), such a call is split by server
// into one request per server, sent concurrently, and counts once until
// every one of them (and their failovers) is done: each server then has at
// most maxDirectCalls requests of takes from the process in flight, but for
// a moment after a failover, when the takes of a failed server join those
// already on their next one.
const maxDirectCalls = 4

// directReq is one decision waiting for a direct take: n tokens from every
// key, all or nothing.
type directReq struct {
	states   []*keyState
	n        int64
	maxDelay int64         // ms: the longest wait for a shaping rule's slot (0: it must be now)
	done     chan struct{} // closed when res or err is set
	res      protocol.CheckResponse
	err      error // no server answered
	sent     int64 // client clock when its call was sent
	// priority is the take's class on the wire; foreign is true when it
	// is not the client's default (see WithPriority): its answer then
	// changes no state of its keys but what they learn of their rules.
	priority string
	foreign  bool
	hash     uint64 // of its first key, when routed (see Config.NoKeyRouting)
	// gone is set when the decision returned without the answer (its
	// context ended): not sent yet, it is not sent at all.
	gone atomic.Bool
}

// directQueue coalesces the direct takes of the process. Its fields are
// guarded by mu.
type directQueue struct {
	mu       sync.Mutex
	pending  []*directReq
	inflight int
	closed   bool           // Close has begun: no sender starts
	senders  sync.WaitGroup // the sendDirect goroutines, for Close
}

// takeDirect decides states by one direct take at a lease server, sent at
// once or with the next call when maxDirectCalls are in flight. It waits for
// the answer, or until ctx ends or the client closes.
//
// A decision alone in its call (no other decision waiting to be sent) makes
// the call in its own goroutine (see callOwn); the others wait for a
// sender goroutine, which coalesces them into the next call. So do all of
// them while a caller gave up on a call since the server's last answer
// (see detached). A call that its caller cancels tells nothing of the
// server; a sender's call, which its callers leave without canceling it,
// ends in an answer or a failure. A server slower than its callers wait is
// so still seen to answer, and one that hangs to fail, once a call sent by
// a sender has gone unanswered for Config.RequestTimeout (see
// checkDetached): otherwise a slow but healthy server, seen only through
// callers who give up first, would be taken for dead and the fallback
// would decide beside it, adding to the limit.
func (c *Client) takeDirect(ctx context.Context, n int64, states []*keyState, maxDelay time.Duration, priority string, foreign bool) Decision {
	if ctx.Err() != nil {
		// Ended before it was sent: no take, whose tokens no one would
		// use. (callOwn would cancel the call, but only once the
		// context's AfterFunc ran, and the call could be sent first.)
		return c.ended(ctx)
	}
	req := &directReq{states: states, n: n, maxDelay: max(maxDelay, 0).Milliseconds(), done: make(chan struct{}), priority: priority, foreign: foreign}
	c.direct.mu.Lock()
	if c.direct.closed {
		c.direct.mu.Unlock()
		return closedDecision
	}
	c.direct.pending = append(c.direct.pending, req)
	var batch []*directReq
	if c.direct.inflight < maxDirectCalls {
		batch = c.direct.pending
		c.direct.pending = nil
		c.direct.inflight++
		c.direct.senders.Add(1)
	}
	c.direct.mu.Unlock()
	switch {
	case len(batch) == 1 && !c.detached(states, c.nanos()):
		return c.callOwn(ctx, req)
	case batch != nil:
		go c.sendDirect(batch)
	}
	select {
	case <-req.done:
	case <-ctx.Done():
		// The take may still happen at the server (not if it is still
		// queued: see sendDirect): its tokens are then lost to
		// utilization, never to accuracy.
		req.gone.Store(true)
		return c.ended(ctx)
	case <-c.stopped:
		return closedDecision
	}
	return c.applyDirect(req)
}

// ended is the decision of a direct take whose ctx ended before a server
// decided it: denied, its Err ctx's error. No server judged it, so no sign
// of it says rate limit: denied with no Err, Source SourceDirect and a
// RetryAfter, it was one by every sign a caller has (found by the API
// review: a handler answered 429 for a server slower than the request's
// deadline, and Wait returned ErrRateLimited).
func (c *Client) ended(ctx context.Context) Decision {
	return Decision{Source: SourceDirect, RetryAfter: c.cfg.SettleInterval, Err: ctx.Err()}
}

// errCallerGone is the cause of the cancellation of a call that callOwn
// makes for a decision whose context ended: no failure of any server.
var errCallerGone = errors.New("client: the decision's context ended")

// callOwn makes the call of req, alone in its batch, in the deciding
// goroutine, then hands what queued meanwhile to a sender goroutine; it
// returns the decision. A sender goroutine for the call would cost its
// start, the growth of its stack through the HTTP client and two hand-offs
// between goroutines: about half the client's work for a direct decision
// (BenchmarkDirectDecision).
//
// The decision returns when ctx ends, as one waiting for a sender does: ctx
// ending cancels the call (with cause errCallerGone, which no one counts as
// a failure of the server, but which sets Client.detach), and the take may
// still have happened at the server, lost to utilization, never to
// accuracy. Unlike a sender's call, a canceled call costs its connection.
func (c *Client) callOwn(ctx context.Context, req *directReq) Decision {
	call, cancel := context.WithCancelCause(c.life)
	stop := func() bool { return false }
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { cancel(errCallerGone) })
	}
	c.callDirect(call, []*directReq{req})
	stop()
	cancel(nil)

	c.direct.mu.Lock()
	batch := c.direct.pending
	c.direct.pending = nil
	if batch == nil {
		c.direct.inflight--
	}
	c.direct.mu.Unlock()
	if batch != nil {
		go c.sendDirect(batch) // it counts as the sender this call was
	} else {
		c.direct.senders.Done()
	}

	if req.err != nil {
		select {
		case <-c.stopped:
			return closedDecision
		default:
		}
		if ctx.Err() != nil {
			return c.ended(ctx)
		}
	}
	return c.applyDirect(req)
}

// sendDirect makes the calls for batch, then for whatever queued meanwhile.
// Decisions that returned while they waited (their context ended) are
// dropped unsent: their takes would spend tokens no one uses.
func (c *Client) sendDirect(batch []*directReq) {
	defer c.direct.senders.Done()
	for batch != nil {
		if batch = waiting(batch); len(batch) > 0 {
			c.callDirect(c.life, batch)
		}
		c.direct.mu.Lock()
		batch = c.direct.pending
		c.direct.pending = nil
		if batch == nil {
			c.direct.inflight--
		}
		c.direct.mu.Unlock()
	}
}

// detached reports whether the direct call of a decision on states goes
// through a sender: a caller gave up on a call since the last answer of the
// servers (unrouted), or, routed, of the server its first key prefers or
// of the one its take goes to now (the first not avoided: see
// caller.route). Not any server's: a server that does not answer (a host
// gone) keeps its mark while it is avoided, and every direct decision of
// the process would pay a hand-off to a sender (65% more CPU per
// decision, measured by this change's review), while only the takes of
// its keys need one: its probes (a probe its caller gives up on judges
// nothing, and the server would be probed again after the shortest
// backoff, by one decision of its keys in each), and their takes where
// they fail over to (a server there that callers give up on would
// otherwise never be judged).
func (c *Client) detached(states []*keyState, now int64) bool {
	if c.detach.Load() {
		return true
	}
	if !c.routing() {
		return false
	}
	top, to := c.http.route(hashString(states[0].key), now)
	return c.http.health[top].detach.Load() || c.http.health[to].detach.Load()
}

// errUnanswered is the failure checkDetached records.
var errUnanswered = errors.New("client: no lease server answered a direct take within RequestTimeout")

// checkDetached records as failures, at now, the calls made through
// senders (see takeDirect) that went unanswered for Config.RequestTimeout:
// a server that hangs, seen through callers who give up first. Routed, the
// server is avoided (its keys fail over), and the client goes offline only
// when every server is avoided, as when a routed call fails over; unrouted,
// it goes offline. A call that ends sooner (answered or failed) clears its
// mark; waiting for its own end would take the retries of the HTTP client,
// twice RequestTimeout and more.
func (c *Client) checkDetached(now int64) {
	rt := int64(c.cfg.RequestTimeout)
	first := int64(0) // the send time of the earliest call found unanswered
	for i := range c.http.health {
		h := &c.http.health[i]
		if s := h.detachSince.Load(); s != 0 && now-s >= rt && h.detachSince.CompareAndSwap(s, 0) {
			h.failed(s, now, int64(c.cfg.SettleInterval), int64(c.cfg.MaxRetryWait))
			if first == 0 || s < first {
				first = s
			}
		}
	}
	if first != 0 {
		for i := range c.http.health {
			if now >= c.http.health[i].until.Load() {
				return // a server is left to fail over to
			}
		}
	}
	if s := c.detachSince.Load(); s != 0 && now-s >= rt && c.detachSince.CompareAndSwap(s, 0) {
		first = s
	}
	if first != 0 && c.directFailed(first, now, errUnanswered) {
		c.noteServerError(errUnanswered)
	}
}

// waiting returns the requests of batch whose decisions still wait for
// their answers, in place; it completes the others.
func waiting(batch []*directReq) []*directReq {
	kept := batch[:0]
	for _, r := range batch {
		if r.gone.Load() {
			close(r.done)
			continue
		}
		kept = append(kept, r)
	}
	clear(batch[len(kept):])
	return kept
}

// callDirect sends the takes of batch, at most protocol.MaxEntries keys a
// call, under parent (the client's life, or a decision's call; see
// callOwn), and completes every request: routed by key (see callRouted),
// or, with Config.NoKeyRouting or a single server, to the current server.
func (c *Client) callDirect(parent context.Context, batch []*directReq) {
	ctx, cancel := context.WithTimeout(parent, 2*c.cfg.RequestTimeout+2*c.cfg.MaxRetryWait)
	defer cancel()
	if c.routing() {
		c.callRouted(ctx, batch)
		return
	}
	c.sendTakes(ctx, nil, -1, batch, nil, 0)
}

// sendTakes sends the takes of reqs, at most protocol.MaxEntries keys a
// call, to server srv (see caller.leaseAt), whose failure moves them on to
// the next server of their keys (see failover); or, srv < 0, to the current
// server and the others after it (see caller.lease). It completes every
// request that it does not move on.
func (c *Client) sendTakes(ctx context.Context, wg *sync.WaitGroup, srv int, reqs []*directReq, tried []int, round int) {
	for len(reqs) > 0 {
		keys := 0
		end := 0
		for end < len(reqs) && (end == 0 || keys+len(reqs[end].states) <= protocol.MaxEntries) {
			keys += len(reqs[end].states)
			end++
		}
		chunk := reqs[:end]
		req := &protocol.LeaseRequest{ClientID: c.cfg.ClientID, Takes: make([]protocol.CheckRequest, len(chunk))}
		for i, r := range chunk {
			req.Takes[i].Keys = make([]string, len(r.states))
			for j, ks := range r.states {
				req.Takes[i].Keys[j] = ks.key
			}
			req.Takes[i].Cost = &chunk[i].n
			req.Takes[i].MaxDelayMillis = &chunk[i].maxDelay
			if r.priority != protocol.PriorityNormal {
				req.Takes[i].Priority = r.priority
			}
		}
		sent := c.nanos()
		// Made through a sender (see takeDirect), its outcome, or no answer
		// for RequestTimeout, judges the server (routed) or the servers.
		mark := &c.detachSince
		if srv >= 0 {
			mark = &c.http.health[srv].detachSince
		}
		if srv < 0 && c.detach.Load() || srv >= 0 && c.http.health[srv].detach.Load() {
			mark.CompareAndSwap(0, sent)
		}
		var resp *protocol.LeaseResponse
		var err error
		if srv < 0 {
			resp, err = c.http.lease(ctx, req)
		} else {
			resp, err = c.http.leaseAt(ctx, srv, req)
		}
		now := c.nanos()
		switch {
		case err == nil:
			if srv >= 0 {
				c.http.health[srv].answered(sent)
			}
			c.directAnswered()
		case errors.Is(err, ErrServerRefused):
			// A server answered, refusing the call (a bad token, a call too
			// large): a misconfiguration, not an outage. The decisions are
			// denied; the fallback is not for this.
			c.noteRefused(err, now)
			c.detachAnswered(srv)
			c.takesOnline() // an answer: the refusal, not the fallback, decides
		case errors.Is(context.Cause(ctx), errCallerGone):
			// The deciding goroutine's context ended (see callOwn): its
			// decision is returning, and no server failed. Until the
			// server answers, the next calls are made by senders, which
			// find out whether it does (see takeDirect). This call judged
			// nothing: a mark it set goes.
			mark.CompareAndSwap(sent, 0)
			if srv >= 0 {
				c.http.health[srv].detach.Store(true)
			} else {
				c.detach.Store(true)
			}
		default:
			if srv >= 0 {
				if ctx.Err() == nil {
					c.http.health[srv].failed(sent, now, int64(c.cfg.SettleInterval), int64(c.cfg.MaxRetryWait))
					// This and the calls left move on together.
					if c.failover(ctx, wg, srv, reqs, tried, round) {
						return
					}
				}
				c.http.failures.Add(1) // lease counts its own
				chunk = reqs           // every server failed them all
			}
			if c.directFailed(sent, now, err) {
				c.noteServerError(err)
			}
		}
		for i, r := range chunk {
			r.sent = sent
			if err != nil {
				r.err = err
			} else {
				r.res = resp.Takes[i]
			}
			close(r.done)
		}
		reqs = reqs[len(chunk):]
	}
}

// directFailed records that no server answered a direct call sent at sent
// (err): until the backoff ends, direct decisions go to the fallback
// without a call (one decision per backoff period probes the servers). The
// decisions queued for the next call are completed with err, unsent: they
// were to go to the servers just found not to answer, and would each wait
// for a failed call more (see offline for how they are decided). A call
// sent before the last failure counted fails in the same outage (so does
// a call checkDetached counted already, at its own end): it is not
// counted again, and directFailed reports false.
func (c *Client) directFailed(sent, now int64, err error) bool {
	for {
		at := c.directFailedAt.Load()
		if sent <= at {
			return false
		}
		if c.directFailedAt.CompareAndSwap(at, now) {
			break
		}
	}
	c.online.Store(false)
	c.detachSince.Store(0)
	b := min(max(2*c.directBackoff.Load(), int64(c.cfg.SettleInterval)), int64(c.cfg.MaxRetryWait))
	c.directBackoff.Store(b)
	c.directRetryAt.Store(now + b)
	c.direct.mu.Lock()
	queued := c.direct.pending
	c.direct.pending = nil
	c.direct.mu.Unlock()
	for _, r := range queued {
		r.sent, r.err = now, err
		close(r.done)
	}
	return true
}

// directAnswered records that a server answered a direct call.
func (c *Client) directAnswered() {
	c.detachAnswered(-1)
	c.accepted()
	c.takesOnline()
}

// detachAnswered records that a server answered a direct call (routed:
// server srv), if only to refuse it: the calls given up on before are
// judged (see takeDirect).
func (c *Client) detachAnswered(srv int) {
	if srv >= 0 {
		c.http.health[srv].detach.Store(false)
		c.http.health[srv].detachSince.Store(0)
	}
	c.detach.Store(false)
	c.detachSince.Store(0)
}

// takesOnline sends direct decisions to the servers again, at once: a
// server answered a direct take, or a lease call (proof enough that the
// servers are back after an outage; a failed lease call, though, says
// nothing of the takes, see Client.online).
func (c *Client) takesOnline() {
	c.directBackoff.Store(0)
	c.directRetryAt.Store(0)
	if !c.online.Swap(true) {
		c.cfg.Logger.Info("ratelease: lease servers answer again")
	}
}

// applyDirect turns the answer to a direct take into a decision and keeps
// what it taught about the keys: their rules, denials and demand.
func (c *Client) applyDirect(r *directReq) Decision {
	now := c.nanos()
	if re, ok := errors.AsType[*RefusedError](r.err); ok {
		return Decision{Source: SourceRefused, Err: re, RetryAfter: refusalHold}
	}
	if r.err != nil {
		// No server answered: as offline decides, a key whose spent-out
		// lease is still ours is denied until its deadline (the fallback
		// never adds to a lease's tokens), the others by the fallback.
		return c.offline(r.n, r.states, now)
	}
	res := &r.res
	if p := res.Error; p != nil {
		switch p.Code {
		case protocol.CodeForbidden, protocol.CodeNoRule:
			// Refused: deny locally for a while, then ask again (the rules
			// or permissions may change). A forbidden key is this client's
			// misconfiguration, and so is a key no rule matches under a
			// default of deny (no retry serves it until the rules change):
			// the decision says so. Without an Err, a no-rule key was a
			// rate limit to an inbound limiter (a 429) and to Wait and the
			// Transport (ErrRateLimited, retry after a second), for ever
			// (found by review).
			re := &RefusedError{Status: http.StatusForbidden, Code: p.Code, Detail: p.Detail}
			for _, ks := range r.states {
				ks.refused.Store(true)
				ks.refusal.Store(re)
				ks.extendDenial(now + int64(max(time.Second, c.cfg.Horizon)))
			}
			c.cfg.Logger.Warn("ratelease: server refused a key", "keys", keysOf(r.states), "code", p.Code, "detail", p.Detail)
			return Decision{Source: SourceDenied, Err: re}
		case protocol.CodeCostExceedsBurst:
			// No wait serves it: an error, not a rate limit (it was a
			// denial without a reason, which Wait reported as
			// ErrRateLimited with no retry time, inviting a retry forever).
			return Decision{Source: SourceDenied, Err: fmt.Errorf("%w: %s", ErrCostExceedsBurst, p.Detail)}
		case protocol.CodeStoreUnavailable:
			// The server answered, but its store failed for this take's
			// key alone (a Redis Cluster node down): decided as offline
			// decides, and so are the key's next decisions for a hold,
			// without a call (see storeDownHold). The client stays
			// online. A take of several keys holds none: the failed one
			// is not known, and the others' stores answer.
			var held []*keyState
			if len(r.states) == 1 {
				held = r.states
			}
			c.noteStoreDown(held, p, now)
			return c.offline(r.n, r.states, now)
		default:
			// The server failed on this take (internal): as when it does
			// not answer, the fallback decides; it used to be a denial
			// without a reason.
			c.cfg.Logger.Error("ratelease: direct take failed", "keys", keysOf(r.states), "code", p.Code, "detail", p.Detail)
			return c.offline(r.n, r.states, now)
		}
	}
	var keyed time.Duration // the longest local denial of a denied key
	for i, ks := range r.states {
		kr := &res.Keys[i]
		ks.lastDirect.Store(now)
		if kr.Unlimited {
			ks.setUnlimited(now + int64(c.cfg.Horizon))
			continue
		}
		ks.refused.Store(false)
		ks.unlimited.Store(false)
		ks.learn(kr.Limit, kr.PeriodMillis, kr.Burst, kr.LeaseTTLMillis)
		ks.shaped.Store(kr.Algorithm == algorithmLeaky)
		if r.foreign {
			// Another class than the key's lease and local denials serve:
			// its answer is its own.
			if v := c.limitStates(kr.Limits, r.sent); v != nil {
				ks.limits.Store(v)
			}
			continue
		}
		if !kr.Allowed && kr.RetryAfterMillis >= 0 && c.admitted(ks, r.n, now) {
			// A server's denial counts as demand too, on a bucket big
			// enough to lease (see admitted). At a saturated key the
			// holders of leases are served in turn, their deferred grants
			// ahead of the refill, and a process left on direct takes
			// finds the bucket taken at every retry: only a lease of its
			// own (its share among the holders) serves it. So with a
			// shaped key, whose next slots another process's lease holds.
			c.promote(ks)
		}
		if v := c.limitStates(kr.Limits, r.sent); v != nil {
			ks.limits.Store(v)
		}
		if !kr.Allowed && kr.RetryAfterMillis > 0 && !res.Allowed {
			// This key denied: it is denied locally until its bucket can
			// serve again (see denial), without a call. Keys that would
			// have allowed are not held back.
			w := c.denial(ks, time.Duration(kr.RetryAfterMillis)*time.Millisecond)
			keyed = max(keyed, w)
			if !ks.leasing.Load() || !beyondLeases(ks, r.n) {
				ks.extendDenial(r.sent + int64(w))
			} else {
				// A take beyond a leased key's batch (see decide) says
				// when the bucket holds that many, not when its lease can
				// be renewed: denying the key until then denied its small
				// requests, and stopped its renewals, for up to the
				// bucket's fill time (found by review). Takes of as many
				// are denied until then (see keyState.beyondUntil).
				ks.beyondCost.Store(r.n)
				ks.beyondUntil.Store(r.sent + int64(w))
			}
		}
	}
	if !res.Allowed {
		wait := time.Duration(res.RetryAfterMillis) * time.Millisecond
		if keyed > 0 {
			wait = min(wait, keyed)
		}
		d := Decision{Source: SourceDirect, RetryAfter: wait}
		for i, ks := range r.states {
			if !res.Keys[i].Allowed {
				d.Limits = ks.limitsView()
				break
			}
		}
		return d
	}
	c.directOK.Add(r.n)
	remaining := int64(-1)
	var limits []LimitState
	for i, ks := range r.states {
		if res.Keys[i].Unlimited {
			continue
		}
		if remaining < 0 || res.Keys[i].Remaining < remaining {
			remaining = res.Keys[i].Remaining
			limits = ks.limitsView()
		}
		if !r.foreign && c.admitted(ks, r.n, now) {
			c.promote(ks)
		}
	}
	return Decision{Allowed: true, Source: SourceDirect, Remaining: max(remaining, 0), Limits: limits, delay: directDelay(res)}
}

func keysOf(states []*keyState) []string {
	keys := make([]string, len(states))
	for i, ks := range states {
		keys[i] = ks.key
	}
	return keys
}

// admitted adds n tokens admitted directly, or denied (see applyDirect), to
// the key's demand estimate and reports whether the key should now be
// leased: whether this process was admitted or denied at least
// Config.LeaseMinTokens over one lease TTL, or half of them since the first
// at a pace of twice that, on a bucket of at least four times that.
//
// The estimate is an event-driven average of that rate with a time
// constant of one lease TTL: each decision decays it by e^(−Δt/TTL) and
// adds n/TTL. Denials count: at a saturated key the lease holders are
// served in turn, and a process left on direct takes would get nothing;
// its own lease is granted its share, no more (the server's fair share
// among the holders), deferred until its turn, so it holds no token the
// others need.
func (c *Client) admitted(ks *keyState, n int64, now int64) bool {
	ttl := ks.leaseTTL.Load()
	if ttl <= 0 || ks.leasing.Load() || !c.leasable(ks, now) {
		// No rule learned yet, leased already, or not to be leased now.
		return false
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	tau := float64(ttl)
	if ks.mu.rateAt != 0 {
		ks.mu.rate *= math.Exp(-float64(now-ks.mu.rateAt) / tau)
	}
	ks.mu.rate += float64(n) / tau // tokens per ns
	ks.mu.rateAt = now
	if ks.mu.admitted == 0 {
		ks.mu.since = now
	}
	ks.mu.admitted += n
	if ks.mu.rate*tau >= float64(c.cfg.LeaseMinTokens) {
		return true
	}
	// A key that just became hot: half the tokens, admitted at a pace
	// that would bring twice the threshold over a TTL, are proof enough.
	// The average over a TTL alone would decide thousands of a hot key's
	// decisions directly before it moved. The decisions waiting for this
	// answer (see decide and Client.young) count with them, as far as the
	// bucket still had room for them at this answer: they are demand
	// already here, and on a key that just became hot they promote it at
	// its first answers.
	half := (c.cfg.LeaseMinTokens + 1) / 2
	span := max(now-ks.mu.since, int64(10*time.Millisecond))
	seen := ks.mu.admitted + min(ks.waiting.Load(), ks.room())
	ks.mu.seen = max(ks.mu.seen, seen)
	return seen >= half && float64(seen)*tau/float64(span) >= 2*float64(c.cfg.LeaseMinTokens)
}

// leasable reports whether a key whose rule is learned may be leased at
// now: not if its bucket is so small that a batch (a quarter of it at most)
// could not hold Config.LeaseMinTokens (a lease would run out before it
// saved a call), nor while a server lately refused it more leases
// (directUntil).
func (c *Client) leasable(ks *keyState, now int64) bool {
	return ks.ruleBurst.Load()/4 >= c.cfg.LeaseMinTokens && now >= ks.directUntil.Load()
}

// directRate returns the key's admitted rate, tokens per second, at now: the
// larger of the average over a lease TTL and the tokens admitted over the
// time they took (at least 10 ms), the decisions that waited for its
// answers counted with them. The first follows a slow key, the second
// a key that just became hot: the average over a TTL would start a key
// asked 2,000 times a second with a batch of a few tokens.
func (ks *keyState) directRate(now int64) float64 {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	r := ks.mu.rate * float64(time.Second)
	if ks.mu.admitted > 0 {
		span := max(now-ks.mu.since, int64(10*time.Millisecond))
		r = max(r, float64(max(ks.mu.admitted, ks.mu.seen))/time.Duration(span).Seconds())
	}
	return r
}

// promote moves a key to leases: the settle loop takes it over.
func (c *Client) promote(ks *keyState) {
	if ks.leasing.Swap(true) {
		return
	}
	ks.need.Store(true)
	c.promoMu.Lock()
	c.promoted = append(c.promoted, ks)
	c.promoMu.Unlock()
	c.wake()
}

// fallbackAll decides every key by the fallback, all or nothing.
func (c *Client) fallbackAll(n int64, states []*keyState) Decision {
	// One decision, counted once: counted per key, a decision over three
	// keys counted three (found by the API review).
	c.fallbacks.Add(1)
	var buf [4]spent
	done := buf[:0]
	for _, ks := range states {
		d, sp := c.fallback(n, ks)
		if !d.Allowed {
			c.undo(n, done)
			return d
		}
		done = append(done, sp)
	}
	return Decision{Allowed: true, Source: SourceFallback}
}

// noteServerError reports a direct call that no server answered: logged,
// and passed to Config.OnServerError.
func (c *Client) noteServerError(err error) {
	c.cfg.Logger.Warn("ratelease: no lease server answered; open leases serve until their deadlines, then the fallback applies",
		"error", err, "fallback", c.cfg.Fallback.String())
	if c.cfg.OnServerError != nil {
		c.cfg.OnServerError(err)
	}
}

// noteLeaseError reports a lease call of the settle loop that no server
// answered: logged, and passed to Config.OnServerError. It sends no
// decision to the fallback (see Client.online), and does not say so.
func (c *Client) noteLeaseError(err error) {
	c.cfg.Logger.Warn("ratelease: a lease call went unanswered; open leases serve until their deadlines, and decisions go on by direct takes",
		"error", err)
	if c.cfg.OnServerError != nil {
		c.cfg.OnServerError(err)
	}
}
