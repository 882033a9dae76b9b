package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// DefaultRuleDBPrefix is the prefix of the Redis keys of the rule database
// when RuleDBOptions.Prefix is empty. Its braces are a Redis Cluster hash
// tag: every key of the database lives in one slot, so that one script
// can change an item, the version and the change log atomically.
const DefaultRuleDBPrefix = "{rl:db}:"

// DefaultChangeLogSize is how many changes the change log keeps when
// RuleDBOptions.ChangeLogSize is zero.
const DefaultChangeLogSize = 10_000

// Kinds of items of the rule database, as the change log names them.
const (
	KindRule     = "rule"
	KindClient   = "client"
	KindOverride = "override"
	// KindSetting is the kind of the rule set's settings (one item,
	// SettingsName).
	KindSetting = "setting"
)

// Errors of RuleDB writes, for callers to branch on.
var (
	// ErrPrecondition is returned by a write whose If-Match (or
	// If-None-Match) does not hold: the item changed, or does not exist,
	// or exists. Nothing was stored.
	ErrPrecondition = errors.New("precondition failed")
	// ErrNoSuchItem is returned by a read or delete of an item that does
	// not exist.
	ErrNoSuchItem = errors.New("no such item")
	// ErrContention is returned when a rule or client write was retried
	// because others changed the rule set meanwhile, and gave up.
	ErrContention = errors.New("rule set changed concurrently too often")
)

// RuleDB is the rule database: rules, clients and per-key overrides in
// Redis, the store the lease servers already share. Every item is stored
// as "<version>|<JSON>" in a hash per kind, where version is the value the
// database's version counter took when the item was last written; that
// version is the item's ETag. Every change, done by one Lua script,
// increments the counter, appends to a capped change log (who, what,
// when), and publishes the new version on a channel. Rule and client
// changes also increment a second counter, the rule set's version, which
// a write checks so that the whole set it validated is the set it
// changes.
//
// Keys (with the default prefix):
//
//	{rl:db}:version     the database version (INCR on every change)
//	{rl:db}:setversion  the version of the rule set (rules and clients)
//	{rl:db}:rules       hash: rule name → version|AdminRule JSON
//	{rl:db}:clients     hash: client name → version|AdminClient JSON
//	{rl:db}:overrides   hash: key → version|AdminOverride JSON
//	{rl:db}:log         list: the newest DefaultChangeLogSize changes, newest first
//	{rl:db}:changes     pub/sub channel: the new version after each change
//
// A RuleDB is safe for concurrent use. It does not cache: see Options.RuleDB
// for the cache each server keeps.
type RuleDB struct {
	rdb    redis.UniversalClient
	prefix string
	logCap int
}

// RuleDBOptions configure a RuleDB.
type RuleDBOptions struct {
	// Prefix of every Redis key; empty means DefaultRuleDBPrefix. Keep a
	// hash tag in it for Redis Cluster.
	Prefix string
	// ChangeLogSize is how many changes the log keeps; zero means
	// DefaultChangeLogSize.
	ChangeLogSize int
}

// NewRuleDB returns the rule database in rdb. It does not call Redis.
func NewRuleDB(rdb redis.UniversalClient, opts RuleDBOptions) *RuleDB {
	if opts.Prefix == "" {
		opts.Prefix = DefaultRuleDBPrefix
	}
	if opts.ChangeLogSize <= 0 {
		opts.ChangeLogSize = DefaultChangeLogSize
	}
	return &RuleDB{rdb: rdb, prefix: opts.Prefix, logCap: opts.ChangeLogSize}
}

func (db *RuleDB) key(name string) string { return db.prefix + name }

func (db *RuleDB) hashOf(kind string) string {
	switch kind {
	case KindRule:
		return db.key("rules")
	case KindClient:
		return db.key("clients")
	case KindSetting:
		return db.key("settings")
	default:
		return db.key("overrides")
	}
}

// Channel returns the pub/sub channel on which every change publishes the
// new version.
func (db *RuleDB) Channel() string { return db.key("changes") }

// OverridesKey returns the Redis key of the overrides hash.
func (db *RuleDB) OverridesKey() string { return db.hashOf(KindOverride) }

// Client returns the Redis client of the database.
func (db *RuleDB) Client() redis.UniversalClient { return db.rdb }

// ruleSetSnapshot is the rule set as stored at one set version.
type ruleSetSnapshot struct {
	version    int64 // database version
	setVersion int64
	rules      []protocol.AdminRule   // by name
	clients    []protocol.AdminClient // by name
	settings   protocol.AdminSettings
	// bad describes the stored items that do not decode (written behind
	// the API's back), each naming its item; they are left out of rules,
	// clients and settings.
	bad []storedFault
}

// storedFault is a stored item of the rule set that does not decode.
type storedFault struct {
	kind, name string
	err        error // names the item
}

// faults returns nil when every item of the snapshot (of kinds, when
// given) decoded, else an error wrapping leases.ErrInvalidRules that names
// each item that did not.
func (s *ruleSetSnapshot) faults(kinds ...string) error {
	var msgs []string
	for _, f := range s.bad {
		if len(kinds) == 0 || slices.Contains(kinds, f.kind) {
			msgs = append(msgs, f.err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: DELETE or PUT each through the admin API", leases.ErrInvalidRules, strings.Join(msgs, "; "))
}

// without returns the faults of s but that of the item kind/name, which a
// change replaces or deletes.
func (s *ruleSetSnapshot) without(kind, name string) []storedFault {
	return slices.DeleteFunc(slices.Clone(s.bad), func(f storedFault) bool { return f.kind == kind && f.name == name })
}

// SettingsName is the one item of KindSetting.
const SettingsName = "rules"

// splitItem splits a stored "<version>|<JSON>" value.
func splitItem(v string) (int64, []byte, error) {
	num, doc, ok := strings.Cut(v, "|")
	if !ok {
		return 0, nil, fmt.Errorf("stored item %.40q has no version", v)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("stored item %.40q: version: %w", v, err)
	}
	if n < 0 {
		// Never written by a server: served, it was an ETag that If-Match
		// then refused.
		return 0, nil, fmt.Errorf("stored item %.40q: version %d is negative", v, n)
	}
	return n, []byte(doc), nil
}

// snapshot reads the rule set atomically (one MULTI). An item that does
// not decode is left out and described in bad: compile refuses such a
// snapshot, and a change that deletes or replaces the item may still be
// made (changeSet).
func (db *RuleDB) snapshot(ctx context.Context) (*ruleSetSnapshot, error) {
	var ver, setVer *redis.StringCmd
	var rules, clients *redis.MapStringStringCmd
	var settings *redis.StringCmd
	cmds, err := db.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ver = p.Get(ctx, db.key("version"))
		setVer = p.Get(ctx, db.key("setversion"))
		rules = p.HGetAll(ctx, db.hashOf(KindRule))
		clients = p.HGetAll(ctx, db.hashOf(KindClient))
		settings = p.HGet(ctx, db.hashOf(KindSetting), SettingsName)
		return nil
	})
	if redis.IsExecAbortError(err) {
		// A command refused when queued (NOPERM: the user's key patterns
		// do not reach the database) aborts the transaction: its error,
		// not EXECABORT, says why.
		for _, c := range cmds {
			if cerr := c.Err(); cerr != nil && !redis.IsExecAbortError(cerr) && !errors.Is(cerr, redis.Nil) {
				err = cerr
				break
			}
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read rule database: %w", unavailable(err))
	}
	s := &ruleSetSnapshot{}
	s.version, _ = ver.Int64()
	s.setVersion, _ = setVer.Int64()
	for name, v := range rules.Val() {
		var r protocol.AdminRule
		if err := decodeItem(v, &r, &r.Version); err != nil {
			s.bad = append(s.bad, storedFault{KindRule, name, fmt.Errorf("rule %q: %w", name, err)})
			continue
		}
		r.Name = name
		s.rules = append(s.rules, r)
	}
	for name, v := range clients.Val() {
		var c protocol.AdminClient
		if err := decodeItem(v, &c, &c.Version); err != nil {
			s.bad = append(s.bad, storedFault{KindClient, name, fmt.Errorf("client %q: %w", name, err)})
			continue
		}
		c.Name = name
		s.clients = append(s.clients, c)
	}
	if v, err := settings.Result(); err == nil {
		if err := decodeItem(v, &s.settings, &s.settings.Version); err != nil {
			s.bad = append(s.bad, storedFault{KindSetting, SettingsName, fmt.Errorf("settings: %w", err)})
			s.settings = protocol.AdminSettings{}
		}
	}
	slices.SortFunc(s.rules, func(a, b protocol.AdminRule) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(s.clients, func(a, b protocol.AdminClient) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(s.bad, func(a, b storedFault) int {
		return cmp.Or(strings.Compare(a.kind, b.kind), strings.Compare(a.name, b.name))
	})
	return s, nil
}

// decodeItem decodes a stored "<version>|<JSON>" value into into and its
// version. Errors say what is wrong with the stored text; callers name
// the item.
func decodeItem(v string, into any, version *int64) error {
	n, doc, err := splitItem(v)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(doc, into); err != nil {
		return fmt.Errorf("stored item %.40q does not decode: %w", v, err)
	}
	*version = n
	return nil
}

// redisRefuses reports whether err is Redis answering that it refuses
// this server's commands until its configuration changes, not that it
// does not answer: a password or a user it does not take (WRONGPASS,
// NOAUTH), a command or a key the user may not use (NOPERM: an ACL whose
// key patterns reach the buckets, rl:*, but not the rule database,
// {rl:db}:*), or a key of the database's that holds another type
// (WRONGTYPE). A misconfiguration: logged at ERROR as such (see New and
// dbSynced), though the server waits for it as for a Redis down, since
// Redis applies an ACL fix at once.
func redisRefuses(err error) bool {
	return redis.IsAuthError(err) || redis.IsPermissionError(err) || redis.HasErrorPrefix(err, "WRONGTYPE")
}

// unavailable wraps a Redis error in leases.ErrStoreUnavailable, except
// redis.Nil.
func unavailable(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	return fmt.Errorf("%w: %w", leases.ErrStoreUnavailable, err)
}

// compile builds the Rules of a snapshot, validated as a rules file is:
// errors wrap leases.ErrInvalidRules and name the rule or client and the
// field. Rules are in name order, which decides ties of specificity
// between patterns (see leases.Policy.Match).
func (s *ruleSetSnapshot) compile() (*Rules, error) {
	if err := s.faults(); err != nil {
		return nil, err
	}
	f := RulesFile{Default: leases.Default(s.settings.Default)}
	for i := range s.rules {
		rc, err := ruleConfigOf(&s.rules[i])
		if err != nil {
			return nil, err
		}
		f.Rules = append(f.Rules, rc)
	}
	for _, c := range s.clients {
		f.Clients = append(f.Clients, ClientConfig{Name: c.Name, TokenSHA256: c.TokenSHA256, Keys: c.Keys, Admin: c.Admin})
	}
	p, err := leases.NewPolicy(f.RuleSet())
	if err != nil {
		return nil, err
	}
	clients, err := compileClients(f.Clients)
	if err != nil {
		return nil, err
	}
	canon, _ := json.Marshal(f)
	return &Rules{policy: p, clients: clients, digest: sha256.Sum256(canon)}, nil
}

// parseDuration parses a wire duration; empty is zero.
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 1s or 1m30s", s)
	}
	return d, nil
}

// ruleConfigOf converts a wire rule to a rules file's rule. Errors wrap
// leases.ErrInvalidRules and name the rule and field.
func ruleConfigOf(r *protocol.AdminRule) (RuleConfig, error) {
	fail := func(field string, err error) error {
		return fmt.Errorf("%w: rule %q: %s: %w", leases.ErrInvalidRules, r.Name, field, err)
	}
	rc := RuleConfig{Name: r.Name, Match: r.Match, Algorithm: leases.Algorithm(r.Algorithm), Limit: r.Limit, Burst: r.Burst, Soft: Percent(r.Soft), Shadow: r.Shadow, Elastic: r.Elastic}
	for c, v := range r.Reserve {
		if rc.Reserve == nil {
			rc.Reserve = make(map[string]Percent, len(r.Reserve))
		}
		rc.Reserve[c] = Percent(v)
	}
	var err error
	if rc.Period, err = parseDuration(r.Period); err != nil {
		return rc, fail("period", err)
	}
	if rc.LeaseTTL, err = parseDuration(r.LeaseTTL); err != nil {
		return rc, fail("lease_ttl", err)
	}
	for i, l := range r.Limits {
		lc := LimitConfig{Algorithm: leases.Algorithm(l.Algorithm), Limit: l.Limit, Burst: l.Burst}
		if lc.Period, err = parseDuration(l.Period); err != nil {
			return rc, fail(fmt.Sprintf("limits[%d].period", i), err)
		}
		rc.Limits = append(rc.Limits, lc)
	}
	return rc, nil
}

// AdminRuleOf converts a rules file's rule to its wire form.
func AdminRuleOf(rc RuleConfig) protocol.AdminRule {
	r := protocol.AdminRule{Name: rc.Name, Match: rc.Match, Algorithm: string(rc.Algorithm), Limit: rc.Limit, Burst: rc.Burst, Soft: float64(rc.Soft), Shadow: rc.Shadow, Elastic: rc.Elastic, Reserve: reserveOf(rc.Reserve)}
	if rc.Period != 0 {
		r.Period = formatDuration(rc.Period)
	}
	if rc.LeaseTTL != 0 {
		r.LeaseTTL = formatDuration(rc.LeaseTTL)
	}
	for _, l := range rc.Limits {
		r.Limits = append(r.Limits, protocol.AdminLimit{Algorithm: string(l.Algorithm), Limit: l.Limit, Period: formatDuration(l.Period), Burst: l.Burst})
	}
	return r
}

// overrideRule validates an override and returns its rule. Errors wrap
// leases.ErrInvalidRules and name the key and field.
func overrideRule(o *protocol.AdminOverride) (*leases.Rule, error) {
	fail := func(field string, err error) error {
		return fmt.Errorf("%w: override of key %q: %s: %w", leases.ErrInvalidRules, o.Key, field, err)
	}
	if err := protocol.ValidateKey(o.Key); err != nil {
		return nil, fail("key", err)
	}
	r := leases.Rule{Algorithm: leases.Algorithm(o.Algorithm), Limit: o.Limit, Burst: o.Burst}
	var err error
	if r.Period, err = parseDuration(o.Period); err != nil {
		return nil, fail("period", err)
	}
	if r.LeaseTTL, err = parseDuration(o.LeaseTTL); err != nil {
		return nil, fail("lease_ttl", err)
	}
	for i, l := range o.Limits {
		lim := leases.Limit{Algorithm: leases.Algorithm(l.Algorithm), Limit: l.Limit, Burst: l.Burst}
		if lim.Period, err = parseDuration(l.Period); err != nil {
			return nil, fail(fmt.Sprintf("limits[%d].period", i), err)
		}
		r.Limits = append(r.Limits, lim)
	}
	return leases.NewOverrideRule(o.Key, r)
}

//go:embed ruledb_write.lua
var writeLua string

var writeScript = redis.NewScript(writeLua)

// change is one write of the rule database.
type change struct {
	kind, name string
	value      any    // nil: delete
	ifMatch    string // "": unconditional; "*": must exist; "!": must not exist; else the version
	who        string
	// setVersion, for rules and clients, is the rule set version the
	// change was validated against; the write fails with errSetChanged
	// when it is no longer the current one.
	setVersion int64
}

// errSetChanged: the rule set changed between the snapshot a write
// validated and the write; the write retries.
var errSetChanged = errors.New("rule set changed")

// write runs one change atomically and returns the new database version.
func (db *RuleDB) write(ctx context.Context, c change) (int64, error) {
	op, doc := "delete", []byte(nil)
	if c.value != nil {
		op = "put"
		var err error
		if doc, err = json.Marshal(c.value); err != nil {
			return 0, fmt.Errorf("encode %s %q: %w", c.kind, c.name, err)
		}
	}
	expectSet := ""
	if c.kind != KindOverride {
		expectSet = strconv.FormatInt(c.setVersion, 10)
	}
	res, err := writeScript.Run(ctx, db.rdb,
		[]string{db.key("version"), db.hashOf(c.kind), db.key("log"), db.key("setversion")},
		c.name, op, doc, c.ifMatch, expectSet, db.logCap, db.Channel(), time.Now().UnixMilli(), c.who, c.kind,
	).StringSlice()
	if err != nil {
		return 0, fmt.Errorf("write %s %q: %w", c.kind, c.name, unavailable(err))
	}
	switch res[0] {
	case "ok":
		return strconv.ParseInt(res[1], 10, 64)
	case "precondition":
		cur := "it does not exist"
		if res[1] != "" {
			cur = "its version is " + res[1]
		}
		return 0, fmt.Errorf("%w: %s %q: %s", ErrPrecondition, c.kind, c.name, cur)
	case "absent":
		return 0, fmt.Errorf("%w: %s %q", ErrNoSuchItem, c.kind, c.name)
	case "setchanged":
		return 0, errSetChanged
	}
	return 0, fmt.Errorf("write %s %q: unexpected script answer %q", c.kind, c.name, res)
}

// get reads one item into into and returns its version, or ErrNoSuchItem.
func (db *RuleDB) get(ctx context.Context, kind, name string, into any) (int64, error) {
	v, err := db.rdb.HGet(ctx, db.hashOf(kind), name).Result()
	if errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("%w: %s %q", ErrNoSuchItem, kind, name)
	}
	if err != nil {
		return 0, fmt.Errorf("read %s %q: %w", kind, name, unavailable(err))
	}
	var ver int64
	if err := decodeItem(v, into, &ver); err != nil {
		item := fmt.Sprintf("%s %q", kind, name)
		if kind == KindOverride {
			item = fmt.Sprintf("override of key %q", name) // as overrideRule names it
		}
		return 0, fmt.Errorf("%w: %s: %w: DELETE or PUT it through the admin API", leases.ErrInvalidRules, item, err)
	}
	return ver, nil
}

// maxSetRetries bounds the retries of a rule or client write whose rule
// set changed meanwhile.
const maxSetRetries = 16

// PutRule validates the rule set with r in place of the rule of its name
// (or added) and, when it is valid, stores r atomically: ifMatch as for
// change.ifMatch. It returns the new version. The check, extra, runs on the
// new Rules before the write (the server refuses a set that would leave a
// non-loopback listener without clients).
func (db *RuleDB) PutRule(ctx context.Context, who string, r protocol.AdminRule, ifMatch string, check func(*Rules) error) (int64, error) {
	r.Version = 0
	return db.changeSet(ctx, change{kind: KindRule, name: r.Name, value: r, ifMatch: ifMatch, who: who}, check)
}

// DeleteRule validates the rule set without the rule name and, when it is
// valid, deletes the rule atomically.
func (db *RuleDB) DeleteRule(ctx context.Context, who, name, ifMatch string, check func(*Rules) error) (int64, error) {
	return db.changeSet(ctx, change{kind: KindRule, name: name, ifMatch: ifMatch, who: who}, check)
}

// PutSettings validates the rule set with settings st and, when it is
// valid, stores them atomically (ifMatch as for change.ifMatch).
func (db *RuleDB) PutSettings(ctx context.Context, who string, st protocol.AdminSettings, ifMatch string, check func(*Rules) error) (int64, error) {
	st.Version = 0
	return db.changeSet(ctx, change{kind: KindSetting, name: SettingsName, value: st, ifMatch: ifMatch, who: who}, check)
}

// Settings returns the rule set's settings; never stored, they are the
// defaults (Default "allow") at version 0.
func (db *RuleDB) Settings(ctx context.Context) (protocol.AdminSettings, error) {
	var st protocol.AdminSettings
	v, err := db.get(ctx, KindSetting, SettingsName, &st)
	if errors.Is(err, ErrNoSuchItem) {
		return protocol.AdminSettings{Default: string(leases.DefaultAllow)}, nil
	}
	st.Version = v
	if st.Default == "" {
		st.Default = string(leases.DefaultAllow)
	}
	return st, err
}

// PutClient is PutRule for a client.
func (db *RuleDB) PutClient(ctx context.Context, who string, c protocol.AdminClient, ifMatch string, check func(*Rules) error) (int64, error) {
	c.Version = 0
	return db.changeSet(ctx, change{kind: KindClient, name: c.Name, value: c, ifMatch: ifMatch, who: who}, check)
}

// DeleteClient is DeleteRule for a client.
func (db *RuleDB) DeleteClient(ctx context.Context, who, name, ifMatch string, check func(*Rules) error) (int64, error) {
	return db.changeSet(ctx, change{kind: KindClient, name: name, ifMatch: ifMatch, who: who}, check)
}

// changeSet applies c to a snapshot of the rule set, validates the result
// (errors wrap leases.ErrInvalidRules) and writes c on the condition that
// the set did not change since the snapshot, retrying from a new snapshot
// when it did.
func (db *RuleDB) changeSet(ctx context.Context, c change, check func(*Rules) error) (int64, error) {
	for range maxSetRetries {
		snap, err := db.snapshot(ctx)
		if err != nil {
			return 0, err
		}
		next := *snap
		next.bad = snap.without(c.kind, c.name) // the change replaces or deletes it
		switch c.kind {
		case KindRule:
			next.rules = slices.DeleteFunc(slices.Clone(snap.rules), func(r protocol.AdminRule) bool { return r.Name == c.name })
			if c.value != nil {
				next.rules = append(next.rules, c.value.(protocol.AdminRule))
				slices.SortFunc(next.rules, func(a, b protocol.AdminRule) int { return strings.Compare(a.Name, b.Name) })
			}
		case KindSetting:
			next.settings = protocol.AdminSettings{}
			if c.value != nil {
				next.settings = c.value.(protocol.AdminSettings)
			}
		case KindClient:
			next.clients = slices.DeleteFunc(slices.Clone(snap.clients), func(x protocol.AdminClient) bool { return x.Name == c.name })
			if c.value != nil {
				next.clients = append(next.clients, c.value.(protocol.AdminClient))
				slices.SortFunc(next.clients, func(a, b protocol.AdminClient) int { return strings.Compare(a.Name, b.Name) })
			}
		}
		rules, err := next.compile()
		if err == nil && check != nil {
			err = check(rules)
		}
		if err != nil {
			// A precondition that fails is reported before the set's
			// validity: the caller's view is stale either way.
			if perr := db.precheck(ctx, c); perr != nil {
				return 0, perr
			}
			return 0, err
		}
		c.setVersion = snap.setVersion
		v, err := db.write(ctx, c)
		if errors.Is(err, errSetChanged) {
			continue
		}
		return v, err
	}
	return 0, fmt.Errorf("%w: %s %q: gave up after %d tries", ErrContention, c.kind, c.name, maxSetRetries)
}

// precheck returns the precondition or absence error c would get, if any.
func (db *RuleDB) precheck(ctx context.Context, c change) error {
	var ignored json.RawMessage
	ver, err := db.get(ctx, c.kind, c.name, &ignored)
	exists := err == nil
	if err != nil && !errors.Is(err, ErrNoSuchItem) {
		return err
	}
	switch {
	case c.ifMatch == "*" && !exists, c.ifMatch == "!" && exists,
		c.ifMatch != "" && c.ifMatch != "*" && c.ifMatch != "!" && c.ifMatch != strconv.FormatInt(ver, 10):
		return fmt.Errorf("%w: %s %q", ErrPrecondition, c.kind, c.name)
	case c.value == nil && !exists:
		return fmt.Errorf("%w: %s %q", ErrNoSuchItem, c.kind, c.name)
	}
	return nil
}

// PutOverride validates an override and stores it atomically (see
// PutRule for ifMatch). It returns the new version.
func (db *RuleDB) PutOverride(ctx context.Context, who string, o protocol.AdminOverride, ifMatch string) (int64, error) {
	if _, err := overrideRule(&o); err != nil {
		return 0, err
	}
	key := o.Key
	o.Key, o.Version = "", 0
	return db.write(ctx, change{kind: KindOverride, name: key, value: o, ifMatch: ifMatch, who: who})
}

// DeleteOverride deletes the override of key.
func (db *RuleDB) DeleteOverride(ctx context.Context, who, key, ifMatch string) (int64, error) {
	return db.write(ctx, change{kind: KindOverride, name: key, ifMatch: ifMatch, who: who})
}

// Rule returns the rule name, or ErrNoSuchItem.
func (db *RuleDB) Rule(ctx context.Context, name string) (protocol.AdminRule, error) {
	var r protocol.AdminRule
	v, err := db.get(ctx, KindRule, name, &r)
	r.Name, r.Version = name, v
	return r, err
}

// ClientNamed returns the client name, or ErrNoSuchItem.
func (db *RuleDB) ClientNamed(ctx context.Context, name string) (protocol.AdminClient, error) {
	var c protocol.AdminClient
	v, err := db.get(ctx, KindClient, name, &c)
	c.Name, c.Version = name, v
	return c, err
}

// Override returns the override of key, or ErrNoSuchItem.
func (db *RuleDB) Override(ctx context.Context, key string) (protocol.AdminOverride, error) {
	var o protocol.AdminOverride
	v, err := db.get(ctx, KindOverride, key, &o)
	o.Key, o.Version = key, v
	return o, err
}

// Changes returns the newest n changes of the change log, newest first,
// and the database version.
func (db *RuleDB) Changes(ctx context.Context, n int) (protocol.AdminChanges, error) {
	var out protocol.AdminChanges
	var ver *redis.StringCmd
	var entries *redis.StringSliceCmd
	_, err := db.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ver = p.Get(ctx, db.key("version"))
		entries = p.LRange(ctx, db.key("log"), 0, int64(n)-1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return out, fmt.Errorf("read change log: %w", unavailable(err))
	}
	out.Version, _ = ver.Int64()
	out.Changes = make([]protocol.AdminChange, 0, len(entries.Val()))
	for _, e := range entries.Val() {
		var c protocol.AdminChange
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			// Written behind the API's back: a 422 naming it, not a 500;
			// it leaves the log as newer changes push it out.
			return out, fmt.Errorf("%w: change log entry %.60q does not decode (%v): rateleased did not write it; it leaves the log after %d newer changes",
				leases.ErrInvalidRules, e, err, db.logCap)
		}
		out.Changes = append(out.Changes, c)
	}
	return out, nil
}
