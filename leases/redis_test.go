package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/stretchr/testify/require"
)

func TestRedisStoreConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) leases.Store {
		require.NoError(t, rdb.FlushDB(context.Background()).Err())
		return leases.NewRedisStore(rdb, leases.RedisOptions{Now: now})
	}, storetest.Options{ConcurrentTicks: 500})
}
