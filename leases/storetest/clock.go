package storetest

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is a manual clock for stores under test. Goroutines that run store
// operations inside Hold see one instant for the whole operation, because
// Advance waits until no Hold is running. So a test can attribute every
// operation to an exact time while many goroutines run concurrently.
type Clock struct {
	gate sync.RWMutex
	us   atomic.Int64 // Unix microseconds
}

// NewClock returns a Clock set to start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.us.Store(start.UnixMicro())
	return c
}

// Now returns the clock's time. Pass it as the store's clock.
func (c *Clock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

// Hold runs fn with the clock stopped and passes it the current time.
func (c *Clock) Hold(fn func(now time.Time)) {
	c.gate.RLock()
	defer c.gate.RUnlock()
	fn(c.Now())
}

// Advance moves the clock forward by d, after every running Hold returned.
func (c *Clock) Advance(d time.Duration) {
	c.gate.Lock()
	c.us.Add(d.Microseconds())
	c.gate.Unlock()
}
