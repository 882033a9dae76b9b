//go:build race

package client_test

// raceEnabled reports whether the race detector is on: it instruments
// memory accesses with allocations of its own, so allocation counts are
// checked only without it.
const raceEnabled = true
