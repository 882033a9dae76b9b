package leases_test

import (
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) leases.Store {
		// The suite sweeps by hand: the store has Sweep.
		return leases.NewMemoryStore(leases.MemoryOptions{Now: now, SweepInterval: -1})
	}, storetest.Options{})
}

func TestMemoryStoreWindows(t *testing.T) {
	storetest.RunWindows(t, func(t *testing.T, now func() time.Time) leases.Store {
		return leases.NewMemoryStore(leases.MemoryOptions{Now: now, SweepInterval: -1})
	}, storetest.WindowOptions{})
}

func TestMemoryStoreLeaky(t *testing.T) {
	storetest.RunLeaky(t, func(t *testing.T, now func() time.Time) leases.Store {
		return leases.NewMemoryStore(leases.MemoryOptions{Now: now, SweepInterval: -1})
	}, storetest.Options{})
}

func TestMemoryStoreSnapshot(t *testing.T) {
	storetest.RunSnapshot(t, func(t *testing.T, now func() time.Time) leases.Store {
		return leases.NewMemoryStore(leases.MemoryOptions{Now: now, SweepInterval: -1})
	})
}
