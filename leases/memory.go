package leases

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryOptions configure a MemoryStore. The zero value is ready to use.
type MemoryOptions struct {
	// Now is the store's clock; nil means time.Now. Tests set it to drive
	// time by hand.
	Now func() time.Time
}

const memoryShards = 64

// MemoryStore is a Store that keeps every bucket in this process. It is the
// store of a single lease server: buckets are not shared with other servers
// and are lost on restart (which is safe: a fresh bucket is full, and every
// lease granted before the restart expires by its TTL).
//
// It is safe for concurrent use. Keys are spread over shards, each with its
// own mutex, so operations on different keys rarely contend. Buckets that
// are full and hold no lease are dropped as the store is used (one shard at
// a time, the cost spread over the operations), so memory follows the active
// keys.
type MemoryStore struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [memoryShards]memShard
	closed chan struct{}
	once   sync.Once

	sinceSweep atomic.Int64 // operations since the last sweep
	sweepMu    sync.Mutex   // held by the sweeper
	nextSweep  int          // shard swept next, under sweepMu
}

type memShard struct {
	mu sync.Mutex
	m  map[string]*tbState
	_  [48]byte // keep shards on separate cache lines
}

// ErrClosed is returned, wrapped with ErrStoreUnavailable, by a store used
// after Close.
var ErrClosed = errors.New("store closed")

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore(opts MemoryOptions) *MemoryStore {
	s := &MemoryStore{now: opts.Now, seed: maphash.MakeSeed(), closed: make(chan struct{})}
	if s.now == nil {
		s.now = time.Now
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*tbState)
	}
	return s
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

// with runs fn on key's state under the shard lock, creating the state when
// missing, and sweeps idle buckets of the shard from time to time.
func (s *MemoryStore) with(key string, b *Bucket, now int64, fn func(*tbState)) {
	sh := s.shard(key)
	sh.mu.Lock()
	st, ok := sh.m[key]
	if !ok {
		st = newTBState(b, now)
		sh.m[key] = st
	}
	fn(st)
	sh.mu.Unlock()
	s.maybeSweep(now)
}

// sweepEvery is the least number of operations between two shard sweeps.
const sweepEvery = 256

// maybeSweep drops the idle buckets of one shard, the shards taken in turn,
// once at least sweepEvery operations and at least as many operations as
// the shard holds buckets have run since the last sweep. A sweep's cost is
// thus spread over as many operations as it scans buckets: O(1) per
// operation, and with no background goroutine.
func (s *MemoryStore) maybeSweep(now int64) {
	if s.sinceSweep.Add(1) < sweepEvery || !s.sweepMu.TryLock() {
		return
	}
	defer s.sweepMu.Unlock()
	sh := &s.shards[s.nextSweep]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.sinceSweep.Load() < int64(len(sh.m)) {
		return
	}
	for k, st := range sh.m {
		if st.idle(now) {
			delete(sh.m, k)
		}
	}
	s.nextSweep = (s.nextSweep + 1) % memoryShards
	s.sinceSweep.Store(0)
}

// Lease implements Store.
func (s *MemoryStore) Lease(ctx context.Context, owner string, ops []LeaseOp) ([]LeaseOutcome, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	now := s.now().UnixMicro()
	out := make([]LeaseOutcome, len(ops))
	for i := range ops {
		op := &ops[i]
		s.with(op.Key, &op.Bucket, now, func(st *tbState) {
			out[i] = st.lease(&op.Bucket, owner, op, now)
		})
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
		s.with(op.Key, &op.Bucket, now, func(st *tbState) {
			out[i] = st.take(&op.Bucket, op.Cost, now)
		})
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
		s.with(op.Key, &op.Bucket, now, func(st *tbState) {
			st.refund(&op.Bucket, op.Cost, now)
		})
	}
	return nil
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
	st, ok := sh.m[key]
	if !ok {
		return BucketState{Level: float64(b.Burst), Now: nowT}, nil
	}
	cp := *st
	cp.leases = append([]openLease(nil), st.leases...)
	cp.reap(now)
	cp.refill(&b, now)
	return BucketState{Level: cp.level, Outstanding: cp.out, Leases: len(cp.leases), Now: nowT}, nil
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

// Close implements Store. Later calls fail with ErrClosed.
func (s *MemoryStore) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}
