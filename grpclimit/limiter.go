package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/protocol"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Metadata keys of the responses: the RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers (structured-field lists, exactly as
// client/httplimit writes them) and Retry-After, lower case as gRPC
// metadata is.
const (
	MetadataRateLimitPolicy = "ratelimit-policy"
	MetadataRateLimit       = "ratelimit"
	MetadataRetryAfter      = "retry-after"
)

// Key is one key template of Config.Keys, with its fallback.
type Key struct {
	// Template makes the key from the call: literal text and parts in
	// braces, {ip}, {user}, {method}, {service}, {md:name}. For example
	// "user:{user}", "ip:{ip}", "user:{user}|rpc:{method}",
	// "key:{md:x-api-key}". Required.
	Template string
	// Fallback is the template used instead when a part of Template is
	// missing: for example "ip:{ip}" for "user:{user}" before login. Give
	// it a prefix of its own. Empty: a call missing a part is refused
	// (Config.MissingError).
	Fallback string
}

// HeaderMode says which responses carry the RateLimit metadata:
// HeadersAll (the default), HeadersDenied or HeadersNone, as in httplimit.
type HeaderMode = httplimit.HeaderMode

const (
	HeadersAll    = httplimit.HeadersAll
	HeadersDenied = httplimit.HeadersDenied
	HeadersNone   = httplimit.HeadersNone
)

// Outcome is what the interceptor did with a call (or, for a
// Config.MessageCost decision, a message). The values are httplimit's.
type Outcome = httplimit.Outcome

const (
	OutcomeAllowed      = httplimit.OutcomeAllowed
	OutcomeDenied       = httplimit.OutcomeDenied
	OutcomeShadow       = httplimit.OutcomeShadow
	OutcomeWaited       = httplimit.OutcomeWaited
	OutcomeUnidentified = httplimit.OutcomeUnidentified
)

// Config configures a Limiter. Only Client is required; every zero value
// means the documented default.
type Config struct {
	// Client decides; required.
	Client *client.Client

	// Keys are the key templates. A call needs a token of every key (Cost
	// tokens), all or nothing: one Client.AllowN with all of them.
	// Default: one key, "ip:{ip}".
	Keys []Key
	// TrustedProxies are the addresses of the proxies in front of this
	// server. Only when the direct peer is in one of them is the
	// x-forwarded-for metadata read, and then the client is the right-most
	// address of it that is not itself a trusted proxy. Empty (the
	// default): {ip} is the direct peer's address and x-forwarded-for is
	// ignored. httplimit.ParsePrefixes parses a list.
	TrustedProxies []netip.Prefix
	// IPv6Prefix is the prefix length an IPv6 {ip} is reduced to. Default
	// 64; 128 keeps the full address.
	IPv6Prefix int
	// IPv4Prefix is the same for IPv4. Default 32: the whole address.
	IPv4Prefix int

	// Cost returns the tokens a call (a unary call, or the opening of a
	// stream) takes from each key. nil: 1. A result of 0 or less lets the
	// call through unlimited (health checks, say).
	Cost func(ctx context.Context, fullMethod string) int64
	// MessageCost, when set, is asked for every message a stream's
	// handler receives (after the stream's own decision at its opening):
	// a positive result takes that many tokens from the stream's keys,
	// and a denial makes RecvMsg return the ResourceExhausted status (the
	// RateLimit fields then go in the trailer). 0 or less: the message is
	// free. It is not asked for unary calls, whose one message Cost covers.
	MessageCost func(ctx context.Context, fullMethod string, msg any) int64

	// MissingError returns the error of a call a key cannot be made for
	// (a part missing, and no fallback or a fallback missing one too); err
	// is a *MissingPartError. nil: Unauthenticated for {user},
	// InvalidArgument for {md:name}, Internal for {ip} (the server has no
	// IP peer address: a Unix socket or an in-memory listener) — never
	// ResourceExhausted.
	MissingError func(ctx context.Context, fullMethod string, err error) error
	// OnDecision, when set, is called once for every decision, before the
	// handler runs or the error is returned; it must not block.
	OnDecision func(ctx context.Context, fullMethod string, res Result)

	// Headers says which responses carry the RateLimit metadata. Default
	// HeadersAll.
	Headers HeaderMode
	// Shadow decides and counts every call but admits those the limit
	// denies: OnDecision sees OutcomeShadow, Logger logs it at Info, Stats
	// counts it.
	Shadow bool
	// MaxWait, when positive, holds a denied call up to this long for its
	// tokens (Client.WaitN under a deadline, honouring the call's context)
	// instead of failing it at once. A call whose keys cannot be served
	// within MaxWait fails at once. Default 0: no waiting.
	MaxWait time.Duration
	// MaxQueue bounds the calls waiting at once. Default 1024.
	MaxQueue int

	// Logger receives shadow denials at Info. nil discards them.
	Logger *slog.Logger
}

// Result is the interceptor's decision on one call or message.
type Result struct {
	// Outcome says what happened.
	Outcome Outcome
	// Keys are the call's keys; Cost the tokens taken from each.
	Keys []string
	Cost int64
	// Message is true for a decision on a stream's message
	// (Config.MessageCost), false for a call's or stream's opening.
	Message bool
	// Decision is the SDK's first decision (for a call that waited, the
	// denial that sent it to wait).
	Decision client.Decision
	// Waited is how long the call waited (MaxWait).
	Waited time.Duration
	// QueueFull is true for a denial because MaxQueue calls were waiting.
	QueueFull bool
	// Err is why the call was refused or a wait ended without tokens: the
	// Decision's *client.RefusedError, client.ErrRateLimited, the call's
	// context error, client.ErrClosed, or the *MissingPartError of
	// OutcomeUnidentified.
	Err error
}

// Stats counts the limiter's outcomes since New.
type Stats struct {
	Allowed      int64
	Denied       int64
	Shadow       int64 // admitted by Shadow, would have been denied
	Waited       int64 // admitted after waiting
	QueueFull    int64 // denied because the queue was full (also in Denied)
	Unidentified int64
	Queued       int64 // waiting now
}

// Limiter limits inbound gRPC calls with a ratelease Client. Create it with
// New; UnaryServerInterceptor and StreamServerInterceptor give the
// interceptors, which share its queue and counters. It is safe for
// concurrent use.
type Limiter struct {
	c        *client.Client
	keys     []keyTemplates
	trusted  []netip.Prefix
	v4Bits   int
	v6Bits   int
	cost     func(context.Context, string) int64
	msgCost  func(context.Context, string, any) int64
	missing  func(context.Context, string, error) error
	hook     func(context.Context, string, Result)
	headers  HeaderMode
	shadow   bool
	maxWait  time.Duration
	queue    chan struct{}
	log      *slog.Logger
	now      func() time.Time
	allowed  atomic.Int64
	denied   atomic.Int64
	shadowed atomic.Int64
	waited   atomic.Int64
	full     atomic.Int64
	unident  atomic.Int64
}

type keyTemplates struct {
	primary, fallback *keytemplate.Template
}

// New checks cfg and returns a Limiter: a template that does not parse, an
// IP prefix out of range, an unknown header mode are errors here, never a
// limit later.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, errors.New("grpclimit: Config.Client is required")
	}
	l := &Limiter{
		c:       cfg.Client,
		cost:    cfg.Cost,
		msgCost: cfg.MessageCost,
		missing: cfg.MissingError,
		hook:    cfg.OnDecision,
		headers: cfg.Headers,
		shadow:  cfg.Shadow,
		maxWait: cfg.MaxWait,
		log:     cfg.Logger,
		now:     time.Now,
	}
	keys := cfg.Keys
	if len(keys) == 0 {
		keys = []Key{{Template: "ip:{ip}"}}
	}
	if len(keys) > protocol.MaxEntries {
		return nil, fmt.Errorf("grpclimit: %d keys; at most %d", len(keys), protocol.MaxEntries)
	}
	for i, k := range keys {
		p, err := keytemplate.Parse(k.Template, resolvePart)
		if err != nil {
			return nil, fmt.Errorf("grpclimit: Keys[%d].Template: %w", i, err)
		}
		kt := keyTemplates{primary: p}
		if k.Fallback != "" {
			if kt.fallback, err = keytemplate.Parse(k.Fallback, resolvePart); err != nil {
				return nil, fmt.Errorf("grpclimit: Keys[%d].Fallback: %w", i, err)
			}
		}
		l.keys = append(l.keys, kt)
	}
	l.v6Bits, l.v4Bits = cfg.IPv6Prefix, cfg.IPv4Prefix
	if l.v6Bits == 0 {
		l.v6Bits = 64
	}
	if l.v4Bits == 0 {
		l.v4Bits = 32
	}
	if l.v6Bits < 1 || l.v6Bits > 128 || l.v4Bits < 1 || l.v4Bits > 32 {
		return nil, fmt.Errorf("grpclimit: IPv6Prefix %d or IPv4Prefix %d out of range (1–128, 1–32)", cfg.IPv6Prefix, cfg.IPv4Prefix)
	}
	for _, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("grpclimit: trusted proxy prefix %v is not valid", p)
		}
		l.trusted = append(l.trusted, keytemplate.NormalizePrefix(p))
	}
	if cfg.Headers > HeadersNone {
		return nil, fmt.Errorf("grpclimit: unknown HeaderMode %d", cfg.Headers)
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("grpclimit: MaxWait %v is negative", cfg.MaxWait)
	}
	if cfg.MaxQueue < 0 {
		return nil, fmt.Errorf("grpclimit: MaxQueue %d is negative", cfg.MaxQueue)
	}
	if cfg.MaxWait > 0 {
		n := cfg.MaxQueue
		if n == 0 {
			n = 1024
		}
		l.queue = make(chan struct{}, n)
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l, nil
}

// WithIdentity returns a copy of ctx carrying the authenticated caller's
// identity, the {user} part: httplimit.WithIdentity, so that one
// authentication layer serves both. Set it in an interceptor that runs
// before this one (grpc.ChainUnaryInterceptor(auth, limiter)).
func WithIdentity(ctx context.Context, id string) context.Context {
	return httplimit.WithIdentity(ctx, id)
}

// Keys returns the keys of a call to fullMethod with ctx (the server's
// context of the call: peer, incoming metadata, identity), or a
// *MissingPartError.
func (l *Limiter) Keys(ctx context.Context, fullMethod string) ([]string, error) {
	return l.makeKeys(&call{ctx: ctx, method: fullMethod})
}

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{
		Allowed:      l.allowed.Load(),
		Denied:       l.denied.Load(),
		Shadow:       l.shadowed.Load(),
		Waited:       l.waited.Load(),
		QueueFull:    l.full.Load(),
		Unidentified: l.unident.Load(),
		Queued:       int64(len(l.queue)),
	}
}

// UnaryServerInterceptor returns the interceptor of unary calls: one
// decision per call, before the handler.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		cost := int64(1)
		if l.cost != nil {
			if cost = l.cost(ctx, info.FullMethod); cost <= 0 {
				return handler(ctx, req)
			}
		}
		c := &call{ctx: ctx, method: info.FullMethod}
		keys, err := l.makeKeys(c)
		if err != nil {
			return nil, l.unidentified(ctx, info.FullMethod, cost, err)
		}
		md, err := l.decide(ctx, info.FullMethod, keys, cost, false)
		if md != nil {
			_ = grpc.SetHeader(ctx, md)
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns the interceptor of streams: one decision
// per stream, when it opens (Config.Cost tokens), before the handler runs;
// the messages are not counted unless Config.MessageCost says so. A
// long-lived stream thus takes its tokens once: limit what it carries with
// MessageCost.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		cost := int64(1)
		if l.cost != nil {
			cost = l.cost(ctx, info.FullMethod)
		}
		if cost <= 0 && l.msgCost == nil {
			return handler(srv, ss)
		}
		c := &call{ctx: ctx, method: info.FullMethod}
		keys, err := l.makeKeys(c)
		if err != nil {
			return l.unidentified(ctx, info.FullMethod, cost, err)
		}
		if cost > 0 {
			md, err := l.decide(ctx, info.FullMethod, keys, cost, false)
			if md != nil {
				_ = ss.SetHeader(md)
			}
			if err != nil {
				return err
			}
		}
		if l.msgCost != nil {
			ss = &meteredStream{ServerStream: ss, l: l, method: info.FullMethod, keys: keys}
		}
		return handler(srv, ss)
	}
}

// meteredStream decides each received message (Config.MessageCost).
type meteredStream struct {
	grpc.ServerStream
	l      *Limiter
	method string
	keys   []string
}

func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	cost := s.l.msgCost(ctx, s.method, m)
	if cost <= 0 {
		return nil
	}
	md, err := s.l.decide(ctx, s.method, s.keys, cost, true)
	if err != nil && md != nil {
		// The header may be gone already: the fields go in the trailer.
		s.SetTrailer(md)
	}
	return err
}

func (l *Limiter) unidentified(ctx context.Context, method string, cost int64, err error) error {
	l.unident.Add(1)
	if l.hook != nil {
		l.hook(ctx, method, Result{Outcome: OutcomeUnidentified, Cost: cost, Err: err})
	}
	if l.missing != nil {
		return l.missing(ctx, method, err)
	}
	code := codes.Internal
	msg := err.Error()
	if mp, ok := errors.AsType[*MissingPartError](err); ok {
		switch mp.Kind {
		case "user":
			code, msg = codes.Unauthenticated, "this API needs an authenticated caller"
		case "md":
			code, msg = codes.InvalidArgument, "this API needs the "+mp.Part[len("{md:"):len(mp.Part)-1]+" metadata"
		}
	}
	return status.Error(code, msg)
}

// decide takes cost tokens of keys: a nil error admits. md is the metadata
// to send (RateLimit fields as Headers says, retry-after on a denial);
// nil when there is none.
func (l *Limiter) decide(ctx context.Context, method string, keys []string, cost int64, message bool) (metadata.MD, error) {
	d := l.c.AllowN(ctx, cost, keys...)
	res := Result{Keys: keys, Cost: cost, Message: message, Decision: d}
	switch {
	case d.Allowed:
		l.allowed.Add(1)
		return l.admit(ctx, method, res, true), nil
	case d.Err != nil && !l.shadow:
		// The lease servers refused this service (a wrong token, a key it
		// may not use): a misconfiguration, not a rate limit, so never
		// ResourceExhausted, which would send the caller to retry later.
		l.denied.Add(1)
		res.Outcome, res.Err = OutcomeDenied, d.Err
		l.report(ctx, method, res)
		return nil, status.Error(codes.Unavailable, "the rate limiter refused this service's configuration; its operator must fix it")
	case d.Source == client.SourceClosed && !l.shadow:
		l.denied.Add(1)
		res.Outcome, res.Err = OutcomeDenied, client.ErrClosed
		l.report(ctx, method, res)
		return nil, status.Error(codes.Unavailable, "the rate limiter is shutting down")
	case l.shadow:
		l.shadowed.Add(1)
		res.Outcome = OutcomeShadow
		l.log.Info("grpclimit: shadow: would have denied", "method", method, "keys", keys, "cost", cost, "source", d.Source.String(), "retry_after", d.RetryAfter)
		return l.admit(ctx, method, res, true), nil
	}
	retry := d.RetryAfter
	if l.queue != nil && d.Source != client.SourceDenied && d.RetryAfter <= l.maxWait {
		select {
		case l.queue <- struct{}{}:
			start := l.now()
			wctx, cancel := context.WithTimeout(ctx, l.maxWait)
			err := l.c.WaitN(wctx, cost, keys...)
			cancel()
			<-l.queue
			res.Waited = l.now().Sub(start)
			if err == nil {
				l.waited.Add(1)
				res.Outcome = OutcomeWaited
				// No decision came with the tokens: the first one's
				// state would be stale, so RateLimit is left out.
				return l.admit(ctx, method, res, false), nil
			}
			res.Err = err
			if rl, ok := errors.AsType[*client.RateLimitedError](err); ok && rl.RetryAfter > 0 {
				retry = rl.RetryAfter
			}
			switch {
			case errors.Is(err, client.ErrClosed):
				l.denied.Add(1)
				res.Outcome = OutcomeDenied
				l.report(ctx, method, res)
				return nil, status.Error(codes.Unavailable, "the rate limiter is shutting down")
			case ctx.Err() != nil:
				// The caller gave up (or its deadline passed) while
				// waiting: its own status, not a rate limit.
				l.denied.Add(1)
				res.Outcome = OutcomeDenied
				l.report(ctx, method, res)
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		default:
			res.QueueFull = true
			l.full.Add(1)
		}
	}
	l.denied.Add(1)
	res.Outcome = OutcomeDenied
	l.report(ctx, method, res)
	md := metadata.MD{}
	if l.headers != HeadersNone {
		l.setFields(md, d.Limits, true)
	}
	md.Set(MetadataRetryAfter, retryAfterSeconds(retry))
	return md, deniedStatus(retry, res.QueueFull)
}

func (l *Limiter) report(ctx context.Context, method string, res Result) {
	if l.hook != nil {
		l.hook(ctx, method, res)
	}
}

// admit reports an admitted call and returns its metadata.
func (l *Limiter) admit(ctx context.Context, method string, res Result, withState bool) metadata.MD {
	l.report(ctx, method, res)
	if l.headers != HeadersAll || len(res.Decision.Limits) == 0 || res.Message {
		return nil
	}
	md := metadata.MD{}
	l.setFields(md, res.Decision.Limits, withState)
	return md
}

func (l *Limiter) setFields(md metadata.MD, ls []client.LimitState, withState bool) {
	policy, state := httplimit.RateLimitFields(ls, l.now())
	if policy != "" {
		md.Set(MetadataRateLimitPolicy, policy)
	}
	if state != "" && withState {
		md.Set(MetadataRateLimit, state)
	}
}

// deniedStatus is the ResourceExhausted status of a denial, with a
// RetryInfo detail of the delay (at least a second when unknown).
func deniedStatus(retry time.Duration, queueFull bool) error {
	delay := retry
	if delay <= 0 {
		delay = time.Second
	}
	msg := "rate limit exceeded; retry after " + retryAfterSeconds(retry) + " s"
	if queueFull {
		msg = "too many calls are waiting for this rate limit; retry after " + retryAfterSeconds(retry) + " s"
	}
	st := status.New(codes.ResourceExhausted, msg)
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); err == nil {
		st = ds
	}
	return st.Err()
}

// retryAfterSeconds is retry-after for a wait of d: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64(1)
	if d > time.Second {
		s = int64((d + time.Second - 1) / time.Second)
	}
	return strconv.FormatInt(s, 10)
}
