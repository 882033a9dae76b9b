package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/redis/go-redis/v9"
)

// BucketMemory is what a bucket of the Redis store costs Redis, in bytes.
type BucketMemory struct {
	// Take, Lease and Shared are MEMORY USAGE summed over the bucket's keys:
	// a bucket decided by direct takes, one with a lease open, and one
	// shared by two clients.
	Take, Lease, Shared int64
	// ServerTake is Take for takes made through a leases.OwningStore (as
	// rateleased makes them with -own-keys, its default): the bucket also
	// records the lease server that took (TakeOp.Server), named as
	// NewOwningStore names one by default, and lives a lease TTL at least.
	ServerTake int64
	// BulkTake, BulkServerTake and BulkLease are the growth of used_memory
	// per bucket over BulkBuckets buckets of the kinds above: what a bucket
	// costs with Redis's own overhead (the keyspace and expiry entries,
	// allocator rounding).
	BulkTake, BulkServerTake, BulkLease int64
}

// measureServer names the lease server of ServerTake's takes, as
// NewOwningStore names one when OwningOptions.Server is empty.
const measureServer = "server-9c2e7f3a0b1d22aa"

// BulkBuckets is the number of buckets of each bulk measurement.
const BulkBuckets = 10_000

// MeasureRedisMemory creates buckets through a Redis store over rdb, with
// key names of a per-user limit under prefix, measures them, and deletes
// them. Run it on a Redis that nothing else writes to meanwhile.
func MeasureRedisMemory(ctx context.Context, rdb *redis.Client, prefix string) (BucketMemory, error) {
	s := leases.NewRedisStore(rdb, leases.RedisOptions{})
	b := leases.Bucket{Algorithm: leases.TokenBucket, Limit: 10, Period: time.Second, Burst: 10, LeaseTTL: 2 * time.Second}
	var m BucketMemory
	var keys []string
	defer func() {
		for start := 0; start < len(keys); start += 1000 {
			var del []string
			for _, k := range keys[start:min(len(keys), start+1000)] {
				h, z, sh := leases.RedisKeys(k)
				del = append(del, h, z, sh)
			}
			_ = rdb.Unlink(ctx, del...).Err()
		}
	}()
	usage := func(key string) (int64, error) {
		var sum int64
		h, z, sh := leases.RedisKeys(key)
		for _, k := range []string{h, z, sh} {
			n, err := rdb.MemoryUsage(ctx, k, 0).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
			}
			sum += n
		}
		return sum, nil
	}
	used := func() (int64, error) {
		v, err := rdb.InfoMap(ctx, "memory").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO memory: %w", err)
		}
		return strconv.ParseInt(v["Memory"]["used_memory"], 10, 64)
	}
	a := leases.Owner{Client: "checkout", Process: "7f3a9c2e"}
	lease := func(o leases.Owner, key string) error {
		_, err := s.Lease(ctx, o, []leases.LeaseOp{{Key: key, Bucket: b, Want: 2, NewLeaseID: leases.NewLeaseID()}})
		return err
	}
	take, leased, shared, serverTake := prefix+"241531", prefix+"241532", prefix+"241533", prefix+"241534"
	keys = append(keys, take, leased, shared, serverTake)
	if _, err := s.Take(ctx, []leases.TakeOp{{Key: take, Bucket: b, Cost: 1}, {Key: serverTake, Bucket: b, Cost: 1, Server: measureServer}}); err != nil {
		return m, err
	}
	if err := errors.Join(lease(a, leased), lease(a, shared), lease(leases.Owner{Client: "search", Process: "0b1d22aa"}, shared)); err != nil {
		return m, err
	}
	var errs [4]error
	m.Take, errs[0] = usage(take)
	m.Lease, errs[1] = usage(leased)
	m.Shared, errs[2] = usage(shared)
	m.ServerTake, errs[3] = usage(serverTake)
	if err := errors.Join(errs[:]...); err != nil {
		return m, err
	}

	bulk := func(base int, op func([]string) error) (int64, error) {
		before, err := used()
		if err != nil {
			return 0, err
		}
		batch := make([]string, 0, 1000)
		for i := range BulkBuckets {
			k := fmt.Sprint(prefix, base+i)
			keys = append(keys, k)
			if batch = append(batch, k); len(batch) == cap(batch) {
				if err := op(batch); err != nil {
					return 0, err
				}
				batch = batch[:0]
			}
		}
		after, err := used()
		if err != nil {
			return 0, err
		}
		return (after - before) / BulkBuckets, nil
	}
	var err error
	m.BulkTake, err = bulk(1_000_000, func(ks []string) error {
		ops := make([]leases.TakeOp, len(ks))
		for i, k := range ks {
			ops[i] = leases.TakeOp{Key: k, Bucket: b, Cost: 1}
		}
		_, err := s.Take(ctx, ops)
		return err
	})
	if err != nil {
		return m, err
	}
	m.BulkServerTake, err = bulk(3_000_000, func(ks []string) error {
		ops := make([]leases.TakeOp, len(ks))
		for i, k := range ks {
			ops[i] = leases.TakeOp{Key: k, Bucket: b, Cost: 1, Server: measureServer}
		}
		_, err := s.Take(ctx, ops)
		return err
	})
	if err != nil {
		return m, err
	}
	m.BulkLease, err = bulk(2_000_000, func(ks []string) error {
		ops := make([]leases.LeaseOp, len(ks))
		for i, k := range ks {
			ops[i] = leases.LeaseOp{Key: k, Bucket: b, Want: 2, NewLeaseID: leases.NewLeaseID()}
		}
		_, err := s.Lease(ctx, a, ops)
		return err
	})
	return m, err
}
