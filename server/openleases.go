package server

import (
	"sync"

	"github.com/ratelease/ratelease/leases"
)

// openLeases is the gauge ratelease_open_leases: the leases granted through
// this server that are not yet settled through it and whose deadline (the
// grant's time on the server's clock plus the lease's TTL) has not passed.
//
// Why per server: the store holds every open lease, but counting them
// across the fleet would take a scan of every bucket in Redis. Each server
// instead counts what it granted, from the lease IDs it hands out and the
// lease IDs it is asked to settle. So the gauge is exact for a client that
// settles through the server that granted (the SDK's usual case), and over
// counts in two cases, each for at most the lease's TTL: a lease settled
// through another server, and a lease the store closed without a settle
// (replaced by a new lease of the same owner, key and slot, or found
// expired a little before the server's own deadline). It never under counts
// an open lease it granted. Summed over the servers (the status page does)
// it bounds the fleet's open leases from above. Keys without a rule get no
// lease ID and are not counted.
//
// Cost: a map from lease ID to deadline and a min-heap of (deadline, ID).
// A grant inserts in both, O(log n); a settle deletes from the map, O(1),
// and leaves its heap entry to be dropped when its deadline comes or when
// settled entries outnumber open ones (a rebuild, O(n), paid for by the n/2
// settles before it), so the heap holds at most about twice the open
// leases. Expired entries are popped by the next call or scrape. One mutex
// is taken once per lease call that grants or settles; nothing is
// allocated per call once the map and the heap have grown to the load.
type openLeases struct {
	mu   sync.Mutex
	open map[string]int64 // lease ID → deadline, Unix nanoseconds
	heap []openLease      // min-heap on deadline; may hold settled leases
}

// openLease is a heap entry: a lease and its deadline.
type openLease struct {
	deadline int64
	id       string
}

func newOpenLeases() *openLeases { return &openLeases{open: make(map[string]int64)} }

// record counts the lease entries of one call: asks[i] was decided as
// results[i] at now (Unix nanoseconds). An entry that succeeded settles the
// lease it named, if this server counts it, and counts the lease it was
// granted, if any. An entry on a key no rule limits settles nothing: the
// engine ignores its lease_id, which may name any open lease (another
// client's, or one of a key whose rule a reload removed), and which the
// gauge forgot while the store held it (found by review).
func (o *openLeases) record(asks []leases.LeaseAsk, results []leases.LeaseResult, now int64) {
	locked := false
	for i := range results {
		r := &results[i]
		settles := asks[i].LeaseID != "" && !r.Unlimited
		grants := r.LeaseID != "" && r.Granted > 0
		if r.Err != nil || (!settles && !grants) {
			continue
		}
		if !locked {
			o.mu.Lock()
			locked = true
			o.expire(now)
		}
		if settles {
			delete(o.open, asks[i].LeaseID)
		}
		if grants {
			d := now + int64(r.TTL)
			o.open[r.LeaseID] = d
			o.push(openLease{deadline: d, id: r.LeaseID})
		}
	}
	if locked {
		if len(o.heap) > 2*len(o.open)+64 {
			o.rebuild()
		}
		o.mu.Unlock()
	}
}

// count returns the open leases at now.
func (o *openLeases) count(now int64) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expire(now)
	return len(o.open)
}

// expire pops the entries whose deadline has passed, forgetting their
// leases. Must be called with mu held.
func (o *openLeases) expire(now int64) {
	for len(o.heap) > 0 && o.heap[0].deadline <= now {
		top := o.heap[0]
		last := len(o.heap) - 1
		o.heap[0] = o.heap[last]
		o.heap[last] = openLease{}
		o.heap = o.heap[:last]
		o.down(0)
		if d, ok := o.open[top.id]; ok && d == top.deadline {
			delete(o.open, top.id)
		}
	}
}

// rebuild drops the heap entries of settled leases and restores the heap
// order. Must be called with mu held.
func (o *openLeases) rebuild() {
	live := o.heap[:0]
	for _, e := range o.heap {
		if d, ok := o.open[e.id]; ok && d == e.deadline {
			live = append(live, e)
		}
	}
	clear(o.heap[len(live):])
	o.heap = live
	for i := len(o.heap)/2 - 1; i >= 0; i-- {
		o.down(i)
	}
}

// push adds e to the heap.
func (o *openLeases) push(e openLease) {
	o.heap = append(o.heap, e)
	for i := len(o.heap) - 1; i > 0; {
		p := (i - 1) / 2
		if o.heap[p].deadline <= o.heap[i].deadline {
			break
		}
		o.heap[p], o.heap[i] = o.heap[i], o.heap[p]
		i = p
	}
}

// down restores the heap order below position i.
func (o *openLeases) down(i int) {
	h := o.heap
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].deadline < h[least].deadline {
			least = l
		}
		if r < len(h) && h[r].deadline < h[least].deadline {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
