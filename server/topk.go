package server

import (
	"cmp"
	"container/heap"
	"slices"
	"strings"
	"sync"
)

// topK finds the heaviest keys of a stream in bounded memory with the
// space-saving algorithm (Metwally, Agrawal and El Abbadi, 2005): it keeps
// at most k counters; a key it does not count takes over the smallest
// counter, inheriting its count as its error.
//
// Its error is bounded and reported: for each key listed, the true weight
// lies in [Count-Err, Count], and Err is at most total/k, where total is the
// weight of the whole stream. Every key whose true weight exceeds total/k is
// listed. Keys near the bottom of a list of many distinct keys are the
// least certain; the status page shows Err beside each count.
//
// An add costs a map lookup and O(log k) under a mutex; keys are cloned
// only when they enter the summary. The zero value is not usable: use
// newTopK.
type topK struct {
	mu    sync.Mutex
	k     int
	total int64
	byKey map[string]*topKEntry
	h     topKHeap // min-heap by count
}

// topKEntry is one counted key.
type topKEntry struct {
	Key   string `json:"key"`
	Count int64  `json:"count"` // an upper bound of the key's weight
	Err   int64  `json:"err"`   // Count minus Err is a lower bound
	i     int    // position in the heap
}

func newTopK(k int) *topK {
	return &topK{k: k, byKey: make(map[string]*topKEntry, k)}
}

// add counts n for key.
func (t *topK) add(key string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += n
	if e, ok := t.byKey[key]; ok {
		e.Count += n
		heap.Fix(&t.h, e.i)
		return
	}
	if len(t.h) < t.k {
		e := &topKEntry{Key: strings.Clone(key), Count: n}
		t.byKey[e.Key] = e
		heap.Push(&t.h, e)
		return
	}
	// Replace the smallest counter: the new key may have had up to its
	// count before.
	e := t.h[0]
	delete(t.byKey, e.Key)
	e.Key, e.Err, e.Count = strings.Clone(key), e.Count, e.Count+n
	t.byKey[e.Key] = e
	heap.Fix(&t.h, 0)
}

// top returns the n heaviest entries, heaviest first (ties by key), and the
// weight of the whole stream.
func (t *topK) top(n int) ([]topKEntry, int64) {
	t.mu.Lock()
	out := make([]topKEntry, len(t.h))
	for i, e := range t.h {
		out[i] = *e
	}
	total := t.total
	t.mu.Unlock()
	sortEntries(out)
	if len(out) > n {
		out = out[:n]
	}
	return out, total
}

// sortEntries sorts entries heaviest first, ties by key.
func sortEntries(entries []topKEntry) {
	slices.SortFunc(entries, func(a, b topKEntry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}

// summary returns every counter, heaviest first, as a keySummary for the
// fleet's status page (see fleet.go).
func (t *topK) summary() keySummary {
	entries, total := t.top(t.k)
	ks := keySummary{K: t.k, Total: total, Entries: entries}
	if len(entries) == t.k {
		// Full: a key not counted may have had up to the smallest count
		// before its counter was taken over. Not full: every key seen
		// is counted.
		ks.Floor = entries[len(entries)-1].Count
	}
	return ks
}

// topKHeap is a min-heap of entries by count.
type topKHeap []*topKEntry

func (h topKHeap) Len() int           { return len(h) }
func (h topKHeap) Less(i, j int) bool { return h[i].Count < h[j].Count }
func (h topKHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}
func (h *topKHeap) Push(x any) {
	e := x.(*topKEntry)
	e.i = len(*h)
	*h = append(*h, e)
}
func (h *topKHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
