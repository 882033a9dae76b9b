package compare

import "math/bits"

// hist is a log-linear latency histogram in nanoseconds: exact below
// 2*subCount ns, then subCount buckets per power of two, so a quantile is
// at most 1/subCount/2 (0.8%) off from the bucket midpoint it reports.
// Recording is an array increment: no allocation, no lock (one per
// goroutine, merged after the run).
type hist struct {
	counts [64 * subCount]uint64
	n      uint64
}

const (
	subBits  = 6
	subCount = 1 << subBits
)

func bucketOf(v uint64) int {
	if v < 2*subCount {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1 // v>>e is in [subCount, 2*subCount)
	return (e+1)<<subBits + int(v>>e) - subCount
}

// bucketRange returns the smallest value of bucket i and its width.
func bucketRange(i int) (low, width uint64) {
	if i < 2*subCount {
		return uint64(i), 1
	}
	e := i>>subBits - 1
	m := uint64(i&(subCount-1) + subCount)
	return m << e, 1 << e
}

func (h *hist) record(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h.counts[bucketOf(uint64(ns))]++
	h.n++
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the midpoint of the bucket holding the q-quantile, 0 if
// the histogram is empty.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if rank >= h.n {
		rank = h.n - 1
	}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum > rank {
			low, width := bucketRange(i)
			return float64(low) + float64(width-1)/2
		}
	}
	return 0 // not reached
}
