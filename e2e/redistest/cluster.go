package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of real redis-server processes, masters only,
// with the 16384 slots split evenly between them.
type Cluster struct {
	// Nodes are the cluster's servers, in slot order.
	Nodes []*Server
}

// StartCluster starts n redis-server processes in cluster mode on free
// 127.0.0.1 ports, assigns the slots, joins them with CLUSTER MEET and waits
// (up to 20 s) until every node reports cluster_state:ok. Cleanup stops
// them all.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("redistest: StartCluster needs at least 1 node, got %d", n)
	}
	c := &Cluster{}
	for range n {
		c.Nodes = append(c.Nodes, start(t, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const slots = 16384
	for i, s := range c.Nodes {
		rdb := s.Client(t)
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := rdb.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, s.Addr(), err)
		}
		if i > 0 {
			first := c.Nodes[0]
			if err := rdb.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(first.port)).Err(); err != nil {
				t.Fatalf("redistest: CLUSTER MEET from %s: %v", s.Addr(), err)
			}
		}
	}
	for _, s := range c.Nodes {
		rdb := s.Client(t)
		for {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("redistest: cluster did not become ready on %s: %v\n%s", s.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Client returns a go-redis cluster client, closed at t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	// No retries (see Server.Client); redirections (MOVED, ASK) still
	// follow, as a redirected command did not run.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
