package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
)

// DefaultMaxUpstreamRetryAfter is the longest an upstream's Retry-After
// denies a request's keys locally when TransportOptions.MaxUpstreamRetryAfter
// is zero.
const DefaultMaxUpstreamRetryAfter = time.Minute

// TransportOptions configure Client.Transport and Client.RetryableClient.
// The zero value is the default: a request the budget denies fails at once
// without being sent, and an upstream 429 or 503 with Retry-After denies the
// request's keys locally until then, for at most
// DefaultMaxUpstreamRetryAfter.
type TransportOptions struct {
	// Wait makes RoundTrip wait for the budget, as Client.Wait does with
	// the request's context, instead of failing at once. The request is
	// then sent once every key allows it; it fails without being sent with
	// the context's error when the context ends first, with an error
	// matching ErrRateLimited when the context's deadline would pass
	// before the budget can allow it, or with ErrClosed.
	Wait bool

	// IgnoreUpstreamRetryAfter turns off the local denial that follows an
	// upstream's Retry-After. By default (false), a response with status
	// 429 Too Many Requests or 503 Service Unavailable and a Retry-After
	// header (delay-seconds or an HTTP date) denies the request's keys
	// locally with Client.DenyFor until the time it names, so that the
	// requests that follow fail (or, with Wait, wait) without reaching the
	// upstream. The response itself is returned unchanged either way.
	IgnoreUpstreamRetryAfter bool

	// MaxUpstreamRetryAfter caps the local denial an upstream's
	// Retry-After causes, so that a wrong or hostile header cannot stop
	// the keys for long. Zero or negative means
	// DefaultMaxUpstreamRetryAfter (one minute).
	MaxUpstreamRetryAfter time.Duration

	// OnDenied, when set, is called for every request the budget denies,
	// before RoundTrip returns err; the request was not sent. It may be
	// called concurrently and must not modify req or err.
	OnDenied func(req *http.Request, err *RateLimitedError)

	// OnUpstreamRetryAfter, when set, is called after an upstream response
	// made the transport deny the request's keys locally, with that
	// response and the length of the denial (after MaxUpstreamRetryAfter).
	// It may be called concurrently and must neither read nor close
	// resp.Body: the caller of RoundTrip owns it.
	OnUpstreamRetryAfter func(resp *http.Response, d time.Duration)
}

// transport is the http.RoundTripper of Client.Transport.
type transport struct {
	c       *Client
	base    http.RoundTripper
	keys    func(*http.Request) []string
	opts    TransportOptions
	maxDeny time.Duration
}

// Transport returns an http.RoundTripper that spends from the budget of a
// request's keys before sending it through base.
//
// keys names the keys of each request (for example
// []string{"host:" + req.URL.Host}); a request is sent only when every key
// allows it (all or nothing, as Client.Allow). When keys is nil, or returns
// no key for a request, the request is sent without spending. base nil
// means http.DefaultTransport.
//
// When the budget denies a request, RoundTrip sends nothing, closes the
// request's body and returns a *RateLimitedError, which matches
// ErrRateLimited with errors.Is and carries the keys, the time until the
// budget may allow them (RetryAfter, 0 when unknown) and the Source of the
// decision; an http.Client returns it wrapped in a *url.Error. RoundTrip
// returns ErrClosed after Client.Close, the context's error when the
// request's context has ended before RoundTrip (spending nothing) or ends
// before the budget decided, an error that wraps the decision's Err
// (matching ErrServerRefused, and ErrUnauthorized or ErrForbidden) when a
// lease server refused the client or a key, and one matching
// ErrInvalidRequest, never ErrRateLimited, when keys returns an invalid key
// (see protocol.ValidateKey). A request whose keys hold no live lease waits for
// a direct take, about one round trip, as Client.Allow does.
//
// After a response, an upstream 429 or 503 with Retry-After denies the
// request's keys locally until then (see
// TransportOptions.IgnoreUpstreamRetryAfter). The request is never
// modified. Every request that reaches RoundTrip spends: an http.Client
// following redirects spends once per hop, and a retrying client once per
// attempt.
//
// opts holds at most one TransportOptions; when several are given, the last
// one applies. The returned RoundTripper is safe for concurrent use, and its
// CloseIdleConnections method closes base's idle connections when base has
// such a method, so http.Client.CloseIdleConnections reaches base.
func (c *Client) Transport(base http.RoundTripper, keys func(*http.Request) []string, opts ...TransportOptions) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &transport{c: c, base: base, keys: keys}
	if len(opts) > 0 {
		t.opts = opts[len(opts)-1]
	}
	t.maxDeny = t.opts.MaxUpstreamRetryAfter
	if t.maxDeny <= 0 {
		t.maxDeny = DefaultMaxUpstreamRetryAfter
	}
	return t
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var keys []string
	if t.keys != nil {
		keys = t.keys(req)
	}
	if len(keys) == 0 {
		return t.base.RoundTrip(req)
	}
	if err := t.spend(req, keys); err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // RoundTrip must close the body, even on errors
		}
		return nil, err
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil || t.opts.IgnoreUpstreamRetryAfter {
		return resp, err
	}
	if d, ok := upstreamRetryAfter(resp, time.Now()); ok && d > 0 {
		d = min(d, t.maxDeny)
		t.c.DenyFor(d, keys...)
		if t.opts.OnUpstreamRetryAfter != nil {
			t.opts.OnUpstreamRetryAfter(resp, d)
		}
	}
	return resp, nil
}

// spend takes one token of every key, or says why not. A request whose
// context has ended is not sent, and spends nothing: a leased key's spend
// does not read the context, and the token was spent for a request the
// base RoundTripper then refused at once (found by review).
func (t *transport) spend(req *http.Request, keys []string) error {
	if err := req.Context().Err(); err != nil {
		return err
	}
	var rl *RateLimitedError
	if t.opts.Wait {
		err := t.c.Wait(req.Context(), keys...)
		if err == nil || !errors.As(err, &rl) {
			return err
		}
	} else {
		d := t.c.Allow(req.Context(), keys...)
		if d.Allowed {
			return nil
		}
		if err := req.Context().Err(); err != nil {
			// The request was canceled (or timed out) while its first
			// lease was on the way: that, not the budget, stopped it.
			return err
		}
		if d.Source == SourceClosed {
			return ErrClosed
		}
		if d.Err != nil {
			// A misconfiguration, not the budget: never reported as a
			// rate limit.
			return fmt.Errorf("client: transport: %s %s: %w", req.Method, req.URL.Redacted(), d.Err)
		}
		rl = &RateLimitedError{Keys: slices.Clone(keys), RetryAfter: d.RetryAfter, Source: d.Source}
	}
	if t.opts.OnDenied != nil {
		t.opts.OnDenied(req, rl)
	}
	return rl
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, when it has such a method.
func (t *transport) CloseIdleConnections() {
	if ci, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// upstreamRetryAfter returns the Retry-After of a 429 or 503 response, and
// whether there was a valid one. A date in the past yields 0.
func upstreamRetryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
		return 0, false
	}
	return parseRetryAfter(resp.Header.Get("Retry-After"), now)
}

// parseRetryAfter parses a Retry-After value: delay-seconds (a
// non-negative integer) or an HTTP date (RFC 9110, section 10.2.3). A date
// in the past yields 0; a delay too large for a time.Duration yields the
// largest one.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		// Digits only: ParseUint reports a range error as soon as the
		// digits overflow, before it looks at what follows them, so
		// "99999999999999999999x" would otherwise be the longest wait.
		if strings.ContainsFunc(v, func(r rune) bool { return r < '0' || r > '9' }) {
			return 0, false
		}
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			var ne *strconv.NumError
			if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
				return math.MaxInt64, true
			}
			return 0, false
		}
		if s > uint64(math.MaxInt64/int64(time.Second)) {
			return math.MaxInt64, true
		}
		return time.Duration(s) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		// go-retryablehttp also takes RFC 1123 with any zone name.
		if at, err = time.Parse(time.RFC1123, v); err != nil {
			return 0, false
		}
	}
	return max(at.Sub(now), 0), true
}

// RetryAfterBackoff is a retryablehttp.Backoff that honours an upstream's
// Retry-After, capped at max: after a 429 or 503 response with a valid
// Retry-After header (delay-seconds or an HTTP date) it waits the time the
// header names (0 for a date in the past), but never longer than max.
// Otherwise it returns retryablehttp.DefaultBackoff(min, max, attempt, resp),
// an exponential backoff from min, also capped at max. A max of zero or less
// means no wait at all.
//
// Unlike retryablehttp.DefaultBackoff, which waits as long as Retry-After
// says, a hostile or mistaken header cannot stall a caller beyond max.
func RetryAfterBackoff(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
	if max <= 0 {
		return 0
	}
	if d, ok := upstreamRetryAfter(resp, time.Now()); ok {
		return capWait(d, max)
	}
	// Without resp: DefaultBackoff would parse Retry-After again, more
	// laxly ("+30", "-0"), and honour a header the transport refused
	// (found by review).
	return capWait(retryablehttp.DefaultBackoff(min, max, attempt, nil), max)
}

// RetryPolicy is a retryablehttp.CheckRetry for requests sent through
// Client.Transport: it stops, returning false and err, when err matches
// ErrRateLimited (the budget denied the attempt, which was not sent),
// ErrServerRefused (a lease server refused the client: a misconfiguration),
// ErrInvalidRequest or ErrCostExceedsBurst (a mistake no retry fixes: an
// invalid key, say) or ErrClosed, and otherwise decides as
// retryablehttp.DefaultRetryPolicy does:
// no retry once ctx has ended; a retry after connection errors, 429, and 5xx
// statuses other than 501.
//
// So a budget denial is never retried by go-retryablehttp: the caller gets
// the *RateLimitedError (wrapped) at once, and decides whether to wait its
// RetryAfter. With TransportOptions.Wait the attempt waits for the budget
// instead, within the request's context.
func RetryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if err != nil && (errors.Is(err, ErrRateLimited) || errors.Is(err, ErrClosed) || errors.Is(err, ErrServerRefused) ||
		errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrCostExceedsBurst)) {
		// Retried, an invalid key was sent RetryMax more times with
		// backoff, 15 s by default, before Do failed (found by review).
		return false, err
	}
	return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
}

// RetryableClient returns a go-retryablehttp client whose every attempt,
// retries included, spends from the budget of the request's keys: its
// HTTPClient sends through c.Transport with keys and opts (see Transport)
// over a pooled transport of its own (go-cleanhttp). Its Backoff is
// RetryAfterBackoff, which honours an upstream 429 or 503 Retry-After
// capped at RetryWaitMax; its CheckRetry is RetryPolicy, which stops at
// once when the budget denies an attempt; its Logger is nil. RetryWaitMin,
// RetryWaitMax and RetryMax are those of retryablehttp.NewClient (1s, 30s
// and 4 today); change them, or any field, before the first request.
//
// A budget denial is not retried: Do returns an error that wraps the
// *RateLimitedError, and sends nothing more. After an upstream 429 or 503
// whose Retry-After exceeds RetryWaitMax, the retry comes before the local
// denial (TransportOptions.IgnoreUpstreamRetryAfter) has ended, so it is
// denied by the budget and Do stops with that error rather than send a
// request the upstream said it would refuse; with TransportOptions.Wait,
// the attempt waits for the denial to end instead, within the request's
// context.
//
// Call rc.HTTPClient.CloseIdleConnections when done with the client to
// release its connections.
func (c *Client) RetryableClient(keys func(*http.Request) []string, opts ...TransportOptions) *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.HTTPClient = &http.Client{Transport: c.Transport(cleanhttp.DefaultPooledTransport(), keys, opts...)}
	rc.Backoff = RetryAfterBackoff
	rc.CheckRetry = RetryPolicy
	return rc
}
