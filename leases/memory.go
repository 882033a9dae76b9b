package leases

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// MemoryOptions configure a MemoryStore. The zero value is ready to use.
type MemoryOptions struct {
	// Now is the store's clock; nil means time.Now. Tests set it to drive
	// time by hand.
	Now func() time.Time
	// SweepInterval is how long the store takes to look at every bucket
	// once and drop those that are idle (full, with no open lease): a
	// background goroutine sweeps one shard every SweepInterval/64. Zero
	// means DefaultSweepInterval; a negative value starts no goroutine, and
	// idle buckets are dropped only by calls to Sweep.
	SweepInterval time.Duration
}

// DefaultSweepInterval is the MemoryOptions.SweepInterval of the zero
// value.
const DefaultSweepInterval = 10 * time.Second

const memoryShards = 64

// MemoryStore is a Store that keeps every bucket in this process. It is the
// store of a single lease server: buckets are not shared with other servers
// and are lost on restart (which is safe: a fresh bucket is full, and every
// lease granted before the restart expires by its TTL).
//
// It is safe for concurrent use. Keys are spread over shards, each with its
// own mutex, so operations on different keys rarely contend. Buckets that
// are full and hold no lease are dropped by a background sweep, one shard at
// a time, whether or not requests arrive, so memory follows the active keys.
type MemoryStore struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [memoryShards]memShard
	closed chan struct{}
	once   sync.Once
	swept  sync.WaitGroup // the sweeper goroutine

	sweepMu   sync.Mutex // serializes sweeps
	nextSweep int        // shard swept next, under sweepMu

	idKey []byte // see IDKey
}

type memShard struct {
	mu sync.Mutex
	m  map[memKey]keyState
	_  [48]byte // keep shards on separate cache lines
}

// ErrClosed is returned, wrapped with ErrStoreUnavailable, by a store used
// after Close.
var ErrClosed = errors.New("store closed")

// NewMemoryStore returns an empty MemoryStore. Unless
// opts.SweepInterval is negative it starts a goroutine that sweeps idle
// buckets; Close stops it.
func NewMemoryStore(opts MemoryOptions) *MemoryStore {
	s := &MemoryStore{now: opts.Now, seed: maphash.MakeSeed(), closed: make(chan struct{}), idKey: newIDKey()}
	if s.now == nil {
		s.now = time.Now
	}
	for i := range s.shards {
		s.shards[i].m = make(map[memKey]keyState)
	}
	if iv := opts.SweepInterval; iv >= 0 {
		if iv == 0 {
			iv = DefaultSweepInterval
		}
		s.swept.Add(1)
		go s.sweeper(max(iv/memoryShards, time.Millisecond))
	}
	return s
}

func (s *MemoryStore) sweeper(every time.Duration) {
	defer s.swept.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case <-t.C:
			s.sweepShard()
		}
	}
}

func (s *MemoryStore) shard(key string) *memShard {
	return &s.shards[maphash.String(s.seed, key)%memoryShards]
}

func (s *MemoryStore) check(ctx context.Context) error {
	select {
	case <-s.closed:
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, ErrClosed)
	default:
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	return nil
}

// memKey names the state of a key under one algorithm. A key keeps one
// state per algorithm, as in Redis, where each algorithm's keys have a tag
// of their own: a rule that changes a key's algorithm and back finds the
// state it left, open leases included. (It once replaced the state: the
// leases open under it were forgotten, and a token bucket whose whole burst
// was leased out granted it again.) Idle states are swept like any.
type memKey struct {
	key string
	alg Algorithm
}

// with runs fn on key's state under b's algorithm, under the shard lock,
// creating the state when missing.
func (s *MemoryStore) with(key string, b *Bucket, now int64, fn func(keyState)) error {
	a, err := algorithmOf(b)
	if err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	mk := memKey{key, algName(b)}
	st, ok := sh.m[mk]
	if !ok {
		st = a.newState(b, now)
		sh.m[mk] = st
	}
	fn(st)
	sh.mu.Unlock()
	return nil
}

// algName returns b's algorithm, token_bucket when it names none.
func algName(b *Bucket) Algorithm {
	if b.Algorithm == "" {
		return TokenBucket
	}
	return b.Algorithm
}

// sweepShard drops the idle buckets of one shard, the shards taken in turn.
func (s *MemoryStore) sweepShard() {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	now := s.now().UnixMicro()
	sh := &s.shards[s.nextSweep]
	sh.mu.Lock()
	for k, st := range sh.m {
		if st.idle(now) {
			delete(sh.m, k)
		}
	}
	sh.mu.Unlock()
	s.nextSweep = (s.nextSweep + 1) % memoryShards
}

// Sweep drops every idle bucket (full, with no open lease) now. The
// background sweep does the same one shard at a time; Sweep exists for
// stores without one and for tests.
func (s *MemoryStore) Sweep() {
	for range memoryShards {
		s.sweepShard()
	}
}

// Lease implements Store.
func (s *MemoryStore) Lease(ctx context.Context, owner Owner, ops []LeaseOp) ([]LeaseOutcome, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	now := s.now().UnixMicro()
	out := make([]LeaseOutcome, len(ops))
	for i := range ops {
		op := &ops[i]
		if err := s.with(op.Key, &op.Bucket, now, func(st keyState) {
			out[i] = st.lease(&op.Bucket, owner, op, now)
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Take implements Store.
func (s *MemoryStore) Take(ctx context.Context, ops []TakeOp) ([]TakeOutcome, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	now := s.now().UnixMicro()
	out := make([]TakeOutcome, len(ops))
	for i := range ops {
		op := &ops[i]
		if err := s.with(op.Key, &op.Bucket, now, func(st keyState) {
			tb, _ := st.(*tbState)
			var contested *bool // the owner's mark, when op comes through the owner
			if tb != nil && tb.owner != nil && op.Server != "" && tb.owner.server == op.Server {
				c := tb.owner.contested
				contested = &c
			}
			out[i] = st.take(&op.Bucket, op.Cost, op.Floor, maxDelayOf(op), now)
			switch {
			case tb == nil:
			case out[i].Taken:
				tb.noteTaker(op.Server, now)
			case out[i].Owned && contested != nil:
				// Through the owner itself, which lost track of its
				// ownership: not contested (nobody else wants it).
				out[i].OwnedByServer = true
				tb.owner.contested = *contested
			}
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Refund implements Store.
func (s *MemoryStore) Refund(ctx context.Context, ops []TakeOp) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	now := s.now().UnixMicro()
	for i := range ops {
		op := &ops[i]
		if err := s.with(op.Key, &op.Bucket, now, func(st keyState) {
			st.refund(&op.Bucket, op.Cost, op.At, now)
		}); err != nil {
			return err
		}
	}
	return nil
}

// Own implements Owning (see own.go and tokenbucket_own.go). An acquire
// refused for open leases has a RetryAfter until the last of them ends, at
// most one lease TTL. The idle sweep keeps a bucket while it is owned.
func (s *MemoryStore) Own(ctx context.Context, ops []OwnOp) ([]OwnOutcome, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	now := s.now().UnixMicro()
	out := make([]OwnOutcome, len(ops))
	for i := range ops {
		op := &ops[i]
		if algName(&op.Bucket) != TokenBucket {
			out[i].Err = ErrNotOwnable
			continue
		}
		if err := op.check(); err != nil {
			out[i].Err = err
			continue
		}
		if err := s.with(op.Key, &op.Bucket, now, func(st keyState) {
			out[i] = st.(*tbState).own(&op.Bucket, op, op.releaseLevel(), now)
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// State implements Store. A key the store does not hold is a full bucket.
func (s *MemoryStore) State(ctx context.Context, key string, b Bucket) (BucketState, error) {
	if err := s.check(ctx); err != nil {
		return BucketState{}, err
	}
	nowT := s.now()
	now := nowT.UnixMicro()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st, ok := sh.m[memKey{key, algName(&b)}]
	if !ok {
		a, err := algorithmOf(&b)
		if err != nil {
			return BucketState{}, err
		}
		st = a.newState(&b, now)
	}
	bs := st.snapshot(&b, now)
	bs.Now = nowT
	return bs, nil
}

// Len returns the number of buckets the store holds, idle ones not yet
// swept included.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Ping implements Store; it fails only after Close.
func (s *MemoryStore) Ping(ctx context.Context) error { return s.check(ctx) }

// IDKey implements IDKeyStore: a random key of this store, made with it.
func (s *MemoryStore) IDKey(context.Context) ([]byte, error) { return s.idKey, nil }

// Close implements Store: it stops the sweeper. Later calls fail with
// ErrClosed.
func (s *MemoryStore) Close() error {
	s.once.Do(func() { close(s.closed) })
	s.swept.Wait()
	return nil
}

// maxDelayOf returns op's MaxDelay, −1 when it has none.
func maxDelayOf(op *TakeOp) time.Duration {
	if op.MaxDelay == nil {
		return -1
	}
	return max(*op.MaxDelay, 0)
}
