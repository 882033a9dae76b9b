package client

import "time"

// clock is the client's time. A Client reads the monotonic clock (clock
// nil); the package's tests give it one they drive, so that the settle
// loop's timing (renewals, returns, idle keys) is tested at chosen instants.
type clock interface {
	// nanos returns the time since the client started, in nanoseconds.
	nanos() int64
	// ticker returns a channel that receives every d, and a function that
	// stops it.
	ticker(d time.Duration) (<-chan time.Time, func())
	// after returns a channel that receives once d has passed, and a
	// function that stops it.
	after(d time.Duration) (<-chan time.Time, func())
}

// nanos reads the client's clock: the monotonic clock, unless a test set
// another.
func (c *Client) nanos() int64 {
	if c.clk != nil {
		return c.clk.nanos()
	}
	return int64(time.Since(c.start))
}

// ticker returns the settle loop's tick.
func (c *Client) ticker(d time.Duration) (<-chan time.Time, func()) {
	if c.clk != nil {
		return c.clk.ticker(d)
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// after returns a channel that receives once d has passed on the client's
// clock.
func (c *Client) after(d time.Duration) (<-chan time.Time, func()) {
	if c.clk != nil {
		return c.clk.after(d)
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}
