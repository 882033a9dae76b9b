package compare

import (
	"context"
	"fmt"
	"testing"

	"github.com/ratelease/ratelease/leases/storetest"
	"github.com/redis/go-redis/v9"
)

// The figures the report compares the measured memory with.
const (
	seedEstimate = 48  // B per user, the first design document's estimate
	oldLayout    = 240 // B, a bucket with one lease in the layout of two keys
)

// measureMemory measures what a bucket costs Redis on the benchmark's
// redis-server (storetest.MeasureRedisMemory), before any run writes to it.
func measureMemory(b *testing.B, rdb *redis.Client) storetest.BucketMemory {
	b.Helper()
	m, err := storetest.MeasureRedisMemory(context.Background(), rdb, "mem:")
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// memoryText renders the memory section of the report.
func memoryText(m storetest.BucketMemory) string {
	if m.Take == 0 {
		return ""
	}
	return fmt.Sprintf(`## Redis memory per bucket

What one key's bucket costs Redis, with the key names of a per-user limit (`+"`user:<6 digits>`"+`-like), measured on this run's redis-server. An idle bucket costs nothing: its keys expire once its leases have ended and it would be full again (a bucket of takes made through an owning server: a lease TTL after the last take at least), plus a second.

| bucket | MEMORY USAGE | used_memory growth per bucket, over %s |
|---|--:|--:|
| decided by direct takes (the per-user case), through rateleased's `+"`-own-keys`"+` (the default: the bucket names the server that took, and lives a lease TTL at least) | %d B | %d B |
| decided by direct takes, without `+"`-own-keys`"+` | %d B | %d B |
| one lease open | %d B | %d B |
| shared by two clients | %d B | |

For comparison: the first design document estimated %d B per user; the previous layout (a bucket hash and a lease hash, both always present) measured %d B for a bucket with one lease.

`, fmtInt(storetest.BulkBuckets), m.ServerTake, m.BulkServerTake, m.Take, m.BulkTake, m.Lease, m.BulkLease, m.Shared, seedEstimate, oldLayout)
}
