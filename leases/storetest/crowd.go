package storetest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// crowd is the bookkeeping of a concurrent test: workers that call a store
// under the fixture's driven clock until the run is done, counting their
// calls, and the first failure any of them met.
type crowd struct {
	done   atomic.Bool
	ops    atomic.Int64
	wg     sync.WaitGroup
	failed atomic.Pointer[error]
}

// start runs loop(w) on a goroutine of its own for each of workers.
func (c *crowd) start(workers int, loop func(w int)) {
	for w := range workers {
		c.wg.Go(func() { loop(w) })
	}
}

// fail keeps err as the run's failure, unless one came first.
func (c *crowd) fail(err error) { c.failed.CompareAndSwap(nil, &err) }

// drive advances f's clock by one millisecond ticks times, each once the
// workers have made about two calls each at the instant before (observed
// in their call count, not slept for), then stops the workers, waits for
// them, and fails t if any of them failed.
func (c *crowd) drive(t *testing.T, f *fixture, ticks, workers int) {
	t.Helper()
	for range ticks {
		target := c.ops.Load() + 2*int64(workers)
		for c.ops.Load() < target && c.failed.Load() == nil {
			time.Sleep(20 * time.Microsecond)
		}
		f.clock.Advance(time.Millisecond)
	}
	c.stop(t)
}

// stop stops the workers, waits for them, and fails t if any of them
// failed.
func (c *crowd) stop(t *testing.T) {
	t.Helper()
	c.done.Store(true)
	c.wg.Wait()
	if err := c.failed.Load(); err != nil {
		t.Fatalf("store failed: %v", *err)
	}
}
