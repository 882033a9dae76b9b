package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/ratelease/ratelease/protocol"
)

// maxResponseBytes bounds a lease server's answer.
const maxResponseBytes = 8 << 20

// Errors of calls to the lease servers.
var (
	// ErrServerResponse: a server answered something that is not a valid
	// answer to the request (garbage, wrong entries, impossible grants). The
	// client treats it like a server that did not answer.
	ErrServerResponse = errors.New("invalid response from lease server")
	// ErrServerRefused is matched by the error of a call a server refused
	// as a whole (401, 403, another 4xx without per-entry answers): a
	// configuration problem (token, key patterns, client ID) that retrying
	// will not fix. Use errors.As with *RefusedError for the status and the
	// server's explanation.
	ErrServerRefused = errors.New("lease server refused the call")
	// ErrUnauthorized is matched, besides ErrServerRefused, by the error of
	// a call a server answered 401: the client sent no bearer token, or one
	// the server does not know. Check Config.Token.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden is matched, besides ErrServerRefused, by the error of a
	// call a server answered 403, and by the error of a decision on a key
	// the client's token may not use: check the client's key patterns in
	// the server's rules.
	ErrForbidden = errors.New("forbidden")
)

// RefusedError is a refusal by a lease server: of a whole call (a 4xx
// status such as 401 or 403), or of one key (code forbidden). It is a
// misconfiguration, never a rate limit. It matches ErrServerRefused with
// errors.Is, and ErrUnauthorized or ErrForbidden as its status or code says.
type RefusedError struct {
	// Server is the host that refused.
	Server string
	// Status is the HTTP status of the refusal: 401, 403, another 4xx.
	Status int
	// Code is the problem code the server gave (protocol.CodeUnauthorized,
	// protocol.CodeForbidden, ...), empty when its answer carried none.
	Code protocol.Code
	// Detail is the server's explanation, when it gave one.
	Detail string
}

// Error describes the refusal and what to check.
func (e *RefusedError) Error() string {
	var hint string
	switch {
	case e.Code == protocol.CodeNoRule:
		hint = "no rule matches the key, and the servers' default is deny: add a rule for it, or check the key's spelling"
	case e.Status == http.StatusUnauthorized:
		hint = "unauthorized: check the client's token (Config.Token)"
	case e.Status == http.StatusForbidden:
		hint = "forbidden: check the client's key patterns in the server's rules"
	default:
		hint = "refused: check the client's configuration"
	}
	who := "a lease server"
	if e.Server != "" {
		who = "lease server " + e.Server
	}
	msg := fmt.Sprintf("%s refused (HTTP %d): %s", who, e.Status, hint)
	if e.Code != "" {
		msg += " (code " + string(e.Code) + ")"
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Is makes errors.Is match ErrServerRefused always, ErrUnauthorized for a
// 401 and ErrForbidden for a 403.
func (e *RefusedError) Is(target error) bool {
	switch target {
	case ErrServerRefused:
		return true
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrForbidden:
		return e.Status == http.StatusForbidden
	}
	return false
}

// caller makes the calls to the lease servers: one server at a time, moving
// to the next on failure, with go-retryablehttp's retries and a capped
// backoff (lease); or one attempt at a chosen server (leaseAt), for the
// direct takes the client routes by key (see pick).
type caller struct {
	cfg  *Config
	urls []*url.URL
	// rawURLs are urls as strings, for the requests of leaseAt.
	rawURLs []string
	rc      *retryablehttp.Client
	hc      *http.Client
	// once makes the single attempts of leaseAt: hc without its Timeout,
	// which net/http enforces with a timer and contexts of its own for
	// every request (some twenty allocations); the attempt's context
	// carries Config.RequestTimeout instead.
	once     *http.Client
	cur      atomic.Int64
	calls    atomic.Int64
	failures atomic.Int64
	// seeds are the servers' rendezvous seeds (hashes of their URLs, so
	// that clients listing them in another order route alike), health
	// their state for the routed takes; both indexed like urls.
	seeds  []uint64
	health []serverHealth
}

func newCaller(cfg *Config) *caller {
	h := &caller{cfg: cfg}
	for _, s := range cfg.Servers {
		u, _ := url.Parse(s + protocol.PathLeases) // validated by withDefaults
		h.urls = append(h.urls, u)
		h.rawURLs = append(h.rawURLs, u.String())
		h.seeds = append(h.seeds, mix64(hashString(s)))
	}
	h.health = make([]serverHealth, len(h.urls))
	if cfg.HTTPClient != nil {
		hc := *cfg.HTTPClient
		h.hc = &hc
	} else {
		h.hc = defaultHTTPClient()
	}
	h.hc.Timeout = cfg.RequestTimeout
	once := *h.hc
	once.Timeout = 0
	h.once = &once
	n := len(h.urls)
	h.rc = &retryablehttp.Client{
		HTTPClient:   h.hc,
		Logger:       nil,
		RetryWaitMin: 10 * time.Millisecond,
		RetryWaitMax: cfg.MaxRetryWait,
		// Every server once, then one more round after a backoff.
		RetryMax: 2*n - 1,
		RequestLogHook: func(retryablehttp.Logger, *http.Request, int) {
			h.calls.Add(1)
		},
		CheckRetry: checkRetry,
		Backoff: func(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
			// The next server is tried at once; a full round waits.
			if (attempt+1)%n != 0 {
				return 0
			}
			return capWait(retryablehttp.DefaultBackoff(min, max, (attempt+1)/n-1, resp), max)
		},
		PrepareRetry: func(req *http.Request) error {
			u := h.urls[int(h.cur.Add(1)%int64(n))]
			req.URL = u
			req.Host = u.Host
			return nil
		},
	}
	return h
}

// defaultHTTPClient is the client of the calls when Config.HTTPClient is
// nil: go-cleanhttp's pooled client, keeping enough idle connections per
// server for the direct calls a process may have in flight to one server
// (maxDirectCalls) beside a lease call, so that a burst of them does not
// close and dial connections again (its default keeps GOMAXPROCS+1).
func defaultHTTPClient() *http.Client {
	hc := cleanhttp.DefaultPooledClient()
	if tr, ok := hc.Transport.(*http.Transport); ok {
		tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, maxDirectCalls+2)
	}
	return hc
}

// capWait bounds a backoff by max, whatever Retry-After said.
func capWait(d, max time.Duration) time.Duration {
	if d > max || d < 0 {
		return max
	}
	return d
}

// permanent wraps errors that retrying will not fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		var p permanent
		if errors.As(err, &p) {
			return false, p.err
		}
		return true, nil
	}
	return failedStatus(resp), nil
}

// failedStatus reports whether resp's status says the server failed the
// call, which another server, or a later try, may not: a 5xx, or a 429
// that is not rateleased's own.
func failedStatus(resp *http.Response) bool {
	if resp.StatusCode == http.StatusTooManyRequests && isProblem(resp) {
		// rateleased's own 429s are answers, per entry (too_many_keys,
		// too_many_leases: every entry was refused by a cap), which a retry
		// would only repeat; a denial by a rule is a 200. A 429 without a
		// problem body comes from something in between: retried.
		return false
	}
	if resp.StatusCode == http.StatusServiceUnavailable && isProblem(resp) && keysStoreFailed(resp) {
		// Every entry's key failed in the server's store alone (a Redis
		// Cluster node down): an answer, per entry (see
		// decodeLeaseResponse), which another server would repeat.
		return false
	}
	return resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
}

// keysStoreFailed reports whether resp, a 503 problem, is store_unavailable
// with the result of each entry, each failed (see decodeLeaseResponse; a
// lying server's other 503s are retried at another server). It reads the
// body, at most maxResponseBytes, and puts it back for the decoder, with
// the verdict: go-retryablehttp asks again once the decoder has read it.
func keysStoreFailed(resp *http.Response) bool {
	if pb, ok := resp.Body.(*peekedBody); ok {
		return pb.keysFailed
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	_ = resp.Body.Close()
	pb := &peekedBody{Reader: bytes.NewReader(data)}
	resp.Body = pb
	var p protocol.Problem
	pb.keysFailed = err == nil && len(data) <= maxResponseBytes && json.Unmarshal(data, &p) == nil &&
		p.Code == protocol.CodeStoreUnavailable && len(p.Leases) > 0 &&
		!slices.ContainsFunc(p.Leases, func(r protocol.LeaseResult) bool { return r.Error == nil })
	return pb.keysFailed
}

// peekedBody is a response body keysStoreFailed read, with its verdict.
type peekedBody struct {
	*bytes.Reader
	keysFailed bool
}

func (*peekedBody) Close() error { return nil }

// isProblem reports whether resp carries an RFC 9457 problem body.
func isProblem(resp *http.Response) bool {
	mt, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(mt), protocol.ContentTypeProblem)
}

// lease sends one lease request and returns the validated response: one
// result per lease entry and one per take. It starts at the current server
// and moves to the next on failure, every server once, then every one again
// after a capped backoff. It fails with a *RefusedError, ErrServerResponse,
// a transport error or ctx's error; a failure is counted in failures.
func (h *caller) lease(ctx context.Context, req *protocol.LeaseRequest) (*protocol.LeaseResponse, error) {
	return h.post(ctx, int(h.cur.Load()%int64(len(h.urls))), req)
}

// leaseAt is lease with one attempt, at server i, and no failure counted:
// the caller moves on to another server, and counts a call that failed on
// every one. It is the call of the direct takes routed by key, so it goes
// straight to net/http: a go-retryablehttp client that makes no retry only
// cost allocations and CPU. It fails as lease does.
func (h *caller) leaseAt(ctx context.Context, i int, req *protocol.LeaseRequest) (*protocol.LeaseResponse, error) {
	h.calls.Add(1)
	host := h.urls[i].Host
	actx, cancel := context.WithTimeout(ctx, h.cfg.RequestTimeout)
	defer cancel()
	r, err := http.NewRequestWithContext(actx, http.MethodPost, h.rawURLs[i], bytes.NewReader(protocol.AppendLeaseRequest(make([]byte, 0, 256), req)))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	h.setHeaders(r.Header)
	resp, err := h.once.Do(r)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("client: lease server %s: %w", host, err)
	}
	defer resp.Body.Close()
	if failedStatus(resp) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // so that the connection serves again
		return nil, fmt.Errorf("client: lease server %s: %w: HTTP %d", host, ErrServerResponse, resp.StatusCode)
	}
	out, err := decodeLeaseResponse(resp, req)
	if err != nil {
		if p, ok := errors.AsType[permanent](err); ok {
			// A refusal, counted by the client, not a failure of the
			// server; a RefusedError names its server.
			return nil, fmt.Errorf("client: %w", p.err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("client: lease server %s: %w", host, err)
	}
	return out, nil
}

// setHeaders sets the headers of a lease call.
func (h *caller) setHeaders(hd http.Header) {
	hd.Set("Content-Type", "application/json")
	hd.Set("Accept", "application/json")
	if h.cfg.Token != "" {
		hd.Set("Authorization", "Bearer "+h.cfg.Token)
	}
}

// roundWait is how long lease waits once every server failed before trying
// them all again.
func (h *caller) roundWait() time.Duration {
	return h.rc.Backoff(h.rc.RetryWaitMin, h.rc.RetryWaitMax, len(h.urls)-1, nil)
}

// post sends req through rc, starting at server i.
func (h *caller) post(ctx context.Context, i int, req *protocol.LeaseRequest) (*protocol.LeaseResponse, error) {
	r, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, h.rawURLs[i], protocol.AppendLeaseRequest(make([]byte, 0, 256), req))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	h.setHeaders(r.Header)
	var results *protocol.LeaseResponse
	r.SetResponseHandler(func(resp *http.Response) error {
		res, err := decodeLeaseResponse(resp, req)
		if err != nil {
			if _, ok := errors.AsType[permanent](err); ok {
				return err // a RefusedError names its server
			}
			return fmt.Errorf("%s: %w", resp.Request.URL.Host, err)
		}
		results = res
		return nil
	})
	resp, err := h.rc.Do(r)
	if err != nil {
		if ctx.Err() != nil {
			if !errors.Is(context.Cause(ctx), errCallerGone) { // not a failure (see Client.callOwn)
				h.failures.Add(1)
			}
			return nil, ctx.Err()
		}
		if errors.Is(err, ErrServerRefused) {
			// A server answered: a refusal, counted by the client, not a
			// failure of every server.
			return nil, fmt.Errorf("client: %w", err)
		}
		h.failures.Add(1)
		return nil, fmt.Errorf("client: lease servers %v: %w", h.cfg.Servers, err)
	}
	resp.Body.Close()
	return results, nil
}

// hostOf returns the host resp came from, empty when unknown.
func hostOf(resp *http.Response) string {
	if resp.Request == nil || resp.Request.URL == nil {
		return ""
	}
	return resp.Request.URL.Host
}

// decodeLeaseResponse reads a lease server's answer. A 4xx problem that
// carries per-entry results (every entry failed) is an answer too, and so
// is a 503 store_unavailable that carries them: the server's store failed
// for each entry's key alone (a Redis Cluster node down, see
// storeDownHold), while a store down fails the call with no entry's
// result.
func decodeLeaseResponse(resp *http.Response, req *protocol.LeaseRequest) (*protocol.LeaseResponse, error) {
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if len(data) > maxResponseBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrServerResponse, maxResponseBytes)
	}
	var out protocol.LeaseResponse
	switch {
	case resp.StatusCode == http.StatusOK:
		if err := protocol.UnmarshalLeaseResponse(data, &out); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrServerResponse, err)
		}
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		var p protocol.Problem
		if err := json.Unmarshal(data, &p); err != nil || p.Code == "" {
			return nil, permanent{&RefusedError{Server: hostOf(resp), Status: resp.StatusCode,
				Detail: string(bytes.ToValidUTF8(bytes.TrimSpace(data[:min(len(data), 200)]), nil))}}
		}
		if resp.StatusCode == http.StatusTooManyRequests && (len(p.Leases) == 0 || len(req.Takes) > 0) {
			// rateleased's own 429s answer every entry of a call without
			// takes (a cap refused them all); any other 429 comes from
			// something in between, problem body or not: a failed server,
			// not a refusal of this client's configuration.
			return nil, fmt.Errorf("%w: HTTP 429 (%s) without the answers of its entries", ErrServerResponse, p.Code)
		}
		if len(p.Leases) == 0 || len(req.Takes) > 0 {
			return nil, permanent{&RefusedError{Server: hostOf(resp), Status: resp.StatusCode, Code: p.Code, Detail: p.Detail}}
		}
		out.Leases = p.Leases
	case resp.StatusCode == http.StatusServiceUnavailable && isProblem(resp) && len(req.Takes) == 0:
		var p protocol.Problem
		if err := json.Unmarshal(data, &p); err != nil || p.Code != protocol.CodeStoreUnavailable || len(p.Leases) == 0 ||
			slices.ContainsFunc(p.Leases, func(r protocol.LeaseResult) bool { return r.Error == nil }) {
			// A store down, or not what rateleased sends (every entry
			// failed): a failed server.
			return nil, fmt.Errorf("%w: HTTP %d", ErrServerResponse, resp.StatusCode)
		}
		out.Leases = p.Leases
	default:
		return nil, fmt.Errorf("%w: HTTP %d", ErrServerResponse, resp.StatusCode)
	}
	if err := validateResults(req, out.Leases); err != nil {
		return nil, err
	}
	if err := validateTakes(req, out.Takes); err != nil {
		return nil, err
	}
	return &out, nil
}

// validateTakes checks that a server's take results answer req's takes, so
// that a lying server cannot make the client admit what it did not decide.
func validateTakes(req *protocol.LeaseRequest, res []protocol.CheckResponse) error {
	if len(res) != len(req.Takes) {
		return fmt.Errorf("%w: %d take results for %d takes", ErrServerResponse, len(res), len(req.Takes))
	}
	for i := range res {
		t, r := &req.Takes[i], &res[i]
		if r.Error != nil {
			if r.Allowed {
				return fmt.Errorf("%w: take %d allowed with an error", ErrServerResponse, i)
			}
			continue
		}
		if len(r.Keys) != len(t.Keys) {
			return fmt.Errorf("%w: take %d: %d key results for %d keys", ErrServerResponse, i, len(r.Keys), len(t.Keys))
		}
		for j := range r.Keys {
			k := &r.Keys[j]
			switch {
			case k.Key != t.Keys[j]:
				return fmt.Errorf("%w: take %d answers key %q for %q", ErrServerResponse, i, k.Key, t.Keys[j])
			case r.Allowed && !k.Allowed:
				return fmt.Errorf("%w: take %d allowed although key %q denied", ErrServerResponse, i, k.Key)
			case k.RetryAfterMillis < 0 || k.RetryAfterMillis > protocol.MaxWaitMillis:
				return fmt.Errorf("%w: take %d key %q: retry_after_ms out of range", ErrServerResponse, i, k.Key)
			case k.DelayMillis < 0 || k.DelayMillis > protocol.MaxWaitMillis:
				return fmt.Errorf("%w: take %d key %q: delay_ms out of range", ErrServerResponse, i, k.Key)
			case k.Burst < 0 || k.Limit < 0 || !periodOK(k.PeriodMillis) || k.LeaseTTLMillis < 0 || k.LeaseTTLMillis > int64(time.Hour/time.Millisecond):
				return fmt.Errorf("%w: take %d key %q: rule out of range", ErrServerResponse, i, k.Key)
			case !limitsOK(k.Limits):
				return fmt.Errorf("%w: take %d key %q: limits out of range", ErrServerResponse, i, k.Key)
			}
		}
		if r.RetryAfterMillis < 0 || r.RetryAfterMillis > protocol.MaxWaitMillis {
			return fmt.Errorf("%w: take %d: retry_after_ms out of range", ErrServerResponse, i)
		}
	}
	return nil
}

// validateResults checks that a server's results answer req and are
// possible, so that a lying server cannot make the client overspend.
func validateResults(req *protocol.LeaseRequest, res []protocol.LeaseResult) error {
	if len(res) != len(req.Leases) {
		return fmt.Errorf("%w: %d results for %d entries", ErrServerResponse, len(res), len(req.Leases))
	}
	for i := range res {
		e, r := &req.Leases[i], &res[i]
		bad := func(what string) error {
			return fmt.Errorf("%w: result %d (key %q): %s", ErrServerResponse, i, e.Key, what)
		}
		switch {
		case r.Key != e.Key || r.Slot != e.Slot:
			return bad(fmt.Sprintf("answers key %q slot %d", r.Key, r.Slot))
		case r.Error != nil:
			continue
		case r.Granted < 0 || r.Granted > e.Want:
			return bad("granted " + strconv.FormatInt(r.Granted, 10) + " of " + strconv.FormatInt(e.Want, 10))
		case r.Granted > 0 && !r.Unlimited && !protocol.ValidLeaseID(r.LeaseID):
			// An ID the protocol forbids would be sent back at the settle,
			// and every call carrying it refused whole, as a
			// misconfiguration of the client, until the lease ended.
			return bad("grant without a valid lease_id")
		case (r.Granted > 0 && r.TTLMillis <= 0) || r.TTLMillis < 0 || r.TTLMillis > maxTTLMillis(r):
			// On every answer: an unlimited key is allowed locally for
			// its TTL (a lying 10^12 ms once pinned one for 31 years).
			return bad("ttl_ms out of range")
		case r.RetryAfterMillis < 0 || r.RetryAfterMillis > protocol.MaxWaitMillis:
			return bad("retry_after_ms out of range")
		case r.DelayMillis < 0 || r.DelayMillis > protocol.MaxWaitMillis:
			return bad("delay_ms out of range")
		case math.IsNaN(r.SafeRate) || math.IsInf(r.SafeRate, 0) || r.SafeRate < 0:
			return bad("safe_rate out of range")
		case r.Burst < 0 || r.Limit < 0:
			return bad("negative limit or burst")
		case !periodOK(r.PeriodMillis):
			// A shaped lease spaces its slots period/limit apart: a period
			// beyond any rule's overflowed them, and admitted more than
			// the lease held.
			return bad("period_ms out of range")
		case !limitsOK(r.Limits):
			return bad("limits out of range")
		}
	}
	return nil
}

// periodOK reports whether a period_ms of an answer is one a rule may have
// (0: not given).
func periodOK(ms int64) bool { return ms >= 0 && ms <= protocol.MaxPeriodMillis }

// limitsOK reports whether the limits of an answer are as many as a rule
// may hold, each with a possible period, limit and burst: the decisions
// carry them to their callers (RateLimit fields), and a lying server once
// made them carry thousands.
func limitsOK(ls []protocol.LimitStatus) bool {
	if len(ls) > protocol.MaxLimits {
		return false
	}
	for i := range ls {
		if l := &ls[i]; l.Limit < 0 || l.Burst < 0 || !periodOK(l.PeriodMillis) {
			return false
		}
	}
	return true
}

// maxTTLMillis is the longest TTL a server may give the lease of r: a
// lease TTL of any rule (an hour at most), or, for a slice of a shaping
// rule (leaky_bucket), until the slice ends, its slots period/limit apart
// after its delay, plus that hour. (An hour alone once made the client take
// a correct grant of a slow shaping rule, 2 slots of 10 a day lasting
// 4h48m, for a failed server.)
func maxTTLMillis(r *protocol.LeaseResult) int64 {
	const hour = int64(time.Hour / time.Millisecond)
	if r.Algorithm != algorithmLeaky || r.Limit <= 0 || r.Granted <= 0 || !periodOK(r.PeriodMillis) || r.DelayMillis < 0 || r.DelayMillis > protocol.MaxWaitMillis {
		return hour // out of range ones are refused by their own checks
	}
	// Granted ≤ Want ≤ MaxCount (checked before) and PeriodMillis ≤
	// MaxPeriodMillis: the product fits in an int64.
	return hour + r.DelayMillis + (r.Granted*r.PeriodMillis+r.Limit-1)/r.Limit
}
