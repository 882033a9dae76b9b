package compare

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplay replays 100 ms of arrivals through a decider that is slow on
// every tenth arrival: every arrival is decided, by the instance and key it
// names, and the slow decisions hold back no later one.
func TestReplay(t *testing.T) {
	const n = 200
	arr := make([]arrival, n)
	keys := make([]string, n)
	for i := range arr {
		arr[i] = arrival{at: time.Duration(i) * 500 * time.Microsecond, key: int32(i), inst: uint16(i % 3)}
		keys[i] = strconv.Itoa(i)
	}
	const slow = 30 * time.Millisecond
	insts := make([]int, n) // each index written by its own decision only
	rep := replay(context.Background(), arr, keys, func(_ context.Context, inst int, key string) decision {
		i, err := strconv.Atoi(key)
		if err != nil {
			panic(err)
		}
		insts[i] = inst
		if i%10 == 0 {
			time.Sleep(slow)
		}
		return decision{allowed: i%2 == 0, source: 3}
	})
	require.Len(t, rep.decisions, n)
	require.Len(t, rep.lag, n)
	for i, d := range rep.decisions {
		assert.Equal(t, int(arr[i].inst), insts[i], "arrival %d", i)
		assert.Equal(t, i%2 == 0, d.allowed, "arrival %d", i)
		assert.Equal(t, uint8(3), d.source)
		assert.False(t, d.failed)
		assert.GreaterOrEqual(t, d.end, d.start)
		assert.GreaterOrEqual(t, rep.lag[i], time.Duration(0), "arrival %d started before its time", i)
		if i%10 == 0 {
			assert.GreaterOrEqual(t, d.end-d.start, slow)
		}
	}
	// Workers are reused: about as many as decisions were in flight at
	// once (a few slow ones), not one per arrival.
	assert.Greater(t, rep.workers, 1)
	assert.Less(t, rep.workers, n/4)
	// Open loop: the whole schedule took about its length plus one slow
	// decision, not the sum of the slow ones (20 × 30 ms).
	assert.Less(t, rep.elapsed, arr[n-1].at+slow+300*time.Millisecond)
}

// TestReplayCutOff ends the context while the pacer waits for an arrival an
// hour away: the decision in flight returns, the arrivals left are failed.
func TestReplayCutOff(t *testing.T) {
	arr := []arrival{{at: 0}, {at: time.Hour}, {at: 2 * time.Hour}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep := replay(ctx, arr, []string{"k"}, func(ctx context.Context, _ int, _ string) decision {
		<-ctx.Done()
		return decision{allowed: true}
	})
	assert.Less(t, time.Since(start), 10*time.Second)
	require.Len(t, rep.decisions, 3)
	assert.True(t, rep.decisions[0].allowed)
	assert.False(t, rep.decisions[0].failed)
	for _, d := range rep.decisions[1:] {
		assert.True(t, d.failed)
		assert.False(t, d.allowed)
	}
}
