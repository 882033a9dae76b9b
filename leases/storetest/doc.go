// Package storetest is the conformance suite of leases.Store: every store
// implementation runs it (the memory store and the Redis store do, in their
// tests), so that all stores keep the invariant of the token bucket with
// leases and answer alike.
//
// The suite drives time through a Clock the store must use as its clock
// (leases.MemoryOptions.Now, leases.RedisOptions.Now), which makes every
// expectation exact: retry_after to the millisecond, expiry at the TTL, and
// the bound burst + rate·W checked for every window while many goroutines
// settle concurrently.
package storetest
