package client

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A process paused across a lease's deadline resumes with the lease still
// in its fast first half (the settle loop never marked it strict): the
// sampled clock check must stop the spending within 1<<clockShift tokens.
func TestSpendStopsAfterDeadlineWithoutTheLoop(t *testing.T) {
	c := &Client{start: time.Now()}
	l := &lease{granted: 1000, halfway: -1, deadline: c.nanos() - 1} // expired, not strict
	l.remaining.Store(1000)
	spent := 0
	for range 100 {
		if l.spend(1, c) {
			spent++
		}
	}
	assert.Less(t, spent, 1<<clockShift, "spent %d tokens of an expired lease", spent)
	assert.True(t, l.strict.Load(), "the check made the lease strict")
	assert.False(t, l.spend(1, c))
	assert.EqualValues(t, 1000-spent, l.left(), "failed spends took nothing")
}

func TestSpendFreezeIsExact(t *testing.T) {
	c := &Client{start: time.Now()}
	l := &lease{granted: 100000, deadline: c.nanos() + int64(time.Hour)}
	l.remaining.Store(100000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for range 50000 {
				if l.spend(1, c) {
					n++
				}
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	time.Sleep(time.Millisecond)
	left := l.freeze()
	used := l.granted - left
	wg.Wait()
	require.False(t, l.spend(1, c), "a frozen lease spends nothing")
	assert.EqualValues(t, total, used, "the used count reported at freeze is exactly what was spent")
	l.giveBack(5)
	assert.Zero(t, l.left(), "a give-back after freeze does not revive it")
}

// TestUsedTotalFrozenActiveLease: a Stats that reads a key's active lease
// at the moment the settle loop closes it (freezes it before it adds its
// used count to closedUsed; the lease is still the active one for a Stats
// that loaded it just before) counts none of that lease, never its whole
// grant: a frozen lease has 0 left, and granted − 0 counted its unspent
// tokens as spent. Stats.Allowed keeps the highest sum it has returned
// (clientmetrics exports it as a counter), so such an overcount would
// stand until as many more tokens were spent (found by the review of the
// API review's fixes).
func TestUsedTotalFrozenActiveLease(t *testing.T) {
	ks := newKeyState("k")
	ks.closedUsed.Store(7)
	l := &lease{granted: 1000}
	l.remaining.Store(900) // 100 spent
	ks.active.Store(l)
	require.Equal(t, int64(107), ks.usedTotal())

	l.freeze() // the loop's closeLease, before closedUsed.Add
	assert.LessOrEqual(t, ks.usedTotal(), int64(107), "a frozen lease's unspent tokens counted as spent")
	ks.closedUsed.Add(100) // closeLease's count
	ks.active.Store(nil)
	assert.Equal(t, int64(107), ks.usedTotal())
}
