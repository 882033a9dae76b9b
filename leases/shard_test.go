package leases_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failFastClient returns a client of cl made as rateleased makes it
// (server/cmd/rateleased, redisFailFast.apply): 500 ms timeouts, the
// context's deadline honoured, one dial attempt, and no second try of a
// command that may have run, neither a retry nor a redirection. A client
// with go-redis's defaults took 3.3 s to give up on a dead node, and sent
// a script that timed out again (see TestRedisClusterStalledRefundOnce).
func failFastClient(t *testing.T, cl *redistest.Cluster) *redis.ClusterClient {
	t.Helper()
	const ff = 500 * time.Millisecond
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1, MaxRedirects: -1, DialerRetries: 1, MaxRetryBackoff: 100 * time.Millisecond,
		DialTimeout: ff, ReadTimeout: ff, WriteTimeout: ff, PoolTimeout: ff, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// shardSetup starts a three-node cluster and a store over a client made
// as rateleased makes it, finds a key on each node and takes a token of
// each (so that the client knows the slots). The bucket b refills slowly
// enough that a test can count what it takes.
func shardSetup(t *testing.T) (cl *redistest.Cluster, rdb *redis.ClusterClient, keys []string, store *leases.RedisStore, b leases.Bucket) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl = redistest.StartCluster(t, 3)
	rdb = failFastClient(t, cl)
	keys = keysByNode(t, rdb, 3)
	store = leases.NewRedisStore(rdb, leases.RedisOptions{})
	b = leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Hour, Burst: 100, LeaseTTL: 2 * time.Second}
	ops := make([]leases.TakeOp, len(keys))
	for i, k := range keys {
		ops[i] = leases.TakeOp{Key: k, Bucket: b, Cost: 1}
	}
	_, err := store.Take(context.Background(), ops)
	require.NoError(t, err)
	return cl, rdb, keys, store, b
}

// keysByNode returns one key per node of a cluster of n masters started by
// redistest.StartCluster (node i serves the i-th n-th of the slots).
func keysByNode(t *testing.T, rdb *redis.ClusterClient, n int) []string {
	t.Helper()
	out := make([]string, n)
	found := 0
	for i := 0; found < n; i++ {
		require.Less(t, i, 1000, "no key found on every node")
		k := fmt.Sprintf("user:%d", i)
		h, _, _ := leases.RedisKeys(k)
		slot, err := rdb.ClusterKeySlot(context.Background(), h).Result()
		require.NoError(t, err)
		if node := int(slot) * n / 16384; out[node] == "" {
			out[node] = k
			found++
		}
	}
	return out
}

// TestRedisClusterShardDown: with one master of a Redis Cluster down (its
// slots unserved until a failover), a call whose keys are on several
// shards fails for the dead shard's keys only: the others are granted and
// taken as before, and the dead shard's ops fail alone with
// ErrStoreUnavailable. So do the ops of a call with none but the dead
// shard's keys, while other nodes answer (see RedisOptions.PartialWindow);
// with a negative window, or every node down, such a call fails whole, as
// when the store is down. Ping succeeds while a master answers.
func TestRedisClusterShardDown(t *testing.T) {
	cl, rdb, keys, store, b := shardSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	cl.Nodes[2].Kill(t)

	owner := leases.Owner{Client: "c", Process: "p"}
	ops := make([]leases.LeaseOp, 3)
	for i, k := range keys {
		ops[i] = leases.LeaseOp{Key: k, Bucket: b, Want: 5, NewLeaseID: leases.NewLeaseID()}
	}
	t0 := time.Now()
	outs, err := store.Lease(ctx, owner, ops)
	t.Logf("a lease call with a node down took %v", time.Since(t0))
	require.NoError(t, err, "two shards of three answer")
	require.Len(t, outs, 3)
	for i := range 2 {
		require.NoError(t, outs[i].Err, keys[i])
		require.EqualValues(t, 5, outs[i].Granted, keys[i])
	}
	require.ErrorIs(t, outs[2].Err, leases.ErrStoreUnavailable)
	require.Zero(t, outs[2].Granted)

	takes := make([]leases.TakeOp, 3)
	for i, k := range keys {
		takes[i] = leases.TakeOp{Key: k, Bucket: b, Cost: 2}
	}
	t0 = time.Now()
	touts, err := store.Take(ctx, takes)
	t.Logf("a take call with a node down took %v", time.Since(t0))
	require.NoError(t, err, "two shards of three answer")
	require.Len(t, touts, 3)
	for i := range 2 {
		require.NoError(t, touts[i].Err, keys[i])
		require.True(t, touts[i].Taken, keys[i])
	}
	require.ErrorIs(t, touts[2].Err, leases.ErrStoreUnavailable)
	require.False(t, touts[2].Taken)

	// The dead shard's keys alone, while the other nodes answer: the ops
	// fail, not the call; the others answered ops a moment ago, or (a
	// window too short for that) a PING.
	brief := leases.NewRedisStore(rdb, leases.RedisOptions{PartialWindow: time.Nanosecond})
	for _, st := range []*leases.RedisStore{store, brief} {
		outs, err = st.Lease(ctx, owner, ops[2:])
		require.NoError(t, err, "the other nodes answer")
		require.ErrorIs(t, outs[0].Err, leases.ErrStoreUnavailable)
		touts, err = st.Take(ctx, takes[2:])
		require.NoError(t, err, "the other nodes answer")
		require.ErrorIs(t, touts[0].Err, leases.ErrStoreUnavailable)
	}

	// A store that never takes a failure as partial fails the call.
	strict := leases.NewRedisStore(rdb, leases.RedisOptions{PartialWindow: -1})
	_, err = strict.Take(ctx, takes[:1])
	require.NoError(t, err)
	_, err = strict.Lease(ctx, owner, ops[2:])
	require.ErrorIs(t, err, leases.ErrStoreUnavailable, "the dead shard's keys alone")
	_, err = strict.Take(ctx, takes[2:])
	require.ErrorIs(t, err, leases.ErrStoreUnavailable, "the dead shard's keys alone")

	// The store is up (GET /readyz) while the cluster serves: a PING went
	// to a node at random, the dead one a third of the time.
	for range 20 {
		require.NoError(t, store.Ping(ctx))
	}

	// Every node down: the call fails, as on a single node.
	cl.Nodes[0].Kill(t)
	cl.Nodes[1].Kill(t)
	require.ErrorIs(t, store.Ping(ctx), leases.ErrStoreUnavailable)
	_, err = brief.Take(ctx, takes)
	require.ErrorIs(t, err, leases.ErrStoreUnavailable, "no node answers")
	_, err = brief.Lease(ctx, owner, ops)
	require.ErrorIs(t, err, leases.ErrStoreUnavailable, "no node answers")
}

// TestEngineClusterShardDown: the engine over a Redis Cluster with one
// master down fails the entries and takes of that node's keys alone, with
// errors that wrap ErrStoreUnavailable and name the key, and decides the
// others: a take whose keys span the dead node and a live one gives back
// what the live one took, and a two-limit rule whose second limit is on
// the dead node gives back its first limit's grant. The partial failure is
// observed as the call's error (the server counts it).
func TestEngineClusterShardDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	rdb := failFastClient(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nodeOf := func(redisKey string) int {
		slot, err := rdb.ClusterKeySlot(ctx, redisKey).Result()
		require.NoError(t, err)
		return int(slot) * 3 / 16384
	}
	var live, dead, multi string // user keys on nodes 0 and 2; a multi key whose 2nd limit is on node 2 and 1st is not
	for i := 0; live == "" || dead == "" || multi == ""; i++ {
		require.Less(t, i, 10000)
		k := fmt.Sprintf("user:%d", i)
		h, _, _ := leases.RedisKeys(k)
		switch nodeOf(h) {
		case 0:
			live = cmp.Or(live, k)
		case 2:
			dead = cmp.Or(dead, k)
		}
		m := fmt.Sprintf("multi:%d", i)
		h0, _, _ := leases.RedisKeys(m)
		h1, _, _ := leases.RedisKeys(m + "\x1f1") // the second limit's key (see limitKey)
		if multi == "" && nodeOf(h0) != 2 && nodeOf(h1) == 2 {
			multi = m
		}
	}
	policy, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{
		{Name: "user", Match: "user:*", Limit: 100, Period: time.Hour},
		{Name: "multi", Match: "multi:*", Limits: []leases.Limit{{Limit: 100, Period: time.Hour}, {Limit: 1000, Period: 24 * time.Hour}}},
	}})
	require.NoError(t, err)
	store := leases.NewRedisStore(rdb, leases.RedisOptions{})
	var mu sync.Mutex
	var observed []error
	engine := leases.NewEngine(leases.EngineOptions{Store: store, Policy: policy, OnStoreCall: func(op string, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		observed = append(observed, err)
	}})
	// Every node answers once, so the client knows the slots.
	_, _, err = engine.Take(ctx, []leases.TakeAsk{{Keys: []string{live}, Cost: 1}, {Keys: []string{dead}, Cost: 1}, {Keys: []string{multi}, Cost: 1}})
	require.NoError(t, err)
	level := func(key string, b leases.Bucket) float64 {
		st, err := store.State(ctx, key, b)
		require.NoError(t, err)
		return st.Level
	}
	userBucket := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Hour, Burst: 100, LeaseTTL: leases.DefaultLeaseTTL}
	before := level(live, userBucket)
	multiBefore := level(multi, leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Hour, Burst: 100, LeaseTTL: leases.DefaultLeaseTTL})

	cl.Nodes[2].Kill(t)
	mu.Lock()
	observed = nil
	mu.Unlock()

	res, _, err := engine.Lease(ctx, leases.Owner{Client: "c", Process: "p"}, []leases.LeaseAsk{{Key: live, Want: 5}, {Key: dead, Want: 5}, {Key: multi, Want: 5}})
	require.NoError(t, err, "one node of three down fails its keys alone")
	require.NoError(t, res[0].Err)
	require.EqualValues(t, 5, res[0].Granted)
	for _, r := range res[1:] {
		require.ErrorIs(t, r.Err, leases.ErrStoreUnavailable, r.Key)
		de, ok := errors.AsType[*leases.DecisionError](r.Err)
		require.True(t, ok, "%T", r.Err)
		require.Contains(t, de.Detail, r.Key)
		require.NotContains(t, de.Detail, "127.0.0.1", "the cause is for the server's log, not the caller")
		require.Zero(t, r.Granted)
	}
	require.InDelta(t, before-5, level(live, userBucket), 0.1, "the live key's lease holds 5")
	require.InDelta(t, multiBefore, level(multi, leases.Bucket{Algorithm: leases.TokenBucket, Limit: 100, Period: time.Hour, Burst: 100, LeaseTTL: leases.DefaultLeaseTTL}), 0.1,
		"the first limit's grant is given back when the second failed")

	takes, _, err := engine.Take(ctx, []leases.TakeAsk{{Keys: []string{live, dead}, Cost: 3}, {Keys: []string{live}, Cost: 1}})
	require.NoError(t, err)
	require.ErrorIs(t, takes[0].Err, leases.ErrStoreUnavailable)
	require.False(t, takes[0].Allowed)
	require.Empty(t, takes[0].Keys, "a failed take reports no key")
	require.NoError(t, takes[1].Err)
	require.True(t, takes[1].Allowed)
	require.InDelta(t, before-5-1, level(live, userBucket), 0.1, "the failed take gave back its 3 tokens of the live key")

	_, _, err = engine.Check(ctx, []string{dead}, 1)
	require.ErrorIs(t, err, leases.ErrStoreUnavailable)

	mu.Lock()
	defer mu.Unlock()
	failed := 0
	for _, e := range observed {
		if errors.Is(e, leases.ErrStoreUnavailable) {
			failed++
		}
	}
	require.Equal(t, 3, failed, "the lease call, the take call and the check's call, each once: %v", observed)
}

// storeTimeout is the bound the server puts on a request's store calls
// (server.DefaultStoreTimeout).
const storeTimeout = 800 * time.Millisecond

// TestRedisClusterDownIsNotPartial (found by review): a cluster under
// Redis's default cluster-require-full-coverage yes declares itself down
// once a master has been unreachable for cluster-node-timeout: every live
// master then refuses every key (CLUSTERDOWN) while it still answers PING.
// No op runs: the store is down, and a call fails whole, not each op as if
// one node's keys failed alone; it was taken as partial for as long as
// the cluster stayed down (the PING answered).
func TestRedisClusterDownIsNotPartial(t *testing.T) {
	cl, rdb, keys, _, b := shardSetup(t)
	// A window too short for any op to count: every call that fails whole
	// asks the masters.
	store := leases.NewRedisStore(rdb, leases.RedisOptions{PartialWindow: time.Nanosecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cl.Nodes[2].Kill(t)
	live := cl.Nodes[0].Client(t)
	require.Eventually(t, func() bool {
		info, err := live.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:fail")
	}, 20*time.Second, 50*time.Millisecond, "the cluster declares itself down (cluster-node-timeout 2 s)")

	// The live masters' keys: none runs.
	takes := []leases.TakeOp{{Key: keys[0], Bucket: b, Cost: 1}, {Key: keys[1], Bucket: b, Cost: 1}}
	for range 3 {
		outs, err := store.Take(ctx, takes)
		if err == nil {
			t.Logf("op errors: %v | %v", outs[0].Err, outs[1].Err)
		}
		require.ErrorIs(t, err, leases.ErrStoreUnavailable, "no op of any key ran: the store is down, not one node's keys")
	}
}

// TestRedisClusterHungNodeMixedCall (found by review): one master hangs
// (SIGSTOP) rather than refusing connections. A call whose keys are on a
// live master and on the hung one, under the server's store timeout,
// answers the live key and fails the hung one's op alone, as for a killed
// master. With go-redis's redirections (MaxRedirects 3) the pipeline to
// the hung node was sent again after its read timeout, and when the
// deadline passed in the backoff go-redis set the error on every command,
// the live key's, which had run, included: the call failed whole.
func TestRedisClusterHungNodeMixedCall(t *testing.T) {
	cl, _, keys, store, b := shardSetup(t)
	bg := context.Background()
	cl.Nodes[2].Pause(t)

	ctx, cancel := context.WithTimeout(bg, storeTimeout)
	defer cancel()
	t0 := time.Now()
	outs, err := store.Take(ctx, []leases.TakeOp{{Key: keys[0], Bucket: b, Cost: 1}, {Key: keys[2], Bucket: b, Cost: 1}})
	t.Logf("a take call with a master hung took %v", time.Since(t0))
	require.NoError(t, err, "the live master answered its key")
	require.NoError(t, outs[0].Err)
	require.True(t, outs[0].Taken)
	require.ErrorIs(t, outs[1].Err, leases.ErrStoreUnavailable)
}

// TestRedisClusterHungNodeAlonePartial (found by review): with a master
// hung, a call with none but its keys fails its ops alone while the other
// masters serve. The check asked every master through ForEachMaster, which
// first reads the map of the slots from a node, sometimes the hung one,
// spending the whole 100 ms there: 3 calls of 12 failed whole.
func TestRedisClusterHungNodeAlonePartial(t *testing.T) {
	cl, rdb, keys, _, b := shardSetup(t)
	// A window too short for any op to count: every call asks the masters.
	store := leases.NewRedisStore(rdb, leases.RedisOptions{PartialWindow: time.Nanosecond})
	bg := context.Background()
	// The cluster serves on, however long the hang lasts (else it stops
	// serving at cluster-node-timeout, 2 s here: see
	// TestRedisClusterDownIsNotPartial).
	for _, n := range cl.Nodes {
		require.NoError(t, n.Client(t).ConfigSet(bg, "cluster-require-full-coverage", "no").Err())
	}
	cl.Nodes[2].Pause(t)
	whole := 0
	const n = 12
	for range n {
		ctx, cancel := context.WithTimeout(bg, storeTimeout)
		outs, err := store.Take(ctx, []leases.TakeOp{{Key: keys[2], Bucket: b, Cost: 1}})
		cancel()
		if err != nil {
			whole++
			continue
		}
		require.ErrorIs(t, outs[0].Err, leases.ErrStoreUnavailable)
	}
	require.Zero(t, whole, "of %d calls with the hung master's key alone, while two masters serve, %d failed whole", n, whole)
}

// TestRedisClusterStalledRefundOnce (found by review): a refund pipelined
// to a master that stalls longer than the read timeout, then resumes, is
// applied once. go-redis sent a cluster command that timed out again on a
// new connection (MaxRedirects bounds its tries, not MaxRetries), and the
// master ran every copy on resuming: 40 tokens were given back twice, and
// a take that was never made admitted.
func TestRedisClusterStalledRefundOnce(t *testing.T) {
	cl, rdb, _, store, b := shardSetup(t)
	bg := context.Background()
	// Two keys on node 2, so that the refund is a pipeline.
	var k2 []string
	for i := 0; len(k2) < 2; i++ {
		k := fmt.Sprintf("user:r%d", i)
		h, _, _ := leases.RedisKeys(k)
		slot, err := rdb.ClusterKeySlot(bg, h).Result()
		require.NoError(t, err)
		if int(slot)*3/16384 == 2 {
			k2 = append(k2, k)
		}
	}
	ops := []leases.TakeOp{{Key: k2[0], Bucket: b, Cost: 40}, {Key: k2[1], Bucket: b, Cost: 40}}
	for range 2 {
		outs, err := store.Take(bg, ops)
		require.NoError(t, err)
		for i := range ops {
			require.True(t, outs[i].Taken)
			ops[i].At = outs[i].At
		}
	}
	// Level 20 each. The second takes' 40 tokens go back (as when their
	// takes were denied by another key) while the master stalls for 2.5 s.
	resume := cl.Nodes[2].Pause(t)
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- store.Refund(ctx, ops) }()
	time.Sleep(2500 * time.Millisecond) // the stall: several read timeouts
	resume()
	t.Logf("refund: %v", <-done)
	require.Eventually(t, func() bool {
		st, err := store.State(bg, k2[0], b)
		return err == nil && st.Level >= 20
	}, 5*time.Second, 10*time.Millisecond, "the master serves again")
	time.Sleep(200 * time.Millisecond) // any copy still queued has run
	for _, k := range k2 {
		st, err := store.State(bg, k, b)
		require.NoError(t, err)
		require.LessOrEqual(t, st.Level, 60.5, "%s: 100 - 40 - 40, plus 40 given back once at most", k)
	}
}

// TestRedisClusterFailoverRecovers (found by the second review): a master
// dies and another serves its slots (what a failover does: the replica
// that takes over has another address; here node 0 takes node 2's slots
// with CLUSTER SETSLOT). A fresh client takes the dead node's key at once;
// the store that knew the old map of the slots serves it within a moment.
// It sent the key to the dead address for a minute: a dead node never
// answers MOVED, and go-redis read the slots again only every
// ClusterStateReloadInterval (60 s).
func TestRedisClusterFailoverRecovers(t *testing.T) {
	cl, _, keys, store, b := shardSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cl.Nodes[2].Kill(t)
	n0, n1 := cl.Nodes[0].Client(t), cl.Nodes[1].Client(t)
	id0, err := n0.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, n0.Do(ctx, "CLUSTER", "BUMPEPOCH").Err())
	for _, n := range []*redis.Client{n0, n1} {
		p := n.Pipeline()
		for s := 2 * 16384 / 3; s < 16384; s++ {
			p.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", id0)
		}
		_, err := p.Exec(ctx)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		for _, n := range []*redis.Client{n0, n1} {
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond)
	failedOver := time.Now()

	// The cluster serves the dead node's key: a fresh client takes it.
	fresh := leases.NewRedisStore(failFastClient(t, cl), leases.RedisOptions{})
	outs, err := fresh.Take(ctx, []leases.TakeOp{{Key: keys[2], Bucket: b, Cost: 1}})
	require.NoError(t, err)
	require.NoError(t, outs[0].Err, "the cluster serves the moved key")

	// The store that knew the old map.
	var last error
	for time.Since(failedOver) < 10*time.Second {
		c, cancel := context.WithTimeout(ctx, storeTimeout)
		outs, err := store.Take(c, []leases.TakeOp{{Key: keys[0], Bucket: b, Cost: 1}, {Key: keys[2], Bucket: b, Cost: 1}})
		cancel()
		require.NoError(t, err)
		if outs[1].Err == nil {
			t.Logf("recovered %v after the failover", time.Since(failedOver))
			return
		}
		last = outs[1].Err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("10 s after the failover the moved key still fails on the store: %v", last)
}

// TestRedisClusterOwnOneNodeDown (found by the second review): rateleased's
// store owns hot token buckets by default (-own-keys: an OwningStore over
// the Redis store). With one master of three down, a key of a live master,
// its bucket nearly full, is taken at a steady pace through the
// OwningStore, as is a key of the dead master: every take of the live key
// is admitted. RedisStore.Own failed its whole call when one op's node was
// down, while the live key's acquisition had run: Redis recorded this
// server as the owner, the OwningStore believed it failed and sent the
// key's takes to the store, which refused them as owned (17 taken, 540
// denied in 3 s): a store failure answered as a rate limit.
func TestRedisClusterOwnOneNodeDown(t *testing.T) {
	cl, _, keys, store, _ := shardSetup(t)
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 1_000_000, Period: time.Hour, Burst: 1_000_000, LeaseTTL: time.Second}
	owning, err := leases.NewOwningStore(store, leases.OwningOptions{MinTakes: 4})
	require.NoError(t, err)
	defer owning.Close()
	ctx := context.Background()
	cl.Nodes[2].Kill(t)

	var liveTaken, liveDenied, liveFailed, deadFailed int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		c, cancel := context.WithTimeout(ctx, storeTimeout)
		outs, err := owning.Take(c, []leases.TakeOp{{Key: keys[0], Bucket: b, Cost: 1}, {Key: keys[2], Bucket: b, Cost: 1}})
		cancel()
		require.NoError(t, err)
		switch {
		case outs[0].Err != nil:
			liveFailed++
		case outs[0].Taken:
			liveTaken++
		default:
			liveDenied++
		}
		if outs[1].Err != nil {
			deadFailed++
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("live key: %d taken, %d denied, %d failed; dead key: %d failed; owning stats %+v", liveTaken, liveDenied, liveFailed, deadFailed, owning.Stats())
	require.Zero(t, liveDenied+liveFailed, "the live master's key, its bucket full, is denied or fails while only another node is down")
}

// observedOwning is a Redis store whose Own calls the test watches: it
// reports the key of each op that failed. Nothing else changes.
type observedOwning struct {
	*leases.RedisStore
	failed chan string
}

func (o *observedOwning) Own(ctx context.Context, ops []leases.OwnOp) ([]leases.OwnOutcome, error) {
	outs, err := o.RedisStore.Own(ctx, ops)
	for i, op := range ops {
		if err != nil || outs[i].Err != nil {
			select {
			case o.failed <- op.Key:
			default:
			}
		}
	}
	return outs, err
}

// ownTakes takes one token of key through s every 20 ms for d, each with
// the server's store timeout, and counts the outcomes.
func ownTakes(t *testing.T, s leases.Store, key string, b leases.Bucket, d time.Duration) (taken, denied, failed int, worst time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		t0 := time.Now()
		outs, err := s.Take(ctx, []leases.TakeOp{{Key: key, Bucket: b, Cost: 1}})
		worst = max(worst, time.Since(t0))
		cancel()
		switch {
		case err != nil || outs[0].Err != nil:
			failed++
		case outs[0].Taken:
			taken++
		default:
			denied++
		}
		time.Sleep(20 * time.Millisecond)
	}
	return taken, denied, failed, worst
}

// otherKeysOfNode returns n keys "other:<i>" that node (of a cluster of
// three started by redistest.StartCluster) serves.
func otherKeysOfNode(t *testing.T, rdb *redis.ClusterClient, node uint64, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		require.Less(t, i, 10000)
		k := fmt.Sprintf("other:%d", i)
		h, _, _ := leases.RedisKeys(k)
		slot, err := rdb.ClusterKeySlot(context.Background(), h).Result()
		require.NoError(t, err)
		if uint64(slot)*3/16384 == node {
			out = append(out, k)
		}
	}
	return out
}

// stallableCluster sets up shardSetup's cluster so that a stalled master
// does not stop it serving (cluster-require-full-coverage no), and an
// OwningStore over its store whose Own calls the test watches. The bucket
// is shardSetup's, with a lease TTL of 1 s: 99 tokens left, no refill to
// speak of.
func stallableCluster(t *testing.T) (cl *redistest.Cluster, rdb *redis.ClusterClient, keys []string, owning *leases.OwningStore, obs *observedOwning, b leases.Bucket) {
	t.Helper()
	cl, rdb, keys, store, b := shardSetup(t)
	b.LeaseTTL = time.Second
	for _, n := range cl.Nodes {
		require.NoError(t, n.Client(t).ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err())
	}
	// Idle connections to every master, so that the ops sent while one
	// stalls go out on connections it accepted: a new connection waits
	// for its handshake, and the op on it is never sent.
	var wg sync.WaitGroup
	for range 16 {
		for _, k := range keys {
			wg.Go(func() {
				_, err := store.State(context.Background(), k, b)
				assert.NoError(t, err)
			})
		}
	}
	wg.Wait()
	obs = &observedOwning{RedisStore: store, failed: make(chan string, 64)}
	owning, err := leases.NewOwningStore(obs, leases.OwningOptions{MinTakes: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = owning.Close() })
	return cl, rdb, keys, owning, obs, b
}

// TestRedisClusterOwnAcquisitionStalled (found by review): an acquisition
// of a bucket sent to a master that stalls past the read timeout, and that
// the master runs when it resumes, neither leaves the store refusing this
// server's takes as owned nor has the owner start from an empty bucket.
// Before, the key's bucket (99 tokens) allowed 2 takes and refused 73 in
// 1.5 s.
func TestRedisClusterOwnAcquisitionStalled(t *testing.T) {
	cl, _, keys, owning, obs, b := stallableCluster(t)
	resume := cl.Nodes[2].Pause(t)
	// MinTakes takes make the key a candidate; they fail (the master is
	// stalled), then the loop sends the acquisition, which fails too.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			defer cancel()
			_, _ = owning.Take(ctx, []leases.TakeOp{{Key: keys[2], Bucket: b, Cost: 1}})
		})
	}
	wg.Wait()
	select {
	case k := <-obs.failed:
		require.Equal(t, keys[2], k)
	case <-time.After(10 * time.Second):
		t.Fatal("no acquisition was sent to the stalled master")
	}
	resume() // it runs what it had queued: the acquisition, and any copy sent since
	taken, denied, failed, worst := ownTakes(t, owning, keys[2], b, 1500*time.Millisecond)
	t.Logf("after the master resumed: %d taken, %d denied, %d failed, the longest take %v; owning stats %+v", taken, denied, failed, worst, owning.Stats())
	require.Zero(t, denied, "takes of a bucket of 99 tokens refused")
	require.Zero(t, failed)
	require.Equal(t, 1, owning.Stats().Owned, "owned, from the acquisition that ran late or the next one")
}

// TestRedisClusterOwnHungNodeSparesLiveKey (found by review): the
// acquisitions of a stalled master's key, which fail at the read timeout,
// delay no other key's renewal: an owned key on a live master is decided
// throughout. Before, its renewals waited in the same call as the stalled
// ones, past its deadline: a take denied (the bucket full) in two runs
// of three, the longest waiting 493 ms.
func TestRedisClusterOwnHungNodeSparesLiveKey(t *testing.T) {
	cl, rdb, keys, owning, obs, b := stallableCluster(t)
	// Keys of the master that will stall, besides keys[2].
	stalledKeys := otherKeysOfNode(t, rdb, 2, 6)
	for range 4 {
		take := func() { _, _ = owning.Take(context.Background(), []leases.TakeOp{{Key: keys[0], Bucket: b, Cost: 1}}) }
		take()
	}
	require.Eventually(t, func() bool { return owning.Stats().Owned == 1 }, 5*time.Second, time.Millisecond, "the live key owned")
	cl.Nodes[2].Pause(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, k := range stalledKeys {
		wg.Go(func() {
			// A key of the stalled master, asked in bursts of four: a
			// candidate whose acquisitions go to the stalled master, one
			// key after another.
			time.Sleep(time.Duration(i) * 150 * time.Millisecond)
			for {
				select {
				case <-stop:
					return
				default:
				}
				var burst sync.WaitGroup
				for range 4 {
					burst.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
						defer cancel()
						_, _ = owning.Take(ctx, []leases.TakeOp{{Key: k, Bucket: b, Cost: 1}})
					})
				}
				burst.Wait()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	// A take waits for its key's renewal only past its deadline: never,
	// unless the renewal waited for the stalled master (500 ms).
	liveKeySpared(t, owning, obs, keys[0], b, 1800*time.Millisecond, 250*time.Millisecond, func() { close(stop); wg.Wait() })
}

// liveKeySpared takes keys[0], owned on a live master, for d (ownTakes),
// calls done, and requires that ops on other keys failed (obs: sent to a
// stalled master), that none of the live key's takes was denied or failed,
// and that none waited as long as worst.
func liveKeySpared(t *testing.T, owning *leases.OwningStore, obs *observedOwning, live string, b leases.Bucket, d, worst time.Duration, done func()) {
	t.Helper()
	taken, denied, failed, longest := ownTakes(t, owning, live, b, d)
	done()
	stalled := 0
	for len(obs.failed) > 0 {
		if k := <-obs.failed; k != live {
			stalled++
		}
	}
	t.Logf("live key: %d taken, %d denied, %d failed, the longest take %v; %d ops on the stalled master's keys failed; owning stats %+v", taken, denied, failed, longest, stalled, owning.Stats())
	require.Positive(t, stalled, "ops were sent to the stalled master")
	require.Zero(t, denied+failed, "takes of the live master's owned key denied or failed")
	require.Less(t, longest, worst, "a take of the live key waited for the stalled master")
}

// TestRedisClusterOwnStalledKeysSpareLiveRenewal: keys owned on a master
// that stalls, renewed at the same ticks as a key owned on a live master.
// Their first renewals after the stall, before any of their ops has
// failed, went in one call with the live key's, which waited for the
// stalled master's read timeout (500 ms); with a lease TTL of 200 ms the
// live key's renewal came back past its deadline and its takes waited for
// the next acquisition. The calls are now made per Redis node.
func TestRedisClusterOwnStalledKeysSpareLiveRenewal(t *testing.T) {
	cl, rdb, keys, owning, obs, b := stallableCluster(t)
	b.LeaseTTL = 200 * time.Millisecond
	all := append([]string{keys[0]}, otherKeysOfNode(t, rdb, 2, 4)...)
	take := func(ctx context.Context, k string) {
		_, _ = owning.Take(ctx, []leases.TakeOp{{Key: k, Bucket: b, Cost: 1}})
	}
	// Every key a candidate at once (MinTakes takes each, back to back),
	// so that the loop acquires them at one tick and renews them at the
	// same ticks.
	for _, k := range all {
		for range 4 {
			take(context.Background(), k)
		}
	}
	require.Eventually(t, func() bool { return owning.Stats().Owned == len(all) }, 5*time.Second, time.Millisecond, "every key owned")
	cl.Nodes[2].Pause(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, k := range all[1:] {
		wg.Go(func() {
			// In use, so renewed rather than released.
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
				take(ctx, k)
				cancel()
			}
		})
	}
	liveKeySpared(t, owning, obs, keys[0], b, 1200*time.Millisecond, 100*time.Millisecond, func() { close(stop); wg.Wait() })
}
