package server

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// Defaults of the rule database's cache (see Options.RuleDB).
const (
	// DefaultDBCheckInterval is how often a server in database mode checks
	// the database version when Options.DBCheckInterval is zero.
	DefaultDBCheckInterval = time.Second
	// DefaultOverrideCacheSize is the most overrides (and keys known to
	// have none) a server caches when Options.OverrideCacheSize is zero.
	DefaultOverrideCacheSize = 100_000
	// DefaultOverrideCacheTTL is how long a cached override (or its
	// absence) is used when Options.OverrideCacheTTL is zero.
	DefaultOverrideCacheTTL = time.Minute
)

// dbMode is the state of a server whose rules live in the rule database:
// the versions it has seen and the override cache.
//
// The rule set (rules and clients) is held whole, compiled into the Rules
// in force, and rebuilt when the rule set's version changes. Overrides are
// looked up by the engine (leases.Overrides) on first use and cached. Two
// paths bring changes: every change publishes on the database's channel,
// and each message wakes the syncer at once; the syncer also runs every
// DBCheckInterval, in case a message was lost (a reconnect, say). Either
// way it reads the versions (one MGET), rebuilds the rules when the rule
// set's changed, and reads the change log entries since the version it
// last saw to drop the changed keys from the override cache; when the log
// no longer holds them all, it drops the whole cache.
type dbMode struct {
	db       *RuleDB
	cache    *overrideCache
	interval time.Duration

	seen, setSeen int64 // versions in force; written under Server.reloadMu after New
	kick          chan struct{}
	done          chan struct{}
	lastErr       string // last sync failure logged
}

// openDBMode reads the rule set from the database and returns the mode's
// state and the rules. When the database does not answer (an error
// wrapping leases.ErrStoreUnavailable), it returns the mode's state with
// no rules, and the error: the server then waits for the database (see
// state.pending), and its syncer reads the rule set once it answers.
func openDBMode(ctx context.Context, opts Options) (*dbMode, *Rules, error) {
	d := &dbMode{
		db:       opts.RuleDB,
		cache:    newOverrideCache(opts.RuleDB, opts.OverrideCacheSize, opts.OverrideCacheTTL, opts.Now),
		interval: opts.DBCheckInterval,
		seen:     -1, // no version read: the first sync reads them all
		setSeen:  -1,
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	d.cache.log = opts.Logger
	snap, err := opts.RuleDB.snapshot(ctx)
	if errors.Is(err, leases.ErrStoreUnavailable) {
		return d, nil, fmt.Errorf("server: rule database: %w", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("server: rule database: %w", err)
	}
	rules, err := snap.compile()
	if err != nil {
		return nil, nil, fmt.Errorf("server: rule database (version %d): %w", snap.version, err)
	}
	d.seen, d.setSeen = snap.version, snap.setVersion
	return d, rules, nil
}

// watchDB keeps the rules and the override cache in step with the database
// until Close.
func (s *Server) watchDB() {
	d := s.db
	defer close(d.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := d.db.rdb.Subscribe(ctx, d.db.Channel())
	defer ps.Close()
	// A change made after openDBMode read the database but before the
	// subscription took effect sends its notice to nobody: once Redis has
	// confirmed the subscription, sync once, so that such a change applies
	// now, not at the next tick. (Redis down: the ticker's syncs go on.)
	sync := func() {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		defer scancel()
		s.dbSynced(s.syncRuleDB(sctx))
	}
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := ps.Receive(rctx)
	rcancel()
	msgs := ps.Channel()
	if err == nil {
		sync()
	}
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-msgs:
		}
		// Drain what else came meanwhile: one sync covers it all.
		for drained := false; !drained; {
			select {
			case <-msgs:
			default:
				drained = true
			}
		}
		sync()
	}
}

// SyncRuleDB brings the rules and the override cache in step with the
// rule database now, as the server does on every change notice and every
// Options.DBCheckInterval. It does nothing outside database mode.
func (s *Server) SyncRuleDB(ctx context.Context) error {
	if s.db == nil {
		return nil
	}
	_, err := s.syncRuleDB(ctx)
	return err
}

// syncRuleDB is SyncRuleDB in database mode; it also returns the database
// version seen after the sync, read under reloadMu as it was written.
func (s *Server) syncRuleDB(ctx context.Context) (int64, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	err := s.syncDBLocked(ctx)
	return s.db.seen, err
}

// syncDBLocked is SyncRuleDB with reloadMu held. The rule set and the
// override cache are brought in step independently: a stored rule set
// that cannot be applied (it does not decode or validate, or this server
// refuses it: checkExposure) keeps the rules in force and is returned as
// the error, but overrides changed meanwhile still apply, so that a key's
// override never waits for the rule set to be repaired.
func (s *Server) syncDBLocked(ctx context.Context) error {
	d := s.db
	vals, err := d.db.rdb.MGet(ctx, d.db.key("version"), d.db.key("setversion")).Result()
	if err != nil {
		leases.RereadSlots(d.db.rdb, err) // the node that holds the database may have failed over
		return fmt.Errorf("read rule database version: %w", unavailable(err))
	}
	ver, setVer := intOf(vals[0]), intOf(vals[1])
	var setErr error
	if setVer != d.setSeen {
		setErr = s.applyRuleSetLocked(ctx)
	}
	if ver != d.seen {
		if err := d.invalidateSince(ctx, ver); err != nil {
			return errors.Join(setErr, err)
		}
	}
	return setErr
}

// applyRuleSetLocked reads the stored rule set and, when it compiles and
// this server accepts it, puts it in force. reloadMu is held.
func (s *Server) applyRuleSetLocked(ctx context.Context) error {
	d := s.db
	snap, err := d.db.snapshot(ctx)
	if err != nil {
		return err
	}
	rules, err := snap.compile()
	if err == nil {
		if addr := *s.listenAddr.Load(); addr != "" {
			err = checkExposure(addr, rules, s.opts.Insecure)
		}
	}
	if err != nil {
		return fmt.Errorf("rule database (version %d): %w", snap.version, err)
	}
	s.metrics.reloads.WithLabelValues("ok").Inc()
	s.log.Info("rules reloaded from the rule database", "version", snap.version,
		"rules", len(rules.policy.Rules()), "clients", len(rules.clients))
	s.setRules(rules)
	d.setSeen = snap.setVersion
	return nil
}

// invalidateSince drops from the override cache the keys changed after
// the version last seen, reading the change log; it drops everything when
// the log does not reach back that far.
func (d *dbMode) invalidateSince(ctx context.Context, ver int64) error {
	n := ver - d.seen
	if n <= 0 || n > int64(d.db.logCap) {
		d.cache.flush()
		d.seen = ver
		return nil
	}
	// A few more than needed: changes made since the MGET are newer and
	// come first.
	entries, err := d.db.rdb.LRange(ctx, d.db.key("log"), 0, n+63).Result()
	if err != nil {
		return fmt.Errorf("read change log: %w", unavailable(err))
	}
	var keys []string
	newest, oldest := int64(0), int64(0)
	for _, e := range entries {
		var c protocol.AdminChange
		if json.Unmarshal([]byte(e), &c) != nil {
			continue
		}
		if c.Version <= d.seen {
			break
		}
		newest, oldest = max(newest, c.Version), c.Version
		if c.Kind == KindOverride {
			keys = append(keys, c.Name)
		}
	}
	if oldest != d.seen+1 {
		d.cache.flush() // a gap: the log was trimmed past what we saw
	} else {
		d.cache.invalidate(keys)
	}
	d.seen = max(ver, newest)
	return nil
}

// dbSynced logs a sync failure once per distinct message, and its end at
// version seen. Only the syncer calls it, so lastErr needs no lock; the
// versions, which admin requests write too, it never reads.
func (s *Server) dbSynced(seen int64, err error) {
	d := s.db
	if err == nil {
		if d.lastErr != "" {
			s.log.Info("rule database in sync again", "version", seen)
			d.lastErr = ""
			s.reloadErr.Store(nil)
			s.metrics.reloadSuccess.Set(1)
		}
		return
	}
	if msg := err.Error(); msg != d.lastErr {
		d.lastErr = msg
		keep := "keeping the rules in force"
		if s.state.Load().pending {
			keep = "answering every call 503 until a rule set is read" // there are none in force
		}
		switch {
		case errors.Is(err, leases.ErrInvalidRules):
			s.log.Error("rule database holds invalid rules: "+keep, "err", err)
		case errors.Is(err, ErrInsecureListen):
			s.log.Error("rule database: its rule set is refused on this address: "+keep, "err", err)
		case redisRefuses(err):
			// A misconfiguration, not an outage that ends by itself.
			s.log.Error("rule database: redis refuses its commands: check the user of the Redis URL, its password and its ACL (its key patterns must reach the rule database's keys, "+
				d.db.prefix+"*); "+keep, "err", err)
		default:
			s.log.Warn("rule database: sync failed; retrying", "err", err)
		}
		s.reloadErr.Store(&err)
		s.metrics.reloadSuccess.Set(0)
		s.metrics.reloads.WithLabelValues("error").Inc()
	}
}

func intOf(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// overrideCache is the leases.Overrides of a server in database mode: an
// LRU of overrides (and of keys known to have none) with a TTL, filled
// from the database on first use. A lookup whose keys are all cached takes
// a mutex and reads a map; the misses of one lookup cost one HMGET
// together.
//
// When the database does not answer (the Redis Cluster node that holds it
// down), a key's entry expired less than a TTL ago stands, and the keys
// without one fail alone while the store serves others (see stale).
//
// A fill races with invalidation: a value read before a change may arrive
// after the change was invalidated. Every invalidation bumps epoch, and a
// fill stores its values only if epoch did not move while it read them.
type overrideCache struct {
	db  *RuleDB
	max int
	ttl time.Duration
	now func() time.Time
	log *slog.Logger // nil: no logs

	mu    sync.Mutex
	m     map[string]*list.Element // of *overrideEntry
	lru   list.List                // front: most recently used
	epoch uint64

	lookups, misses, stales uint64 // under mu
}

type overrideEntry struct {
	key     string
	rule    *leases.Rule // nil: the key has no override
	expires time.Time
}

func newOverrideCache(db *RuleDB, size int, ttl time.Duration, now func() time.Time) *overrideCache {
	return &overrideCache{db: db, max: size, ttl: ttl, now: now, m: map[string]*list.Element{}}
}

// stale answers a lookup whose misses (missing) the database did not
// answer at now (err): a key's entry expired less than a TTL ago stands
// (its override, or its lack of one, as read at most two TTLs ago: a
// change this server missed, its notice lost just before the database
// stopped answering, so applies at most a TTL later than it would have),
// counted in override_cache_stale_total; the keys without one fail alone
// (*leases.OverridesUnavailableError), when the store serves others (a
// Redis Cluster whose node that holds the database is down: the engine
// asks). out holds the overrides found so far.
func (c *overrideCache) stale(out map[string]*leases.Rule, missing []string, now time.Time, err error) (map[string]*leases.Rule, error) {
	var unknown []string
	c.mu.Lock()
	for _, k := range missing {
		el, ok := c.m[k]
		if !ok || !now.Before(el.Value.(*overrideEntry).expires.Add(c.ttl)) {
			unknown = append(unknown, k)
			continue
		}
		c.stales++
		if e := el.Value.(*overrideEntry); e.rule != nil {
			if out == nil {
				out = make(map[string]*leases.Rule, len(missing))
			}
			out[k] = e.rule
		}
	}
	c.mu.Unlock()
	if len(unknown) == 0 {
		return out, nil
	}
	return out, &leases.OverridesUnavailableError{Keys: unknown, Err: err}
}

// Lookup implements leases.Overrides.
func (c *overrideCache) Lookup(ctx context.Context, keys []string) (map[string]*leases.Rule, error) {
	var out map[string]*leases.Rule
	var missing []string
	now := c.now()
	c.mu.Lock()
	epoch := c.epoch
	c.lookups += uint64(len(keys))
	for _, k := range keys {
		if el, ok := c.m[k]; ok {
			e := el.Value.(*overrideEntry)
			if now.Before(e.expires) {
				c.lru.MoveToFront(el)
				if e.rule != nil {
					if out == nil {
						out = make(map[string]*leases.Rule, len(keys))
					}
					out[k] = e.rule
				}
				continue
			}
		}
		missing = append(missing, k)
	}
	c.misses += uint64(len(missing))
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	vals, err := c.db.rdb.HMGet(ctx, c.db.OverridesKey(), missing...).Result()
	if err != nil {
		leases.RereadSlots(c.db.rdb, err)
		return c.stale(out, missing, now, fmt.Errorf("read overrides: %w", unavailable(err)))
	}
	rules := make([]*leases.Rule, len(missing))
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var o protocol.AdminOverride
		if err := decodeItem(s, &o, &o.Version); err != nil {
			// Validated when written: one written behind the API's back is
			// no override, and said so, once a cache TTL per key (the
			// admin API names it, and a PUT or DELETE of it repairs it).
			c.corrupt(missing[i], err)
			continue
		}
		o.Key = missing[i]
		r, err := overrideRule(&o)
		if err != nil {
			c.corrupt(missing[i], err)
		} else {
			rules[i] = r
			if out == nil {
				out = make(map[string]*leases.Rule, len(keys))
			}
			out[missing[i]] = r
		}
	}
	c.mu.Lock()
	if c.epoch == epoch {
		exp := now.Add(c.ttl)
		for i, k := range missing {
			if el, ok := c.m[k]; ok {
				e := el.Value.(*overrideEntry)
				e.rule, e.expires = rules[i], exp
				c.lru.MoveToFront(el)
				continue
			}
			c.m[k] = c.lru.PushFront(&overrideEntry{key: k, rule: rules[i], expires: exp})
		}
		for c.lru.Len() > c.max {
			el := c.lru.Back()
			c.lru.Remove(el)
			delete(c.m, el.Value.(*overrideEntry).key)
		}
	}
	c.mu.Unlock()
	return out, nil
}

// corrupt logs that the stored override of key is invalid (err), and is
// not applied: the key is limited by its rule.
func (c *overrideCache) corrupt(key string, err error) {
	if c.log != nil {
		c.log.Error("stored override is invalid and not applied; the key is limited by its rule: PUT or DELETE it through the admin API",
			"key", key, "error", err)
	}
}

// invalidate drops keys from the cache.
func (c *overrideCache) invalidate(keys []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	for _, k := range keys {
		if el, ok := c.m[k]; ok {
			c.lru.Remove(el)
			delete(c.m, k)
		}
	}
}

// flush drops every entry.
func (c *overrideCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	clear(c.m)
	c.lru.Init()
}

// stats returns the keys looked up and those that missed the cache.
// collectors returns the cache's metrics, read at each scrape: keys looked
// up, lookups that missed the cache (one HMGET per call's misses), and the
// entries held.
func (c *overrideCache) collectors() []prometheus.Collector {
	count := func(misses bool) func() float64 {
		return func() float64 {
			l, m := c.stats()
			if misses {
				return float64(m)
			}
			return float64(l)
		}
	}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "override_lookups_total",
			Help: "Keys looked up for a per-key override (database mode)."}, count(false)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "override_cache_misses_total",
			Help: "Override lookups the cache could not answer, read from Redis (database mode)."}, count(true)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "override_cache_stale_total",
			Help: "Keys decided with a cache entry expired less than a TTL ago, while the rule database did not answer (database mode)."}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			return float64(c.stales)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "override_cache_entries",
			Help: "Keys the override cache holds, with or without an override (database mode)."}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			return float64(len(c.m))
		}),
	}
}

func (c *overrideCache) stats() (lookups, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookups, c.misses
}
