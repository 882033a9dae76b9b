package client

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Key routing of the direct takes (see Config.NoKeyRouting): each take goes
// to the server of highest rendezvous weight for its first key among those
// not avoided, so that a key's direct demand, spread over many processes,
// meets at one server. Routing only concentrates demand: every server
// decides every key correctly.

// hashString is 64-bit FNV-1a: stable across processes and versions, as a
// routing hash must be (hash/maphash seeds differ per process).
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is the finalizer of MurmurHash3: a bijection of 64-bit words whose
// every output bit depends on every input bit.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// rendezvous is the weight of the server with seed for a key of hash kh.
func rendezvous(kh, seed uint64) uint64 { return mix64(kh ^ seed) }

// routeHash is the hash a take is routed by: its first key's.
func routeHash(r *directReq) uint64 { return hashString(r.states[0].key) }

// serverHealth is what the routed takes know of one server. A server that
// failed a call is avoided for a backoff (from Config.SettleInterval,
// doubling with each failure in a row, at most Config.MaxRetryWait); then
// one take probes it, while the others keep avoiding it, and an answer
// ends the backoff.
type serverHealth struct {
	until    atomic.Int64 // client clock: avoided before this; 0: healthy
	backoff  atomic.Int64 // ns: the last avoidance
	failedAt atomic.Int64 // client clock: the last failure counted
	// detach and detachSince are the server's own Client.detach and
	// Client.detachSince, for routed takes: a caller gave up on a call to
	// it since its last answer, and when the first call to it made
	// meanwhile was sent. The client-wide ones would be cleared by the
	// answers of another server, and a server that hangs, seen by callers
	// who give up first, would never be avoided.
	detach      atomic.Bool
	detachSince atomic.Int64
}

// admit reports whether a take may go to the server at now: it is healthy,
// or its backoff has ended and this take is the one that probes it (the
// others avoid it for another backoff, or until the probe answers).
func (s *serverHealth) admit(now, minAvoid int64) bool {
	until := s.until.Load()
	if until == 0 {
		return true
	}
	return now >= until && s.until.CompareAndSwap(until, now+max(s.backoff.Load(), minAvoid))
}

// failed records that a call sent at sent failed at now: the server is
// avoided for the next backoff. A call sent before the last failure was
// counted fails of the same outage and does not lengthen it.
func (s *serverHealth) failed(sent, now, minAvoid, maxAvoid int64) {
	if sent <= s.failedAt.Load() {
		s.until.Store(max(s.until.Load(), now+max(s.backoff.Load(), minAvoid)))
		return
	}
	b := min(max(2*s.backoff.Load(), minAvoid), maxAvoid)
	s.backoff.Store(b)
	s.failedAt.Store(now)
	s.until.Store(now + b)
	s.detachSince.Store(0)
}

// answered records that a call sent at sent was answered: the server is
// healthy again, unless it failed since the call was sent.
func (s *serverHealth) answered(sent int64) {
	s.detach.Store(false)
	s.detachSince.Store(0)
	if s.until.Load() == 0 || s.failedAt.Load() > sent {
		return
	}
	s.backoff.Store(0)
	s.until.Store(0)
}

// pick returns the server for a take whose first key hashes to kh, among
// those not in tried: the first in the key's rendezvous order (weights
// descending) that is not avoided, else, when every one is, the first.
func (h *caller) pick(kh uint64, tried []int, now int64) int {
	minAvoid := int64(h.cfg.SettleInterval)
	for {
		top, best := h.rank(kh, tried, now)
		if best < 0 {
			return top
		}
		if h.health[best].admit(now, minAvoid) {
			return best
		}
		// Another take took the probe meanwhile: best is avoided now.
	}
}

// route returns, for a take whose first key hashes to kh, the server it
// prefers (the first of its rendezvous order, avoided or not) and the one
// it goes to at now: the first not avoided, else the preferred one. Unlike
// pick, it claims no probe.
func (h *caller) route(kh uint64, now int64) (top, to int) {
	top, to = h.rank(kh, nil, now)
	if to < 0 {
		to = top
	}
	return top, to
}

// rank returns, among the servers not in skip, the first of kh's
// rendezvous order (weights descending) and the first that is not avoided
// at now (-1 when every one is).
func (h *caller) rank(kh uint64, skip []int, now int64) (top, best int) {
	top, best = -1, -1
	var topW, bestW uint64
	for i, seed := range h.seeds {
		if slices.Contains(skip, i) {
			continue
		}
		w := rendezvous(kh, seed)
		if top < 0 || w > topW {
			top, topW = i, w
		}
		if now >= h.health[i].until.Load() && (best < 0 || w > bestW) {
			best, bestW = i, w
		}
	}
	return top, best
}

// routing reports whether direct takes are routed by key.
func (c *Client) routing() bool { return !c.cfg.NoKeyRouting && len(c.http.urls) > 1 }

// callRouted sends the takes of batch routed by key: grouped by server, one
// call per server, concurrently; it returns once every take is complete.
func (c *Client) callRouted(ctx context.Context, batch []*directReq) {
	for _, r := range batch {
		r.hash = routeHash(r)
	}
	var wg sync.WaitGroup
	c.dispatch(ctx, &wg, batch, nil, 0)
	wg.Wait()
}

// dispatch groups reqs by the server each take goes to next (see pick),
// after the servers in tried failed them in this round, and sends each
// group: the last one in this goroutine, the others each in its own, added
// to wg.
func (c *Client) dispatch(ctx context.Context, wg *sync.WaitGroup, reqs []*directReq, tried []int, round int) {
	now := c.nanos()
	groups := make([][]*directReq, len(c.http.urls))
	last := -1
	for _, r := range reqs {
		s := c.http.pick(r.hash, tried, now)
		groups[s] = append(groups[s], r)
		last = max(last, s)
	}
	for s, g := range groups {
		switch {
		case len(g) == 0:
		case s == last:
			c.sendTakes(ctx, wg, s, g, tried, round)
		default:
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.sendTakes(ctx, wg, s, g, tried, round)
			}()
		}
	}
}

// failover moves reqs, whose call failed at server srv, on to the next
// server of each take's key: at once while a server of the round is left,
// else, in the first round, after the wait of a round of retries (see
// caller.lease). It reports false, having sent nothing, when the second
// round is over too (or ctx ended): every server failed.
func (c *Client) failover(ctx context.Context, wg *sync.WaitGroup, srv int, reqs []*directReq, tried []int, round int) bool {
	tried = append(slices.Clip(tried), srv)
	if len(tried) == len(c.http.urls) {
		if round > 0 || !c.sleepCtx(ctx, c.http.roundWait()) {
			return false
		}
		tried, round = nil, round+1
	}
	c.dispatch(ctx, wg, reqs, tried, round)
	return true
}

// sleepCtx waits d, or until ctx ends; it reports whether d passed.
func (c *Client) sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
