package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keysDownStore is a store whose ops on keys that start with "down:" fail
// alone, as a leases.RedisStore's do on the keys of a Redis Cluster node
// that is down while the others answer (leases: TestRedisClusterShardDown
// shows it on a real cluster); the other ops go to the store underneath.
type keysDownStore struct{ leases.Store }

var errNodeDown = fmt.Errorf("redis: %w: dial tcp 127.0.0.1:7002: connect: connection refused", leases.ErrStoreUnavailable)

func isDown(key string) bool { return strings.HasPrefix(key, "down:") }

func (s keysDownStore) Lease(ctx context.Context, owner leases.Owner, ops []leases.LeaseOp) ([]leases.LeaseOutcome, error) {
	return splitDown(ops, func(op leases.LeaseOp) string { return op.Key },
		func(up []leases.LeaseOp) ([]leases.LeaseOutcome, error) { return s.Store.Lease(ctx, owner, up) },
		func(o *leases.LeaseOutcome) { o.Err = errNodeDown })
}

func (s keysDownStore) Take(ctx context.Context, ops []leases.TakeOp) ([]leases.TakeOutcome, error) {
	return splitDown(ops, func(op leases.TakeOp) string { return op.Key },
		func(up []leases.TakeOp) ([]leases.TakeOutcome, error) { return s.Store.Take(ctx, up) },
		func(o *leases.TakeOutcome) { o.Err = errNodeDown })
}

// splitDown runs the ops on keys that are up (run) and fails the others
// alone (fail), one outcome per op in order.
func splitDown[Op, Out any](ops []Op, key func(Op) string, run func([]Op) ([]Out, error), fail func(*Out)) ([]Out, error) {
	var up []Op
	for _, op := range ops {
		if !isDown(key(op)) {
			up = append(up, op)
		}
	}
	res, err := run(up)
	if err != nil {
		return nil, err
	}
	out := make([]Out, len(ops))
	for i, op := range ops {
		if isDown(key(op)) {
			fail(&out[i])
			continue
		}
		out[i], res = res[0], res[1:]
	}
	return out, nil
}

// TestKeysStoreDown: a store that fails some keys alone (a Redis Cluster
// node down). A lease call or check that mixes keys is answered for the
// others and fails the down keys' entries alone with store_unavailable,
// whose detail names the key and not the cause; a lease call with none
// but such keys is a 503 with Retry-After whose problem carries every
// entry's result; a check with such a key is a 503 and gives back what
// its other keys took. Each such call counts in store_errors_total, and
// the server logs them at most once a second, with the cause.
func TestKeysStoreDown(t *testing.T) {
	var now atomic.Int64
	now.Store(time.UnixMilli(1_700_000_000_000).UnixNano())
	f := newFixture(t, "rules:\n  - {name: users, match: \"*\", limit: 100, period: 1s}\n", keysDownStore{frozenStore(t)},
		Options{Now: func() time.Time { return time.Unix(0, now.Load()) }})

	res := f.lease("", "p1", protocol.LeaseEntry{Key: "user:a", Want: 5}, protocol.LeaseEntry{Key: "down:b", Want: 5})
	require.Nil(t, res[0].Error)
	assert.EqualValues(t, 5, res[0].Granted)
	require.NotNil(t, res[1].Error)
	assert.Equal(t, protocol.CodeStoreUnavailable, res[1].Error.Code)
	assert.Contains(t, res[1].Error.Detail, `"down:b"`)
	assert.NotContains(t, res[1].Error.Detail, "127.0.0.1", "the cause is the server's log's")
	assert.Zero(t, res[1].Granted)

	r := f.postJSON(protocol.PathLeases, "", protocol.LeaseRequest{ClientID: "p1", Leases: []protocol.LeaseEntry{{Key: "down:b", Want: 5}, {Key: "down:c", Want: 1}}})
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	p := r.problem(t)
	assert.Equal(t, protocol.CodeStoreUnavailable, p.Code)
	require.Len(t, p.Leases, 2, "every entry's result: an answer, unlike a store that is down")
	for _, l := range p.Leases {
		assert.Equal(t, protocol.CodeStoreUnavailable, l.Error.Code)
	}

	before := f.state("user:a").Level
	for _, keys := range [][]string{{"down:b"}, {"user:a", "down:b"}} {
		r = f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: keys})
		assert.Equal(t, http.StatusServiceUnavailable, r.status, "%v", keys)
		assert.Equal(t, "1", r.header.Get("Retry-After"))
		assert.Equal(t, protocol.CodeStoreUnavailable, r.problem(t).Code)
	}
	assert.InDelta(t, before, f.state("user:a").Level, 1e-9, "the failed check gave back what user:a took")
	r = f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"user:a"}})
	assert.Equal(t, http.StatusOK, r.status)

	assert.Equal(t, "2", f.metric(`ratelease_store_errors_total{op="lease"}`))
	assert.Equal(t, "2", f.metric(`ratelease_store_errors_total{op="take"}`))
	logged := func() int { return strings.Count(f.logs.String(), "store unavailable for some keys") }
	assert.Equal(t, 1, logged(), "at most once a second:\n%s", f.logs.String())
	now.Add(int64(time.Second))
	f.lease("", "p1", protocol.LeaseEntry{Key: "user:a", Want: 1}, protocol.LeaseEntry{Key: "down:b", Want: 1})
	assert.Equal(t, 2, logged())
	assert.Contains(t, f.logs.String(), "calls_not_logged=3")
	assert.Contains(t, f.logs.String(), "connection refused", "the cause is logged")
}
