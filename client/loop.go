package client

import (
	"cmp"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// pending is one entry of a call to the lease servers.
type pending struct {
	ks       *keyState
	slot     int
	want     int64
	settling *lease // the lease this entry settles, if any
	used     int64
	// deferrable accepts a deferred grant (see maxLeaseDelay): set when the
	// key has no token left to spend meanwhile.
	deferrable bool
}

// maxLeaseDelay is the longest wait a lease request accepts for a deferred
// grant (protocol.LeaseEntry.MaxDelayMillis); the server also caps it at
// half the lease TTL. A key whose bucket, or whose fair share, cannot serve
// its batch now is then granted the batch with the wait before it may be
// spent, rather than refused with a retry_after: it is denied locally until
// then, as after a refusal, but it needs no second call, and the holders
// waiting for a saturated key are served in turn instead of all asking
// again at the same moment.
const maxLeaseDelay = time.Second

// maxCalls is the most calls to the lease servers in flight at once: a
// slow call does not hold up a key's first lease. A key is in at most one
// call at a time.
const maxCalls = 2

type callResult struct {
	sent  int64
	items []pending
	res   []protocol.LeaseResult
	err   error
}

// safeRateRise is the fraction of a higher safe rate taken per answer.
const safeRateRise = 0.05

// The time constants of the demand average: it follows a rise of demand
// within about ewmaTauUp and a fall within about ewmaTau.
const (
	ewmaTau   = time.Second
	ewmaTauUp = 100 * time.Millisecond
)

// loopState is owned by the settle loop goroutine.
type loopState struct {
	// leased are the keys the loop keeps leases for: promoted by the direct
	// path, dropped once demoted or forgotten with no lease left. The loop
	// scans only these at each tick.
	leased map[*keyState]struct{}
	// lastSweep is when the direct keys were last swept for idleness.
	lastSweep int64
}

// loop is the settle loop: it keeps time for the leases (deadlines), sizes
// and sends renewals, returns idle keys' tokens and applies the answers. It
// is the only goroutine that writes a key's loop-owned fields.
func (c *Client) loop() {
	defer close(c.stopped)
	tick, stopTick := c.ticker(c.cfg.SettleInterval)
	defer stopTick()
	results := make(chan callResult, maxCalls)
	inflight := 0
	var retryAt, backoff int64
	last := c.nanos()
	c.run.leased = make(map[*keyState]struct{})
	for {
		select {
		case <-c.stop:
			for ; inflight > 0; inflight-- {
				c.apply(<-results, &retryAt, &backoff)
			}
			c.shutdown()
			return
		case <-tick:
		case <-c.kick:
		case r := <-results:
			inflight--
			c.apply(r, &retryAt, &backoff)
		}
		now := c.nanos()
		dt := now - last
		last = now
		c.takePromoted()
		if now-c.run.lastSweep >= int64(time.Second) {
			c.run.lastSweep = now
			c.sweepDirect(now)
		}
		items := c.scan(now, dt, inflight < maxCalls && now >= retryAt)
		if len(items) > 0 {
			inflight++
			go func() { results <- c.send(context.Background(), items) }()
		} else if inflight == 0 && len(c.run.leased) == 0 && backoff != 0 {
			// Lease calls failed, and the loop has dropped every key it
			// kept leases for: no call is waiting to be made again, and a
			// failure of calls nobody makes any longer says nothing of
			// the servers. Left as it was, Stats.Online stayed false until
			// a key was leased again, however long the servers answered
			// every direct take (TestOnlineAfterLeaseCallsStop); the next
			// promoted key starts as the first one did: it waits for its
			// first lease, and the loop asks at once.
			backoff, retryAt = 0, 0
			c.leasesOnline.Store(true)
		}
	}
}

// send makes the calls for items, at most protocol.MaxEntries per call.
func (c *Client) send(ctx context.Context, items []pending) callResult {
	r := callResult{sent: c.nanos(), items: items}
	// Bound the whole exchange: retries included, it must not outlive the
	// shortest lease it could renew.
	ctx, cancel := context.WithTimeout(ctx, 2*c.cfg.RequestTimeout+2*c.cfg.MaxRetryWait)
	defer cancel()
	for start := 0; start < len(items); start += protocol.MaxEntries {
		chunk := items[start:min(len(items), start+protocol.MaxEntries)]
		req := &protocol.LeaseRequest{ClientID: c.cfg.ClientID, Leases: make([]protocol.LeaseEntry, len(chunk))}
		for i, p := range chunk {
			e := protocol.LeaseEntry{Key: p.ks.key, Want: p.want, Slot: p.slot, Priority: c.wirePriority()}
			if p.settling != nil {
				e.LeaseID, e.Used = p.settling.id, p.used
			}
			if p.deferrable && p.want > 0 {
				e.MaxDelayMillis = maxLeaseDelay.Milliseconds()
			}
			req.Leases[i] = e
		}
		res, err := c.http.lease(ctx, req)
		if err != nil {
			r.err = err // the chunks before this one were answered
			return r
		}
		r.res = append(r.res, res.Leases...)
	}
	return r
}

// takePromoted moves the keys the direct path promoted into the loop's
// set.
func (c *Client) takePromoted() {
	c.promoMu.Lock()
	keys := c.promoted
	c.promoted = nil
	c.promoMu.Unlock()
	for _, ks := range keys {
		if !ks.dead.Load() {
			c.run.leased[ks] = struct{}{}
			if ks.run.ewma <= 0 {
				// Start the demand average where the direct path left it,
				// but at InitialBatch over the horizon at least: the
				// direct estimate averages over a whole lease TTL and
				// lags a demand that just rose.
				ks.run.ewma = max(ks.directRate(c.nanos()), float64(c.cfg.InitialBatch)/c.cfg.Horizon.Seconds())
			}
			ks.run.starved = ks.denyUntil.Load() > c.nanos()
		}
	}
}

// sweepDirect forgets the keys decided directly that saw no decision for
// Config.IdleTimeout, and drops the DenyFor ends that have passed.
func (c *Client) sweepDirect(now int64) {
	c.keys.Range(func(_, v any) bool {
		ks := v.(*keyState)
		if _, leased := c.run.leased[ks]; !leased && !ks.leasing.Load() && now-ks.lastDirect.Load() >= int64(c.cfg.IdleTimeout) {
			c.forgetKey(ks)
		}
		return true
	})
	c.denyFor.Range(func(k, v any) bool {
		if v.(int64) <= now {
			c.denyFor.CompareAndDelete(k, v) // ended
		}
		return true
	})
}

// want sizes the next batch of a key: its demand over the horizon, at most
// half a lease TTL's worth and the bucket size.
func (c *Client) want(ks *keyState) int64 {
	burst, ttl := ks.ruleBurst.Load(), ks.leaseTTL.Load()
	if ks.run.ewma <= 0 {
		return min(c.cfg.InitialBatch, max(1, burst/4))
	}
	h := c.cfg.Horizon
	if ttl > 0 && time.Duration(ttl/2) < h {
		h = time.Duration(ttl / 2)
	}
	return c.batchOf(ks, ks.run.ewma, h)
}

// roomyWant sizes the renewal of l, the active lease of a roomy key (see
// keyState.run.roomy): the rate l was spent at since it was asked for
// (the demand average when it is younger than ten ticks), over the time
// from asking to the next lease's late renewal point (lateOffset), so that
// the next lease lasts until that point and is nearly spent by then.
// Measured on the lease, not by the demand average: that average rises
// fast and falls slowly, so it runs a little above a steady demand, and a
// batch sized on it would be frozen with a tenth or more of it left.
func (c *Client) roomyWant(ks *keyState, l *lease, now int64) int64 {
	rate := ks.run.ewma
	if elapsed := now - l.sent(); elapsed >= 10*int64(c.cfg.SettleInterval) {
		rate = float64(l.granted-l.left()) / time.Duration(elapsed).Seconds()
	}
	ttl := ks.leaseTTL.Load()
	if rate <= 0 || ttl <= 0 {
		return c.want(ks)
	}
	return c.batchOf(ks, rate, time.Duration(c.lateOffset(ttl)))
}

// batchOf sizes a batch of a key at rate tokens per second over h: at most
// a quarter of the time its bucket takes to fill, Config.MaxBatch, and a
// quarter of the bucket.
func (c *Client) batchOf(ks *keyState, rate float64, h time.Duration) int64 {
	burst, fill := ks.ruleBurst.Load(), ks.ruleFill.Load()
	// Tokens held in a lease count as taken from the bucket until they are
	// spent, so on a shared key a batch must be small beside the bucket: at
	// most a quarter of the time the bucket takes to fill.
	if fill > 0 && time.Duration(fill/4) < h {
		h = time.Duration(fill / 4)
	}
	w := int64(math.Ceil(rate * h.Seconds()))
	w = max(1, min(w, c.cfg.MaxBatch))
	if burst > 0 {
		// Never a whole bucket for one process: a quarter at most.
		w = min(w, max(1, burst/4))
	}
	return w
}

// clearActive makes l no longer the key's active lease, if it still is.
func (c *Client) clearActive(ks *keyState, l *lease) bool {
	if !ks.active.CompareAndSwap(l, nil) {
		return false
	}
	c.activeKeys.Add(-1)
	return true
}

// setActive makes l the key's active lease and returns the one it replaced.
func (c *Client) setActive(ks *keyState, l *lease) *lease {
	old := ks.active.Swap(l)
	switch {
	case old == nil && l != nil:
		// Only the settle loop installs leases, so this max needs no CAS.
		if n := c.activeKeys.Add(1); n > c.maxActive.Load() {
			c.maxActive.Store(n)
		}
	case old != nil && l == nil:
		c.activeKeys.Add(-1)
	}
	return old
}

// closeLease freezes l and records what it used. It returns the used count.
func (ks *keyState) closeLease(l *lease) int64 {
	used := l.granted - l.freeze()
	ks.closedUsed.Add(used)
	return used
}

// scan does the loop's timekeeping for every key and, when collect is set,
// returns the entries of the next call.
func (c *Client) scan(now, dt int64, collect bool) []pending {
	var items []pending
	alpha := 1 - math.Exp(-float64(dt)/float64(ewmaTau))
	alphaUp := 1 - math.Exp(-float64(dt)/float64(ewmaTauUp))
	for ks := range c.run.leased {
		// Deadlines: a lease past its deadline is dead; past its late
		// renewal point (see lateAt) every spend reads the clock.
		if l := ks.active.Load(); l != nil {
			if now >= l.deadline || (l.shape != nil && l.shape.exhausted(now)) {
				if c.clearActive(ks, l) {
					ks.closeLease(l)
					ks.notify()
				}
				ks.run.slots[l.slot] = nil
			} else if now >= c.lateAt(l) {
				l.strict.Store(true)
			} else if l.strict.Load() && l.pausedUntil.Load() <= now && l.shape == nil {
				l.strict.Store(false) // a DenyFor ran out: back to the fast path
				if l.pausedUntil.Load() > now {
					// A DenyFor called since the load above (it sets
					// pausedUntil, then strict): strict again, or its
					// pause would be ignored by the fast path.
					l.strict.Store(true)
				}
			}
		}
		active := ks.active.Load()
		for s, l := range ks.run.slots {
			if l != nil && l != active && now >= l.deadline {
				ks.run.slots[s] = nil // the server expired it: nothing to return
			}
		}
		// Demand: tokens used from leases plus tokens asked for in vain.
		total := ks.usedTotal() + ks.unserved.Load()
		delta := total - ks.run.lastUsed
		ks.run.lastUsed = total
		if dt > 0 {
			// Rise fast, fall slowly: a batch must cover a burst of
			// demand, and a lull should not shrink it at once.
			sample := float64(delta) / (float64(dt) / float64(time.Second))
			a := alpha
			if sample > ks.run.ewma {
				a = alphaUp
			}
			ks.run.ewma += a * (sample - ks.run.ewma)
		}
		if delta > 0 || ks.need.Load() || ks.run.lastActive == 0 {
			ks.run.lastActive = now
		}
		if !collect || ks.run.inflight {
			continue
		}
		if storeDown(ks, now) && !c.closing.Load() {
			// Its store failed for it alone: asked again after the hold.
			continue
		}
		if ks.run.lastAsk != 0 && now-ks.run.lastAsk < int64(c.cfg.SettleInterval) && !ks.run.forget {
			// At most one call per key per tick: a key that keeps running
			// out asks for more once a tick, not once a request.
			continue
		}
		if p, ok := c.plan(ks, now, active); ok {
			ks.run.inflight = true
			ks.run.lastAsk = now
			items = append(items, p...)
		}
	}
	return items
}

// plan returns the entries one key needs now, if any.
func (c *Client) plan(ks *keyState, now int64, active *lease) ([]pending, bool) {
	idle := now-ks.run.lastActive >= int64(c.cfg.IdleTimeout)
	if !ks.run.demote && !ks.run.forget && active != nil && c.shouldDemote(ks, active, now) {
		ks.leave(false)
	}
	if ks.run.demote && !ks.run.forget && !c.closing.Load() {
		// Back to direct decisions: return every lease, keep the key.
		if out := c.returnAll(ks, active); len(out) > 0 {
			return out, true
		}
		c.demoted(ks)
		return nil, false
	}
	if idle || ks.run.forget || c.closing.Load() {
		// Return everything and forget the key.
		ks.leave(true)
		if out := c.returnAll(ks, active); len(out) > 0 {
			return out, true
		}
		c.forgetKey(ks)
		return nil, false
	}
	entry := func(slot int, want int64) pending {
		p := pending{ks: ks, slot: slot, want: want}
		if l := ks.run.slots[slot]; l != nil && l != active {
			p.settling, p.used = l, ks.run.returnUsed[slot]
		}
		return p
	}
	denied := ks.denyUntil.Load() > now
	switch {
	case active != nil && ks.denyForUntil.Load() >= active.deadline-c.frozenMargin():
		// DenyFor outlasts the lease: nothing spends from it again before
		// it would be returned on its own (frozenMargin), so it is
		// returned now with what was spent, and no lease is asked for
		// while the key is denied. Left open, it expired at the server,
		// its remainder counted as spent: lost to every process for a
		// lease TTL (DenyFor keeps a lease's tokens, and they go back).
		out := c.returnAll(ks, active)
		ks.notify()
		return out, len(out) > 0
	case active != nil:
		left := active.left()
		// A bound key's lease is not renewed early (see keyState.run.bound):
		// near its deadline it is settled and the next asked for in one
		// entry that accepts a deferral, as when spent out, so that its
		// remainder goes back. Renewed at half its TTL by a request that
		// accepted no deferral, it was refused at a saturated bucket, the
		// key denied for the retry_after, and the spent-out batch's next
		// turn asked for that much later, each batch (found by review).
		// Not before it has been spendable for two ticks: at a short TTL
		// a deferred batch's last ticks come soon after its deferral
		// ends, and it was settled, unspent, and asked for again, deferred
		// again, the key never served (found by review: a TTL of 70 ms,
		// deferrals of 30 ms).
		nearEnd := ks.run.bound && active.shape == nil && left > 0 && now >= c.nearEndAt(active)
		if left == 0 || nearEnd {
			// Spent out: nothing is lost by closing it now, so settle it
			// and take the next lease in one step, in its own slot. While
			// the key is denied (a share-bound key waiting for its share),
			// it is settled alone, unless holding it is cheap (see
			// cheapToHold) and the denial ends before it does: then it
			// goes with the next lease request.
			if denied && ks.denyUntil.Load() < active.deadline-c.frozenMargin() && c.cheapToHold(ks, active) {
				return nil, false
			}
			if c.clearActive(ks, active) {
				used := ks.closeLease(active)
				ks.run.returnUsed[active.slot] = used
				want := c.want(ks)
				if denied {
					want = 0
				}
				return []pending{{ks: ks, slot: active.slot, want: want, settling: active, used: used, deferrable: true}}, true
			}
			return nil, false
		}
		// Renew with about a quarter left, or with less left than two
		// ticks of demand, or at half the TTL; a bound key (see
		// keyState.run.bound) not early: once spent out, or near its
		// deadline (above), it settles and asks in one entry that
		// accepts a deferral, and an unspent one is returned as idle
		// (shouldDemote); a roomy
		// key with its cushion left (or two ticks of demand), or at its
		// late renewal point (see lateOffset), or soon after (below).
		ticks := int64(math.Ceil(ks.run.ewma * 2 * c.cfg.SettleInterval.Seconds()))
		renew := (left <= max(active.granted/4, ticks) || now >= active.halfway) && !ks.run.bound
		want := c.want(ks)
		if ks.run.roomy && !ks.run.bound {
			// Past its late renewal point it waits for its cushion when
			// its pace brings it there soon (cushionSoon), but not when two
			// ticks of demand are more than its cushion: renewed there, it
			// would be frozen with more than its cushion all the same.
			renew = left <= max(cushion(active), ticks) ||
				(now >= c.lateAt(active) && (ticks > cushion(active) || !c.cushionSoon(active, now)))
			want = c.roomyWant(ks, active, now)
		}
		if active.shape != nil {
			// A schedule of slots is renewed when it is about to end, so
			// that the next slice (which the server starts where this one
			// ends, unless another holder's came between) arrives in
			// time; renewing earlier would cut this one short, as the new
			// lease replaces it.
			renew = active.shape.end-now <= 2*int64(c.cfg.SettleInterval)
		}
		if !denied && renew {
			// Renew into the other slot; the current lease keeps serving
			// until the new one is in, and is settled after.
			return []pending{entry(1-active.slot, want)}, true
		}
	case ks.need.Load() && !denied:
		slot := 0
		if ks.run.slots[0] == nil && ks.run.slots[1] != nil {
			slot = 1
		}
		want := c.want(ks)
		if ks.run.starved {
			// Promoted while denied: the bucket is taken, and a deferred
			// grant waits for its whole batch's refill. Two ticks of
			// refill until a first lease is granted; the next one is
			// sized to the demand.
			if burst, fill := ks.ruleBurst.Load(), ks.ruleFill.Load(); burst > 0 && fill > 0 {
				want = min(want, max(1, int64(math.Ceil(float64(burst)*float64(2*c.cfg.SettleInterval)/float64(fill)))))
			}
		}
		p := entry(slot, want)
		p.deferrable = true // nothing to spend meanwhile
		return []pending{p}, true
	}
	// Return frozen leases that no renewal carried. On a roomy key (see
	// keyState.run.roomy) a frozen lease waits for the key's next renewal,
	// which goes into its slot and returns it in the same entry: a hot key
	// then costs one call per batch, not two. It is returned on its own
	// once the key is no longer roomy, is denied, or the lease comes
	// within frozenMargin of its deadline; if even that call is late the
	// lease expires at the server, its remainder counted as spent, which
	// errs toward the limit. A roomy key's frozen lease left with no more
	// than its cushion, and cheap to hold open (see cheapToHold), is not
	// returned on its own at all (see lateOffset): it expires at the
	// server the same way.
	var out []pending
	for s, l := range ks.run.slots {
		if l == nil || l == active {
			continue
		}
		if ks.run.roomy && active != nil && !denied &&
			(l.deadline-now > c.frozenMargin() || (l.granted-ks.run.returnUsed[s] <= cushion(l) && c.cheapToHold(ks, l))) {
			continue
		}
		out = append(out, entry(s, 0))
	}
	return out, len(out) > 0
}

// lateOffset is when, after asking for it, a roomy key's lease of TTL ttl
// (ns) is due for renewal: at three quarters of its TTL, but at least
// eight ticks before its deadline, and never before half its TTL, where
// other keys renew. Its batch is sized to last until then (see
// roomyWant), and it is renewed earlier once no more than its cushion
// (see cushion) is left, or later, up to an eighth of its TTL before its
// deadline (lastRenewAt), when the pace it is spent at brings it down to its
// cushion by then (see cushionSoon); should it run out all the same
// before the renewal is in (the loop was late), its decisions wait for
// the renewal rather than be denied (see Client.decide).
//
// Why later: a hot key renewed at half its TTL, or with a quarter left,
// costs the store a renewal every three eighths of a TTL or so, each a
// Lua script of six to ten commands; at the benchmark's hot key that was
// about half the Redis work of the whole run. Renewing at three quarters
// costs one every three quarters. The price: the lease it replaces is
// frozen with at most its cushion left, up to a quarter of a TTL before
// its deadline, and the next renewal comes after that deadline, so it cannot
// return it in the same entry; returning it alone would cost as much as
// the renewal saved. So a roomy key's frozen lease left with no more than
// its cushion, a sixteenth of its batch, is not returned: it expires at
// the server, its remainder counted as spent (toward the limit, never
// past it). The key is roomy only while the bucket holds at least twice
// its grant, so that remainder is not what another holder waits for, and
// the lease is left open only when the holders' leases of its size stay
// within a quarter of the bucket (cheapToHold), so that its tokens,
// outstanding until it expires, do not cap the bucket's refill; a key
// that stops being roomy, a lease frozen with more left (the demand fell),
// or one too big beside the bucket is returned as before. Its deadline
// is unchanged, and every spend reads the clock from the late renewal
// point on (see lateAt), however much later the renewal comes.
func (c *Client) lateOffset(ttl int64) int64 {
	return max(ttl/2, ttl-max(ttl/4, 8*int64(c.cfg.SettleInterval)))
}

// lateAt is l's late renewal point (lateOffset after it was asked for):
// three quarters of its TTL, or eight ticks before its deadline, never
// before half of it. A roomy key renews its lease there, and from there on
// every spend of l reads the clock (strict, see lease.spend); before it,
// one spend in eight does. Where the sampled checks end changes no bound:
// a process paused across the deadline from anywhere in the sampled part
// spends at most seven tokens of the lease after it, and one that is not
// paused has at least eight of the loop's ticks to mark the lease strict
// before the deadline (and a starved loop leaves the sampled check, the
// same seven tokens at most). So a roomy key's leases are spent without a
// clock read per spend until they are replaced; were they strict from half
// their TTL, a third of their life would read the clock on every spend,
// about twice the cost of the spend itself.
func (c *Client) lateAt(l *lease) int64 { return l.sent() + c.lateOffset(l.ttl()) }

// lastRenewAt is the latest a roomy key's lease l is renewed: an eighth
// of its TTL, and at least eight ticks, before its deadline (250 ms at a
// TTL of 2 s: room for a slow or failed call to be made again), never
// before its late renewal point (lateAt).
func (c *Client) lastRenewAt(l *lease) int64 {
	return max(c.lateAt(l), l.deadline-max(l.ttl()/8, 8*int64(c.cfg.SettleInterval)))
}

// cushionSoon reports whether l, the active lease of a roomy key past its
// late renewal point with more than its cushion left, comes down to its
// cushion by lastRenewAt(l) if it is spent on at the pace it was spent at
// since it was asked for: its renewal then waits for the cushion rather
// than freeze it with more left. A lease frozen with more than its cushion
// is returned by a call of its own near its deadline, as the next renewal
// comes after that (see lateOffset); the sizing of a batch (roomyWant) is
// an estimate, and a lease that was sized a few percent above its demand
// (the growth lease after a key's small first one, a demand that dipped)
// would cost that call. Renewed at its cushion, it is left to expire. A
// lease whose demand fell further is renewed at its late renewal point,
// as before, and returned (see plan).
func (c *Client) cushionSoon(l *lease, now int64) bool {
	elapsed, spent := now-l.sent(), l.granted-l.left()
	over, rest := l.left()-cushion(l), c.lastRenewAt(l)-now
	if elapsed <= 0 || spent <= 0 || rest <= 0 {
		return false
	}
	// over/(spent/elapsed) <= rest, without the division.
	return float64(over)*float64(elapsed) <= float64(spent)*float64(rest)
}

// cushion is how much of a roomy key's lease l may be left when it is
// renewed: a sixteenth of its batch (about 90 ms of demand at a TTL of
// 2 s). A lease frozen with no more than that is left to expire.
func cushion(l *lease) int64 { return l.granted / 16 }

// cheapToHold reports whether a spent-out lease l may stay open until the
// key's next lease request rather than be settled by a call of its own.
// An open lease's tokens, spent or not, count as outstanding, and the
// bucket's level is capped at its burst less what is outstanding (the
// bound needs it: every outstanding token may still be spent). It is
// cheap when the holders' leases of that size together stay within a
// quarter of the bucket (the holders are the rule's rate over the last
// safe rate): at a saturated key with a small bucket, leases held open
// while their owners wait for their shares would cap its refill, and the
// tokens refilled above the cap would be lost to everyone.
func (c *Client) cheapToHold(ks *keyState, l *lease) bool {
	burst, fill, sr := ks.ruleBurst.Load(), ks.ruleFill.Load(), ks.getSafeRate()
	if burst <= 0 || fill <= 0 || sr <= 0 {
		return false
	}
	rate := float64(burst) / time.Duration(fill).Seconds() // tokens per second
	holders := max(1, math.Round(rate/sr))
	return float64(l.granted)*holders <= float64(burst)/4
}

// nearEndAt is when the lease l is near its end: frozenMargin before its
// deadline, but not before it has been spendable for two ticks (nor later
// than a tick before its deadline). A bound key's lease is settled there
// (see plan), and an unspent one judged idle there at the latest (see
// shouldDemote).
func (c *Client) nearEndAt(l *lease) int64 {
	tick := int64(c.cfg.SettleInterval)
	return max(l.deadline-c.frozenMargin(), min(l.pausedUntil.Load()+2*tick, l.deadline-tick))
}

// frozenMargin is how long before its deadline a frozen lease waiting for
// its key's next renewal is returned by a call of its own: four ticks of
// the settle loop.
func (c *Client) frozenMargin() int64 { return 4 * int64(c.cfg.SettleInterval) }

// returnAll stops the key's active lease and returns the entries that
// return every lease it holds (none when it holds none).
func (c *Client) returnAll(ks *keyState, active *lease) []pending {
	if active != nil && c.clearActive(ks, active) {
		ks.run.returnUsed[active.slot] = ks.closeLease(active)
	}
	var out []pending
	for s, l := range ks.run.slots {
		if l != nil {
			out = append(out, pending{ks: ks, slot: s, settling: l, used: ks.run.returnUsed[s]})
		}
	}
	return out
}

// shouldDemote reports whether a leased key should return to direct
// decisions: its lease was not spent from by half its TTL (from when it
// could be spent from), the renewal point of a key that is not roomy
// (idle costs nothing: the lease is returned, not renewed; a roomy key's
// idle lease too, before its later renewal point), or its demand over a
// lease TTL fell below half of Config.LeaseMinTokens.
func (c *Client) shouldDemote(ks *keyState, active *lease, now int64) bool {
	// Half its TTL from when it could first be spent from: a deferred
	// batch (or one paused by DenyFor) is not idle for the time it could
	// not serve. Counted from its sending, a batch deferred 990 ms was
	// returned as idle 10 ms after it became spendable, the key demoted,
	// and its turn at a saturated bucket given up (found by review). But
	// before its deadline (frozenMargin), so that an unspent one is
	// returned: a bound key's unspent lease is not renewed (see plan),
	// and a key whose batches were all deferred, its demand gone, asked
	// for a batch a second until IdleTimeout (found by review). Not by
	// its late renewal point: a batch deferred by half its TTL was then
	// judged idle half a second after it became spendable, and at a TTL
	// of 16 ticks or less at the first tick it could be spent from
	// (found by review). Nor before it has been spendable for two ticks
	// (nearEndAt): at a TTL of 60 ms a batch deferred by 28 ms became
	// spendable two milliseconds before its halfway point, was judged
	// idle there, and a saturated key was allowed nothing.
	if now < max(active.halfway, min(active.pausedUntil.Load()+active.ttl()/2, c.nearEndAt(active))) {
		return false
	}
	if active.left() == active.granted && ks.denyUntil.Load() <= now {
		return true
	}
	ttl := ks.leaseTTL.Load()
	return ttl > 0 && ks.run.ewma*time.Duration(ttl).Seconds() < float64(c.cfg.LeaseMinTokens)/2
}

// demoted finishes a key's return to direct decisions once it holds no
// lease.
func (c *Client) demoted(ks *keyState) {
	ks.run.demote = false
	ks.need.Store(false)
	ks.deadline.Store(0) // promoted again, it waits for no lease: direct
	ks.run.ewma = 0
	ks.mu.Lock()
	ks.mu.rate, ks.mu.rateAt, ks.mu.admitted, ks.mu.seen, ks.mu.since = 0, 0, 0, 0, 0
	ks.mu.Unlock()
	ks.lastDirect.Store(c.nanos())
	delete(c.run.leased, ks)
	ks.leasing.Store(false)
	ks.leaving.Store(false)
	ks.notify()
}

// leave starts a key's return to direct decisions (demote) or its
// forgetting: the loop returns its leases at its next plan, then demotes
// or forgets it (plan). Meanwhile its decisions are taken directly
// (keyState.leaving): taken for a key whose lease ran out, they were
// denied, on a bucket that was full, until the return was answered, and
// a roomy key's decision waited for that answer to be denied (found by
// review).
func (ks *keyState) leave(forget bool) {
	if forget {
		ks.run.forget = true
	} else {
		ks.run.demote = true
	}
	if !ks.leaving.Swap(true) {
		ks.notify() // a decision waiting for a lease decides again
	}
}

// forgetKey drops a key that holds no lease.
func (c *Client) forgetKey(ks *keyState) {
	if ks.dead.Swap(true) {
		return
	}
	delete(c.run.leased, ks)
	c.keys.CompareAndDelete(ks.key, ks)
	c.forgottenUse.Add(ks.usedTotal() + ks.unlimitedOK.Load() + ks.fallbackOK.Load())
	ks.notify()
}

// apply installs the answers of a call. When a call of several chunks
// failed part way, the chunks that were answered are applied and only the
// rest count as failed.
func (c *Client) apply(r callResult, retryAt, backoff *int64) {
	now := c.nanos()
	for _, p := range r.items {
		p.ks.run.inflight = false
	}
	done, failed := r.items[:len(r.res)], r.items[len(r.res):]
	if len(done) > 0 {
		c.accepted()
		c.leasesOnline.Store(true)
		c.takesOnline()
		c.makeRoom(done, r.res)
		for i, p := range done {
			c.applyOne(p, &r.res[i], r.sent, now)
		}
	}
	if r.err == nil {
		*backoff, *retryAt = 0, 0
		return
	}
	// Back off: a tick, doubling up to MaxRetryWait.
	*backoff = min(max(2**backoff, int64(c.cfg.SettleInterval)), int64(c.cfg.MaxRetryWait))
	*retryAt = now + *backoff
	if errors.Is(r.err, ErrServerRefused) {
		// A server answered, refusing the call: a misconfiguration, not an
		// outage. The keys that wanted tokens are denied while the refusal
		// stands (refusalHold), and no longer: denied beyond it (for the
		// Horizon, once), their decisions said SourceRetryAfter without
		// an Err, a misconfiguration reported as a rate limit. The client
		// stays online, so the fallback does not decide: a refusal is an
		// answer, and ends an outage as one does.
		c.noteRefused(r.err, now)
		c.leasesOnline.Store(true)
		c.takesOnline()
		re, _ := errors.AsType[*RefusedError](r.err)
		for _, p := range failed {
			if p.want > 0 {
				// Refused with the call's refusal, so that the key's
				// denial says why (decide), whatever ends the
				// client-wide one.
				p.ks.refused.Store(true)
				p.ks.refusal.Store(re)
				p.ks.extendDenial(now + int64(refusalHold))
				p.ks.answered()
			}
		}
		return
	}
	// Decisions no longer wait for leases; they go on by direct takes,
	// which judge the servers by their own calls (see Client.online).
	c.leasesOnline.Store(false)
	c.noteLeaseError(r.err)
	for _, p := range failed {
		if p.want > 0 {
			p.ks.answered() // waiters decide without the lease now
		}
	}
}

// makeRoom keeps the keys holding a lease within MaxKeys: before the new
// leases of a call are installed, it returns the least recently used keys.
func (c *Client) makeRoom(items []pending, res []protocol.LeaseResult) {
	newActive := 0
	batch := make(map[*keyState]bool, len(items))
	for i, p := range items {
		batch[p.ks] = true
		if r := &res[i]; r.Error == nil && !r.Unlimited && r.Granted > 0 && p.want > 0 && !p.ks.run.forget && p.ks.active.Load() == nil {
			newActive++
		}
	}
	if over := int(c.activeKeys.Load()) + newActive - c.cfg.MaxKeys; over > 0 {
		c.evict(over, batch)
	}
}

// evict returns the leases of the n least recently used keys that hold one
// (keys in skip excepted) and forgets those keys.
func (c *Client) evict(n int, skip map[*keyState]bool) {
	var held []*keyState
	for ks := range c.run.leased {
		if !skip[ks] && ks.active.Load() != nil {
			held = append(held, ks)
		}
	}
	slices.SortFunc(held, func(a, b *keyState) int { return cmp.Compare(a.run.lastActive, b.run.lastActive) })
	for _, ks := range held[:min(n, len(held))] {
		if l := ks.active.Load(); l != nil && c.clearActive(ks, l) {
			ks.run.returnUsed[l.slot] = ks.closeLease(l)
			ks.leave(true)
		}
	}
}

func (c *Client) applyOne(p pending, res *protocol.LeaseResult, sent, now int64) {
	ks := p.ks
	defer ks.answered()
	if p.settling != nil && ks.run.slots[p.slot] == p.settling {
		// Settled, or unknown to the server (expired): gone either way.
		ks.run.slots[p.slot] = nil
		ks.run.returnUsed[p.slot] = 0
	}
	if res.Error != nil {
		switch res.Error.Code {
		case protocol.CodeUnknownLease:
			if p.want > 0 {
				ks.need.Store(true) // ask again without the lease ID
			}
		case protocol.CodeTooManyLeases, protocol.CodeTooManyKeys:
			// The key, or this client, has as many leases as the server
			// allows: decide the key directly, and do not ask again for an
			// idle timeout.
			ks.leave(false)
			ks.directUntil.Store(now + int64(c.cfg.IdleTimeout))
			c.cfg.Logger.Warn("ratelease: server allows no more leases on key; deciding it directly", "key", ks.key, "detail", res.Error.Detail)
		case protocol.CodeForbidden, protocol.CodeNoRule:
			// Refused: deny locally for a while, then ask again (the
			// rules or permissions may change).
			ks.refused.Store(true)
			ks.refusal.Store(&RefusedError{Status: http.StatusForbidden, Code: res.Error.Code, Detail: res.Error.Detail})
			ks.setDenial(now + int64(max(time.Second, c.cfg.Horizon)))
			ks.need.Store(false)
			c.cfg.Logger.Warn("ratelease: server refused key", "key", ks.key, "code", res.Error.Code, "detail", res.Error.Detail)
		case protocol.CodeStoreUnavailable:
			// The store failed for this key alone (a Redis Cluster node
			// down): its live lease serves, a spent-out one is denied
			// until its deadline, then the fallback decides, and the loop
			// asks again after a hold (see storeDownHold). A decision
			// waiting for this lease is decided again, as offline
			// decides (need cleared, as a refusal does).
			c.noteStoreDown([]*keyState{ks}, res.Error, now)
			ks.need.Store(false)
		default:
			c.cfg.Logger.Error("ratelease: lease entry failed", "key", ks.key, "code", res.Error.Code, "detail", res.Error.Detail)
			ks.extendDenial(now + int64(c.cfg.SettleInterval))
		}
		return
	}
	ks.refused.Store(false)
	if ks.run.forget && res.Granted == 0 {
		// Forgotten once plan has returned its leases: forgotten here at
		// once, a key evicted while its renewal was in flight (makeRoom)
		// left that lease, and the renewal's grant, unreturned: held at
		// the server until they expired (found by review).
		return
	}
	if res.SafeRate > 0 {
		// The fallback uses about the lowest safe rate given lately: it
		// follows a drop at once and a rise slowly, so that a moment when
		// fewer clients held leases (and each was given more) does not let
		// the fleet's fallbacks add up to more than the rule's rate.
		cur := ks.getSafeRate()
		if cur <= 0 || res.SafeRate < cur {
			cur = res.SafeRate
		} else {
			cur += (res.SafeRate - cur) * safeRateRise
		}
		ks.safeRate.Store(math.Float64bits(cur))
	}
	ks.learn(res.Limit, res.PeriodMillis, res.Burst, res.TTLMillis)
	ks.shaped.Store(res.Algorithm == algorithmLeaky)
	if v := c.limitStates(res.Limits, sent); v != nil {
		ks.limits.Store(v)
	}
	if res.Unlimited {
		// No rule: allowed locally until asked again, directly.
		ks.setUnlimited(now + int64(max(c.cfg.Horizon, time.Duration(ks.leaseTTL.Load()))))
		ks.leave(false)
		ks.need.Store(false)
		if old := c.setActive(ks, nil); old != nil {
			ks.run.returnUsed[old.slot] = ks.closeLease(old)
		}
		return
	}
	ks.unlimited.Store(false)
	if p.want == 0 {
		return
	}
	ks.run.bound = res.Granted == 0 || (res.DelayMillis > 0 && !shaped(res.Algorithm))
	if res.Granted > 0 {
		ks.run.starved = false
	}
	if res.Granted == 0 {
		ks.run.roomy = false
		if res.Owned {
			// A lease server owns the key's bucket and decides its direct
			// takes from memory: decide the key directly (the takes are
			// routed to the owner) rather than deny it, and do not lease
			// it again for a lease TTL, by when the owner, told by the
			// store that a lease was wanted, has handed the bucket back.
			ks.leave(false)
			ks.directUntil.Store(now + max(ks.leaseTTL.Load(), int64(time.Second)))
			ks.need.Store(false)
			return
		}
		wait := time.Duration(res.RetryAfterMillis) * time.Millisecond
		if wait <= 0 {
			wait = c.cfg.SettleInterval
		}
		if res.SafeRate > 0 && res.Limit > 0 && res.PeriodMillis > 0 {
			// Spread the holders' next asks: each denied process was told
			// the same wait, and asking together, all but one would be
			// refused again.
			rate := float64(res.Limit) / (float64(res.PeriodMillis) / 1000)
			if h := rate / res.SafeRate; h > 1.5 {
				wait += time.Duration(rand.Int64N(int64(wait)/2 + 1))
			}
		}
		// The server's wait runs from its decision, which came after the
		// request was sent: counted from the answer's arrival, a slow
		// round trip lengthened the denial beyond its reason, as the
		// direct path, which counts from the sending, never did.
		from := sent
		if res.RetryAfterMillis <= 0 {
			from = now
		}
		ks.setDenial(from + int64(c.denial(ks, wait)))
		ks.need.Store(false)
		return
	}
	ks.run.roomy = res.Granted >= p.want && res.Remaining >= 2*res.Granted && !shaped(res.Algorithm)
	ttl := res.TTLMillis * int64(time.Millisecond)
	l := &lease{id: res.LeaseID, slot: p.slot, granted: res.Granted, halfway: sent + ttl/2, deadline: sent + ttl}
	if now >= l.deadline {
		// Answered past its deadline (a slow call, retries: a call may
		// take 2·RequestTimeout + 2·MaxRetryWait): dead on arrival, and
		// the server may have expired it already. Installed, it was spent
		// from without a clock read until the loop's next scan closed it
		// (found by review: 5 tokens spent 100 ms past the deadline). Not
		// installed, nothing to return; asked for again.
		ks.need.Store(true)
		return
	}
	l.remaining.Store(res.Granted)
	if now >= c.lateAt(l) {
		// Past its late renewal point already: every spend reads the
		// clock (see spend), as scan would have made it at its next tick.
		l.strict.Store(true)
	}
	if shaped(res.Algorithm) && res.Limit > 0 && res.PeriodMillis > 0 {
		l.shape = newSlots(res.Granted, res.Limit, time.Duration(res.PeriodMillis)*time.Millisecond, time.Duration(res.DelayMillis)*time.Millisecond, sent, now)
		l.strict.Store(true)
	}
	ks.run.slots[p.slot] = l
	if ks.run.forget {
		// Granted after the key was forgotten: return it at once.
		ks.run.returnUsed[p.slot] = 0
		l.freeze()
		return
	}
	if du := ks.denyForUntil.Load(); du > now {
		// DenyFor is in force: the new lease waits too.
		l.pausedUntil.Store(du)
		l.strict.Store(true)
	} else {
		ks.setDenial(0) // granted: the server can serve
	}
	if d := res.DelayMillis; d > 0 && l.shape == nil {
		// A deferred grant: none of it is spent before its answer arrived
		// plus the delay (the server's wait runs from its decision, which
		// came before). The key is denied locally until then.
		// A delay past the lease's deadline (more than was asked: a
		// faulty server) leaves it unspendable; the key is denied no
		// longer than the lease lives.
		at := min(now+d*int64(time.Millisecond), l.deadline)
		if l.pausedUntil.Load() < at {
			l.pausedUntil.Store(at)
		}
		l.strict.Store(true)
		ks.extendDenial(at)
	}
	ks.lastGrant.Store(l.granted)
	if old := c.setActive(ks, l); old != nil {
		used := ks.closeLease(old)
		if ks.run.slots[old.slot] == old {
			ks.run.returnUsed[old.slot] = used
		}
	}
	if du := ks.denyForUntil.Load(); du > now && l.pausedUntil.Load() < du {
		// A DenyFor called since the check above paused the lease active
		// then, not this one.
		extend(&l.pausedUntil, du)
		l.strict.Store(true)
	}
	// After the lease is active: a decision waiting for it (see
	// Client.decide) sees the lease, or need still set, never neither.
	ks.need.Store(false)
	// After the lease is active: a key with a deadline is never cold.
	ks.deadline.Store(l.deadline)
}

// shutdown returns every lease; it runs on the loop goroutine at Close.
func (c *Client) shutdown() {
	ctx := <-c.closeCtx
	var items []pending
	c.keys.Range(func(_, v any) bool {
		ks := v.(*keyState)
		ks.run.forget = true
		if p, ok := c.plan(ks, c.nanos(), ks.active.Load()); ok {
			items = append(items, p...)
		}
		return true
	})
	if len(items) > 0 {
		r := c.send(ctx, items)
		if r.err != nil {
			c.closeErr = r.err
		} else {
			for i, p := range r.items {
				c.applyOne(p, &r.res[i], r.sent, c.nanos())
			}
		}
	}
	c.keys.Range(func(_, v any) bool {
		c.forgetKey(v.(*keyState))
		return true
	})
}

// Close settles every key, returns every unused token to the servers and
// stops the client's goroutines. Decisions after Close deny with
// SourceClosed and Err ErrClosed (Wait returns ErrClosed, and so do the Waits blocked when
// Close is called). It returns an error when the final settle failed (the
// servers will expire the leases by their TTL) or ctx ended first; the
// client then goes on stopping, and a later Close waits for it. Close may
// be called more than once and from several goroutines: each returns once
// the client has stopped or its ctx ended, and only the first reports a
// failed settle.
func (c *Client) Close(ctx context.Context) error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		c.closing.Store(true)
		c.closeCtx <- ctx
		close(c.stop)
	})
	select {
	case <-c.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Direct calls in flight end now (their takes may still have happened
	// at the server: lost to utilization, never to accuracy), and no new
	// one starts.
	c.direct.mu.Lock()
	c.direct.closed = true
	c.direct.mu.Unlock()
	c.endLife()
	c.direct.senders.Wait()
	c.http.hc.CloseIdleConnections()
	if first && c.closeErr != nil {
		return errors.Join(errors.New("client: close: the final settle failed; the servers will expire the leases by their TTL"), c.closeErr)
	}
	return nil
}
