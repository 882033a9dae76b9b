package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Peer timings of the status page.
const (
	// PeerInterval is how often a server records itself in Options.Peers
	// (see fleet.go).
	PeerInterval = 2 * time.Second
	// SnapshotTTL is how long a published status snapshot lives: a server
	// that stops publishing drops out of the fleet's figures after at
	// most this long.
	SnapshotTTL = 3 * PeerInterval
	// snapshotRefresh is how often a server publishes its status
	// snapshot: every other interval, a whole interval before the last
	// one expires.
	snapshotRefresh = SnapshotTTL - PeerInterval
	// PeerWindow is how recently a server must have recorded itself to be
	// listed as sharing the store.
	PeerWindow = 30 * time.Second
	// peerForget is how long a silent server's entry is kept before a
	// heartbeat of any server removes it, and the lifetime of the whole
	// record once every server is silent.
	peerForget = 10 * time.Minute
	// peerTidy is how often a server's heartbeat, besides recording it,
	// removes the entries silent for peerForget and renews the record's
	// time to live: a tenth of peerForget, so an entry goes at most that
	// much after peerForget, and the record lives at least nine tenths
	// of peerForget once every server is silent.
	peerTidy = peerForget / 10
)

// Peer is a lease server seen sharing the store.
type Peer struct {
	// Name identifies the server: its host, listen address and process.
	Name string
	// Seen is when it last recorded itself.
	Seen time.Time
}

// Peers records the lease servers that share a store and their status
// snapshots, so that the status page can list them and show the fleet's
// figures. Each server calls Beat and Publish every PeerInterval while it
// runs, and Leave when it stops. Implementations must be safe for
// concurrent use.
type Peers interface {
	// Beat records that the server name is alive at now.
	Beat(ctx context.Context, name string, now time.Time) error
	// List returns the servers that recorded themselves at since or later,
	// the most recently seen first.
	List(ctx context.Context, since time.Time) ([]Peer, error)
	// Leave forgets the server name, and its snapshot.
	Leave(ctx context.Context, name string) error
	// Publish stores the status snapshot of server name, an opaque
	// document, to be forgotten after ttl unless published again.
	Publish(ctx context.Context, name string, snapshot []byte, ttl time.Duration) error
	// Snapshots returns the snapshots of the servers names, in the order
	// of names: nil for a server that has none (it never published, or
	// its snapshot's ttl passed).
	Snapshots(ctx context.Context, names []string) ([][]byte, error)
}

// RedisPeersKey is the Redis key of NewRedisPeers' record: a sorted set of
// server names scored by the Unix time in milliseconds at which each was
// last seen.
const RedisPeersKey = "rl:servers"

// RedisSnapshotPrefix is the prefix of the Redis keys of NewRedisPeers'
// status snapshots: one string key per server, RedisSnapshotPrefix + its
// name, with a time to live. Its braces are a Redis Cluster hash tag, so
// that every snapshot lives in one slot and one MGET reads them all.
const RedisSnapshotPrefix = "{rl:status}:"

// RedisPeers is Peers in Redis: the sorted set RedisPeersKey, with a
// time to live, and a key per server's snapshot (RedisSnapshotPrefix).
// Create it with NewRedisPeers.
//
// A heartbeat costs Redis one command (ZADD) most of the time: the
// record's upkeep, removing the silent servers' entries and renewing its
// time to live, is done by a server's first heartbeat and then every
// peerTidy, not by every one. Every server's heartbeats run all the time
// (a ticker per server, whatever the traffic), so at a hot key's rate of
// decisions they would otherwise be a visible part of the Redis commands
// per decision.
type RedisPeers struct {
	rdb redis.UniversalClient
	key string
	// commands counts the Redis commands that reached Redis (see Commands).
	commands atomic.Int64

	mu     sync.Mutex
	tidied time.Time // when Beat last did the record's upkeep; zero: never
}

// Commands returns the number of Redis commands of p that reached Redis
// (answered, or refused with an error reply): its heartbeats, snapshots,
// and the status page's reads. The server exports it as
// ratelease_peer_commands_total, so that the Redis work of the fleet view,
// a cost per second whatever the traffic, can be told from the store's, a
// cost per decision. Servers that share one RedisPeers share its count.
func (p *RedisPeers) Commands() int64 { return p.commands.Load() }

// count adds to Commands the commands of cmds that reached Redis.
func (p *RedisPeers) count(cmds ...redis.Cmder) {
	for _, c := range cmds {
		var reply redis.Error
		if err := c.Err(); err == nil || errors.As(err, &reply) {
			p.commands.Add(1)
		}
	}
}

// NewRedisPeers returns Peers kept in rdb under RedisPeersKey and
// RedisSnapshotPrefix. It works with Redis Cluster too: the record is one
// key, and the snapshots share one hash tag.
func NewRedisPeers(rdb redis.UniversalClient) *RedisPeers {
	return &RedisPeers{rdb: rdb, key: RedisPeersKey}
}

// Beat implements Peers: it sets name's score to now (one ZADD). At the
// first beat, and then every peerTidy, it also removes the entries of
// servers silent for peerForget and keeps the record alive for peerForget
// more, in the same round trip. The three commands need no transaction:
// each is right on its own, whatever runs between them.
func (p *RedisPeers) Beat(ctx context.Context, name string, now time.Time) error {
	ms := now.UnixMilli()
	z := redis.Z{Score: float64(ms), Member: name}
	p.mu.Lock()
	tidy := p.tidied.IsZero() || now.Sub(p.tidied) >= peerTidy || now.Before(p.tidied)
	p.mu.Unlock()
	var err error
	if !tidy {
		cmd := p.rdb.ZAdd(ctx, p.key, z)
		p.count(cmd)
		err = cmd.Err()
	} else {
		var cmds []redis.Cmder
		cmds, err = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.ZAdd(ctx, p.key, z)
			pipe.ZRemRangeByScore(ctx, p.key, "-inf", "("+strconv.FormatInt(ms-peerForget.Milliseconds(), 10))
			pipe.PExpire(ctx, p.key, peerForget)
			return nil
		})
		p.count(cmds...)
	}
	if err != nil {
		return fmt.Errorf("server: record this server in redis key %s: %w", p.key, err)
	}
	if tidy {
		p.mu.Lock()
		p.tidied = now
		p.mu.Unlock()
	}
	return nil
}

// List implements Peers.
func (p *RedisPeers) List(ctx context.Context, since time.Time) ([]Peer, error) {
	cmd := p.rdb.ZRevRangeByScoreWithScores(ctx, p.key, &redis.ZRangeBy{
		Min: strconv.FormatInt(since.UnixMilli(), 10), Max: "+inf",
	})
	p.count(cmd)
	zs, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("server: list the servers in redis key %s: %w", p.key, err)
	}
	out := make([]Peer, len(zs))
	for i, z := range zs {
		name, _ := z.Member.(string)
		out[i] = Peer{Name: name, Seen: time.UnixMilli(int64(z.Score))}
	}
	return out, nil
}

// Leave implements Peers.
func (p *RedisPeers) Leave(ctx context.Context, name string) error {
	zrem := p.rdb.ZRem(ctx, p.key, name)
	p.count(zrem)
	if err := zrem.Err(); err != nil {
		return fmt.Errorf("server: remove this server from redis key %s: %w", p.key, err)
	}
	del := p.rdb.Del(ctx, RedisSnapshotPrefix+name)
	p.count(del)
	if err := del.Err(); err != nil {
		return fmt.Errorf("server: delete this server's status snapshot: %w", err)
	}
	return nil
}

// Publish implements Peers with one SET with a time to live.
func (p *RedisPeers) Publish(ctx context.Context, name string, snapshot []byte, ttl time.Duration) error {
	set := p.rdb.Set(ctx, RedisSnapshotPrefix+name, snapshot, ttl)
	p.count(set)
	if err := set.Err(); err != nil {
		return fmt.Errorf("server: publish this server's status snapshot: %w", err)
	}
	return nil
}

// Snapshots implements Peers with one MGET.
func (p *RedisPeers) Snapshots(ctx context.Context, names []string) ([][]byte, error) {
	if len(names) == 0 {
		return nil, nil
	}
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = RedisSnapshotPrefix + n
	}
	cmd := p.rdb.MGet(ctx, keys...)
	p.count(cmd)
	vals, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("server: read the servers' status snapshots: %w", err)
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i] = []byte(s)
		}
	}
	return out, nil
}

// peerCommands is what Peers that count their store commands (RedisPeers)
// report.
type peerCommands interface {
	Commands() int64
}

// peerCollector returns ratelease_peer_commands_total: the store commands
// of the fleet view (see RedisPeers.Commands), for any Peers that counts
// them.
func peerCollector(pc peerCommands) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: namespace, Name: "peer_commands_total",
		Help: "Redis commands sent for the fleet view: this server's heartbeats and status snapshots, and the status page's reads of the other servers. A cost per second, whatever the traffic, beside the store's per decision.",
	}, func() float64 { return float64(pc.Commands()) })
}
