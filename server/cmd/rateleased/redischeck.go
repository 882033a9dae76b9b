package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisCheckTimeout bounds the configuration check at start.
const redisCheckTimeout = 2 * time.Second

// checkRedisConfig logs, at start, what in the Redis configuration can make
// the limits leak. It never fails the start: the operator may know better
// (a Redis of its own for rateleased with ample memory, say), and a managed
// Redis may refuse to show its configuration.
//
//   - A maxmemory-policy other than noeviction, allkeys-* and volatile-*
//     alike (bucket keys carry a TTL), lets Redis evict a bucket while leases
//     on it are open. The bucket then comes back full and forgets the tokens
//     out in leases, which can let one extra burst through: WARN.
//   - Neither RDB snapshots (save has save points) nor AOF (appendonly yes):
//     a restart loses every bucket with its open leases, which can let one
//     extra burst through as well: WARN.
//   - CONFIG GET refused (managed Redis services disable or rename it, and
//     an ACL user may lack it): INFO, saying what could not be checked.
//
// On a cluster every master is checked, and each log line names the node.
// It reports whether every node was seen to run maxmemory-policy
// noeviction: the store may then skip its check for a partly evicted bucket
// (leases.RedisOptions.NoEviction).
func checkRedisConfig(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger) (noEviction bool) {
	ctx, cancel := context.WithTimeout(ctx, redisCheckTimeout)
	defer cancel()
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		all := true
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			ok := checkRedisNode(ctx, node, log)
			mu.Lock()
			all = all && ok
			mu.Unlock()
			return nil
		})
		if err != nil {
			log.Info("could not check the redis cluster's maxmemory-policy and persistence: run every master with maxmemory-policy noeviction and persistence (RDB or AOF)",
				"err", err)
			return false
		}
		return all
	case *redis.Client:
		return checkRedisNode(ctx, c, log)
	default:
		log.Info("could not check redis maxmemory-policy and persistence: unknown client type", "type", fmt.Sprintf("%T", rdb))
		return false
	}
}

// checkRedisNode checks the configuration of one Redis server and reports
// whether its maxmemory-policy is noeviction.
func checkRedisNode(ctx context.Context, c *redis.Client, log *slog.Logger) bool {
	addr := c.Options().Addr
	get := func(param string) (string, error) {
		m, err := c.ConfigGet(ctx, param).Result()
		if err != nil {
			return "", fmt.Errorf("CONFIG GET %s: %w", param, err)
		}
		v, ok := m[param]
		if !ok {
			return "", fmt.Errorf("CONFIG GET %s: no such parameter", param)
		}
		return v, nil
	}

	policy, err := get("maxmemory-policy")
	if err != nil {
		log.Info("could not check redis maxmemory-policy and persistence: CONFIG is refused (a managed Redis may disable it); make sure the policy is noeviction and RDB or AOF is on, or an eviction or a restart can let one extra burst through",
			"redis", addr, "err", err)
		return false
	}
	noEviction := policy == "noeviction"
	if !noEviction {
		log.Warn("redis maxmemory-policy can evict bucket keys: a bucket evicted while leases on it are open forgets them, which can let one extra burst through; set maxmemory-policy noeviction",
			"redis", addr, "maxmemory_policy", policy)
	}

	save, errSave := get("save")
	aof, errAOF := get("appendonly")
	if err := errors.Join(errSave, errAOF); err != nil {
		log.Info("could not check redis persistence: CONFIG is refused (a managed Redis may disable it); make sure RDB or AOF is on, or a restart can let one extra burst through",
			"redis", addr, "err", err)
		return noEviction
	}
	if strings.TrimSpace(save) == "" && !strings.EqualFold(aof, "yes") {
		log.Warn("redis persists nothing (no RDB save points, appendonly no): a restart forgets every bucket and its open leases, which can let one extra burst through; turn on RDB snapshots or AOF",
			"redis", addr, "save", save, "appendonly", aof)
	}
	return noEviction
}
