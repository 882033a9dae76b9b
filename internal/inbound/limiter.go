package inbound

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/protocol"
)

// HeaderMode says which responses carry the RateLimit fields.
type HeaderMode uint8

// The header modes. They are untyped, so that httplimit.HeaderMode's
// constants, which grpclimit shares, can be these very values.
const (
	// HeadersAll writes the RateLimit fields on every response the limit
	// decided, admitted or denied.
	HeadersAll = iota
	// HeadersDenied writes them on denials only.
	HeadersDenied
	// HeadersNone writes them on no response.
	HeadersNone
)

// Key is one key template and its fallback, as the limiters' Config.Keys
// give them.
type Key struct {
	// Template is the key template; required.
	Template string
	// Fallback is the template used when a part of Template is missing;
	// empty for none.
	Fallback string
}

// Keys converts a limiter's Config.Keys, whose element type has the
// fields of Key, to this package's Keys.
func Keys[K ~struct{ Template, Fallback string }](keys []K) []Key {
	out := make([]Key, len(keys))
	for i, k := range keys {
		out[i] = Key(k)
	}
	return out
}

// templates is one parsed Key; fallback is nil when it has none.
type templates struct {
	primary, fallback *keytemplate.Template
}

// DefaultKey is the key of a Config without Keys.
const DefaultKey = "ip:{ip}"

// DefaultMaxQueue is the queue bound of a Config with MaxWait but without
// MaxQueue.
const DefaultMaxQueue = 1024

// Config is the part of a limiter's configuration that this package
// checks and acts on. Each field means what the field of the same name in
// httplimit.Config and grpclimit.Config means.
type Config struct {
	// Prefix begins every error New returns, and the error of an invalid
	// key: the limiter's package name, "httplimit" or "grpclimit".
	Prefix string
	// Client decides; required.
	Client *client.Client
	// Keys are the key templates; empty means one key, DefaultKey.
	Keys []Key
	// Resolve resolves the names of the parts of Keys' templates: each
	// limiter has parts of its own.
	Resolve keytemplate.Resolver
	// TrustedProxies are the prefixes of the trusted proxies; New
	// normalizes them with keytemplate.NormalizePrefix.
	TrustedProxies []netip.Prefix
	// CheckProxies, when set, is called with the normalized trusted
	// proxies once they are checked, before Headers is: a limiter's own
	// proxy settings (httplimit's ProxyHeader). Its error is New's.
	CheckProxies func(trusted []netip.Prefix) error
	// IPv6Prefix is the prefix length an IPv6 {ip} is reduced to; 0 means
	// 64.
	IPv6Prefix int
	// IPv4Prefix is the prefix length an IPv4 {ip} is reduced to; 0 means
	// 32.
	IPv4Prefix int
	// Headers says which responses carry the RateLimit fields.
	Headers HeaderMode
	// Shadow admits what the limit denies, as OutcomeShadow.
	Shadow bool
	// MaxWait, when positive, holds a denial up to this long for its
	// tokens in the wait queue.
	MaxWait time.Duration
	// MaxQueue bounds the requests waiting at once; 0 means
	// DefaultMaxQueue.
	MaxQueue int
	// Logger is the limiter's logger (Limiter.Logger); nil discards.
	Logger *slog.Logger
}

// Limiter is the checked configuration, the wait queue, the counters and
// the cache of RateLimit fields one limiter shares between all its
// handlers or interceptors. It is safe for concurrent use.
type Limiter struct {
	prefix  string
	c       *client.Client
	keys    []templates
	peers   Peers
	headers HeaderMode
	shadow  bool
	maxWait time.Duration
	queue   chan struct{} // nil without MaxWait
	log     *slog.Logger
	// fields caches the RateLimit fields of recent decisions (Fields):
	// an allocation of its own, off the cache lines of the counters that
	// every request writes.
	fields *fieldCache

	allowed  atomic.Int64
	denied   atomic.Int64
	refused  atomic.Int64
	shadowed atomic.Int64
	waited   atomic.Int64
	full     atomic.Int64
	unident  atomic.Int64
}

// New checks cfg and returns a Limiter. It checks, in this order: Client,
// the number of Keys, each template and fallback, the prefix lengths, the
// trusted proxies (then CheckProxies), Headers, MaxWait and MaxQueue; the
// first error found is returned, prefixed with Config.Prefix.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%s: Config.Client is required", cfg.Prefix)
	}
	l := &Limiter{
		prefix:  cfg.Prefix,
		c:       cfg.Client,
		headers: cfg.Headers,
		shadow:  cfg.Shadow,
		maxWait: cfg.MaxWait,
		log:     cfg.Logger,
		fields:  newFieldCache(),
	}
	keys := cfg.Keys
	if len(keys) == 0 {
		keys = []Key{{Template: DefaultKey}}
	}
	if len(keys) > protocol.MaxEntries {
		return nil, fmt.Errorf("%s: %d keys; at most %d", cfg.Prefix, len(keys), protocol.MaxEntries)
	}
	for i, k := range keys {
		p, err := keytemplate.Parse(k.Template, cfg.Resolve)
		if err != nil {
			return nil, fmt.Errorf("%s: Keys[%d].Template: %w", cfg.Prefix, i, err)
		}
		ts := templates{primary: p}
		if k.Fallback != "" {
			if ts.fallback, err = keytemplate.Parse(k.Fallback, cfg.Resolve); err != nil {
				return nil, fmt.Errorf("%s: Keys[%d].Fallback: %w", cfg.Prefix, i, err)
			}
		}
		l.keys = append(l.keys, ts)
	}
	l.peers.V6Bits, l.peers.V4Bits = cfg.IPv6Prefix, cfg.IPv4Prefix
	if l.peers.V6Bits == 0 {
		l.peers.V6Bits = 64
	}
	if l.peers.V4Bits == 0 {
		l.peers.V4Bits = 32
	}
	if l.peers.V6Bits < 1 || l.peers.V6Bits > 128 || l.peers.V4Bits < 1 || l.peers.V4Bits > 32 {
		return nil, fmt.Errorf("%s: IPv6Prefix %d or IPv4Prefix %d out of range (1–128, 1–32)", cfg.Prefix, cfg.IPv6Prefix, cfg.IPv4Prefix)
	}
	for _, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("%s: trusted proxy prefix %v is not valid", cfg.Prefix, p)
		}
		l.peers.Trusted = append(l.peers.Trusted, keytemplate.NormalizePrefix(p))
	}
	if cfg.CheckProxies != nil {
		if err := cfg.CheckProxies(l.peers.Trusted); err != nil {
			return nil, err
		}
	}
	if cfg.Headers > HeadersNone {
		return nil, fmt.Errorf("%s: unknown HeaderMode %d", cfg.Prefix, cfg.Headers)
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("%s: MaxWait %v is negative", cfg.Prefix, cfg.MaxWait)
	}
	if cfg.MaxQueue < 0 {
		return nil, fmt.Errorf("%s: MaxQueue %d is negative", cfg.Prefix, cfg.MaxQueue)
	}
	if cfg.MaxWait > 0 {
		n := cfg.MaxQueue
		if n == 0 {
			n = DefaultMaxQueue
		}
		l.queue = make(chan struct{}, n)
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l, nil
}

// Peers returns how the limiter makes {ip}: the normalized trusted proxies
// and the prefix lengths. It is shared: do not modify it.
func (l *Limiter) Peers() *Peers { return &l.peers }

// Logger returns Config.Logger, or a logger that discards when it was nil.
func (l *Limiter) Logger() *slog.Logger { return l.log }

// MakeKeys makes the keys of one request, one per Config.Keys entry:
// its template filled with value (keytemplate.Template.Expand's: a part's
// value, and false or "" when the request lacks it), or its fallback when
// the template lacks a part. A part that the template lacks and that has
// no fallback, or that the fallback lacks too, makes the error a
// *keytemplate.MissingPartError (not wrapped) of the last template tried;
// the limiter turns it into its own MissingPartError. A key that
// protocol.ValidateKey refuses, which escaping and hashing make
// impossible, is an error rather than a key the servers would refuse.
func (l *Limiter) MakeKeys(value func(keytemplate.Segment) (string, bool)) ([]string, error) {
	keys := make([]string, len(l.keys))
	for i, ts := range l.keys {
		t := ts.primary
		k, err := t.Expand(value)
		if err != nil && ts.fallback != nil {
			t = ts.fallback
			k, err = t.Expand(value)
		}
		if err != nil {
			return nil, err
		}
		if err := protocol.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("%s: template %q made an invalid key: %w", l.prefix, t, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// Stats counts a limiter's outcomes since New. Its fields are those of
// httplimit.Stats and grpclimit.Stats, which convert from it.
type Stats struct {
	// Allowed counts the requests the limit allowed at once.
	Allowed int64
	// Denied counts the requests denied, for whatever reason.
	Denied int64
	// Refused counts the requests whose keys the lease servers refused (a
	// misconfiguration, OutcomeRefused): those answered as unavailable
	// are in Denied as well; those Shadow admitted are in no other
	// counter.
	Refused int64
	// Shadow counts the requests Shadow admitted that the limit denied.
	Shadow int64
	// Waited counts the requests admitted after waiting in the queue.
	Waited int64
	// QueueFull counts the denials because the queue was full; each is
	// in Denied as well.
	QueueFull int64
	// Unidentified counts the requests no key could be made for.
	Unidentified int64
	// Queued is the number of requests waiting now.
	Queued int64
}

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{
		Allowed:      l.allowed.Load(),
		Denied:       l.denied.Load(),
		Refused:      l.refused.Load(),
		Shadow:       l.shadowed.Load(),
		Waited:       l.waited.Load(),
		QueueFull:    l.full.Load(),
		Unidentified: l.unident.Load(),
		Queued:       int64(len(l.queue)),
	}
}
