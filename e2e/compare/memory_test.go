package compare

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/redis/go-redis/v9"
)

// memoryUse is what a bucket costs Redis, in bytes.
type memoryUse struct {
	Take, Lease, Shared  int64 // MEMORY USAGE of all of one bucket's keys
	BulkTake, BulkLease  int64 // growth of used_memory per bucket over memBulk buckets
	seedEstimate, oldOne int64
}

// memBulk is the number of buckets of each bulk measurement.
const memBulk = 10_000

// measureMemory creates buckets of three kinds, with the key names of a
// per-user limit, through the Redis store on the benchmark's redis-server,
// and measures them: a bucket decided by direct takes, one with a lease
// open, one shared by two clients; then the growth of used_memory over
// memBulk buckets of the first two kinds. It deletes them after.
func measureMemory(b *testing.B, rdb *redis.Client) memoryUse {
	b.Helper()
	ctx := context.Background()
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	bk := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: 2 * time.Second}
	var keys []string
	usage := func(key string) int64 {
		var sum int64
		h, z, sh := leases.RedisKeys(key)
		for _, k := range []string{h, z, sh} {
			n, err := rdb.MemoryUsage(ctx, k, 0).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			sum += n
		}
		return sum
	}
	used := func() int64 {
		v, err := rdb.InfoMap(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		n, err := strconv.ParseInt(v["Memory"]["used_memory"], 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	check := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	a := leases.Owner{Client: "checkout", Process: "7f3a9c2e"}
	m := memoryUse{seedEstimate: 48, oldOne: 240}
	_, err := s.Take(ctx, []leases.TakeOp{{Key: "mem:241531", Bucket: bk, Cost: 1}})
	check(err)
	m.Take = usage("mem:241531")
	_, err = s.Lease(ctx, a, []leases.LeaseOp{{Key: "mem:241532", Bucket: bk, Want: 2, NewLeaseID: leases.NewLeaseID()}})
	check(err)
	m.Lease = usage("mem:241532")
	_, err = s.Lease(ctx, a, []leases.LeaseOp{{Key: "mem:241533", Bucket: bk, Want: 2, NewLeaseID: leases.NewLeaseID()}})
	check(err)
	_, err = s.Lease(ctx, leases.Owner{Client: "search", Process: "0b1d22aa"}, []leases.LeaseOp{{Key: "mem:241533", Bucket: bk, Want: 2, NewLeaseID: leases.NewLeaseID()}})
	check(err)
	m.Shared = usage("mem:241533")
	keys = append(keys, "mem:241531", "mem:241532", "mem:241533")

	before := used()
	ops := make([]leases.TakeOp, 0, 1000)
	for i := range memBulk {
		k := fmt.Sprint("mem:", 1_000_000+i)
		keys = append(keys, k)
		ops = append(ops, leases.TakeOp{Key: k, Bucket: bk, Cost: 1})
		if len(ops) == cap(ops) {
			_, err := s.Take(ctx, ops)
			check(err)
			ops = ops[:0]
		}
	}
	m.BulkTake = (used() - before) / memBulk
	before = used()
	lops := make([]leases.LeaseOp, 0, 1000)
	for i := range memBulk {
		k := fmt.Sprint("mem:", 2_000_000+i)
		keys = append(keys, k)
		lops = append(lops, leases.LeaseOp{Key: k, Bucket: bk, Want: 2, NewLeaseID: leases.NewLeaseID()})
		if len(lops) == cap(lops) {
			_, err := s.Lease(ctx, a, lops)
			check(err)
			lops = lops[:0]
		}
	}
	m.BulkLease = (used() - before) / memBulk
	for start := 0; start < len(keys); start += 1000 {
		var del []string
		for _, k := range keys[start:min(len(keys), start+1000)] {
			h, z, sh := leases.RedisKeys(k)
			del = append(del, h, z, sh)
		}
		check(rdb.Unlink(ctx, del...).Err())
	}
	return m
}

// memoryText renders the memory section of the report.
func memoryText(m memoryUse) string {
	if m.Take == 0 {
		return ""
	}
	return fmt.Sprintf(`## Redis memory per bucket

What one key's bucket costs Redis, with the key names of a per-user limit (`+"`user:<6 digits>`"+`-like), measured on this run's redis-server. An idle bucket costs nothing: its keys expire once its leases have ended and it would be full again.

| bucket | MEMORY USAGE | used_memory growth per bucket, over %s |
|---|--:|--:|
| decided by direct takes (the per-user case) | %d B | %d B |
| one lease open | %d B | %d B |
| shared by two clients | %d B | |

For comparison: the first design document estimated %d B per user; the previous layout (a bucket hash and a lease hash, both always present) measured %d B for a bucket with one lease.

`, fmtInt(memBulk), m.Take, m.BulkTake, m.Lease, m.BulkLease, m.Shared, m.seedEstimate, m.oldOne)
}
