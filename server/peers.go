package server

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Peer timings of the status page.
const (
	// PeerInterval is how often a server records itself in Options.Peers.
	PeerInterval = 5 * time.Second
	// PeerWindow is how recently a server must have recorded itself to be
	// listed as sharing the store.
	PeerWindow = 30 * time.Second
	// peerForget is how long a silent server's entry is kept before a
	// heartbeat of any server removes it, and the lifetime of the whole
	// record once every server is silent.
	peerForget = 10 * time.Minute
)

// Peer is a lease server seen sharing the store.
type Peer struct {
	// Name identifies the server: its host, listen address and process.
	Name string
	// Seen is when it last recorded itself.
	Seen time.Time
}

// Peers records the lease servers that share a store, so that the status
// page can list them. Each server calls Beat every PeerInterval while it
// runs, and Leave when it stops. Implementations must be safe for
// concurrent use.
type Peers interface {
	// Beat records that the server name is alive at now.
	Beat(ctx context.Context, name string, now time.Time) error
	// List returns the servers that recorded themselves at since or later,
	// the most recently seen first.
	List(ctx context.Context, since time.Time) ([]Peer, error)
	// Leave forgets the server name.
	Leave(ctx context.Context, name string) error
}

// RedisPeersKey is the Redis key of NewRedisPeers' record: a sorted set of
// server names scored by the Unix time in milliseconds at which each was
// last seen.
const RedisPeersKey = "rl:servers"

// RedisPeers is Peers in Redis: the sorted set RedisPeersKey, with a
// time to live refreshed by every heartbeat. Create it with NewRedisPeers.
type RedisPeers struct {
	rdb redis.UniversalClient
	key string
}

// NewRedisPeers returns Peers kept in rdb under RedisPeersKey. It works with
// Redis Cluster too: the record is one key.
func NewRedisPeers(rdb redis.UniversalClient) *RedisPeers {
	return &RedisPeers{rdb: rdb, key: RedisPeersKey}
}

// Beat implements Peers: it sets name's score to now, removes the entries
// of servers silent for ten minutes and keeps the key alive for ten more.
func (p *RedisPeers) Beat(ctx context.Context, name string, now time.Time) error {
	ms := now.UnixMilli()
	_, err := p.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZAdd(ctx, p.key, redis.Z{Score: float64(ms), Member: name})
		pipe.ZRemRangeByScore(ctx, p.key, "-inf", "("+strconv.FormatInt(ms-peerForget.Milliseconds(), 10))
		pipe.PExpire(ctx, p.key, peerForget)
		return nil
	})
	if err != nil {
		return fmt.Errorf("server: record this server in redis key %s: %w", p.key, err)
	}
	return nil
}

// List implements Peers.
func (p *RedisPeers) List(ctx context.Context, since time.Time) ([]Peer, error) {
	zs, err := p.rdb.ZRevRangeByScoreWithScores(ctx, p.key, &redis.ZRangeBy{
		Min: strconv.FormatInt(since.UnixMilli(), 10), Max: "+inf",
	}).Result()
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
	if err := p.rdb.ZRem(ctx, p.key, name).Err(); err != nil {
		return fmt.Errorf("server: remove this server from redis key %s: %w", p.key, err)
	}
	return nil
}
