package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelease/ratelease/protocol"
	"golang.org/x/time/rate"
)

// Source says which path decided a request.
type Source uint8

const (
	// SourceLease: a live lease decided (allowed, or its tokens ran out).
	SourceLease Source = iota
	// SourceRetryAfter: denied locally because a server granted nothing and
	// said when to retry; no network call was made.
	SourceRetryAfter
	// SourceUnlimited: allowed because no rule matches the key and the
	// servers' default is allow.
	SourceUnlimited
	// SourceFallback: decided by Config.Fallback, because no lease was live
	// and no server answered (or the one that did failed on the take).
	SourceFallback
	// SourceDenied: denied because the server refused the key (no rule
	// under default deny, or a key this client may not lease), because
	// the request asked more than the key's rule can ever hold (Err
	// matches ErrCostExceedsBurst), or because the request was invalid
	// (Err matches ErrInvalidRequest).
	SourceDenied
	// SourceClosed: the client is closed (Decision.Err is ErrClosed).
	SourceClosed
	// SourceDirect: a lease server decided this request alone, by a direct
	// take (one call, coalesced with the process's other decisions in
	// flight): the key holds no lease in this process. Or none did: the
	// decision's context ended before the answer, and Err is the
	// context's error.
	SourceDirect
	// SourceRefused: denied because a lease server refused the client's
	// calls as a whole (401 unauthorized, 403 forbidden, another 4xx): a
	// misconfiguration, not a rate limit. Decision.Err says why. The
	// fallback does not decide: a server answered. For about a second
	// after a refusal, decisions are denied without a call; then the next
	// one asks again, so a corrected token on the server is seen.
	SourceRefused
)

// String returns the source's name.
func (s Source) String() string {
	switch s {
	case SourceLease:
		return "lease"
	case SourceRetryAfter:
		return "retry_after"
	case SourceUnlimited:
		return "unlimited"
	case SourceFallback:
		return "fallback"
	case SourceDenied:
		return "denied"
	case SourceClosed:
		return "closed"
	case SourceDirect:
		return "direct"
	case SourceRefused:
		return "refused"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Decision is the outcome of Allow.
type Decision struct {
	// Allowed is true when the request may go ahead; its tokens are spent.
	Allowed bool
	// RetryAfter, when the request was denied, is how long until it may be
	// allowed; 0 when unknown.
	RetryAfter time.Duration
	// Remaining is the number of tokens left after this decision, the least
	// over the keys: in the lease, when a lease decided; in the server's
	// bucket, when a direct take did. 0 when neither did (an unlimited
	// key, the fallback, a local denial).
	Remaining int64
	// Source says which path decided.
	Source Source
	// Err is set when the request was denied for another reason than a
	// limit, nil for every other decision, denials by a limit included:
	//   - the client is closed (Source SourceClosed): ErrClosed;
	//   - a server refused the client's calls (Source SourceRefused): a
	//     *RefusedError matching ErrServerRefused, and ErrUnauthorized for
	//     a 401, ErrForbidden for a 403;
	//   - a server refused a key this client may not use, or one no rule
	//     matches under the servers' default of deny (Source SourceDenied):
	//     a *RefusedError matching ErrForbidden (Code protocol.CodeForbidden
	//     or protocol.CodeNoRule);
	//   - the request asked more than the key's rule can ever hold
	//     (ErrCostExceedsBurst), or was invalid (ErrInvalidRequest);
	//   - the decision's context ended before a server decided it (Source
	//     SourceDirect): the context's error, matching context.Canceled or
	//     context.DeadlineExceeded.
	Err error
	// Limits are the limits of the rule of the key that decided (the key
	// that denied, or the one with the least Remaining), as the lease
	// servers last saw them, fleet-wide: enough to write RateLimit
	// headers. Nil when no answer about the key carried them yet (an
	// unlimited key, the fallback before any answer). The slice is shared:
	// do not modify it.
	Limits []LimitState

	// delay is, for a direct take of a shaping rule, how long the request
	// must wait for its slot.
	delay time.Duration
}

// Stats counts what a client did since New.
type Stats struct {
	// Allowed counts tokens spent: from leases, by direct takes, by
	// unlimited keys and by the fallback. It never goes down from one
	// call to the next, though a token a decision over several keys
	// spent while it waited for another key, then gave back when that
	// key denied it, may be counted meanwhile: the count then stands
	// until as many more tokens are spent.
	Allowed int64
	// Denied counts requests denied: each Allow, AllowN and Limiter
	// decision denied, invalid input included, and each Wait or WaitN
	// that failed after a denial or on its arguments, once, however many
	// times it was decided; a Wait that waited and then went ahead counts
	// none. A closed client's denials count none.
	Denied int64
	// ServerCalls counts HTTP calls to lease servers, retries included.
	ServerCalls int64
	// ServerErrors counts calls that failed on every server. Calls a
	// server refused are counted in Refusals instead.
	ServerErrors int64
	// Refusals counts calls a lease server refused as a whole (401, 403,
	// another 4xx; see ErrServerRefused): a misconfiguration. The first
	// refusal after an answer is logged at level error, the others not.
	Refusals int64
	// FallbackDecisions counts requests decided by the fallback, one per
	// decision whatever its keys.
	FallbackDecisions int64
	// DirectDecisions counts requests sent to a lease server as direct
	// takes (allowed or not), one per decision whatever its keys; it
	// includes the few queued for a call while another was in flight whose
	// caller left before the call went (they are not sent).
	DirectDecisions int64
	// KeysHeld is the number of keys holding a lease now; at most
	// Config.MaxKeys.
	KeysHeld int
	// MaxKeysHeld is the most keys that held a lease at once since New.
	MaxKeysHeld int
	// TokensHeld is the number of tokens left in the keys' active leases
	// at the moment of the call, deferred ones included: granted to this
	// process and not spent yet, which the servers count as taken. Leases
	// already replaced (frozen, their remainder waiting to be returned or
	// to expire) are not counted.
	TokensHeld int64
	// Online is false while the client takes the servers for down: while
	// direct decisions go to the fallback (a direct take went unanswered,
	// and no call of either kind has been answered since), or while lease
	// calls go unanswered (the servers may still answer direct takes, and
	// the fallback then decides nothing): from a failed lease call until
	// one is answered, or until no key holds or wants a lease any more.
	Online bool
}

// closedDecision is the decision of a closed client: no limit judged it,
// and its Err says so. Without one, a caller who answers a denial without
// Err as a rate limit (429 and its RetryAfter) took a closed client for
// one (found by the API review: a server draining its requests at
// shutdown answered them 429 with a Retry-After of 0).
var closedDecision = Decision{Source: SourceClosed, Err: ErrClosed}

// Errors of the client; match them with errors.Is.
var (
	// ErrClosed is returned by calls on a closed client, and is the Err of
	// its decisions (Source SourceClosed).
	ErrClosed = errors.New("client: closed")
	// ErrRateLimited is matched by the errors of Wait, Transport and
	// RetryableClient when the budget denies a request. Use errors.As with
	// *RateLimitedError for the retry time. A refusal by a server (see
	// ErrServerRefused) never matches it.
	ErrRateLimited = errors.New("rate limited")
	// ErrCostExceedsBurst is matched by the error of a decision for more
	// tokens than a key's rule can ever hold (Decision.Err, Source
	// SourceDenied): no wait serves it, so Wait returns it at once, and it
	// never matches ErrRateLimited.
	ErrCostExceedsBurst = errors.New("cost exceeds the burst of the key's rule")
	// ErrInvalidRequest is matched by the error of a decision the client
	// cannot make from its arguments (Decision.Err, Source SourceDenied):
	// n below 1 or above protocol.MaxCount, no key or more than
	// protocol.MaxEntries, an invalid key. A mistake of the caller's, not
	// a rate limit: no server is asked, Wait returns it at once, and it
	// never matches ErrRateLimited.
	ErrInvalidRequest = errors.New("client: invalid request")
)

// RateLimitedError says a request was denied and when to retry. It matches
// ErrRateLimited with errors.Is.
type RateLimitedError struct {
	// Keys are the keys of the request denied: a copy the error owns.
	Keys []string
	// RetryAfter is how long until the request may be allowed, as the
	// denying decision's RetryAfter; 0 when unknown.
	RetryAfter time.Duration
	// Source says which path denied it.
	Source Source
}

// Error describes the denial: its keys, its Source and its RetryAfter.
func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("rate limited on %v (%s): retry after %v", e.Keys, e.Source, e.RetryAfter)
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// Client leases tokens from the lease servers and spends them locally. It
// is safe for concurrent use. Create it with New and stop it with Close.
type Client struct {
	cfg   Config
	start time.Time
	clk   clock // nil: the monotonic clock since start
	http  *caller

	keys       sync.Map     // string -> *keyState
	activeKeys atomic.Int64 // keys with an active lease
	maxActive  atomic.Int64 // high-water mark of activeKeys

	// denyFor keeps the end (client clock, int64) of each key's DenyFor
	// while it lasts, apart from the key's state: an idle key is forgotten
	// (IdleTimeout, MaxKeys), and its state made again by its next
	// decision had lost the denial (found by review: allowed 10 s into a
	// DenyFor of two minutes). Pruned by the settle loop's sweep.
	denyFor sync.Map // string -> int64

	kick    chan struct{}
	stop    chan struct{}
	stopped chan struct{}
	closing atomic.Bool
	// online and leasesOnline are the two paths' views of the servers:
	// online is cleared by a failed direct take only (decisions go to
	// Fallback while it is false, see probe), leasesOnline by a failed
	// lease call only (decisions wait for leases only while it is true),
	// and set again by an answered one or once the loop holds no key (no
	// call left to make again, see loop).
	// A failure of the one path says nothing of the other: lease calls
	// failing (a server or a proxy that fails them alone) once sent every
	// direct decision to the fallback while the servers answered its
	// takes. An answer to either sets online (see takesOnline): after an
	// outage, direct decisions resume with the first answer, not at their
	// next probe.
	online       atomic.Bool
	leasesOnline atomic.Bool

	closeOnce sync.Once
	closeCtx  chan context.Context
	closeErr  error // set by the loop before it stops

	denied    atomic.Int64
	fallbacks atomic.Int64
	refusals  atomic.Int64 // calls a server refused as a whole

	// refusal is the last refusal of a call as a whole, while it stands:
	// decisions that need a server are denied with it until refusedUntil
	// (client clock), then the next one asks again. Cleared by any answer.
	refusal      atomic.Pointer[RefusedError]
	refusedUntil atomic.Int64
	forgottenUse atomic.Int64 // Allowed of keys no longer held
	// allowedSeen is the highest Stats.Allowed returned: Stats never
	// returns less (see Stats).
	allowedSeen atomic.Int64
	// waitDenials counts the denied decisions of WaitN's tries, each of
	// them (Stats.Denied counts a Wait once): the tests see a busy loop
	// in it.
	waitDenials atomic.Int64
	directOK    atomic.Int64 // tokens allowed by direct takes
	directs     atomic.Int64 // decisions sent as direct takes

	direct        directQueue
	directBackoff atomic.Int64 // ns; doubles while no server answers a direct call
	directRetryAt atomic.Int64 // client clock: no direct call before this while offline
	// detach is set when an unrouted direct call was canceled because its
	// caller gave up (see callOwn; a routed call sets its server's, see
	// serverHealth), and cleared by the next answer to a direct call:
	// meanwhile every direct call is made by a sender goroutine, which no
	// caller cancels, so the servers are judged by what they do (see
	// takeDirect). detachSince is the client clock at which the first call
	// made meanwhile was sent (0: none since the last answer or failure):
	// no answer RequestTimeout after it is an outage (see checkDetached).
	detach      atomic.Bool
	detachSince atomic.Int64
	// directFailedAt is the client clock at the last failure of the direct
	// takes counted (see directFailed).
	directFailedAt atomic.Int64
	// storeDownLogged is the client clock at which noteStoreDown last
	// logged (0: never).
	storeDownLogged atomic.Int64

	promoMu  sync.Mutex
	promoted []*keyState // keys moved to leases, for the loop to take over

	run loopState // owned by the settle loop

	life    context.Context // ends at Close: the direct calls run under it
	endLife context.CancelFunc
}

// New returns a Client and starts its settle loop.
//
// Before it returns, New asks the servers, in order, whether they accept
// the client's token (GET /v1/rules, within Config.ProbeTimeout), so that a
// misconfiguration fails at start rather than denying every request: when
// the first server that answers refuses with 401 or 403, New fails with a
// *RefusedError that matches ErrUnauthorized or ErrForbidden. When no
// server answers in time, New starts anyway: servers that are down are an
// outage, which the fallback covers, not a misconfiguration. A negative
// ProbeTimeout skips the probe.
func New(cfg Config) (*Client, error) {
	c, err := newClient(cfg, nil)
	if err != nil {
		return nil, err
	}
	if err := c.probeStart(); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ProbeTimeout)
		defer cancel()
		_ = c.Close(ctx) // nothing leased yet: nothing to settle
		return nil, err
	}
	return c, nil
}

// newClient is New with a clock (nil: the monotonic clock).
func newClient(cfg Config, clk clock) (*Client, error) {
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:      full,
		start:    time.Now(),
		clk:      clk,
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
		closeCtx: make(chan context.Context, 1),
	}
	c.life, c.endLife = context.WithCancel(context.Background())
	c.http = newCaller(&c.cfg)
	c.online.Store(true)
	c.leasesOnline.Store(true)
	c.directFailedAt.Store(-1) // none: a call sent at 0 (a test's clock) fails
	go c.loop()
	return c, nil
}

// ClientID returns the ID the client sends to the servers.
func (c *Client) ClientID() string { return c.cfg.ClientID }

func (c *Client) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// state returns the key's state, creating it when new.
func (c *Client) state(key string) *keyState {
	for {
		if v, ok := c.keys.Load(key); ok {
			ks := v.(*keyState)
			if !ks.dead.Load() {
				return ks
			}
			// Being forgotten: make sure it is gone, then start afresh.
			c.keys.CompareAndDelete(key, ks)
			continue
		}
		ks := newKeyState(key)
		now := c.nanos()
		ks.lastDirect.Store(now)
		if v, ok := c.denyFor.Load(key); ok && v.(int64) > now {
			// A DenyFor in force on a key forgotten since.
			ks.denyForUntil.Store(v.(int64))
			ks.denyUntil.Store(v.(int64))
		}
		v, _ := c.keys.LoadOrStore(key, ks)
		return v.(*keyState)
	}
}

// Allow reports whether one request may happen now for every key, spending
// one token of each (all or nothing). See AllowN.
func (c *Client) Allow(ctx context.Context, keys ...string) Decision {
	return c.AllowN(ctx, 1, keys...)
}

// AllowN reports whether n requests' worth may happen now for every key,
// spending n tokens of each: all of them or none. The decision's priority
// class is ctx's (WithPriority), else Config.Priority; a class other than
// the default is decided by a direct take (see WithPriority).
//
// A key with a live lease is decided locally, without a lock, unless n is
// more than the key's batches hold (at most a quarter of its bucket): then
// by a direct take, and a denial of it denies takes of as many until its
// RetryAfter. A key just moved to leases waits for its first lease, and a
// young key's decision for the answer of a take of it in flight (see the
// package documentation): these waits take Config.RequestTimeout at most in all,
// on the client's clock. A decision over several keys holds no token of
// the others while it waits: it decides them again after, as if it came
// then (a key that can no longer serve it denies it), unless one of them
// took a shaping rule's slot, which cannot be given back: then it holds
// them. Any other key is decided by a direct take at a lease server
// (Source SourceDirect): one call, sent at once and coalesced with the
// process's other decisions in flight, so the decision waits about one
// round trip (at most until ctx ends: a decision whose ctx ended before
// the answer, or before it was sent, which it then is not, is denied with
// Err ctx's error and RetryAfter Config.SettleInterval).
// A key a server denied is denied locally until its bucket can serve again
// (the server's retry_after, at most the bucket's fill time), without a
// call. Config.Fallback decides
// only while no server answers. Keys move to leases by themselves once
// this process is admitted enough of them (Config.LeaseMinTokens).
// Invalid keys, n < 1 or n above protocol.MaxCount are denied with Source
// SourceDenied and an Err matching ErrInvalidRequest, without a call. A
// key named twice counts once.
func (c *Client) AllowN(ctx context.Context, n int64, keys ...string) Decision {
	if err := checkCount(n, len(keys)); err != nil {
		c.denied.Add(1)
		return Decision{Source: SourceDenied, Err: err}
	}
	if len(keys) > 1 {
		keys = distinctKeys(keys)
	}
	var buf [4]*keyState
	states := buf[:0]
	for _, k := range keys {
		if err := protocol.ValidateKey(k); err != nil {
			c.denied.Add(1)
			return Decision{Source: SourceDenied, Err: invalidKey(k, err)}
		}
		states = append(states, c.state(k))
	}
	d := c.decide(ctx, n, states, 0)
	c.count(d.Allowed, d.Source)
	return d
}

// count counts a decision of Allow, AllowN or a Limiter in Stats.Denied
// when it is a denial (a closed client's is not). WaitN counts its own
// (see WaitN): one per Wait, however many decisions it made. (Its
// arguments are the decision's fields, not the Decision: a wrapper that
// took and returned it cost BenchmarkClientAllow 2 ns of copying.)
func (c *Client) count(allowed bool, src Source) {
	if !allowed && src != SourceClosed {
		c.denied.Add(1)
	}
}

// distinctKeys returns keys without repeats, in the order of their first
// appearance: keys itself when none repeats. A decision on a key named
// twice is one decision on it (the keys are all or nothing together). It
// used to become a take the server refuses whole (duplicate_key), which the
// client took for a misconfiguration of its own, denying every key for a
// second.
func distinctKeys(keys []string) []string {
	if len(keys) > 16 {
		seen := make(map[string]struct{}, len(keys))
		out := keys[:0:0]
		for _, k := range keys {
			if _, ok := seen[k]; !ok {
				seen[k] = struct{}{}
				out = append(out, k)
			}
		}
		if len(out) == len(keys) {
			return keys
		}
		return out
	}
	for i := 1; i < len(keys); i++ {
		if slices.Contains(keys[:i], keys[i]) {
			out := slices.Clone(keys[:i])
			for _, k := range keys[i+1:] {
				if !slices.Contains(out, k) {
					out = append(out, k)
				}
			}
			return out
		}
	}
	return keys
}

// Wait blocks until one request may happen for every key, spending one
// token of each, or until ctx ends. It returns nil when the tokens are
// spent, or an error and spends nothing (but a shaping rule's slots, see
// WaitN):
//   - ctx's error itself when ctx ends first (while Wait waits, or before
//     a server decided);
//   - a *RateLimitedError, matching ErrRateLimited, when ctx's deadline
//     would pass before the wait the denial names is over: at once, as
//     golang.org/x/time/rate's Wait does, without waiting for it;
//   - ErrClosed once the client is closed (or while it closes);
//   - at once, since waiting would not fix it, an error wrapping
//     Decision.Err: the *RefusedError of a server that refused the client
//     or a key (matching ErrServerRefused, and ErrUnauthorized or
//     ErrForbidden), or one matching ErrCostExceedsBurst (more tokens
//     than the key's rule can ever hold) or ErrInvalidRequest (an invalid
//     key, no key or more than protocol.MaxEntries, n out of range).
//
// It never returns an error matching ErrRateLimited for any of the latter.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	return c.WaitN(ctx, 1, keys...)
}

// WaitN is Wait for n tokens of each key, under ctx's priority class as
// AllowN decides it (see WithPriority).
//
// A key whose rule shapes (leaky_bucket) is served in slots, one every
// period/limit: a Wait for such a key alone takes the next free slots of
// its lease and sleeps until the first of them, so that waiters go ahead
// in the order they called, spaced by the rule's interval. The slots are
// taken when the sleep begins: if ctx ends during it, Wait returns ctx's
// error and the slots stay spent (the waiters behind hold the later
// slots already, so they are not handed back). A Wait whose
// slot starts beyond Config.MaxWait, or after ctx's deadline, fails at once
// with an error matching ErrRateLimited and takes nothing. Decided by a
// direct take, such a key may be given a slot later than now: WaitN sleeps
// until it when it starts within the same bounds, and otherwise fails (the
// slot is then lost: a direct take's slot cannot be given back). With
// several keys, shaped ones are retried until their slots come.
//
// Wait callers of a key are served first come, first served: they queue
// (on the first key, when there are several), and only the first decides;
// it retries when the key's state changes (its lease arrives, a server is
// back) or when the time its denial named has passed, not at every tick.
// Allow callers do not queue: under saturation they may take tokens before
// the first waiter.
func (c *Client) WaitN(ctx context.Context, n int64, keys ...string) (err error) {
	// A Wait counts once in Stats.Denied, when it fails after a denial or
	// on its arguments, whatever its tries: it counted each of them, and a
	// Wait that waited and went ahead counted its denials (found by the
	// API review). A closed client's failure counts none, as its denials.
	denied := false
	defer func() {
		if denied && err != nil && !errors.Is(err, ErrClosed) {
			c.denied.Add(1)
		}
	}()
	if err := checkCount(n, len(keys)); err != nil {
		denied = true
		return err
	}
	keys = distinctKeys(keys)
	states := make([]*keyState, len(keys))
	for i, k := range keys {
		if err := protocol.ValidateKey(k); err != nil {
			denied = true
			return invalidKey(k, err)
		}
		states[i] = c.state(k)
	}
	// Wait callers of a key go in turn, first come first served: only the
	// first of the queue (of the first key, for several) decides; the
	// others wait for it to be done, without a call or a timer of their
	// own.
	q := states[0]
	turn := q.enqueue()
	defer q.dequeue(turn)
	select {
	case <-turn:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stopped:
		return ErrClosed
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Taken before deciding, so that a change during the decision
		// (a lease arriving) is not missed.
		changed := q.waitCh()
		if _, foreign := c.callPriority(ctx); len(states) == 1 && !foreign {
			if done, err := c.waitShaped(ctx, n, states[0], func() { q.dequeue(turn) }); done {
				denied = errors.Is(err, ErrRateLimited)
				return err
			}
		}
		maxWait := c.maxWait(ctx)
		d := c.decide(ctx, n, states, time.Duration(maxWait))
		if d.Allowed {
			q.dequeue(turn) // the tokens are taken: the next waiter's turn
			denied = false  // it went ahead: sleeping for its slot is no denial
			return c.sleep(ctx, int64(d.delay))
		}
		if d.Source != SourceClosed {
			denied = true
			c.waitDenials.Add(1)
		}
		// Each error holds its own copy of keys, as the Transport's does:
		// it held the caller's slice (found by the API review).
		if d.delay > 0 {
			return &RateLimitedError{Keys: slices.Clone(keys), RetryAfter: d.delay, Source: d.Source}
		}
		if len(states) == 1 && states[0].shaped.Load() && d.RetryAfter > time.Duration(maxWait) {
			// A shaped key's next slot is further away than the caller
			// waits: fail at once, without taking it (the server took
			// none further than max_delay_ms).
			return &RateLimitedError{Keys: slices.Clone(keys), RetryAfter: d.RetryAfter, Source: d.Source}
		}
		if d.Source == SourceClosed {
			return ErrClosed
		}
		if d.Err != nil {
			if err := ctx.Err(); err != nil && errors.Is(d.Err, err) {
				return err // ended before a server decided
			}
			return fmt.Errorf("client: %v: %w", keys, d.Err)
		}
		switch d.Source {
		case SourceDenied:
			return &RateLimitedError{Keys: slices.Clone(keys), Source: d.Source, RetryAfter: d.RetryAfter}
		}
		wait := d.RetryAfter
		if wait <= 0 {
			wait = c.cfg.SettleInterval
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return &RateLimitedError{Keys: slices.Clone(keys), RetryAfter: wait, Source: d.Source}
		}
		// Event-driven: the key's next change (its lease arriving, a
		// server back) or the time the denial named, whichever is first.
		tc, stop := c.after(wait)
		select {
		case <-ctx.Done():
			stop()
			return ctx.Err()
		case <-c.stopped:
			stop()
			return ErrClosed
		case <-changed:
		case <-tc:
		}
		stop()
	}
}

// checkCount returns an error matching ErrInvalidRequest unless a
// decision for n tokens of each of keys keys can be made: n from 1 to
// protocol.MaxCount, 1 to protocol.MaxEntries keys.
func checkCount(n int64, keys int) error {
	if n < 1 || n > protocol.MaxCount || keys == 0 || keys > protocol.MaxEntries {
		return fmt.Errorf("%w: %d tokens of %d keys: n must be 1 to %d and keys 1 to %d", ErrInvalidRequest, n, keys, protocol.MaxCount, protocol.MaxEntries)
	}
	return nil
}

// invalidKey is the error of a decision on the invalid key k.
func invalidKey(k string, err error) error {
	return fmt.Errorf("%w: key %q: %w", ErrInvalidRequest, k, err)
}

// spent records one key's share of a decision, to undo it.
type spent struct {
	l  *lease
	r  *rate.Reservation
	ks *keyState
}

// decide spends n tokens from each key, all or nothing: from live leases
// first, then by one direct take for the keys no lease could serve. A
// direct take of a shaping rule whose slot starts more than maxDelay from
// now is a denial (its slot is lost); within maxDelay the decision is
// allowed and carries the delay the caller must wait.
func (c *Client) decide(ctx context.Context, n int64, states []*keyState, maxDelay time.Duration) Decision {
	var buf [4]spent
	done := buf[:0]
	// direct collects the keys a server must decide. It escapes to the
	// direct call, so it is allocated only when a key needs one: a decision
	// served by leases allocates nothing.
	var direct []*keyState
	d := Decision{Allowed: true, Source: SourceLease, Remaining: -1}
	prio, foreign := c.callPriority(ctx)
	var now int64
	// A decision waits at most once for a young key's answer in flight,
	// and once for a promoted key's first lease (or a roomy key's late
	// renewal), Config.RequestTimeout at most in all: waitEnd, on the
	// client's clock, is set by the first wait.
	waitedAnswer, waitedLease := false, false
	var waitEnd int64
	budget := func() time.Duration {
		if waitEnd == 0 {
			waitEnd = c.nanos() + int64(c.cfg.RequestTimeout)
		}
		return time.Duration(waitEnd - c.nanos())
	}
	// A decision holds no token while it waits: before a wait, letGo
	// gives back what the keys before this one took (and takes their
	// demand back), and reports whether it did; the decision then starts
	// again from its first key after the wait, bounded all the same, as
	// each kind of wait is made once. A shaping rule's slot cannot be given
	// back (see lease.giveBack): a decision that took one holds it, as
	// before.
	letGo := func() bool {
		if len(done) == 0 && len(direct) == 0 {
			return false
		}
		for _, sp := range done {
			if sp.l != nil && sp.l.shape != nil {
				return false
			}
		}
		c.undo(n, done)
		for _, ks := range direct {
			ks.unserved.Add(-n)
		}
		done, direct = done[:0], direct[:0]
		d = Decision{Allowed: true, Source: SourceLease, Remaining: -1}
		return true
	}
	var i int // the key being decided
	// leaseWaited ends a wait for a lease of ks, which served it l (nil:
	// none did), again telling whether letGo let the keys before it go.
	// It reports whether the decision goes on: with l, or from its first
	// key again (i = -1) when letGo did, l's token given back (or the
	// demand ks counted taken back: it will count again). Were l of a
	// shaping rule, its slot would be lost: the waits that let go are not
	// made on a shaped key's lease. Otherwise, without l, ks is decided
	// as if no lease had been waited for.
	leaseWaited := func(ks *keyState, l *lease, again bool) bool {
		now = 0 // read again after a wait
		switch {
		case again && l != nil:
			l.giveBack(n)
		case again:
			ks.unserved.Add(-n)
		case l != nil:
			done = append(done, spent{l: l, ks: ks})
			d.leased(l, ks)
			return true
		default:
			return false
		}
		i = -1
		return true
	}
	for i = 0; i < len(states); i++ {
		ks := states[i]
		if ks.dead.Load() {
			ks = c.state(ks.key)
			states[i] = ks
		}
		if ks.unlimited.Load() && c.unlimitedLive(ks) && !c.deniedFor(ks) {
			if d.Source == SourceLease && d.Remaining < 0 {
				d.Source = SourceUnlimited
			}
			done = append(done, spent{ks: ks})
			continue
		}
		if foreign {
			// A class other than the default: decided directly, never
			// from the lease nor denied by another class's denial (see
			// WithPriority); a refusal holds for every class.
			if now == 0 {
				now = c.nanos()
			}
			if c.closing.Load() {
				c.undo(n, done)
				return closedDecision
			}
			if err := c.refused(now); err != nil {
				c.undo(n, done)
				return Decision{Source: SourceRefused, Err: err, RetryAfter: time.Duration(c.refusedUntil.Load() - now)}
			}
			if ks.refused.Load() && ks.denyUntil.Load() > now {
				c.undo(n, done)
				d := Decision{Source: SourceDenied, RetryAfter: time.Duration(ks.denyUntil.Load() - now)}
				if e := ks.refusal.Load(); e != nil {
					d.Err = e
				}
				return d
			}
			if u := ks.denyForUntil.Load(); u > now {
				// DenyFor (an upstream said no) holds for every class.
				c.undo(n, done)
				return Decision{Source: SourceRetryAfter, RetryAfter: time.Duration(u - now)}
			}
			direct = append(direct, ks)
			continue
		}
		tried := ks.active.Load()
		var l *lease
		if tried != nil {
			if tried.spend(n, c) {
				l = tried
			} else {
				l, tried = ks.spendAgain(tried, n, c)
			}
		}
		if l != nil {
			done = append(done, spent{l: l, ks: ks})
			d.leased(l, ks)
			continue
		}
		// No live lease can serve this key.
		if now == 0 {
			now = c.nanos()
		}
		ks.unserved.Add(n)
		if c.closing.Load() {
			c.undo(n, done)
			return closedDecision
		}
		if err := c.refused(now); err != nil {
			c.undo(n, done)
			return Decision{Source: SourceRefused, Err: err, RetryAfter: time.Duration(c.refusedUntil.Load() - now)}
		}
		du := ks.denyUntil.Load()
		// A shaped key's denial says when its next slot is now; a caller
		// that waits at least that long asks for the slot.
		if du > now && !(ks.shaped.Load() && ks.denyForUntil.Load() <= now && !ks.refused.Load() && du-now <= int64(maxDelay)) {
			c.undo(n, done)
			if ks.refused.Load() {
				d := Decision{Source: SourceDenied, RetryAfter: time.Duration(du - now)}
				if e := ks.refusal.Load(); e != nil {
					d.Err = e
				}
				return d
			}
			if c.admitted(ks, n, now) {
				// A denial counts as demand (see applyDirect): at a
				// saturated key, or a shaped one, a lease of its own is
				// this process's share.
				c.promote(ks)
			}
			return Decision{Source: SourceRetryAfter, RetryAfter: time.Duration(du - now), Limits: ks.limitsView()}
		}
		if ks.leasing.Load() && beyondLeases(ks, n) {
			// More tokens than the key's batches hold (at most a quarter
			// of the bucket, see batchOf): no lease of it can serve the
			// decision, which is taken directly. Denied locally, as one
			// a lease ran short for, it was denied for as long as the key
			// stayed leased, while the bucket held the tokens (found by
			// review). Not the key's lease demand either.
			ks.unserved.Add(-n)
			if u := ks.beyondUntil.Load(); u > now && n >= ks.beyondCost.Load() {
				// A take of as many was denied until then: without a
				// call (each change of the key, every renewal, woke a
				// WaitN that sent it again: 51 takes in 1 s of a
				// RetryAfter of 1.5 s; found by review).
				c.undo(n, done)
				return Decision{Source: SourceRetryAfter, RetryAfter: time.Duration(u - now), Limits: ks.limitsView()}
			}
			direct = append(direct, ks)
			continue
		}
		if l := ks.active.Load(); l != nil && l.shape != nil && now < l.deadline && !l.shape.exhausted(now) {
			// A schedule of slots whose next slot is not yet due: denied
			// until it is, without waking the loop. When it is due and
			// the decision's slots do not fit what is left of the
			// schedule, the lease has run out for it: see below (denied
			// with a RetryAfter of 1 ns, Wait asked again at once, a
			// busy loop; found by review).
			if due := l.shape.due(now); due > 0 {
				c.undo(n, done)
				return Decision{Source: SourceLease, RetryAfter: time.Duration(due)}
			}
		}
		if ks.leasing.Load() && !ks.leaving.Load() && ks.deadline.Load() != 0 && c.leasesOnline.Load() && !storeDown(ks, now) {
			// Its lease ran out: the loop fetches the next batch, and the
			// request is denied until it comes (it counts as demand for
			// the batch). Deciding it directly instead would cost a call
			// per request on exactly the keys whose demand exceeds their
			// share, and would take tokens outside the fair share that
			// leases keep.
			l := ks.active.Load()
			if l != tried {
				// The loop installed a lease since this decision's spend
				// failed (the renewal of a spent-out lease, or a first
				// lease): it serves. Judged "not run out" instead, the
				// decision was denied with the renewal full (found by
				// review).
				if sl, _ := ks.spendAgain(tried, n, c); sl != nil {
					ks.unserved.Add(-n) // served after all
					done = append(done, spent{l: sl, ks: ks})
					d.leased(sl, ks)
					continue
				}
				l = ks.active.Load()
			}
			// Only a lease that ran out (or is closed) has a renewal
			// coming for it: a live one with fewer tokens left than
			// this decision wants is renewed at its usual point, and a
			// decision waiting for that waited the whole RequestTimeout
			// to be denied (found by review).
			ranOut := l == nil || l.left() == 0 || now >= l.deadline
			roomy := !waitedLease && ranOut && c.ranOutRoomy(ks, l, now)
			var changed <-chan struct{}
			answers := ks.answers.Load()
			if roomy {
				changed = ks.waitCh() // before the loop is woken: see awaitChange
			}
			ks.need.Store(true)
			c.wake()
			if roomy {
				// But a roomy key (the bucket held at least twice its
				// lease at its latest answer) ran out only because its
				// renewal came late (a paused process, a starved CPU; a
				// roomy key renews with a sixteenth of its batch left,
				// see lateOffset): its tokens are there, so the decision
				// waits for the renewal, as for a first lease, rather
				// than be denied. So it does when the loop has closed the
				// spent-out lease to ask for the next (l nil, or nil by
				// the time it waits), or past its deadline (the loop's
				// closing of it is no answer: see awaitLease). It waits
				// for the loop's answer, unless the answer came already
				// (a lease neither l nor nil, or need cleared: a
				// refusal), or the key is no longer leased or forgotten.
				// Served by no lease, the decision is made again (no
				// second wait): denied for as long as the server said if
				// it refused the renewal, directly if the key went back
				// to direct decisions meanwhile (a key the loop was
				// demoting has no lease either), else denied as below.
				waitedLease = true
				again := letGo()
				nl := c.awaitLease(ctx, ks, n, budget(), changed, answers, func() bool {
					a := ks.active.Load()
					return (a == l || a == nil) && ks.need.Load() && ks.leasing.Load() && !ks.leaving.Load() && !ks.dead.Load()
				})
				if !leaseWaited(ks, nl, again) {
					ks.unserved.Add(-n) // counted again
					i--
				}
				continue
			}
			c.undo(n, done)
			return Decision{Source: SourceLease, RetryAfter: c.cfg.SettleInterval, Limits: ks.limitsView()}
		}
		if !waitedAnswer && ks.probing.Load() && c.online.Load() && c.young(ks) {
			// A young key (see young) with a take in flight: wait for its
			// answer rather than send a take of its own. The answer
			// teaches the key its rule, and the decisions waiting for it
			// count as demand (see admitted): a key that just became hot
			// is promoted at its first answers, and they are then served
			// from its first lease instead of each costing a take. A key
			// that stays direct costs them a round trip more, during its
			// first few answers only. Then the key is decided again.
			waitedAnswer = true
			ks.unserved.Add(-n)
			again := letGo()
			c.awaitChange(ctx, ks, budget(), nil, func() bool { return ks.probing.Load() && c.young(ks) }, n)
			now = 0 // read again after a wait
			i--
			if again {
				i = -1
			}
			continue
		}
		if ks.leasing.Load() && !ks.leaving.Load() {
			// Promoted, its first lease not in yet: the loop asks for it
			// at once, and the decision waits for it rather than take
			// directly, which would cost a call and Redis work per
			// decision for the round trip the lease takes, on the keys
			// hot enough to be leased. If no lease comes (refused, none
			// granted, the call failed or is slower than
			// RequestTimeout), the decision goes on as it would have:
			// directly, or by the fallback when no server answers. A key
			// held store-down is not asked for (see storeDownHold): its
			// decisions do not wake the loop.
			held := storeDown(ks, now)
			wait := !waitedLease && ks.deadline.Load() == 0 && c.leasesOnline.Load() && !held
			var changed <-chan struct{}
			answers := ks.answers.Load()
			if wait {
				changed = ks.waitCh() // before the loop is woken: see awaitChange
			}
			if !held {
				ks.need.Store(true)
				c.wake()
			}
			if wait {
				waitedLease = true
				again := !ks.shaped.Load() && letGo()
				l := c.awaitLease(ctx, ks, n, budget(), changed, answers, func() bool {
					return ks.active.Load() == nil && ks.deadline.Load() == 0 && ks.leasing.Load() && !ks.leaving.Load() && !ks.dead.Load()
				})
				if leaseWaited(ks, l, again) {
					continue
				}
			}
		}
		direct = append(direct, ks)
	}
	if len(direct) > 0 {
		if now == 0 {
			now = c.nanos()
		}
		var dd Decision
		c.checkDetached(now)
		switch {
		case anyStoreDown(direct, now):
			// A server said lately that its store fails for this key
			// alone (see storeDownHold): decided as offline decides,
			// without a call that would fail again.
			dd = c.offline(n, direct, now)
		case !foreign && !c.leasesOnline.Load() && c.leaseHeld(direct, now):
			// Lease calls fail, and a key's spent-out lease is still ours:
			// denied until its deadline, as offline decides, without a
			// take (a take of another class than the lease's, which the
			// lease does not serve, is made). The take would fail too where the key's own store
			// does (one Redis Cluster shard down: its lease calls fail),
			// and that failure would send every other key to the
			// fallback while the servers answer their takes
			// (TestLeasedKeyStoreDownKeepsOthersTaken).
			dd = c.offline(n, direct, now)
		case ctx.Err() != nil:
			// Ended before a call was made: no take (see takeDirect), no
			// probe of the servers spent, nothing counted as sent.
			dd = c.ended(ctx)
		case c.online.Load() || c.probe(now):
			c.directs.Add(1)
			probes := c.claimProbes(direct, foreign)
			dd = c.takeDirect(ctx, n, direct, maxDelay, prio, foreign)
			c.releaseProbes(direct, probes)
		default:
			dd = c.offline(n, direct, now)
		}
		if !dd.Allowed {
			c.undo(n, done)
			return dd
		}
		if dd.delay > maxDelay {
			// The server gave a slot later than the caller waits (it
			// takes none further than max_delay_ms, so this is only the
			// millisecond rounding of the delay): the request does not go
			// ahead, and the slot is lost.
			c.undo(n, done)
			return Decision{Source: SourceDirect, RetryAfter: dd.delay, delay: dd.delay}
		}
		d.delay = dd.delay
		if d.Source != SourceUnlimited || dd.Source != SourceDirect || d.Remaining >= 0 {
			d.Source = dd.Source
		}
		if dd.Source == SourceDirect && (d.Remaining < 0 || dd.Remaining < d.Remaining) {
			d.Remaining = dd.Remaining
			d.Limits = dd.Limits
		}
	}
	for _, s := range done {
		if s.l == nil && s.r == nil && s.ks.unlimited.Load() {
			s.ks.unlimitedOK.Add(n)
		}
	}
	if d.Remaining < 0 {
		d.Remaining = 0
	}
	return d
}

// leased records in d that lease l of key ks served its share: d's
// Remaining is the least left over the keys, with that key's limits.
func (d *Decision) leased(l *lease, ks *keyState) {
	d.Source = SourceLease
	if r := l.left(); d.Remaining < 0 || r < d.Remaining {
		d.Remaining = r
		d.Limits = ks.limitsView()
	}
}

// beyondLeases reports whether a decision for n tokens of leased key ks
// wants more than its latest batch held: no lease of the key serves it.
func beyondLeases(ks *keyState, n int64) bool {
	g := ks.lastGrant.Load()
	return g > 0 && n > g
}

// ranOutRoomy reports whether a decision on leased key ks at now, which
// no lease could serve, waits for the key's next lease rather than be
// denied: l, the active lease, ran out, it is not a schedule of slots, and
// the bucket held at least twice the latest lease's grant at its latest
// answer. l is nil when the loop closed the spent-out lease, or the expired
// one, to ask for the next; or when it returns the key's leases (a server
// refused it more, see directUntil, or its demand fell), which no wait
// can serve.
func (c *Client) ranOutRoomy(ks *keyState, l *lease, now int64) bool {
	if l == nil {
		return !ks.shaped.Load() && now >= ks.directUntil.Load() && ks.room() >= 2*ks.lastGrant.Load()
	}
	return l.shape == nil && ks.room() >= 2*l.granted
}

// awaitChange waits until the state of ks changes (see keyState.notify),
// for at most limit on the client's clock (what is left of the deciding
// decision's Config.RequestTimeout), or until ctx ends or the client
// closes; not at all when waiting no longer holds once the key's change
// channel is taken (a change just before is seen so), or limit is not
// positive. changed is that channel, taken by the caller before it woke
// the loop for the change it waits for, or nil (taken here): taken after
// the wake, a loop that answered first (a refusal, which leaves waiting
// true) closed the channel before, and the decision waited for the whole
// limit — on a clock a test drives, for ever (found by make test under
// load: TestRefusedLeaseCallReportedAsRateLimit hung for 20 minutes).
// The decisions that wait for a key's change are waiting tokens of the
// key's demand meanwhile (keyState.waiting, see admitted).
func (c *Client) awaitChange(ctx context.Context, ks *keyState, limit time.Duration, changed <-chan struct{}, waiting func() bool, tokens int64) {
	if limit <= 0 {
		return
	}
	if changed == nil {
		changed = ks.waitCh()
	}
	if !waiting() {
		return
	}
	if tokens > 0 {
		ks.waiting.Add(tokens)
		defer ks.waiting.Add(-tokens)
	}
	timeout, stop := c.after(limit)
	defer stop()
	select {
	case <-changed:
	case <-timeout:
	case <-ctx.Done():
	case <-c.stopped:
	}
}

// young reports whether a key decided directly may still be promoted by
// its first few admissions (see admitted), so that its decisions wait for
// a take of it in flight: no answer has taught it its rule yet, or, on a
// bucket big enough to lease (at least four times
// Config.LeaseMinTokens), fewer than half of Config.LeaseMinTokens were
// admitted, the first less than a quarter of a lease TTL ago (later, half
// of them cannot show twice the threshold's pace).
func (c *Client) young(ks *keyState) bool {
	if ks.leasing.Load() {
		return false
	}
	ttl := ks.leaseTTL.Load()
	if ttl == 0 {
		return true
	}
	now := c.nanos()
	if !c.leasable(ks, now) {
		return false
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.mu.admitted < (c.cfg.LeaseMinTokens+1)/2 && (ks.mu.admitted == 0 || now-ks.mu.since < ttl/4)
}

// awaitLease waits for a lease of ks while waiting holds (see
// awaitChange), then spends n tokens from the key's active lease: it
// returns that lease, or nil when none could serve. answers is
// ks.answers as the caller read it before it woke the loop: a change that
// is no answer of the loop's (a lease closed at its deadline, which the
// loop then asks to replace) does not end the wait while waiting holds
// and limit lasts (found by review: a roomy key's decision whose
// spent-out lease expired before the loop's tick woke at the closing and
// was denied, its renewal granted a moment later).
func (c *Client) awaitLease(ctx context.Context, ks *keyState, n int64, limit time.Duration, changed <-chan struct{}, answers int64, waiting func() bool) *lease {
	end := c.nanos() + int64(limit)
	for {
		c.awaitChange(ctx, ks, time.Duration(end-c.nanos()), changed, waiting, 0)
		l := ks.active.Load()
		if l != nil && !l.spend(n, c) {
			l, _ = ks.spendAgain(l, n, c)
		}
		if l != nil {
			ks.unserved.Add(-n) // served after all
			return l
		}
		select {
		case <-c.stopped:
			return nil
		default:
		}
		if ks.answers.Load() != answers || ctx.Err() != nil || c.nanos() >= end || !waiting() {
			return nil
		}
		changed = nil // taken again, after the change that woke it
	}
}

// claimProbes marks the young keys of a direct take (see young) that no
// take is in flight for, so that their other decisions wait for its
// answer (see decide), and returns them as a bit set over states (the
// first 64; a take of another priority class claims none).
func (c *Client) claimProbes(states []*keyState, foreign bool) uint64 {
	var probes uint64
	if foreign {
		return 0
	}
	for i, ks := range states[:min(len(states), 64)] {
		if c.young(ks) && ks.probing.CompareAndSwap(false, true) {
			probes |= 1 << i
		}
	}
	return probes
}

// releaseProbes ends the takes claimed by claimProbes, their answers
// applied: the decisions waiting for them are woken.
func (c *Client) releaseProbes(states []*keyState, probes uint64) {
	for i := 0; probes != 0; i, probes = i+1, probes>>1 {
		if probes&1 != 0 {
			states[i].probing.Store(false)
			states[i].notify()
		}
	}
}

// probe reports whether this decision, made while no server answers, may
// try the servers: one decision per backoff period does, and waits for the
// answer; the others are decided offline meanwhile.
func (c *Client) probe(now int64) bool {
	at := c.directRetryAt.Load()
	return now >= at && c.directRetryAt.CompareAndSwap(at, now+max(int64(c.cfg.SettleInterval), c.directBackoff.Load()))
}

// leaseHeld reports whether a key of states holds a lease that is still
// ours at now (see offline).
func (c *Client) leaseHeld(states []*keyState, now int64) bool {
	for _, ks := range states {
		if now < ks.deadline.Load() {
			return true
		}
	}
	return false
}

// storeDownHold is how long a key whose store a server said failed for it
// alone (store_unavailable for its entry or take, while the call was
// answered: a Redis Cluster node down) is decided as offline decides,
// without a call; then the next decision, or the loop, asks again.
const storeDownHold = time.Second

// storeDown reports whether ks is held store-down at now (see
// storeDownHold).
func storeDown(ks *keyState, now int64) bool {
	u := ks.storeDown.Load()
	return u != 0 && now < u
}

// anyStoreDown reports whether any of states is held store-down at now.
func anyStoreDown(states []*keyState, now int64) bool {
	for _, ks := range states {
		if storeDown(ks, now) {
			return true
		}
	}
	return false
}

// noteStoreDown holds keys store-down from now (see storeDownHold) after a
// server answered that its store failed for them alone (p), and logs it at
// most once per hold, client-wide: a Redis Cluster node down fails a share
// of every key.
func (c *Client) noteStoreDown(keys []*keyState, p *protocol.Problem, now int64) {
	for _, ks := range keys {
		ks.storeDown.Store(now + int64(storeDownHold))
	}
	if last := c.storeDownLogged.Load(); (last == 0 || now-last >= int64(storeDownHold)) && c.storeDownLogged.CompareAndSwap(last, now) {
		c.cfg.Logger.Warn("ratelease: a lease server's store failed for some keys (a Redis Cluster node down?); they are decided as when no server answers, and asked again after a hold, the others as usual",
			"keys", keysOf(keys), "hold", storeDownHold, "detail", p.Detail)
	}
}

// offline decides keys while no server answers: a key whose spent-out
// lease is still ours until its deadline is denied until then (the fallback
// never adds to a lease's tokens), the others by Config.Fallback.
func (c *Client) offline(n int64, states []*keyState, now int64) Decision {
	for _, ks := range states {
		if dl := ks.deadline.Load(); now < dl {
			return Decision{Source: SourceLease, RetryAfter: time.Duration(dl - now)}
		}
	}
	return c.fallbackAll(n, states)
}

// deniedFor reports whether a DenyFor denies ks now. It reads the clock
// only for a key DenyFor was ever called on.
func (c *Client) deniedFor(ks *keyState) bool {
	u := ks.denyForUntil.Load()
	return u != 0 && c.nanos() < u
}

// unlimitedLive reports whether an unlimited key may still be allowed
// without asking: a key learned unlimited by a direct take is asked again
// once its expiry passes (the rules may have changed).
func (c *Client) unlimitedLive(ks *keyState) bool {
	exp := ks.unlimitedExp.Load()
	return exp == 0 || c.nanos() < exp
}

func (c *Client) undo(n int64, done []spent) {
	for _, s := range done {
		switch {
		case s.l != nil:
			s.l.giveBack(n)
		case s.r != nil:
			s.r.Cancel()
			s.ks.fallbackOK.Add(-n)
		}
	}
}

// fallback decides one key by Config.Fallback.
func (c *Client) fallback(n int64, ks *keyState) (Decision, spent) {
	switch c.cfg.Fallback {
	case FallbackOpen:
		ks.fallbackOK.Add(n)
		return Decision{Allowed: true, Source: SourceFallback}, spent{ks: ks}
	case FallbackClosed:
		return Decision{Source: SourceFallback, RetryAfter: c.cfg.SettleInterval}, spent{}
	}
	ks.mu.Lock()
	lim := ks.mu.fallback
	sr := ks.getSafeRate()
	if sr <= 0 {
		sr = c.cfg.DefaultSafeRate
	}
	if lim == nil || lim.Limit() != rate.Limit(sr) {
		// Burst: a tenth of a second's worth, at least one request.
		burst := max(1, int(sr/10))
		lim = rate.NewLimiter(rate.Limit(sr), burst)
		ks.mu.fallback = lim
	}
	ks.mu.Unlock()
	if sr <= 0 {
		return Decision{Source: SourceFallback, RetryAfter: c.cfg.SettleInterval}, spent{}
	}
	r := lim.ReserveN(time.Now(), int(min(n, 1<<30)))
	if !r.OK() {
		return Decision{Source: SourceFallback}, spent{}
	}
	if delay := r.Delay(); delay > 0 {
		r.Cancel()
		return Decision{Source: SourceFallback, RetryAfter: delay}, spent{}
	}
	ks.fallbackOK.Add(n)
	return Decision{Allowed: true, Source: SourceFallback}, spent{r: r, ks: ks}
}

// DenyFor denies keys locally for d, live leases included and for every
// priority class, without a network call: for example when an upstream
// answered 429 with a Retry-After. A d of zero or less does nothing. A later call extends the denial, never
// shortens it, nor does a server's answer. A key's lease that the denial
// outlasts (to within four settle intervals of its deadline) is returned
// at once, its unspent tokens to the bucket; a shorter denial pauses the
// lease, which serves again when the denial ends. No lease is asked for
// a key while it is denied. Invalid keys are skipped.
//
// The client keeps each denial's end, one small map entry per key, until
// it passes, apart from the key's other state (which idleness and
// Config.MaxKeys may forget): what DenyFor keeps is bounded by the
// distinct keys it is called with per unit of time times d, not by
// MaxKeys. The
// Transport bounds d by TransportOptions.MaxUpstreamRetryAfter.
func (c *Client) DenyFor(d time.Duration, keys ...string) {
	if d <= 0 {
		return
	}
	now := c.nanos()
	until := now + int64(min(d, time.Duration(math.MaxInt64-now))) // d near MaxInt64 wrapped to a past end
	for _, k := range keys {
		if protocol.ValidateKey(k) != nil {
			continue
		}
		for {
			v, loaded := c.denyFor.LoadOrStore(k, until)
			if !loaded || v.(int64) >= until || c.denyFor.CompareAndSwap(k, v, until) {
				break
			}
		}
		ks := c.state(k)
		// denyForUntil first: see setDenial. The loop pauses a lease it
		// installs meanwhile (see applyOne).
		extend(&ks.denyForUntil, until)
		ks.extendDenial(until)
		if l := ks.active.Load(); l != nil {
			extend(&l.pausedUntil, until)
			l.strict.Store(true)
		}
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := Stats{
		Denied:            c.denied.Load(),
		ServerCalls:       c.http.calls.Load(),
		ServerErrors:      c.http.failures.Load(),
		FallbackDecisions: c.fallbacks.Load(),
		Refusals:          c.refusals.Load(),
		DirectDecisions:   c.directs.Load(),
		Online:            c.online.Load() && c.leasesOnline.Load(),
		Allowed:           c.forgottenUse.Load() + c.directOK.Load(),
		KeysHeld:          int(c.activeKeys.Load()),
		MaxKeysHeld:       int(c.maxActive.Load()),
	}
	c.keys.Range(func(_, v any) bool {
		ks := v.(*keyState)
		s.Allowed += ks.usedTotal() + ks.unlimitedOK.Load() + ks.fallbackOK.Load()
		if l := ks.active.Load(); l != nil {
			s.TokensHeld += l.left()
		}
		return true
	})
	// The sum read above can fall below one read before: a token spent by
	// a decision that then gave it back (all or nothing over its keys), a
	// lease replaced or closed before its used count is kept, a key
	// forgotten while Range ran (its count moved to forgottenUse, read
	// before). A count that falls is a reset to Prometheus (found by the
	// API review): Allowed is the highest sum seen.
	for {
		seen := c.allowedSeen.Load()
		if s.Allowed <= seen {
			s.Allowed = seen
			break
		}
		if c.allowedSeen.CompareAndSwap(seen, s.Allowed) {
			break
		}
	}
	return s
}
