package leases

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// OwningOptions configure an OwningStore. Every zero value means the
// documented default.
type OwningOptions struct {
	// Server names this lease server as an owner; it must differ between
	// the servers sharing the store. Default: "server-" and 16 random hex
	// digits.
	Server string
	// MinTakes is how many takes of one key this server must decide within
	// one lease TTL (the key's Bucket.LeaseTTL) before it tries to own the
	// key's bucket. Default 16.
	MinTakes int
	// Interval is the tick of the loop that acquires, renews and releases
	// ownerships. Default 20ms.
	Interval time.Duration
	// MaxKeys is the most buckets owned at once. Default 10,000.
	MaxKeys int
	// Logger receives the store's logs; nil discards them.
	Logger *slog.Logger

	// now returns a monotonic clock in µs (tests drive it); nil means the
	// process's monotonic clock.
	now func() int64
	// manual leaves the loop to the tests (step), instead of a goroutine.
	manual bool
}

// OwningStore is a Store that owns the token buckets of the keys this
// server decides most by direct takes, and decides their takes from memory
// (see Owning for the contract with the store underneath): a key asked
// hundreds of times a second through one server costs one store call per
// half a lease TTL instead of one per decision, and answers without a
// round trip to Redis. It decides exactly as the store would (same
// arithmetic, the tbState of the memory store), so no admission is lost or
// added against a bucket fed the same requests; the refill it credits
// lags the store's clock, never leads it.
//
// A key is owned once this server decided MinTakes of its takes within a
// lease TTL, while no lease is open on it; the ownership is renewed at half
// its TTL while the key is used, and released (its level handed back) when
// it is not, when its rule's bucket changes, when a client asks this server
// for a lease on it, or when another server was refused a take or a lease
// on it (the store reports the ownership contested at the renewal). After a
// contested or lease-wanted release the key is not owned again for a
// while. Routing a key's direct takes to one server (the SDK does,
// rendezvous hashing over its servers) makes one server see all of them.
//
// A store that fails (a Redis master down or stalled past the read
// timeout) is met so: each acquisition carries a new ID and the IDs of the
// key's earlier acquisitions whose answers were lost (OwnOp.ID, Lost, the
// last eight kept), so that an ownership one of them began when the master
// ran it late is begun afresh instead of refusing this server's takes. A
// late copy that finds another ownership changes nothing; one that finds
// none begins an ownership nobody decides from, which the store ends at
// its deadline, empty, unless this server acquires the key first: it does
// at the next tick once the store refuses one of its takes as owned by
// this server (TakeOutcome.OwnedByServer; such a take does not mark the
// ownership contested), beginning it afresh. An acquisition whose answer
// was lost is sent again at the next tick, the key's takes waiting for it,
// three times in all; then the key is decided by the store and acquired
// again a quarter of a TTL later, asked for or not (three rounds in all).
// A renewal never begins an ownership (OwnOp.Renew): one that finds it
// expired loses the key. An ownership of this server's that it cannot
// know the level of is handed back at level 0; one acquired or renewed but
// answered after the deadline the op set is handed back at its level.
//
// The loop does not wait for one call before the next: at each tick it
// sends three kinds of call — the renewals and releases of the keys whose
// last op did not fail, which never wait for a slot; their acquisitions;
// and the ops of the keys whose last op failed — the last two with four
// calls in flight at most. A store call waits for every node it reaches,
// so each is split into one call per node where the store names its nodes
// (RedisStore on a Redis Cluster: the master of each key's slot, by the
// client's map), each answer applied as it comes. So a stalled master
// delays no other master's keys; on a store that does not name its nodes,
// a key's renewal sent in the same call as a stalled master's keys' first
// failed renewals waits the read timeout (at half a TTL from its
// deadline). Each key has one op in flight at most.
//
// Only token_bucket buckets are owned; every other operation goes to the
// store underneath, which must implement Owning.
type OwningStore struct {
	inner Store
	own   Owning
	opts  OwningOptions
	now   func() int64 // µs, monotonic
	idKey []byte       // see IDKey: nil when inner keeps one

	mu   sync.Mutex
	keys map[string]*ownedKey // guarded by mu: every key known
	// due lists the candidates that reached MinTakes, and active the keys
	// acquiring, owned or releasing: the loop visits these only (guarded
	// by mu).
	due    map[string]*ownedKey
	active map[string]*ownedKey
	// lastSweep is when keys was last swept of stale candidates.
	lastSweep int64

	stats struct {
		local, acquired, released, contested, lost atomic.Int64
	}
	stop chan struct{}
	done chan struct{}
	// calls counts the loop's store calls in flight: each tick may start
	// one of each kind (see collect), each split by node (see send), so
	// that a call stalled on one Redis master delays no renewal of another
	// key. slots bounds the calls of
	// the kinds that have no deadline (acquisitions, and the ops of keys
	// whose last op failed); the renewals and releases of the others are
	// bounded by the keys owned (one op in flight each), and never wait
	// for a slot: four calls stalled on a hung master would have held
	// every slot while a live key's deadline passed.
	calls sync.WaitGroup
	slots [numKinds]chan struct{}
}

// maxCalls is the most store calls of the loop in flight at once, of
// each kind but kindRenew (see collect); maxOwnTries the most
// acquisitions of a key sent in a row whose answers were lost, before it
// goes back to being decided by the store for a quarter of a TTL, and
// maxOwnRounds the most times that happens in a row before the key is
// acquired only when asked for again. keepLost is how many lost
// acquisitions' IDs a key keeps (see OwnOp.Lost).
const (
	maxCalls     = 4
	maxOwnTries  = 3
	maxOwnRounds = 3
	keepLost     = 8
)

// The kinds of the loop's store calls (see collect).
const (
	kindRenew   = iota // renewals and releases of keys whose last op did not fail
	kindAcquire        // acquisitions of keys whose last op did not fail
	kindFailed         // the ops of keys whose last op failed
	numKinds
)

// ownState is the stage of one key in an OwningStore.
type ownState int

const (
	ownNone      ownState = iota // a candidate: takes are counted, decided by the store
	ownAcquiring                 // an acquisition is in flight or due (resend): takes wait for it
	ownOwned                     // decided here
	ownReleasing                 // a release is in flight or due (resend): takes wait for it
)

// ownedKey is the state of one key: its demand while a candidate, its
// bucket while owned. Guarded by OwningStore.mu.
type ownedKey struct {
	state ownState
	// While a candidate: takes counted since windowStart.
	takes       int
	windowStart int64
	cooldown    int64 // not owned again before this
	// While owned.
	tb        tbState // the bucket, its clock (last) in local µs
	deadline  int64   // local µs: decide nothing from then on
	renewAt   int64   // local µs
	renewing  bool    // a renewal is in flight (decisions go on)
	lastUse   int64   // local µs of the last local decision
	contested bool    // release at the next tick
	release   bool    // release at the next tick (lease wanted, bucket changed)
	sentAt    int64   // local µs the op in flight was sent
	offset    int64   // store clock (µs since the epoch) less the local clock, as of the acquisition
	// id is the ID of the ownership (of the acquisition in flight while
	// acquiring); lost the IDs of this key's last keepLost acquisitions
	// whose answers were lost (kept across resets and answered
	// acquisitions, and the key kept by the sweep for ten TTLs after the
	// last, lostAt: a copy of one may still run late), tries how many
	// were lost in a row.
	id     string
	lost   []string
	lostAt int64
	tries  int
	// rounds counts the times tries ran out in a row: the key is then
	// acquired again once its cool period passes, asked for or not (an
	// ownership one of them began refuses everyone until its deadline),
	// maxOwnRounds times at most.
	rounds int
	// resend: while acquiring, an acquisition is due at the next tick (the
	// last one's answer was lost); while releasing, a release at relLevel
	// is due (of an ownership this server cannot decide from, at 0; of
	// one whose renewal was answered past its deadline, at its level).
	resend   bool
	relLevel float64
	// reclaim: a take sent to the store was refused because the bucket is
	// owned, while an acquisition of this key's may have begun that
	// ownership (lost is not empty): acquired again at the next tick.
	reclaim bool
	// failed: the key's last op failed; its next ones go in a call of
	// their own, so that a stalled master's keys delay no other key.
	failed bool
	// forwarded counts this key's takes sent to the store and not yet
	// answered: no acquisition is sent while one is (the store would
	// refuse it as contested).
	forwarded int
	// wait is closed when an acquisition, renewal or release in flight
	// completes.
	wait chan struct{}
}

// NewOwningStore returns an OwningStore over inner, which must implement
// Owning, and starts its loop; Close stops it, releases what it owns, and
// closes inner.
func NewOwningStore(inner Store, opts OwningOptions) (*OwningStore, error) {
	own, ok := inner.(Owning)
	if !ok {
		return nil, fmt.Errorf("leases: %T cannot be owned (it does not implement Owning)", inner)
	}
	if opts.Server == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		opts.Server = "server-" + hex.EncodeToString(b[:])
	}
	if opts.MinTakes <= 0 {
		opts.MinTakes = 16
	}
	if opts.Interval <= 0 {
		opts.Interval = 20 * time.Millisecond
	}
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = 10_000
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &OwningStore{inner: inner, own: own, opts: opts, now: opts.now, keys: make(map[string]*ownedKey),
		due: make(map[string]*ownedKey), active: make(map[string]*ownedKey), stop: make(chan struct{}), done: make(chan struct{}),
		slots: [numKinds]chan struct{}{kindAcquire: make(chan struct{}, maxCalls), kindFailed: make(chan struct{}, maxCalls)}}
	if s.now == nil {
		base := time.Now()
		s.now = func() int64 { return time.Since(base).Microseconds() }
	}
	if _, ok := inner.(IDKeyStore); !ok {
		s.idKey = newIDKey()
	}
	if opts.manual {
		close(s.done)
	} else {
		go s.loop()
	}
	return s, nil
}

// OwningStats counts what an OwningStore did.
type OwningStats struct {
	// Owned is the number of buckets owned now.
	Owned int
	// LocalTakes is the number of take operations decided from memory.
	LocalTakes int64
	// Acquired, Released and Lost count ownerships begun, handed back, and
	// lost without a release (not renewed in time, or the store down).
	Acquired, Released, Lost int64
	// Contested counts the releases asked for because another server was
	// refused a take or a lease on an owned key.
	Contested int64
}

// Stats returns the store's counts so far.
func (s *OwningStore) Stats() OwningStats {
	s.mu.Lock()
	n := 0
	for _, k := range s.active {
		if k.state == ownOwned {
			n++
		}
	}
	s.mu.Unlock()
	return OwningStats{Owned: n, LocalTakes: s.stats.local.Load(), Acquired: s.stats.acquired.Load(),
		Released: s.stats.released.Load(), Lost: s.stats.lost.Load(), Contested: s.stats.contested.Load()}
}

// ownable reports whether a take on b may be decided by an owner.
func ownable(b *Bucket) bool { return b.Algorithm == TokenBucket && b.LeaseTTL > 0 }

// Take decides the ops on owned buckets here and passes the others to the
// store underneath, in one call. An op on a key whose acquisition or
// release is in flight waits for it (about one store round trip, after at
// most one tick of the loop).
func (s *OwningStore) Take(ctx context.Context, ops []TakeOp) ([]TakeOutcome, error) {
	outs := make([]TakeOutcome, len(ops))
	done := make([]bool, len(ops))
	for {
		var wait chan struct{}
		var fwd []int
		now := s.now()
		s.mu.Lock()
		for i := range ops {
			if done[i] {
				continue
			}
			op := &ops[i]
			if !ownable(&op.Bucket) {
				fwd = append(fwd, i)
				continue
			}
			k, w := s.route(op.Key, &op.Bucket, now)
			switch {
			case w != nil:
				wait = w
			case k == nil:
				fwd = append(fwd, i)
			default:
				outs[i] = k.tb.take(&op.Bucket, op.Cost, op.Floor, 0, now)
				outs[i].Expired = 0
				outs[i].At = now + k.offset
				k.lastUse = now
				done[i] = true
				s.stats.local.Add(1)
			}
		}
		for _, i := range fwd {
			if k := s.keys[ops[i].Key]; k != nil && ownable(&ops[i].Bucket) {
				k.forwarded++
			}
		}
		s.mu.Unlock()
		if len(fwd) > 0 {
			sub := make([]TakeOp, len(fwd))
			for j, i := range fwd {
				sub[j] = ops[i]
				sub[j].Server = s.opts.Server // so that the store sees who takes
			}
			res, err := s.inner.Take(ctx, sub)
			s.mu.Lock()
			for j, i := range fwd {
				k := s.keys[ops[i].Key]
				if k == nil || !ownable(&ops[i].Bucket) {
					continue
				}
				if k.forwarded > 0 {
					k.forwarded--
				}
				if err == nil && res[j].OwnedByServer && len(k.lost) > 0 && k.state == ownNone {
					// Perhaps by an acquisition of ours that ran late:
					// take it back (afresh, if so) at the next tick.
					k.reclaim = true
					s.due[ops[i].Key] = k
				}
			}
			s.mu.Unlock()
			if err != nil && errors.Is(err, ErrStoreUnavailable) && slices.Contains(done, true) {
				// Decided here, some of them: the store's failure is
				// the forwarded ops' alone (see Store.Take).
				res = make([]TakeOutcome, len(fwd))
				for j := range res {
					res[j].Err = err
				}
				err = nil
			}
			if err != nil {
				return nil, err
			}
			for j, i := range fwd {
				outs[i] = res[j]
				done[i] = true
			}
		}
		if wait == nil {
			return outs, nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, ctx.Err())
		}
	}
}

// route says how an op on key is decided now: here (k, the owned key), by
// the store (nil, nil; the take is counted as demand), or after an op in
// flight (the channel to wait on). Called with mu held.
func (s *OwningStore) route(key string, b *Bucket, now int64) (*ownedKey, chan struct{}) {
	k := s.keys[key]
	if k == nil {
		k = &ownedKey{windowStart: now}
		s.keys[key] = k
	}
	switch k.state {
	case ownNone:
		s.count(key, k, b, now)
		return nil, nil
	case ownAcquiring, ownReleasing:
		return nil, s.waitFor(k)
	}
	if k.tb.bucket != *b {
		// The rule changed: hand the bucket back, then decide by the
		// store.
		k.release = true
		return nil, s.waitFor(k)
	}
	if now >= k.deadline {
		if k.renewing {
			return nil, s.waitFor(k)
		}
		s.lose(key, k, now)
		s.count(key, k, b, now)
		return nil, nil
	}
	return k, nil
}

// count adds a take to a candidate key's demand; a key with MinTakes in one
// lease TTL is acquired at the next tick. Called with mu held.
func (s *OwningStore) count(key string, k *ownedKey, b *Bucket, now int64) {
	if now-k.windowStart > b.LeaseTTL.Microseconds() {
		k.windowStart, k.takes = now, 0
	}
	k.takes++
	k.tb.bucket = *b
	if k.takes >= s.opts.MinTakes && now >= k.cooldown {
		s.due[key] = k
	}
}

// waitFor returns the channel closed when k's op in flight completes,
// creating it for an op the loop has yet to send.
func (s *OwningStore) waitFor(k *ownedKey) chan struct{} {
	if k.wait == nil {
		k.wait = make(chan struct{})
	}
	return k.wait
}

// lose drops an ownership that ran out unrenewed: the store empties the
// bucket at its deadline, and this server decides nothing more from it.
// Called with mu held.
func (s *OwningStore) lose(key string, k *ownedKey, now int64) {
	s.stats.lost.Add(1)
	s.opts.Logger.Warn("ratelease: ownership of a bucket ran out unrenewed", "key", key)
	s.reset(key, k, now, k.tb.bucket.LeaseTTL.Microseconds())
}

// reset makes k a candidate again, not acquired before cool has passed,
// and wakes whoever waits on it. Called with mu held.
func (s *OwningStore) reset(key string, k *ownedKey, now, cool int64) {
	w, b, fwd, lost, lostAt, failed, rounds, reclaim := k.wait, k.tb.bucket, k.forwarded, k.lost, k.lostAt, k.failed, k.rounds, k.reclaim
	*k = ownedKey{windowStart: now, cooldown: now + cool, forwarded: fwd, lost: lost, lostAt: lostAt, failed: failed, rounds: rounds, reclaim: reclaim}
	k.tb.bucket = b
	delete(s.active, key)
	if w != nil {
		close(w)
	}
}

// Refund gives back tokens to owned buckets here, and passes the others to
// the store underneath; like Take, it waits for an op in flight on its key.
func (s *OwningStore) Refund(ctx context.Context, ops []TakeOp) error {
	done := make([]bool, len(ops))
	for {
		var fwd []TakeOp
		var wait chan struct{}
		now := s.now()
		s.mu.Lock()
		for i := range ops {
			if done[i] {
				continue
			}
			op := &ops[i]
			k := s.keys[op.Key]
			switch {
			case k == nil || k.state == ownNone || !ownable(&op.Bucket):
			case k.state == ownOwned && now < k.deadline && k.tb.bucket == op.Bucket:
				k.tb.refund(&op.Bucket, op.Cost, op.At, now)
				done[i] = true
				continue
			case k.state == ownOwned && now >= k.deadline && !k.renewing:
				// Lost unrenewed: the store's bucket is empty from its
				// deadline; give back there.
			default:
				wait = s.waitFor(k)
				continue
			}
			fwd = append(fwd, *op)
			done[i] = true
		}
		s.mu.Unlock()
		if len(fwd) > 0 {
			if err := s.inner.Refund(ctx, fwd); err != nil {
				return err
			}
		}
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, ctx.Err())
		}
	}
}

// Lease releases the owned buckets among ops' keys (a client wants a lease:
// the key goes back to the store, and is not owned again for a while), then
// passes ops to the store underneath.
func (s *OwningStore) Lease(ctx context.Context, owner Owner, ops []LeaseOp) ([]LeaseOutcome, error) {
	for {
		var wait chan struct{}
		s.mu.Lock()
		for i := range ops {
			k := s.keys[ops[i].Key]
			if k == nil || k.state == ownNone {
				continue
			}
			if k.state == ownOwned {
				k.release = true
			}
			wait = s.waitFor(k)
		}
		s.mu.Unlock()
		if wait == nil {
			return s.inner.Lease(ctx, owner, ops)
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, ctx.Err())
		}
	}
}

// ServesOthers reports what the store underneath does (see
// RedisStore.ServesOthers), or false.
func (s *OwningStore) ServesOthers(ctx context.Context) bool {
	so, ok := s.inner.(servesOthers)
	return ok && so.ServesOthers(ctx)
}

// State returns an owned bucket's state from memory (no lease is open on
// it: Leases, Holders and Outstanding are zero), any other from the store
// underneath.
func (s *OwningStore) State(ctx context.Context, key string, b Bucket) (BucketState, error) {
	now := s.now()
	s.mu.Lock()
	if k := s.keys[key]; k != nil && k.state == ownOwned && now < k.deadline && k.tb.bucket == b {
		st := k.tb.snapshot(&b, now)
		st.Now = time.UnixMicro(now + k.offset)
		st.Owner = s.opts.Server
		s.mu.Unlock()
		return st, nil
	}
	s.mu.Unlock()
	return s.inner.State(ctx, key, b)
}

// Ping reports whether the store underneath is reachable.
func (s *OwningStore) Ping(ctx context.Context) error { return s.inner.Ping(ctx) }

// IDKey implements IDKeyStore: the inner store's key, or, when it keeps
// none, a random key of this store.
func (s *OwningStore) IDKey(ctx context.Context) ([]byte, error) {
	if k, ok := s.inner.(IDKeyStore); ok {
		return k.IDKey(ctx)
	}
	return s.idKey, nil
}

// Close stops the loop, releases every owned bucket (within 2 s), and
// closes the store underneath.
func (s *OwningStore) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.calls.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.mu.Lock()
	now := s.now()
	for key, k := range s.active {
		switch {
		case k.state == ownOwned:
			k.release = true
		case k.state == ownAcquiring && k.resend:
			s.reset(key, k, now, 0) // acquire nothing more
		}
	}
	s.due = map[string]*ownedKey{} // acquire nothing more
	s.mu.Unlock()
	s.step(ctx)
	return s.inner.Close()
}

func (s *OwningStore) loop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		// A kind whose maxCalls are in flight waits for the next tick
		// (its ops stay due).
		var free [numKinds]bool
		for i, sl := range s.slots {
			if sl == nil {
				free[i] = true
				continue
			}
			select {
			case sl <- struct{}{}:
				free[i] = true
			default:
			}
		}
		calls := s.collect(free)
		release := func(i int) {
			if s.slots[i] != nil {
				<-s.slots[i]
			}
		}
		for i := range calls {
			switch {
			case !free[i]:
				continue
			case len(calls[i].ops) == 0:
				release(i)
				continue
			}
			s.calls.Add(1)
			go func() {
				defer s.calls.Done()
				defer release(i)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				s.send(ctx, &calls[i])
			}()
		}
	}
}

// pendingOwn is one op of a step, with its key.
type pendingOwn struct {
	key string
	k   *ownedKey
}

// ownCall is the ops of one store call of a step.
type ownCall struct {
	ops []OwnOp
	at  []pendingOwn
}

func (c *ownCall) add(key string, k *ownedKey, op OwnOp) {
	c.ops = append(c.ops, op)
	c.at = append(c.at, pendingOwn{key, k})
}

// newOwnID returns a new ID for an acquisition (OwnOp.ID).
func newOwnID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// step sends the acquisitions, renewals and releases due now and applies
// the answers (see collect), its calls concurrent. The loop does the same
// without waiting for the answers; the tests and Close step.
func (s *OwningStore) step(ctx context.Context) {
	calls := s.collect([numKinds]bool{true, true, true})
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { s.send(ctx, &calls[i]) })
	}
	wg.Wait()
}

// collect marks in flight and returns the ops due now, in a call of each
// kind: the renewals and releases of the keys whose last op did not fail,
// which have deadlines; their acquisitions; and the ops of the keys whose
// last op failed, which a Redis master that stalls makes wait for the read
// timeout (its key's ops fail then). A call waits for every node it
// reaches, so a call of one kind delays no other kind's. Ops of a kind
// whose free is false are left due.
func (s *OwningStore) collect(free [numKinds]bool) (calls [numKinds]ownCall) {
	now := s.now()
	kind := func(k *ownedKey) int {
		if k.failed {
			return kindFailed
		}
		return kindRenew
	}
	acqKind := func(k *ownedKey) int {
		if k.failed {
			return kindFailed
		}
		return kindAcquire
	}
	acquire := func(key string, k *ownedKey) {
		k.state, k.sentAt, k.takes, k.resend, k.reclaim, k.id = ownAcquiring, now, 0, false, false, newOwnID()
		s.active[key] = k
		// Not with the renewals: an acquisition sent to a master that
		// stalls delays nothing that has a deadline.
		calls[acqKind(k)].add(key, k, OwnOp{Key: key, Bucket: k.tb.bucket, Server: s.opts.Server, ID: k.id, Lost: slices.Clone(k.lost)})
	}
	s.mu.Lock()
	if now-s.lastSweep > int64(time.Second/time.Microsecond) {
		s.sweep(now)
	}
	for key, k := range s.due {
		if !free[acqKind(k)] {
			continue // it waits for a call of its kind
		}
		if k.state != ownNone || k.forwarded > 0 || len(s.active) >= s.opts.MaxKeys {
			if k.state != ownNone {
				delete(s.due, key)
			}
			continue // a take of its own at the store: next tick
		}
		if k.reclaim {
			k.cooldown = min(k.cooldown, now)
		}
		forced := k.rounds > 0 || k.reclaim // see rounds, reclaim
		if forced && now < k.cooldown {
			continue // due when it has passed
		}
		delete(s.due, key)
		if (k.takes < s.opts.MinTakes && !forced) || now < k.cooldown {
			continue
		}
		acquire(key, k)
	}
	for key, k := range s.active {
		switch {
		case k.state == ownAcquiring && k.resend:
			if free[acqKind(k)] {
				acquire(key, k)
			}
			continue
		case k.state == ownReleasing && k.resend:
			// See resend.
			if free[kind(k)] {
				k.resend, k.sentAt = false, now
				calls[kind(k)].add(key, k, OwnOp{Key: key, Bucket: k.tb.bucket, Server: s.opts.Server, ID: k.id, Release: true, Level: k.relLevel})
			}
			continue
		case k.state != ownOwned || k.renewing || !free[kind(k)]:
			// Nothing due, or its renewal in flight (a key has one op
			// in flight at most: a release sent meanwhile could run
			// first, and the renewal then begin an ownership this
			// server no longer knows).
			continue
		}
		ttl := k.tb.bucket.LeaseTTL.Microseconds()
		idle := k.lastUse <= k.renewAt-ttl/2 // no use since the last acquisition or renewal was sent
		switch {
		case k.release || k.contested || (now >= k.renewAt && idle):
			// Hand back the level as it stands now; decide nothing more
			// from it.
			k.tb.advance(&k.tb.bucket, now)
			calls[kind(k)].add(key, k, OwnOp{Key: key, Bucket: k.tb.bucket, Server: s.opts.Server, ID: k.id, Release: true, Level: k.tb.level})
			k.state, k.sentAt = ownReleasing, now
		case now >= k.renewAt:
			k.renewing, k.sentAt = true, now
			calls[kind(k)].add(key, k, OwnOp{Key: key, Bucket: k.tb.bucket, Server: s.opts.Server, ID: k.id, Renew: true})
		}
	}
	s.mu.Unlock()
	return calls
}

// nodeNamer is implemented by a store whose buckets live on several nodes
// (RedisStore on a Redis Cluster): nodeOf names the node that serves key's
// bucket, "" when it has one node or does not know.
type nodeNamer interface {
	nodeOf(ctx context.Context, key string) string
}

// send makes one store call of a step and applies its answers: one call
// per node of the store (see nodeNamer), concurrent, each applied as it
// is answered. A store call waits for every node it reaches: made as one,
// the first renewals of the keys of a master that had just stalled held
// back the healthy keys' renewals due at the same tick for the read
// timeout, past their deadlines at a short lease TTL, and the healthy
// ownerships were lost with their tokens
// (TestRedisClusterOwnStalledKeysSpareLiveRenewal).
func (s *OwningStore) send(ctx context.Context, c *ownCall) {
	nn, ok := s.inner.(nodeNamer)
	if !ok || len(c.ops) < 2 {
		s.sendNode(ctx, c)
		return
	}
	var parts []ownCall
	byNode := make(map[string]int)
	for i := range c.ops {
		node := nn.nodeOf(ctx, c.ops[i].Key)
		j, seen := byNode[node]
		if !seen {
			j = len(parts)
			byNode[node] = j
			parts = append(parts, ownCall{})
		}
		parts[j].add(c.at[i].key, c.at[i].k, c.ops[i])
	}
	if len(parts) == 1 {
		s.sendNode(ctx, c)
		return
	}
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() { s.sendNode(ctx, &parts[i]) })
	}
	wg.Wait()
}

// sendNode makes one store call of a step, to one node, and applies its
// answers.
func (s *OwningStore) sendNode(ctx context.Context, c *ownCall) {
	if len(c.ops) == 0 {
		return
	}
	outs, err := s.own.Own(ctx, c.ops)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range c.at {
		var o OwnOutcome
		if err == nil {
			o = outs[i]
		} else {
			o.Err = err
		}
		p.k.failed = o.Err != nil
		s.apply(p.key, p.k, &c.ops[i], &o, now)
	}
	if err != nil {
		s.opts.Logger.Warn("ratelease: owning buckets: store call failed", "ops", len(c.ops), "err", err)
	}
}

// apply applies one answer of step. Called with mu held.
func (s *OwningStore) apply(key string, k *ownedKey, op *OwnOp, o *OwnOutcome, now int64) {
	ttl := op.Bucket.LeaseTTL.Microseconds()
	switch {
	case op.Release:
		// Released, or (on an error) left to expire at the store, which
		// then empties the bucket at its deadline: either way no longer
		// this server's. A key handed back because it was wanted
		// elsewhere is not owned again for ten TTLs.
		if o.Err == nil {
			s.stats.released.Add(1)
		} else {
			s.stats.lost.Add(1)
		}
		cool := ttl
		if k.contested || k.release {
			cool = 10 * ttl
		}
		s.reset(key, k, now, cool)
	case k.state == ownAcquiring:
		switch {
		case errors.Is(o.Err, ErrNotOwnable):
			s.reset(key, k, now, math.MaxInt64/2)
		case o.Err != nil:
			// The op may have run, or run later (a stalled master runs
			// what it has queued when it resumes): the next acquisition
			// names it (OwnOp.Lost), so that an ownership it began is
			// begun afresh rather than refusing this server's takes.
			// Sent again at the next tick, the takes waiting for it.
			if len(k.lost) == keepLost {
				k.lost = slices.Delete(k.lost, 0, 1)
			}
			k.lost, k.lostAt = append(k.lost, op.ID), now
			if k.tries++; k.tries < maxOwnTries {
				k.resend = true
				return
			}
			// Decided by the store meanwhile (which refuses the takes
			// if one of them began an ownership), and acquired again
			// well before such an ownership ends at its deadline,
			// empty.
			s.reset(key, k, now, ttl/4)
			if k.rounds++; k.rounds < maxOwnRounds {
				s.due[key] = k
			} else {
				k.rounds = 0
			}
		case !o.Owned:
			k.rounds = 0 // no ownership of this server's is live
			s.reset(key, k, now, max(ttl, o.RetryAfter.Microseconds()))
		case !o.Acquired || o.ID != op.ID:
			// Owned by this server through an ownership this op does
			// not know (its acquisition's answer lost long ago, or its
			// renewals'): its level cannot be known. Handed back empty
			// at the next tick; the takes wait for it.
			k.state, k.resend, k.relLevel, k.id, k.rounds = ownReleasing, true, 0, o.ID, 0
		case now >= k.sentAt+ttl:
			// Acquired, but answered after the deadline it set (a call
			// that waited for a stalled master): nothing was decided
			// from it; handed back at its level rather than left to
			// expire, empty.
			s.stats.acquired.Add(1)
			k.tries, k.rounds = 0, 0
			k.state, k.resend, k.relLevel, k.id = ownReleasing, true, o.Level, op.ID
		default:
			// lost stays (keepLost at most): a copy of one of them may
			// still run late, after this ownership ends, and begin one
			// that the next acquisition then begins afresh.
			s.stats.acquired.Add(1)
			k.tries, k.rounds = 0, 0
			s.begin(k, o, now)
		}
	default: // a renewal
		k.renewing = false
		switch {
		case o.Err != nil:
			// Not renewed: decide until the deadline, then let it go.
			s.wake(k)
		case !o.Owned:
			// Expired at the store, which emptied the bucket at its
			// deadline (after this server's own).
			s.lose(key, k, now)
		case o.ID != op.ID:
			// Another ownership of this server's, unknown: handed back
			// empty (see the acquisition's case).
			k.state, k.resend, k.relLevel, k.id = ownReleasing, true, 0, o.ID
		case now >= k.sentAt+ttl:
			// Renewed, but the answer came after the deadline it set:
			// this server decided nothing since its own deadline, and
			// hands back the level it holds rather than letting the
			// store empty the bucket.
			k.tb.advance(&k.tb.bucket, now)
			k.state, k.resend, k.relLevel = ownReleasing, true, k.tb.level
		default:
			k.deadline = k.sentAt + ttl
			k.renewAt = k.sentAt + ttl/2
			if o.Contested {
				k.contested = true
				s.stats.contested.Add(1)
			}
			s.wake(k)
		}
	}
}

// wake wakes whoever waits on k's op in flight. Called with mu held.
func (s *OwningStore) wake(k *ownedKey) {
	if k.wait != nil {
		close(k.wait)
		k.wait = nil
	}
}

// begin starts an ownership from an acquisition's answer: the store's level
// stands at the moment the answer arrived (the refill credited lags the
// store's), and the deadline runs from the moment the request was sent.
// Called with mu held.
func (s *OwningStore) begin(k *ownedKey, o *OwnOutcome, now int64) {
	b := k.tb.bucket
	ttl := b.LeaseTTL.Microseconds()
	level := o.Level
	if math.IsNaN(level) || level < 0 {
		level = 0
	}
	k.tb = tbState{level: min(level, float64(b.Burst)), last: now, bucket: b}
	k.state = ownOwned
	k.deadline = k.sentAt + ttl
	k.renewAt = k.sentAt + ttl/2
	k.lastUse = now
	k.offset = o.At - now
	k.release, k.contested, k.renewing = false, false, false
	s.wake(k)
}

// sweep drops the candidates whose demand window ended long ago. Called
// with mu held.
func (s *OwningStore) sweep(now int64) {
	s.lastSweep = now
	for key, k := range s.keys {
		ttl := k.tb.bucket.LeaseTTL.Microseconds()
		if k.state == ownNone && k.wait == nil && k.forwarded == 0 && now-k.windowStart > 2*ttl && now >= k.cooldown &&
			(len(k.lost) == 0 || now-k.lostAt > 10*ttl) {
			delete(s.keys, key)
			delete(s.due, key)
		}
	}
}
