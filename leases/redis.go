package leases

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every algorithm's script begins with what they all share (the clock, the
// formatting of numbers, the bookkeeping of the holders of the open leases:
// lease_common.lua), followed by the algorithm's own (see algorithms).
//
//go:embed scripts/lease_common.lua
var leaseCommonLua string

//go:embed scripts/token_bucket.lua
var tokenBucketLua string

// The window algorithms' scripts are the shared lease bookkeeping
// (lease_common.lua, window_leases.lua) followed by the algorithm's body.
var (
	//go:embed scripts/window_leases.lua
	windowLeasesLua string
	//go:embed scripts/fixed_window.lua
	fixedWindowLua string
	//go:embed scripts/sliding_window_log.lua
	slidingWindowLogLua string
)

//go:embed scripts/leaky_bucket.lua
var leakyBucketLua string

// RedisOptions configure a RedisStore. The zero value is ready to use.
type RedisOptions struct {
	// Now, when set, replaces Redis TIME as the clock of every operation.
	// It exists for deterministic tests only: with several lease servers
	// the buckets must share one clock, and Redis TIME is that clock.
	Now func() time.Time
	// NoEviction says Redis runs with maxmemory-policy noeviction, so no
	// key of a bucket is ever lost apart from the others. The store then
	// skips the check for a bucket hash lost while its expiry index holds
	// leases, one command for each new bucket. Leave it false unless the
	// policy is known (rateleased sets it from CONFIG GET at start).
	NoEviction bool
	// PartialWindow applies to a Redis Cluster only. A call every op of
	// which failed is taken as a failure of those keys' nodes alone, each
	// op failing in its outcome (see Store.Lease), when the cluster serves
	// other keys: some op of the store ran within PartialWindow, or a
	// master answered CLUSTER INFO with cluster_state:ok within it, the
	// store asking them when it must (within partialPing). Otherwise, and
	// always on a single node, the call fails whole, as the store is down:
	// so it does once the cluster has declared a node failed and stops
	// serving (cluster_state:fail, under cluster-require-full-coverage
	// yes, Redis's default). Zero means 100 ms; a negative value never
	// takes a call's failure as partial.
	PartialWindow time.Duration
}

// defaultPartialWindow is RedisOptions.PartialWindow's default.
const defaultPartialWindow = 100 * time.Millisecond

// partialPing bounds the CLUSTER INFO of the masters that tells a Redis
// Cluster with a node down from one that is down (see clusterServes).
const partialPing = 100 * time.Millisecond

// RedisStore is a Store that keeps buckets and leases in Redis, so any
// number of lease servers can share them. It takes a redis.UniversalClient:
// a single node, Sentinel (failover) and Cluster are all configuration.
//
// Every operation on a key runs as one Lua script (one per algorithm:
// scripts/lease_common.lua, the holders' bookkeeping every algorithm
// shares, followed by scripts/<algorithm>.lua; embedded) under EVALSHA,
// atomically, with the time taken from Redis TIME.
// A bucket with no lease open is a string (rl:{key}: its level and refill
// clock, and the ownership while a lease server owns it, written with its
// TTL in one SET PX, as a per-request limiter writes); with leases open it is a hash that holds the level, the refill
// clock, the open leases and the sums and counts derived from them, plus,
// beyond 16 leases, a sorted set indexing them by expiry (rl:{key}:z), and,
// while the key is shared, a sorted set of fair-share clocks (rl:{key}:s). All
// carry the same hash tag, so a script touches one slot and the store runs
// unchanged on Redis Cluster. A call for many keys is one pipelined round
// trip per Redis node. The keys expire once every open lease has ended and
// the bucket would be full again, so Redis memory follows the active keys.
//
// Give the store a client that does not retry commands (MaxRetries −1, and
// for a Redis Cluster MaxRedirects −1 too, as rateleased does): a script
// whose answer timed out may have run, and running it again applies it
// twice. For most operations that errs on the side of the limit (a second
// grant nobody spends, a second take), but a refund applied twice gives
// back tokens that were never taken (TestRedisClusterStalledRefundOnce: a
// cluster client bounds its tries by MaxRedirects, not MaxRetries, and
// sends a command that timed out again).
//
// A script reads a bucket with the command that fits its usual type first
// (GET for a take, HMGET for a lease); on the other type Redis answers
// WRONGTYPE, which the script handles, but which Redis counts in its error
// statistics (errorstat_WRONGTYPE, failed_calls): that count is expected,
// not a fault.
//
// The layout of a bucket is not versioned: run one version of the store
// against a Redis at a time (stop the old lease servers before starting
// new ones, or let the buckets expire); servers of two versions sharing a
// Redis can each admit a limit's worth.
//
// Redis must not evict these keys: run it with maxmemory-policy noeviction
// and with persistence. The script still never rebuilds a lost part as a
// full bucket that forgets open leases (see the script's header), but a
// bucket lost whole, or a Redis restarted without its data, is a full bucket
// again and can admit one extra burst.
type RedisStore struct {
	rdb        redis.UniversalClient
	scripts    map[Algorithm]*redis.Script
	now        func() time.Time
	noEviction string                 // the script's ARGV[16]; ARGV[17] is the op's Floor
	idKey      atomic.Pointer[[]byte] // see IDKey; nil until read
	// partial is RedisOptions.PartialWindow on a Redis Cluster, else
	// negative; ranAt is when an op last ran, servesAt when a master last
	// said the cluster serves (see othersAnswer), as mono returns them (0:
	// never).
	partial  time.Duration
	epoch    time.Time
	ranAt    atomic.Int64
	servesAt atomic.Int64
}

// NewRedisStore returns a store over rdb. The caller keeps ownership of rdb:
// Close does not close it.
func NewRedisStore(rdb redis.UniversalClient, opts RedisOptions) *RedisStore {
	s := &RedisStore{rdb: rdb, scripts: make(map[Algorithm]*redis.Script, len(algorithms)), now: opts.Now, noEviction: "0", partial: -1, epoch: time.Now()}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		s.partial = cmp.Or(opts.PartialWindow, defaultPartialWindow)
	}
	for name, a := range algorithms {
		s.scripts[name] = redis.NewScript(a.script)
	}
	if opts.NoEviction {
		s.noEviction = "1"
	}
	return s
}

// RedisKeys returns the Redis keys of key's bucket: the bucket hash, the
// expiry index and the fair-share clocks. All carry one hash tag. A key
// containing '}' would end the tag early (and "}x" would give an empty tag,
// which Redis ignores), so such keys are tagged with a hash of the key
// instead; the full key still follows, so names never collide.
func RedisKeys(key string) (bucket, expiries, shares string) {
	var base string
	if strings.IndexByte(key, '}') < 0 {
		base = "rl:{" + key + "}"
	} else {
		h := fnv.New64a()
		h.Write([]byte(key))
		base = fmt.Sprintf("rl:{h%016x}%s", h.Sum64(), key)
	}
	return base, base + ":z", base + ":s"
}

// AlgorithmRedisKeys returns the Redis keys of key's state under algorithm
// a: those of RedisKeys for token_bucket, and for the others the same names
// with the algorithm's tag after the hash tag ("rl:{user:1}:fw",
// "rl:{user:1}:fw:z", ...), so that a rule changing algorithm never reads
// another algorithm's state.
func AlgorithmRedisKeys(key string, a Algorithm) (bucket, second, third string) {
	b, z, sh := RedisKeys(key)
	alg, ok := algorithms[a]
	if !ok || alg.tag == "" {
		return b, z, sh
	}
	b += ":" + alg.tag
	return b, b + ":z", b + ":s"
}

func redisKeyList(key string, a Algorithm) []string {
	b, z, sh := AlgorithmRedisKeys(key, a)
	return []string{b, z, sh}
}

func (s *RedisStore) nowArg() string {
	if s.now == nil {
		return ""
	}
	return strconv.FormatInt(s.now().UnixMicro(), 10)
}

func bucketArgs(mode, now string, b *Bucket) []any {
	return []any{mode, now, b.Limit, b.Period.Microseconds(), b.Burst, b.LeaseTTL.Microseconds()}
}

// noOwner are the script's arguments 7 to 15 for the modes without one.
var noOwner = []any{"", "", 0, "", 0, "", 0, 0, 0}

// run evaluates one script call per element of args in one pipeline, then
// retries with EVAL the calls that failed with NOSCRIPT (after a Redis
// restart or SCRIPT FLUSH); a NOSCRIPT call did not run, so the retry is
// safe.
//
// It fails whole (an error wrapping ErrStoreUnavailable) only when every
// call failed: Redis is down, or, on a Redis Cluster, every node (see
// RedisOptions.PartialWindow). When some
// calls failed and others ran (one node of a cluster down, its slots
// unserved until a failover), it returns the commands, each with its own
// error, and the caller fails those operations alone (see cmdFailed): the
// keys on the other nodes are decided as usual.
func (s *RedisStore) run(ctx context.Context, algs []Algorithm, keys [][]string, args [][]any) ([]*redis.Cmd, error) {
	scripts := make([]*redis.Script, len(args))
	for i, a := range algs {
		if a == "" {
			a = TokenBucket
		}
		if scripts[i] = s.scripts[a]; scripts[i] == nil {
			return nil, fmt.Errorf("leases: algorithm %q: %w", a, ErrAlgorithmNotImplemented)
		}
	}
	cmds := make([]*redis.Cmd, len(args))
	if len(args) == 1 {
		// One call, the common direct take: a command of its own costs
		// less than a pipeline of one (go-redis's pipelines have their
		// own pool and bookkeeping). Run is EVALSHA, and EVAL when Redis
		// does not have the script (NOSCRIPT).
		cmds[0] = scripts[0].Run(ctx, s.rdb, keys[0], args[0]...)
		return s.ran(ctx, cmds, cmds[0].Err())
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range args {
			cmds[i] = scripts[i].EvalSha(ctx, p, keys[i], args[i]...)
		}
		return nil
	})
	if err != nil {
		var retry []int
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				retry = append(retry, i)
			}
		}
		if len(retry) > 0 {
			_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, i := range retry {
					cmds[i] = scripts[i].Eval(ctx, p, keys[i], args[i]...)
				}
				return nil
			})
		}
	}
	return s.ran(ctx, cmds, err)
}

// ran returns run's result for cmds, which failed with err (nil when each
// ran): the commands, each with its own error, when some ran, or when none
// did but the failure is taken as partial (RedisOptions.PartialWindow);
// otherwise err, wrapping ErrStoreUnavailable.
func (s *RedisStore) ran(ctx context.Context, cmds []*redis.Cmd, err error) ([]*redis.Cmd, error) {
	if err != nil {
		for _, c := range cmds {
			if RereadSlots(s.rdb, c.Err()) {
				break
			}
		}
	}
	if err == nil || slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return cmdFailed(c) == nil }) {
		if s.partial >= 0 {
			s.ranAt.Store(s.mono()) // a clock read per call, on a cluster only
		}
		return cmds, nil
	}
	if s.partial >= 0 && ctx.Err() == nil && s.othersAnswer(ctx) {
		// Other nodes answer (a Redis Cluster node is down, its slots
		// unserved until a failover): these keys fail alone.
		return cmds, nil
	}
	return nil, unavailable(err)
}

// ServesOthers reports whether the store serves other keys than those
// an op of which just failed: false on a single node (Redis failing is the
// store failing); on a Redis Cluster, whether an op ran within
// RedisOptions.PartialWindow or a master says cluster_state:ok. The Engine
// asks it when the overrides of some keys could not be looked up (see
// OverridesUnavailableError): with the node that holds them down, those
// keys fail alone.
func (s *RedisStore) ServesOthers(ctx context.Context) bool {
	return s.partial >= 0 && s.othersAnswer(ctx)
}

// mono returns the time since the store was made, plus one (0 is never).
func (s *RedisStore) mono() int64 { return int64(time.Since(s.epoch)) + 1 }

// othersAnswer reports whether the cluster serves, though not the failed
// call's keys (see RedisOptions.PartialWindow): an op ran within the
// window, or a master says so now (see clusterServes).
func (s *RedisStore) othersAnswer(ctx context.Context) bool {
	now := s.mono()
	if at := s.ranAt.Load(); at != 0 && now-at <= int64(s.partial) {
		return true
	}
	if at := s.servesAt.Load(); at != 0 && now-at <= int64(s.partial) {
		return true
	}
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok || !clusterServes(ctx, cc, partialPing) {
		return false
	}
	s.servesAt.Store(s.mono())
	return true
}

// probeKeys are keys spread over the hash slots: the masters of their
// slots, from the client's map of the slots, are the ones clusterServes
// asks. One that answers is enough; 64 keys reach every master of three
// and about 26 of 30.
var probeKeys = func() (keys [64]string) {
	for i := range keys {
		keys[i] = "rl:probe:" + strconv.Itoa(i)
	}
	return keys
}()

// clusterServes reports whether a master of cc answers CLUSTER INFO with
// cluster_state:ok, within limit when it is positive. With one node down,
// the others say ok until the cluster declares the node failed, and for
// good with cluster-require-full-coverage no; once it has declared it failed under
// the default (yes), they say fail, and refuse every key (CLUSTERDOWN): the
// store is down, not some keys. The masters come from the client's map of
// the slots as it stands: ForEachMaster would read the map from a node
// first, maybe the one that hangs, and spend the whole budget there.
func clusterServes(ctx context.Context, cc *redis.ClusterClient, limit time.Duration) bool {
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	masters := map[string]*redis.Client{}
	for _, k := range probeKeys {
		if m, err := cc.MasterForKey(ctx, k); err == nil {
			masters[m.Options().Addr] = m
		}
	}
	served := make(chan bool, len(masters))
	for _, m := range masters {
		go func() {
			info, err := m.ClusterInfo(ctx).Result()
			served <- err == nil && strings.Contains(info, "cluster_state:ok")
		}()
	}
	for range masters {
		if <-served {
			return true
		}
	}
	return false
}

// RereadSlots has rdb, when it is a Redis Cluster client, read its map of
// the slots again (lazily, at most every 200 ms) when err came without an
// answer from Redis (a connection refused or reset, a timeout), not with a
// Redis error reply; it reports whether it did. A node that did not answer
// may have been failed over to another, which a dead node never says
// (MOVED): go-redis reads the slots again on MOVED only, else once a
// minute, and a moved slot's keys would fail for that long, not for about
// a round trip. RedisStore does it for its commands; rateleased's rule
// database for its reads.
func RereadSlots(rdb redis.UniversalClient, err error) bool {
	cc, ok := rdb.(*redis.ClusterClient)
	if _, reply := errors.AsType[redis.Error](err); !ok || err == nil || reply {
		return false
	}
	cc.ReloadState(context.Background())
	return true
}

// cmdFailed returns the error of a command of run's pipeline that failed on
// its own (its node did not answer, or answered with an error), wrapping
// ErrStoreUnavailable, or nil when it ran.
func cmdFailed(c *redis.Cmd) error {
	if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return unavailable(err)
	}
	return nil
}

func unavailable(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("redis: %w (%w)", ErrStoreUnavailable, err)
	}
	return fmt.Errorf("redis: %w: %w", ErrStoreUnavailable, err)
}

func ints(cmd *redis.Cmd, n int) ([]int64, error) {
	vals, err := cmd.Int64Slice()
	if err != nil {
		return nil, unavailable(err)
	}
	if len(vals) < n {
		return nil, fmt.Errorf("redis: %w: script returned %d values, want %d", ErrStoreUnavailable, len(vals), n)
	}
	return vals, nil
}

// Lease implements Store.
func (s *RedisStore) Lease(ctx context.Context, owner Owner, ops []LeaseOp) ([]LeaseOutcome, error) {
	now := s.nowArg()
	keys := make([][]string, len(ops))
	args := make([][]any, len(ops))
	algs := make([]Algorithm, len(ops))
	for i := range ops {
		op := &ops[i]
		algs[i] = op.Bucket.Algorithm
		keys[i] = redisKeyList(op.Key, algs[i])
		args[i] = append(bucketArgs("lease", now, &op.Bucket), owner.Client, owner.Process, op.Want, op.LeaseID, op.Used, op.NewLeaseID, op.Slot,
			op.Limits.maxLeases(), op.Limits.maxProcesses(), s.noEviction, op.Floor, op.MaxDelay.Microseconds())
	}
	cmds, err := s.run(ctx, algs, keys, args)
	if err != nil {
		return nil, err
	}
	out := make([]LeaseOutcome, len(ops))
	for i, c := range cmds {
		if err := cmdFailed(c); err != nil {
			// This key's node failed (see run): the op did not run, or
			// ran without its answer; nothing is granted, and a lease it
			// settled or replaced expires by its TTL, counted as spent.
			out[i] = LeaseOutcome{Err: err}
			continue
		}
		v, err := ints(c, 7)
		if err != nil {
			return nil, err
		}
		o := LeaseOutcome{Expired: int(v[6])}
		switch v[0] {
		case 0:
			o.Granted = v[1]
			if o.Granted > 0 {
				o.LeaseID = ops[i].NewLeaseID
				o.TTL = ops[i].Bucket.LeaseTTL
				if len(v) >= 10 {
					// The lease's own TTL (µs), when the algorithm sets it:
					// a window's end, a leaky bucket's slice.
					o.TTL = time.Duration(v[9]) * time.Microsecond
				}
			}
			o.RetryAfter = time.Duration(v[2]) * time.Millisecond
			if v[2] < 0 {
				o.RetryAfter = -1 // never, under this floor
			}
			o.Remaining = v[3]
			o.Holders = int(v[4])
			o.Settled = v[5] == 1
			o.Owned = len(v) >= 11 && v[10] == 1
			if len(v) >= 9 {
				o.Reset = time.Duration(v[7]) * time.Millisecond
				o.Delay = time.Duration(v[8]) * time.Millisecond
			}
		case 1:
			o.Err = ErrUnknownLease
		case 2:
			o.Err = ErrUsedExceedsGranted
		case 3:
			o.Err = ErrTooManyLeases
		default:
			return nil, fmt.Errorf("redis: %w: script returned status %d", ErrStoreUnavailable, v[0])
		}
		out[i] = o
	}
	return out, nil
}

// runTake runs the script in mode take or refund for each op.
func (s *RedisStore) runTake(ctx context.Context, mode string, ops []TakeOp) ([]*redis.Cmd, error) {
	now := s.nowArg()
	keys := make([][]string, len(ops))
	args := make([][]any, len(ops))
	algs := make([]Algorithm, len(ops))
	for i := range ops {
		op := &ops[i]
		algs[i] = op.Bucket.Algorithm
		keys[i] = redisKeyList(op.Key, algs[i])
		maxDelay := int64(-1)
		if d := maxDelayOf(op); d >= 0 {
			maxDelay = d.Microseconds()
		}
		server := noOwner[0]
		if mode == "take" && algs[i] == TokenBucket {
			server = op.Server // ARGV[7]: the taker (TakeOp.Server)
		}
		args[i] = append(append(bucketArgs(mode, now, &op.Bucket), server, noOwner[1]), op.Cost, op.At, maxDelay)
		args[i] = append(append(args[i], noOwner[5:]...), s.noEviction, op.Floor)
	}
	return s.run(ctx, algs, keys, args)
}

// Take implements Store.
func (s *RedisStore) Take(ctx context.Context, ops []TakeOp) ([]TakeOutcome, error) {
	cmds, err := s.runTake(ctx, "take", ops)
	if err != nil {
		return nil, err
	}
	out := make([]TakeOutcome, len(ops))
	for i, c := range cmds {
		if err := cmdFailed(c); err != nil {
			// This key's node failed (see run): nothing is taken as far
			// as the caller knows (tokens the op took without its answer
			// count toward the limit: the safe side).
			out[i] = TakeOutcome{Err: err}
			continue
		}
		v, err := ints(c, 4)
		if err != nil {
			return nil, err
		}
		out[i] = TakeOutcome{Taken: v[0] == 1, Remaining: v[2], Expired: int(v[3])}
		if len(v) >= 6 {
			out[i].Reset = time.Duration(v[4]) * time.Millisecond
			out[i].Delay = time.Duration(v[5]) * time.Millisecond
		}
		if len(v) >= 7 {
			out[i].At = v[6]
		}
		out[i].Owned = len(v) >= 8 && v[7] >= 1
		out[i].OwnedByServer = len(v) >= 8 && v[7] == 2
		if v[1] < 0 {
			out[i].RetryAfter = -1
		} else {
			out[i].RetryAfter = time.Duration(v[1]) * time.Millisecond
		}
	}
	return out, nil
}

// Refund implements Store.
func (s *RedisStore) Refund(ctx context.Context, ops []TakeOp) error {
	cmds, err := s.runTake(ctx, "refund", ops)
	if err != nil {
		return err
	}
	for _, c := range cmds {
		if err := cmdFailed(c); err != nil {
			return err
		}
	}
	return nil
}

// State implements Store. The script answers {level, outstanding, open
// leases, now µs, holders, free, next ms, full ms, window end ms} without
// writing anything.
func (s *RedisStore) State(ctx context.Context, key string, b Bucket) (BucketState, error) {
	cmds, err := s.run(ctx, []Algorithm{b.Algorithm}, [][]string{redisKeyList(key, b.Algorithm)}, [][]any{append(append(bucketArgs("state", s.nowArg(), &b), noOwner...), s.noEviction)})
	if err != nil {
		return BucketState{}, err
	}
	vals, err := cmds[0].Slice()
	if err != nil || len(vals) < 9 || len(vals) > 10 {
		return BucketState{}, fmt.Errorf("redis: %w: bad state reply %v: %v", ErrStoreUnavailable, vals, err)
	}
	lvl, _ := strconv.ParseFloat(fmt.Sprint(vals[0]), 64)
	nowUs, _ := strconv.ParseInt(fmt.Sprint(vals[3]), 10, 64)
	n := make([]int64, 9)
	for _, i := range []int{1, 2, 4, 5, 6, 7, 8} {
		n[i], _ = vals[i].(int64)
	}
	ms := func(i int) time.Duration { return time.Duration(n[i]) * time.Millisecond }
	st := BucketState{
		Level: lvl, Outstanding: n[1], Leases: int(n[2]), Holders: int(n[4]), Free: n[5],
		Next: ms(6), Full: ms(7), WindowEnd: ms(8), Now: time.UnixMicro(nowUs),
	}
	if len(vals) == 10 {
		st.Owner = fmt.Sprint(vals[9]) // an owned token bucket
	}
	return st, nil
}

// nodeOf names the master that serves key's bucket on a Redis Cluster, as
// the client's map of the slots has it (see OwningStore.send); "" on a
// single Redis, or when the map cannot be had.
func (s *RedisStore) nodeOf(ctx context.Context, key string) string {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	h, _, _ := RedisKeys(key)
	m, err := cc.MasterForKey(ctx, h)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// Own implements Owning: the script's modes own and release (see the
// header of scripts/token_bucket.lua for where the ownership is kept). A
// direct take on a bucket nobody owns costs what it always did; a take or
// a grant refused because the bucket is owned writes at most one SET, to
// mark the ownership contested. An acquire refused for open leases has a
// RetryAfter until the last of them ends, at most one lease TTL.
func (s *RedisStore) Own(ctx context.Context, ops []OwnOp) ([]OwnOutcome, error) {
	now := s.nowArg()
	out := make([]OwnOutcome, len(ops))
	var at []int // the ops the script runs
	var keys [][]string
	var args [][]any
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
		mode, level := "own", ""
		if op.Release {
			mode, level = "release", formatLevel(op.releaseLevel())
		}
		at = append(at, i)
		keys = append(keys, redisKeyList(op.Key, TokenBucket))
		// ARGV[10] the op's ID, ARGV[11] "1" for a renewal, ARGV[12] the
		// lost IDs, space-separated.
		renew := ""
		if op.Renew && !op.Release {
			renew = "1"
		}
		a := append(bucketArgs(mode, now, &op.Bucket), op.Server, "", level, op.ID, renew, strings.Join(op.Lost, " "))
		args = append(args, append(append(a, noOwner[6:]...), s.noEviction))
	}
	if len(at) == 0 {
		return out, nil
	}
	cmds, err := s.run(ctx, make([]Algorithm, len(at)), keys, args)
	if err != nil {
		return nil, err
	}
	for j, c := range cmds {
		if err := cmdFailed(c); err != nil {
			// This key's node failed (see run): the others' ops ran,
			// and an acquisition that ran is this server's (failing them
			// all had the store refuse their takes as owned, while this
			// server decided them by the store: a failure answered as a
			// rate limit, TestRedisClusterOwnOneNodeDown).
			out[at[j]].Err = err
			continue
		}
		vals, err := c.Slice()
		if err != nil || len(vals) != 7 {
			return nil, fmt.Errorf("redis: %w: bad own reply %v: %v", ErrStoreUnavailable, vals, err)
		}
		n := make([]int64, 6)
		for _, k := range []int{0, 1, 3, 4, 5} {
			n[k], _ = vals[k].(int64)
		}
		lvl, _ := strconv.ParseFloat(fmt.Sprint(vals[2]), 64)
		id, _ := vals[6].(string)
		o := OwnOutcome{Owned: n[0] == 1, Acquired: n[1] == 1, Level: lvl, At: n[3], Contested: n[4] == 1,
			RetryAfter: time.Duration(n[5]) * time.Millisecond}
		if o.Owned {
			o.ID = id
		}
		if o.Owned {
			o.TTL = ops[at[j]].Bucket.LeaseTTL
		}
		out[at[j]] = o
	}
	return out, nil
}

// Ping implements Store.
//
// On a Redis Cluster it succeeds when the cluster serves (a master answers
// CLUSTER INFO with cluster_state:ok, see clusterServes), though a node may
// be down: the store then serves the other nodes' keys (see
// RedisOptions.PartialWindow). A PING went to one node at random, and
// failed a third of the time with one node of three down (with no
// redirection, as rateleased runs a cluster client).
func (s *RedisStore) Ping(ctx context.Context) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		if !clusterServes(ctx, cc, 0) {
			return fmt.Errorf("redis: %w: no master says the cluster serves (cluster_state:ok)", ErrStoreUnavailable)
		}
		return nil
	}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return unavailable(err)
	}
	return nil
}

// Close implements Store. It does not close the Redis client.
func (s *RedisStore) Close() error { return nil }

// redisIDKey is the Redis key that holds the key of the lease IDs of shadow
// and elastic rules (see IDKeyStore). Every key of a bucket has a hash tag,
// so no bucket's key is this one.
const redisIDKey = "rl:lease-id-key"

// IDKey implements IDKeyStore: the key kept in Redis under
// "rl:lease-id-key", written by the first server that asks for it (SET NX)
// and read once per store. A Redis that lost its data lost the buckets and
// their leases too; servers that read the key before then keep it until
// they restart, and an ID that one of them signed is then unknown to the
// others, which errs toward the limit.
func (s *RedisStore) IDKey(ctx context.Context) ([]byte, error) {
	if k := s.idKey.Load(); k != nil {
		return *k, nil
	}
	if err := s.rdb.SetNX(ctx, redisIDKey, hex.EncodeToString(newIDKey()), 0).Err(); err != nil {
		return nil, unavailable(err)
	}
	v, err := s.rdb.Get(ctx, redisIDKey).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if len(v) < 32 {
		return nil, fmt.Errorf("redis: %w: %s holds %d bytes, not a key of 32 or more", ErrStoreUnavailable, redisIDKey, len(v))
	}
	k := []byte(v)
	s.idKey.CompareAndSwap(nil, &k)
	return *s.idKey.Load(), nil
}
