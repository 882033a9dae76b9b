package e2e

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCounterBound: the window check counts every span overlapping a window
// and widens the bound by the longest span on each side, so a request in
// flight across a window's edge cannot fail a run that kept the bound, and
// a run that broke it by more than the widening still fails.
func TestCounterBound(t *testing.T) {
	// 100/s with 10 ms slots: one token per slot; burst 20. A 10-slot
	// window allows 30, widened by 2 per slot of spread.
	for _, tc := range []struct {
		name   string
		spans  []span
		spread int64
		bad    bool
	}{
		{"at the bound", []span{{10, 10, 30}}, 0, false},
		{"one over", []span{{10, 10, 31}}, 0, true},
		{"one in flight across the edge", []span{{10, 10, 30}, {9, 10, 1}}, 1, false},
		{"one over and one in flight: within the widening", []span{{10, 10, 31}, {9, 10, 1}}, 1, false},
		{"three over with a spread of one slot", []span{{10, 10, 33}, {9, 10, 1}}, 1, true},
		{"a doubled burst", []span{{10, 10, 60}, {9, 11, 1}}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A span of nothing at slot 19 makes [10, 19] a whole window.
			c := newCounter(append(tc.spans, span{19, 19, 0}))
			assert.Equal(t, tc.spread, c.spread)
			_, bad := c.worstExcess(100, 20)
			assert.Equal(t, tc.bad, bad)
		})
	}
}
