package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/internal/inbound"
)

// Key is one key template of Config.Keys, with its fallback.
type Key struct {
	// Template makes the key from the request: literal text and parts in
	// braces, {ip}, {user}, {method}, {route}, {header:Name}. For example
	// "user:{user}", "ip:{ip}", "user:{user}|api:{method}:{route}",
	// "key:{header:X-API-Key}". Required.
	Template string
	// Fallback is the template used instead when a part of Template is
	// missing: for example "ip:{ip}" for "user:{user}" before login. Give
	// it a prefix of its own, so that its keys cannot meet Template's.
	// Empty: a request missing a part is refused by
	// Config.MissingHandler. A part missing from the fallback too refuses
	// the request as well.
	Fallback string
}

// HeaderMode says which responses carry the RateLimit fields.
type HeaderMode uint8

const (
	// HeadersAll writes RateLimit-Policy and RateLimit on every response
	// the limit decided, allowed or denied. The default.
	HeadersAll HeaderMode = inbound.HeadersAll
	// HeadersDenied writes them on 429s only.
	HeadersDenied HeaderMode = inbound.HeadersDenied
	// HeadersNone writes neither (a 429 still has Retry-After).
	HeadersNone HeaderMode = inbound.HeadersNone
)

// Config configures a Middleware. Only Client is required; every zero value
// means the documented default.
type Config struct {
	// Client decides; required. Its keys are those Keys make.
	Client *client.Client

	// Keys are the key templates. A request needs a token of every key
	// (Cost tokens), all or nothing: one Client.AllowN with all of them.
	// Default: one key, "ip:{ip}".
	Keys []Key
	// TrustedProxies are the addresses of the reverse proxies in front of
	// this server. Only when the direct peer is in one of them is
	// ProxyHeader read, and then the client is the right-most address of
	// it that is not itself a trusted proxy. Empty (the default): no proxy
	// is trusted and {ip} is the direct peer's address; forwarding headers
	// are ignored. ParsePrefixes parses a list.
	TrustedProxies []netip.Prefix
	// ProxyHeader is the header the trusted proxies write the client's
	// address in: HeaderXForwardedFor (the default) or HeaderForwarded
	// (RFC 7239). Only one is read, the one your proxies write: a client
	// can send the other itself, and the proxies would pass it through.
	ProxyHeader string
	// IPv6Prefix is the prefix length an IPv6 {ip} is reduced to, since
	// one host commonly holds a whole /64. Default 64; 128 keeps the full
	// address.
	IPv6Prefix int
	// IPv4Prefix is the same for IPv4. Default 32: the whole address.
	IPv4Prefix int

	// Cost returns the tokens a request takes from each key. nil: 1. A
	// result of 0 or less lets the request through unlimited (for example
	// health checks); more than protocol.MaxCount is refused as a limit
	// would.
	Cost func(r *http.Request) int64
	// Priority returns a request's priority class: client.PriorityCritical,
	// PriorityHigh, PriorityNormal or PriorityLow. A rule that reserves
	// shares for the classes above a request's serves it only from what
	// lies beyond their reserve, so under saturation the lower classes are
	// denied first. nil, an empty result or an unknown class: the
	// Client's default class (client.Config.Priority). A class other than
	// the default is decided by a direct take, never from the key's lease
	// (see client.WithPriority): keep the bulk of the traffic in the
	// default class.
	Priority func(r *http.Request) string

	// DenyHandler writes the response of a denied request. The middleware
	// has set Retry-After and (unless Headers is HeadersNone) the
	// RateLimit fields already; ResultFrom(r.Context()) gives the
	// decision. nil: a 429 with an application/problem+json body of type
	// ProblemTypeQuotaExceeded.
	DenyHandler http.Handler
	// MissingHandler writes the response of a request a key cannot be
	// made for (a part missing, and no fallback or a fallback missing one
	// too); err is a *MissingPartError. nil: an application/problem+json
	// of status 401 for {user} (not authenticated), 400 for a header, the
	// wrapped mux's own answer for {route} when it has no route for the
	// request (404, or 405 with Allow when the path is served for other
	// methods), and 500 for {route} otherwise (the middleware wraps a handler no
	// http.ServeMux routed to: a misconfiguration) and for {ip} (the
	// server gave no usable remote address). Never a 429: a missing part
	// is not a rate limit.
	MissingHandler func(w http.ResponseWriter, r *http.Request, err error)
	// OnDecision, when set, is called once for every request the limit
	// decided (or could not identify), before the response is written or
	// the next handler runs; it must not block. Use it for metrics and
	// logs.
	OnDecision func(r *http.Request, res Result)

	// Headers says which responses carry the RateLimit fields. Default
	// HeadersAll.
	Headers HeaderMode
	// Shadow decides and counts every request, but admits those the limit
	// denies: to roll a limit out safely. OnDecision sees OutcomeShadow
	// ("would have denied"), Logger logs it, and Stats counts it. Headers
	// are written as Headers says (use HeadersNone for a rollout clients
	// must not see).
	Shadow bool
	// MaxWait, when positive, holds a denied request up to this long for
	// its tokens instead of answering 429 at once, honouring the request's
	// context; after that, 429. A request whose keys cannot be served
	// within MaxWait (the servers' retry-after says so) gets its 429 at
	// once. Waiting is Client.WaitN under a context deadline: waiters of a
	// key (the first of the request's keys) are served first come, first
	// served. Default 0: no queue.
	MaxWait time.Duration
	// MaxQueue bounds the requests waiting at once (MaxWait); a request
	// that finds the queue full gets its 429 at once. Default 1024.
	MaxQueue int

	// Logger receives the middleware's logs: shadow denials at Info. nil
	// discards them.
	Logger *slog.Logger
}

// Outcome is what the middleware did with a request.
type Outcome uint8

const (
	// OutcomeAllowed: the limit allowed the request at once.
	OutcomeAllowed Outcome = inbound.OutcomeAllowed
	// OutcomeDenied: the limit denied it; it got a 429 (or DenyHandler's
	// answer).
	OutcomeDenied Outcome = inbound.OutcomeDenied
	// OutcomeShadow: the limit denied it, and Shadow admitted it anyway.
	OutcomeShadow Outcome = inbound.OutcomeShadow
	// OutcomeWaited: denied at first, it waited in the queue (MaxWait) and
	// was admitted.
	OutcomeWaited Outcome = inbound.OutcomeWaited
	// OutcomeUnidentified: a key part was missing; MissingHandler answered.
	OutcomeUnidentified Outcome = inbound.OutcomeUnidentified
	// OutcomeRefused: the lease servers refused the request's keys or
	// this service (a wrong token, a key it may not use, a cost beyond
	// the rule's burst; Result.Err says which): a misconfiguration, not a
	// rate limit. The request got a 503, never a 429, or, in Shadow mode,
	// was admitted (and is not counted in Stats.Shadow).
	OutcomeRefused Outcome = inbound.OutcomeRefused
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case OutcomeAllowed:
		return "allowed"
	case OutcomeDenied:
		return "denied"
	case OutcomeShadow:
		return "shadow_denied"
	case OutcomeWaited:
		return "waited"
	case OutcomeUnidentified:
		return "unidentified"
	case OutcomeRefused:
		return "refused"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Result is the middleware's decision on one request.
type Result struct {
	// Outcome says what happened.
	Outcome Outcome
	// Keys are the request's keys; Cost the tokens taken from each.
	Keys []string
	Cost int64
	// Decision is the SDK's first decision on the request (for a request
	// that waited, the denial that sent it to the queue).
	Decision client.Decision
	// Waited is how long the request spent in the queue.
	Waited time.Duration
	// QueueFull is true for a denial because MaxQueue requests were
	// waiting already.
	QueueFull bool
	// Err is why a wait ended without tokens (client.ErrRateLimited, the
	// request's context error, client.ErrClosed), the request's context
	// error when it ended before a lease server decided (no limit judged
	// it; still answered 429, as a request whose wait it ended), why the servers refused
	// the request (OutcomeRefused: an error wrapping a *client.RefusedError,
	// or matching client.ErrCostExceedsBurst or client.ErrInvalidRequest),
	// or the *MissingPartError of OutcomeUnidentified.
	Err error
}

// WouldDeny reports whether the limit denied the request when it first
// came, whatever happened next: true for OutcomeDenied, OutcomeShadow and
// OutcomeWaited.
func (r Result) WouldDeny() bool {
	return r.Outcome == OutcomeDenied || r.Outcome == OutcomeShadow || r.Outcome == OutcomeWaited
}

type resultKey struct{}

// ResultFrom returns the Result of a denied request, in DenyHandler.
func ResultFrom(ctx context.Context) (Result, bool) {
	r, ok := ctx.Value(resultKey{}).(*Result)
	if !ok {
		return Result{}, false
	}
	return *r, true
}

// Stats counts the middleware's outcomes since New.
type Stats struct {
	Allowed      int64
	Denied       int64
	Refused      int64 // OutcomeRefused: answered 503 (also in Denied) or admitted by Shadow
	Shadow       int64 // admitted by Shadow, would have been denied
	Waited       int64 // admitted after waiting
	QueueFull    int64 // denied because the queue was full (also in Denied)
	Unidentified int64
	Queued       int64 // waiting now
}

// Middleware limits inbound HTTP requests with a ratelease Client. Create
// it with New; Handler wraps a handler. It is safe for concurrent use.
type Middleware struct {
	core     *inbound.Limiter // the configuration, queue and counters shared with grpclimit
	in       inputs           // the mux is set per Handler
	cost     func(*http.Request) int64
	priority func(*http.Request) string
	deny     http.Handler
	missing  func(http.ResponseWriter, *http.Request, error)
	hook     func(*http.Request, Result)
}

// New checks cfg and returns a Middleware. A template that does not parse,
// a header mode or proxy header it does not know, an IP prefix out of
// range: each is an error here, never a rate limit later.
func New(cfg Config) (*Middleware, error) {
	m := &Middleware{
		cost:     cfg.Cost,
		priority: cfg.Priority,
		deny:     cfg.DenyHandler,
		missing:  cfg.MissingHandler,
		hook:     cfg.OnDecision,
	}
	core, err := inbound.New(inbound.Config{
		Prefix:         "httplimit",
		Client:         cfg.Client,
		Keys:           inbound.Keys(cfg.Keys),
		Resolve:        resolvePart,
		TrustedProxies: cfg.TrustedProxies,
		CheckProxies: func(trusted []netip.Prefix) error {
			return m.in.setProxyHeader(cfg.ProxyHeader, len(trusted) > 0)
		},
		IPv6Prefix: cfg.IPv6Prefix,
		IPv4Prefix: cfg.IPv4Prefix,
		Headers:    inbound.HeaderMode(cfg.Headers),
		Shadow:     cfg.Shadow,
		MaxWait:    cfg.MaxWait,
		MaxQueue:   cfg.MaxQueue,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	m.core = core
	m.in.peers = core.Peers()
	if m.deny == nil {
		m.deny = http.HandlerFunc(defaultDeny)
	}
	return m, nil
}

// Handler returns next behind the limit. When next is an *http.ServeMux,
// {route} is the pattern of the mux route that will serve the request; when
// it is not, the request must have been routed by a mux already (wrap the
// handler you register: mux.Handle("GET /hello", m.Handler(h))).
func (m *Middleware) Handler(next http.Handler) http.Handler {
	in := m.in
	in.mux, _ = next.(*http.ServeMux)
	return &handler{m: m, in: &in, next: next}
}

// Keys returns the keys of a request as Handler makes them, or a
// *MissingPartError. {route} is the request's Pattern.
func (m *Middleware) Keys(r *http.Request) ([]string, error) {
	return m.makeKeys(r, &m.in)
}

// ClientIP returns the client's address as {ip} sees it before its
// reduction to a prefix: the direct peer's, or the proxy header's when the
// peer is a trusted proxy.
func (m *Middleware) ClientIP(r *http.Request) (netip.Addr, bool) {
	return m.in.clientAddr(r)
}

// Stats returns the middleware's counters.
func (m *Middleware) Stats() Stats {
	return Stats(m.core.Stats())
}

// makeKeys makes the keys of r, or returns a *MissingPartError.
func (m *Middleware) makeKeys(r *http.Request, in *inputs) ([]string, error) {
	keys, err := m.core.MakeKeys(func(s keytemplate.Segment) (string, bool) { return in.value(r, s) })
	if miss, ok := err.(*keytemplate.MissingPartError); ok {
		return nil, &MissingPartError{Template: miss.Template, Part: miss.Segment.Written, Kind: partKind(miss.Segment.Kind).String()}
	}
	return keys, err
}

// resultOf is the Result of the shared limiter's decision on keys.
func resultOf(keys []string, cost int64, out *inbound.Decided) Result {
	return Result{Outcome: Outcome(out.Outcome), Keys: keys, Cost: cost, Decision: out.Decision, Waited: out.Waited, QueueFull: out.QueueFull, Err: out.Err}
}

type handler struct {
	m    *Middleware
	in   *inputs
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	cost := int64(1)
	if m.cost != nil {
		if cost = m.cost(r); cost <= 0 {
			h.next.ServeHTTP(w, r)
			return
		}
	}
	keys, err := m.makeKeys(r, h.in)
	if err != nil {
		m.core.Unidentified()
		res := Result{Outcome: OutcomeUnidentified, Cost: cost, Err: err}
		if m.hook != nil {
			m.hook(r, res)
		}
		if m.missing != nil {
			m.missing(w, r, err)
		} else {
			h.defaultMissing(w, r, err)
		}
		return
	}
	ctx := r.Context()
	if m.priority != nil {
		if p := m.priority(r); p != "" {
			ctx = client.WithPriority(ctx, p)
		}
	}
	out := m.core.Decide(ctx, keys, cost)
	d := &out.Decision
	if out.Outcome == inbound.OutcomeShadow {
		m.core.Logger().Info("httplimit: shadow: would have denied", "keys", keys, "cost", cost, "source", d.Source.String(), "retry_after", d.RetryAfter)
	}
	if m.hook != nil {
		m.hook(r, resultOf(keys, cost, &out))
	}
	switch out.Verdict {
	case inbound.VerdictAdmit:
		if out.Fields {
			m.setFields(w.Header(), &out)
		}
		h.next.ServeHTTP(w, r)
		return
	case inbound.VerdictRefused:
		// A misconfiguration, not a rate limit: no 429 that would send the
		// caller to retry. The SDK logs the cause.
		writeProblem(w, problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable, Detail: "the rate limiter refused this service's configuration; its operator must fix it"})
		return
	case inbound.VerdictClosing:
		writeProblem(w, problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable, Detail: "the rate limiter is shutting down"})
		return
	}
	// VerdictDeny, or VerdictEnded: a request whose context ended before
	// its decision or while it waited gets the 429 too.
	wh := w.Header()
	wh.Set("Retry-After", inbound.RetryAfterSeconds(out.Retry))
	if out.Fields {
		m.setFields(wh, &out)
	}
	rp := new(Result) // on the heap on this path only
	*rp = resultOf(keys, cost, &out)
	m.deny.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), resultKey{}, rp)))
}

func (h *handler) defaultMissing(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	detail := err.Error()
	var mp *MissingPartError
	if errors.As(err, &mp) {
		switch mp.Kind {
		case "user":
			status = http.StatusUnauthorized
			detail = "this API needs an authenticated caller"
		case "header":
			status = http.StatusBadRequest
			detail = fmt.Sprintf("this API needs the %s header", mp.Part[len("{header:"):len(mp.Part)-1])
		case "route":
			if h.in.mux != nil {
				// The wrapped mux serves no route for the request: let it
				// answer, 404, or 405 with Allow for a path served for
				// other methods (a 404 said "no route matches" to a wrong
				// method, found by review), or its redirect. None of
				// these runs an application handler.
				h.in.mux.ServeHTTP(w, r)
				return
			}
		}
	}
	writeProblem(w, problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}
