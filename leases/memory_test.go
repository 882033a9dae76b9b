package leases_test

import (
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) leases.Store {
		return leases.NewMemoryStore(leases.MemoryOptions{Now: now})
	}, storetest.Options{})
}
