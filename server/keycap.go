package server

import (
	"context"
	"sync"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// The cap of Options.MaxKeysPerClient. For each principal (a client of the
// rules, or the anonymous client) the server tracks, in a heldKeys, the keys
// on which it granted the principal a lease, each with the latest expiry of
// those grants, and refuses a lease entry that asks for tokens on a key the
// principal does not hold once it holds the cap. The heldKeys of the
// principals hang on the rules' state (state.heldOf), so that a request
// finds its principal's without a lookup; a reload carries them over by
// client name and drops those of removed clients.
//
// A principal's keys are a map from key to *heldKey plus a min-heap of the
// same entries ordered by expiry. Expired entries are dropped lazily: a
// call pops at most a few more expired entries than it has entries, and one
// that finds the principal at the cap pops expired entries until a slot is
// free or none is left. A renewal only raises the entry's expiry; the heap
// learns of it when the old expiry comes to the top, and the entry is then
// pushed back at its new expiry, once per expiry passed at most. So every
// pop is paid for by a grant that inserted or extended an entry, and the
// work of a call is proportional to its entries (times log of the keys
// held); nothing ever scans all the keys.
//
// A call references the entries it was admitted on from before it asks the
// engine until it has recorded the outcome (heldKey.refs), and a key new to
// the principal is inserted at admission with no expiry yet. So entries in
// flight count against the cap, and concurrent calls of one principal can
// never together exceed it with new keys; an entry that was not granted is
// dropped once no call references it and its expiry has passed.

// heldKeys are the keys one principal holds through this server.
type heldKeys struct {
	mu   sync.Mutex
	keys map[string]*heldKey
	heap []*heldKey // min-heap on heldKey.at
}

// heldKey is a key a principal holds, or is being granted.
type heldKey struct {
	key    string
	expiry int64 // Unix nanoseconds: the latest expiry of a grant; 0 before the first
	at     int64 // the expiry the heap orders it by; it may lag behind expiry
	index  int   // position in the heap; -1 when not in it
	refs   int   // calls admitted on the key that have not recorded their outcome
}

// heldPool recycles the slices of references of calls with more entries
// than the handler keeps on its stack, and at most heldPoolCap. finish
// leaves them all nil.
var heldPool = sync.Pool{New: func() any { s := make([]*heldKey, 0, heldPoolCap); return &s }}

const heldPoolCap = 128

// newHeldKeys returns an empty heldKeys.
func newHeldKeys() *heldKeys { return &heldKeys{keys: make(map[string]*heldKey)} }

// admit decides the entries of one call of a principal, before they reach
// the engine. Entries that want no tokens are not tracked. An entry that
// wants tokens is admitted when it settles a lease (see settles), when
// the principal holds its key, when fewer than max keys are held, or when
// no rule of policy matches its key (the engine keeps no state for it);
// otherwise it is refused. admit appends to held,
// for each entry, the *heldKey it referenced (nil when none) and returns
// held with the positions in entries of the refused entries, in order (nil
// when none). The caller must pass held to finish exactly once.
func (h *heldKeys) admit(entries []protocol.LeaseEntry, now int64, max int, policy *leases.Policy, overridden map[string]bool, held []*heldKey) ([]*heldKey, []int) {
	var refused []int
	h.mu.Lock()
	h.expire(now, len(entries)+2)
	for i := range entries {
		e := &entries[i]
		if e.Want == 0 {
			held = append(held, nil)
			continue
		}
		k := h.keys[e.Key]
		if k != nil && k.refs == 0 && k.expiry <= now {
			h.drop(k) // expired, not yet popped: a new key again
			k = nil
		}
		if k == nil {
			if !settles(e.LeaseID) && len(h.keys) >= max && !h.freeSlot(now, max) && (overridden[e.Key] || limited(policy, e.Key)) {
				refused = append(refused, i)
				held = append(held, nil)
				continue
			}
			k = &heldKey{key: e.Key, index: -1}
			h.keys[e.Key] = k
		}
		k.refs++
		held = append(held, k)
	}
	h.mu.Unlock()
	return held, refused
}

// settles reports whether an entry with lease ID id settles a lease: it
// has one, and not the ID of a shadow or elastic rule's lease whose limits
// granted nothing, which settles nothing (see leases.SettlesLease).
func settles(id string) bool {
	return id != "" && leases.SettlesLease(id)
}

// limited reports whether a rule of policy matches key.
func limited(policy *leases.Policy, key string) bool {
	_, ok := policy.Match(key)
	return ok
}

// overriddenUnmatched returns, in database mode, which of the entries'
// keys that want tokens and match no rule have an override: the engine
// applies an override before the rules, so such a key is limited, keeps
// state in the store, and counts toward the key cap like any other. Taken
// for unlimited, a client at a cap of 1 leased every overridden key it
// named (found by review). Looked up through the override cache, as the
// engine is about to; when the lookup fails every such key counts. Nil
// when there is none (file mode, or every key matches a rule).
func (s *Server) overriddenUnmatched(ctx context.Context, st *state, entries []protocol.LeaseEntry) map[string]bool {
	if s.db == nil {
		return nil
	}
	var keys []string
	for i := range entries {
		if e := &entries[i]; e.Want > 0 && !limited(st.rules.policy, e.Key) {
			keys = append(keys, e.Key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.StoreTimeout)
	found, err := s.db.cache.Lookup(ctx, keys)
	cancel()
	var out map[string]bool
	for _, k := range keys {
		if err != nil || found[k] != nil {
			if out == nil {
				out = make(map[string]bool, len(keys))
			}
			out[k] = true
		}
	}
	return out
}

// finish records the outcome of the call whose admitted entries are held:
// out are the engine's results, one per entry, or nil when the call failed.
// A grant with a lease raises its key's expiry to now plus the lease's TTL;
// an entry that nobody references any more and whose expiry has passed is
// dropped. finish clears held, so that a second call does nothing.
func (h *heldKeys) finish(held []*heldKey, out []protocol.LeaseResult, now int64) {
	if h == nil {
		return
	}
	locked := false
	for j, k := range held {
		if k == nil {
			continue
		}
		if !locked {
			h.mu.Lock()
			locked = true
		}
		held[j] = nil
		k.refs--
		if j < len(out) && out[j].LeaseID != "" && out[j].Granted > 0 {
			if exp := now + out[j].TTLMillis*int64(time.Millisecond); exp > k.expiry {
				k.expiry = exp
			}
			if k.index < 0 {
				k.at = k.expiry
				h.push(k)
			}
		}
		if k.refs == 0 && k.expiry <= now {
			h.drop(k)
		}
	}
	if locked {
		h.mu.Unlock()
	}
}

// expire pops up to budget entries whose heap expiry has passed: each is
// pushed back at its new expiry if a grant extended it, left out of the
// heap while a call references it, or dropped. Must be called with mu
// held.
func (h *heldKeys) expire(now int64, budget int) {
	for ; budget > 0 && len(h.heap) > 0 && h.heap[0].at <= now; budget-- {
		h.popExpired(now)
	}
}

// freeSlot pops expired entries until fewer than max keys are held, and
// reports whether that happened. Must be called with mu held.
func (h *heldKeys) freeSlot(now int64, max int) bool {
	for len(h.keys) >= max && len(h.heap) > 0 && h.heap[0].at <= now {
		h.popExpired(now)
	}
	return len(h.keys) < max
}

// popExpired pops the top of the heap, whose heap expiry has passed.
func (h *heldKeys) popExpired(now int64) {
	k := h.heap[0]
	h.remove(0)
	switch {
	case k.expiry > now: // extended by a later grant
		k.at = k.expiry
		h.push(k)
	case k.refs > 0: // finish decides
	default:
		delete(h.keys, k.key)
	}
}

// drop forgets k.
func (h *heldKeys) drop(k *heldKey) {
	if k.index >= 0 {
		h.remove(k.index)
	}
	delete(h.keys, k.key)
}

// push adds k to the heap.
func (h *heldKeys) push(k *heldKey) {
	k.index = len(h.heap)
	h.heap = append(h.heap, k)
	h.up(k.index)
}

// remove takes the entry at position i out of the heap.
func (h *heldKeys) remove(i int) {
	last := len(h.heap) - 1
	k := h.heap[i]
	if i != last {
		h.swap(i, last)
	}
	h.heap[last] = nil
	h.heap = h.heap[:last]
	k.index = -1
	if i != last {
		h.down(i)
		h.up(i)
	}
}

func (h *heldKeys) swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.heap[i].index = i
	h.heap[j].index = j
}

func (h *heldKeys) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if h.heap[parent].at <= h.heap[i].at {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *heldKeys) down(i int) {
	n := len(h.heap)
	for {
		least := i
		if l := 2*i + 1; l < n && h.heap[l].at < h.heap[least].at {
			least = l
		}
		if r := 2*i + 2; r < n && h.heap[r].at < h.heap[least].at {
			least = r
		}
		if least == i {
			return
		}
		h.swap(i, least)
		i = least
	}
}
