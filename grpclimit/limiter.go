package grpclimit

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/internal/inbound"
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
	OutcomeRefused      = httplimit.OutcomeRefused
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
	// context error (also when it ended before a lease server decided:
	// no limit judged the call, which fails with the context's status,
	// never ResourceExhausted), client.ErrClosed, or the *MissingPartError of
	// OutcomeUnidentified.
	Err error
}

// Stats counts the limiter's outcomes since New. Its fields are those of
// httplimit.Stats, which documents them (a call is a request).
type Stats httplimit.Stats

// Limiter limits inbound gRPC calls with a ratelease Client. Create it with
// New; UnaryServerInterceptor and StreamServerInterceptor give the
// interceptors, which share its queue and counters. It is safe for
// concurrent use.
type Limiter struct {
	core    *inbound.Limiter // the configuration, queue and counters shared with httplimit
	cost    func(context.Context, string) int64
	msgCost func(context.Context, string, any) int64
	missing func(context.Context, string, error) error
	hook    func(context.Context, string, Result)
}

// New checks cfg and returns a Limiter: a template that does not parse, an
// IP prefix out of range, an unknown header mode are errors here, never a
// limit later.
func New(cfg Config) (*Limiter, error) {
	core, err := inbound.New(inbound.Config{
		Prefix:         "grpclimit",
		Client:         cfg.Client,
		Keys:           inbound.Keys(cfg.Keys),
		Resolve:        resolvePart,
		TrustedProxies: cfg.TrustedProxies,
		IPv6Prefix:     cfg.IPv6Prefix,
		IPv4Prefix:     cfg.IPv4Prefix,
		Headers:        inbound.HeaderMode(cfg.Headers),
		Shadow:         cfg.Shadow,
		MaxWait:        cfg.MaxWait,
		MaxQueue:       cfg.MaxQueue,
		Logger:         cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Limiter{core: core, cost: cfg.Cost, msgCost: cfg.MessageCost, missing: cfg.MissingError, hook: cfg.OnDecision}, nil
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
	return Stats(l.core.Stats())
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
	l.core.Unidentified()
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

// resultOf is the Result of the shared limiter's decision on keys;
// message says it was a stream message's.
func resultOf(keys []string, cost int64, message bool, out *inbound.Decided) Result {
	return Result{Outcome: Outcome(out.Outcome), Keys: keys, Cost: cost, Message: message, Decision: out.Decision, Waited: out.Waited, QueueFull: out.QueueFull, Err: out.Err}
}

// decide takes cost tokens of keys: a nil error admits. md is the metadata
// to send (RateLimit fields as Headers says, retry-after on a denial);
// nil when there is none.
func (l *Limiter) decide(ctx context.Context, method string, keys []string, cost int64, message bool) (metadata.MD, error) {
	out := l.core.Decide(ctx, keys, cost)
	d := &out.Decision
	if out.Outcome == inbound.OutcomeShadow {
		l.core.Logger().Info("grpclimit: shadow: would have denied", "method", method, "keys", keys, "cost", cost, "source", d.Source.String(), "retry_after", d.RetryAfter)
	}
	if l.hook != nil {
		l.hook(ctx, method, resultOf(keys, cost, message, &out))
	}
	switch out.Verdict {
	case inbound.VerdictAdmit:
		if !out.Fields || message {
			return nil, nil
		}
		return l.metadataOf(&out, time.Now(), false), nil
	case inbound.VerdictRefused:
		// A misconfiguration, not a rate limit: never ResourceExhausted,
		// which would send the caller to retry later.
		return nil, status.Error(codes.Unavailable, "the rate limiter refused this service's configuration; its operator must fix it")
	case inbound.VerdictClosing:
		return nil, status.Error(codes.Unavailable, "the rate limiter is shutting down")
	case inbound.VerdictEnded:
		// The caller gave up (or its deadline passed) while waiting: its
		// own status, not a rate limit.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return l.metadataOf(&out, time.Now(), true), deniedStatus(out.Retry, out.QueueFull)
}

// metadataOf returns the metadata of the answer to out at now: the
// RateLimit fields as out says (inbound.Limiter.Fields, from the shared
// limiter's cache), and retry-after when retry is set; nil when it has
// none. When the fields come from the cache, an admission allocates only
// the metadata itself: its map and one array for all its values.
func (l *Limiter) metadataOf(out *inbound.Decided, now time.Time, retry bool) metadata.MD {
	policy, state := l.core.Fields(out, now)
	var after string
	if retry {
		after = inbound.RetryAfterSeconds(out.Retry)
	}
	if policy == "" && state == "" && after == "" {
		return nil
	}
	md := make(metadata.MD, 3)
	inbound.SetValues(md, MetadataRateLimitPolicy, policy, MetadataRateLimit, state, MetadataRetryAfter, after)
	return md
}

// deniedStatus is the ResourceExhausted status of a denial, with a
// RetryInfo detail of the delay (at least a second when unknown).
func deniedStatus(retry time.Duration, queueFull bool) error {
	delay := retry
	if delay <= 0 {
		delay = time.Second
	}
	msg := "rate limit exceeded; retry after " + inbound.RetryAfterSeconds(retry) + " s"
	if queueFull {
		msg = "too many calls are waiting for this rate limit; retry after " + inbound.RetryAfterSeconds(retry) + " s"
	}
	st := status.New(codes.ResourceExhausted, msg)
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); err == nil {
		st = ds
	}
	return st.Err()
}
