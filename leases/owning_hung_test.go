package leases

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// switchHungOwning is hungOwning with a switch: while hung is set, every Own
// call carrying an op on a key beginning with "hung" waits 400 ms (the read
// timeout) and fails those ops; the other keys' ops run at once (a Redis
// Cluster pipeline: the live nodes answer, the call waits for the hung one).
type switchHungOwning struct {
	Store
	own  Owning
	hung atomic.Bool
}

func (h *switchHungOwning) Own(ctx context.Context, ops []OwnOp) ([]OwnOutcome, error) {
	if !h.hung.Load() {
		return h.own.Own(ctx, ops)
	}
	return (&hungOwning{Store: h.Store, own: h.own}).Own(ctx, ops)
}

// nodeHungOwning is switchHungOwning on a store that names its nodes (see
// nodeNamer): the keys beginning with "hung" on one, the others on another.
type nodeHungOwning struct{ switchHungOwning }

func (h *nodeHungOwning) nodeOf(_ context.Context, key string) string {
	if strings.HasPrefix(key, "hung") {
		return "hung"
	}
	return "live"
}

// TestOwningHungOwnedKeysDelayLiveKey (found by review): the keys already
// owned on a node that hangs are not "keys whose last op failed" until
// their first op on it fails, the read timeout (400 ms) later: their first
// renewals go with the healthy keys' renewals due at the same tick. With a
// lease TTL shorter than twice the read timeout (200 ms here), a live
// key's renewal made in the same store call comes back past its deadline,
// and its takes wait for it. On a store that names its nodes (RedisStore
// on a Redis Cluster) the calls are made per node, and the live key's
// takes wait for nothing; on one that does not, by one read timeout at
// most, and none is refused (before the kinds of call, the hung calls also
// held every slot: 316 ms and more, and ownerships lost).
func TestOwningHungOwnedKeysDelayLiveKey(t *testing.T) {
	for _, tt := range []struct {
		name  string
		nodes bool
		worst time.Duration
	}{
		{"nodes unknown", false, 600 * time.Millisecond},
		{"a call per node", true, 100 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inner := NewMemoryStore(MemoryOptions{SweepInterval: -1})
			t.Cleanup(func() { _ = inner.Close() })
			h := &nodeHungOwning{switchHungOwning{Store: inner, own: inner}}
			var store Store = &h.switchHungOwning
			if tt.nodes {
				store = h
			}
			s, err := NewOwningStore(store, OwningOptions{Server: "a", MinTakes: 4, Interval: 20 * time.Millisecond})
			require.NoError(t, err)
			defer s.Close()
			b := Bucket{Algorithm: TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000, LeaseTTL: 200 * time.Millisecond}
			tk := func(key string) (time.Duration, bool) { return timedTake(s, key, b) }
			keys := []string{"h"}
			for i := range 8 {
				keys = append(keys, fmt.Sprint("hung", i))
			}
			// Own them all, their acquisitions staggered over a few ticks.
			for _, key := range keys {
				for range 6 {
					tk(key)
				}
				time.Sleep(7 * time.Millisecond)
			}
			require.Eventually(t, func() bool {
				for _, key := range keys {
					tk(key)
				}
				return s.Stats().Owned == len(keys)
			}, 2*time.Second, 2*time.Millisecond)
			// The node under the hung keys hangs; every key stays in use.
			h.hung.Store(true)
			var worst time.Duration
			failed := 0
			end := time.Now().Add(1500 * time.Millisecond)
			for i := 0; time.Now().Before(end); i++ {
				if i%3 == 0 {
					for _, key := range keys[1:] {
						go tk(key)
					}
				}
				d, ok := tk("h")
				if !ok {
					failed++
				}
				worst = max(worst, d)
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("live key: worst take %v, %d takes not admitted, %+v", worst, failed, s.Stats())
			assert.Zero(t, failed, "a live key's takes failed or were refused")
			assert.Less(t, worst, tt.worst, "a live key's take waited too long for the hung node")
		})
	}
}

// sharedHungOwning is switchHungOwning that also records whether an op on
// "h" ever went in a call with an op on a hung key after the node hung.
type sharedHungOwning struct {
	switchHungOwning
	mu     sync.Mutex
	shared int
	log    []string
	t0     time.Time
}

func (h *sharedHungOwning) Own(ctx context.Context, ops []OwnOp) ([]OwnOutcome, error) {
	if h.hung.Load() {
		var hasH, hasHung bool
		names := opNames(ops)
		for _, op := range ops {
			hasH = hasH || op.Key == "h"
			hasHung = hasHung || strings.HasPrefix(op.Key, "hung")
		}
		h.mu.Lock()
		if hasH && hasHung {
			h.shared++
		}
		h.log = append(h.log, fmt.Sprintf("%v %v", time.Since(h.t0).Round(time.Millisecond), names))
		h.mu.Unlock()
	}
	return h.switchHungOwning.Own(ctx, ops)
}

// TestOwningHungNodeSlotsSpareLiveRenewal (found by review): four keys
// owned on a node that hangs, whose renewals fall due at four different
// ticks (20, 40, 60, 80 ms after the hang), each went in a call of its own
// (their last op had not failed) and held the four slots of the renewals'
// kind for the read timeout (400 ms): the renewal of a live key "h" of a
// healthy node, due at 110 ms (deadline 200 ms), was not sent before a
// slot freed, and its takes were refused from its deadline on (111 in
// 800 ms), though it never shared a call with a hung key. Renewals and
// releases now never wait for a slot. The renewal phases are set
// (white-box, earlier than they were: only ever sooner renewals and
// earlier local deadlines, both safe) so that the run is deterministic.
func TestOwningHungNodeSlotsSpareLiveRenewal(t *testing.T) {
	inner := NewMemoryStore(MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = inner.Close() })
	h := &sharedHungOwning{switchHungOwning: switchHungOwning{Store: inner, own: inner}}
	s, err := NewOwningStore(h, OwningOptions{Server: "a", MinTakes: 4, Interval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	b := Bucket{Algorithm: TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000, LeaseTTL: time.Second}
	tk := func(key string) (time.Duration, bool) { return timedTake(s, key, b) }
	keys := []string{"hung0", "hung1", "hung2", "hung3", "h"}
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }()
	for _, key := range keys {
		require.Eventually(t, func() bool {
			tk(key)
			s.mu.Lock()
			defer s.mu.Unlock()
			k := s.keys[key]
			return k != nil && k.state == ownOwned
		}, 2*time.Second, time.Millisecond)
		if key != "h" {
			wg.Add(1)
			go func() { // in use: renewed, not released
				defer wg.Done()
				for !stop.Load() {
					tk(key)
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
	}
	// Phases: each key renewed at most 1 s ago by the store (TTL 1 s,
	// renewed every 500 ms): every store deadline is 500 ms away at least.
	s.mu.Lock()
	now := s.now()
	ms := int64(time.Millisecond / time.Microsecond)
	for i, key := range keys[:4] {
		k := s.keys[key]
		require.False(t, k.renewing)
		k.renewAt = now + int64(20+20*i)*ms
	}
	k := s.keys["h"]
	require.False(t, k.renewing)
	k.renewAt, k.deadline = now+110*ms, now+200*ms
	k.lastUse = now // used since
	s.mu.Unlock()
	h.t0 = time.Now()
	h.hung.Store(true)
	var worst time.Duration
	failed := 0
	end := time.Now().Add(800 * time.Millisecond)
	for time.Now().Before(end) {
		d, ok := tk("h")
		if !ok {
			failed++
		}
		worst = max(worst, d)
		time.Sleep(5 * time.Millisecond)
	}
	h.mu.Lock()
	shared, log := h.shared, h.log
	h.mu.Unlock()
	t.Logf("live key: worst take %v, %d takes not admitted, its ops in a call with a hung key's: %d; %+v", worst, failed, shared, s.Stats())
	for _, l := range log[:min(len(log), 10)] {
		t.Log(l)
	}
	require.Zero(t, shared, "the live key's op shared a call with a hung key's")
	assert.Zero(t, failed, "a live key's takes failed or were refused, its renewal never sharing a call with the hung node")
	assert.Less(t, worst, 100*time.Millisecond, "a live key's take waited for the hung node, its renewal never sharing a call with it")
}

// TestOwningHungNodeSparesHealthyAcquisitions (found by review): while
// keys of a hung node are hot (their acquisitions resent at every tick), a
// key of a healthy node that became hot had its acquisition sent in a call
// with theirs: the call waited for the hung node (400 ms), and the healthy
// key's takes waited for the acquisition, which came back past the
// deadline it set and was lost. Acquisitions of keys whose last op did not
// fail now go in calls of their own kind.
func TestOwningHungNodeSparesHealthyAcquisitions(t *testing.T) {
	inner := NewMemoryStore(MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = inner.Close() })
	lg := &logOwning{Store: inner, own: &hungOwning{Store: inner, own: inner}, t0: time.Now()}
	s, err := NewOwningStore(lg, OwningOptions{Server: "a", MinTakes: 4, Interval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	// Each healthy key gets 30 takes: one exact bucket of burst 1000
	// admits them all.
	b := Bucket{Algorithm: TokenBucket, Limit: 100, Period: time.Second, Burst: 1000, LeaseTTL: 200 * time.Millisecond}
	tk := func(key string) (time.Duration, bool) { return timedTake(s, key, b) }
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range 12 { // hung keys, hot all along
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 37 * time.Millisecond) // hot one after another
			for !stop.Load() {
				tk(fmt.Sprint("hung", i))
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(900 * time.Millisecond)
	var worst time.Duration
	failed := 0
	for i := range 8 { // healthy keys becoming hot one after another
		key := fmt.Sprint("n", i)
		for range 30 {
			d, ok := tk(key)
			if !ok {
				failed++
			}
			worst = max(worst, d)
			time.Sleep(3 * time.Millisecond)
		}
	}
	t.Logf("healthy keys: worst take %v, %d not admitted, %+v", worst, failed, s.Stats())
	lg.mu.Lock()
	for _, l := range lg.log {
		t.Log(l)
	}
	lg.mu.Unlock()
	assert.Zero(t, failed, "healthy keys' takes refused that one exact bucket admits")
	assert.Less(t, worst, 100*time.Millisecond, "a healthy key's take waited for a hung node's call")
}

// logOwning passes Own calls to own and logs each (when it was made, how
// long it took, its ops' keys and kinds), for a test to print.
type logOwning struct {
	Store
	own Owning
	mu  sync.Mutex
	log []string
	t0  time.Time
}

func (h *logOwning) Own(ctx context.Context, ops []OwnOp) ([]OwnOutcome, error) {
	names := opNames(ops)
	start := time.Now()
	out, err := h.own.Own(ctx, ops)
	h.mu.Lock()
	h.log = append(h.log, fmt.Sprintf("%v +%v %v", start.Sub(h.t0).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), names))
	h.mu.Unlock()
	return out, err
}

// timedTake takes one token of key through s, with a second to spare, and
// returns how long it took and whether it was taken.
func timedTake(s Store, key string, b Bucket) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	out, err := s.Take(ctx, []TakeOp{{Key: key, Bucket: b, Cost: 1}})
	return time.Since(start), err == nil && out[0].Taken
}

// opNames names each op by its key and kind (acq, renew or rel).
func opNames(ops []OwnOp) []string {
	names := make([]string, 0, len(ops))
	for _, op := range ops {
		kind := "acq"
		switch {
		case op.Release:
			kind = "rel"
		case op.Renew:
			kind = "renew"
		}
		names = append(names, op.Key+"/"+kind)
	}
	return names
}
