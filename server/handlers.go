package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// routes builds the handler. Every route is instrumented and recovers from
// panics. Besides the API's method patterns, each API path is registered
// without a method, which answers 405 with an Allow header, and "/" catches
// everything else with 404; both in problem+json, where ServeMux would
// answer plain text.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	type route struct {
		method, path string
		h            http.HandlerFunc
	}
	metrics := promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	})
	api := []route{
		{http.MethodPost, protocol.PathLeases, s.authed(s.handleLeases)},
		{http.MethodPost, protocol.PathCheck, s.authed(s.handleCheck)},
		{http.MethodGet, protocol.PathRules, s.authed(s.handleRules)},
		{http.MethodGet, protocol.PathHealthz, s.handleHealthz},
		{http.MethodGet, protocol.PathReadyz, s.handleReadyz},
		{http.MethodGet, protocol.PathMetrics, s.metricsAuth(metrics.ServeHTTP)},
	}
	for _, rt := range api {
		s.handle(mux, rt.method+" "+rt.path, rt.h)
		allow := rt.method
		if rt.method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		s.handle(mux, rt.path, methodNotAllowed(allow))
	}
	s.adminRoutes(mux)
	s.handle(mux, "/", notFound)
	return mux
}

// handle registers h for pattern, wrapped to record metrics, log, and turn a
// panic into a 500 problem. The route's metric children are looked up here,
// once, rather than per request.
func (s *Server) handle(mux *http.ServeMux, pattern string, h http.HandlerFunc) {
	duration := s.metrics.duration.MustCurryWith(prometheus.Labels{"route": pattern})
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { //nolint:errorlint // sentinel value, never wrapped
					panic(p)
				}
				s.log.ErrorContext(r.Context(), "panic serving request: this is a bug",
					"route", pattern, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				if !sw.wroteHeader {
					writeProblem(sw, protocol.NewProblem(protocol.CodeInternal, "the server failed while serving this request and logged why"))
				}
			}
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			elapsed := time.Since(start)
			// Counted once: the histogram's count is the number of
			// requests.
			duration.WithLabelValues(strconv.Itoa(status)).Observe(elapsed.Seconds())
			if ctx := r.Context(); s.log.Enabled(ctx, slog.LevelDebug) {
				s.log.DebugContext(ctx, "request", "method", r.Method, "path", r.URL.Path,
					"route", pattern, "status", status, "elapsed", elapsed)
			}
		}()
		h(sw, r)
	})
}

// statusWriter records the status of a response.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if !w.wroteHeader {
			w.status, w.wroteHeader = http.StatusOK, true
		}
		f.Flush()
	}
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, protocol.NewProblem(protocol.CodeNotFound, fmt.Sprintf(
		"no route for %s %s: the API serves POST %s, POST %s, GET %s, GET %s, GET %s and GET %s",
		r.Method, r.URL.Path, protocol.PathLeases, protocol.PathCheck, protocol.PathRules,
		protocol.PathHealthz, protocol.PathReadyz, protocol.PathMetrics)))
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, protocol.NewProblem(protocol.CodeMethodNotAllowed, fmt.Sprintf(
			"%s does not serve %s: use %s", r.URL.Path, r.Method, allow)))
	}
}

// writeProblem writes p as an RFC 9457 problem+json response with p.Status.
func writeProblem(w http.ResponseWriter, p *protocol.Problem) {
	h := w.Header()
	h.Set("Content-Type", protocol.ContentTypeProblem)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeJSON writes v as an application/json response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiHandler serves an authenticated /v1 request with one version of the
// rules; who is the client of the rules that sent it, or anonymous.
type apiHandler func(w http.ResponseWriter, r *http.Request, st *state, who *client)

// authed loads the rules in force and authenticates the caller: when the
// rules configure clients, the request needs "Authorization: Bearer
// <token>" with the token of one of them, or it gets 401.
func (s *Server) authed(h apiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := s.state.Load()
		if !st.rules.authRequired() {
			h(w, r, st, anonymous)
			return
		}
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, "send the header \"Authorization: Bearer <token>\": this server authenticates its clients")
			return
		}
		c := st.rules.authenticate(token)
		if c == nil {
			unauthorized(w, "the bearer token is not the token of any client of the rules file")
			return
		}
		h(w, r, st, c)
	}
}

func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ratelease"`)
	writeProblem(w, protocol.NewProblem(protocol.CodeUnauthorized, detail))
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header value. The scheme is case-insensitive (RFC 9110).
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// readBody checks the content type and reads the body, at most
// Options.MaxBodyBytes. On failure it writes the problem and returns false.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		// The media type is what comes before any parameter (RFC 9110
		// 8.3.1); it is case-insensitive.
		mt, _, _ := strings.Cut(ct, ";")
		if !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
			writeProblem(w, protocol.NewProblem(protocol.CodeUnsupportedMediaType, fmt.Sprintf(
				"Content-Type is %q: send application/json", ct)))
			return nil, false
		}
	}
	max := s.opts.MaxBodyBytes
	if r.ContentLength > max {
		w.Header().Set("Connection", "close")
		writeProblem(w, protocol.NewProblem(protocol.CodeBodyTooLarge, fmt.Sprintf(
			"body is %d bytes; the most is %d: split the call", r.ContentLength, max)))
		return nil, false
	}
	// When the length is known (it is at most max here), the buffer is
	// allocated once, with a byte to spare to read the end of the body.
	size := int64(512)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, max), make([]byte, 0, size))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeProblem(w, protocol.NewProblem(protocol.CodeBodyTooLarge, fmt.Sprintf(
				"body is more than %d bytes: split the call", max)))
			return nil, false
		}
		writeProblem(w, protocol.NewProblem(protocol.CodeInvalidJSON, "could not read the body: "+err.Error()))
		return nil, false
	}
	return body, true
}

// readAll is io.ReadAll into buf, which it grows only when full.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// problemOf returns the *protocol.Problem in err, or a 500 problem when err
// holds none.
func problemOf(err error) *protocol.Problem {
	if p, ok := errors.AsType[*protocol.Problem](err); ok {
		return p
	}
	return protocol.NewProblem(protocol.CodeInternal, "the server failed and logged why")
}

// storeFailed answers a failed engine call: 503 with Retry-After when the
// store is unreachable, closed or too slow, 500 otherwise.
func (s *Server) storeFailed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, leases.ErrClosed):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeShuttingDown, "the store is closed: the server is stopping; use another lease server"))
	case errors.Is(err, leases.ErrStoreUnavailable),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		if r.Context().Err() != nil {
			s.log.DebugContext(r.Context(), "request canceled by the caller", "route", r.Pattern, "err", err)
		} else {
			s.log.WarnContext(r.Context(), "store unavailable", "route", r.Pattern, "err", err)
		}
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeStoreUnavailable,
			"the store did not answer: retry after the Retry-After delay, or use another lease server"))
	default:
		s.log.ErrorContext(r.Context(), "engine failed", "route", r.Pattern, "err", err)
		writeProblem(w, protocol.NewProblem(protocol.CodeInternal, "the server failed and logged why"))
	}
}

// handleLeases serves POST /v1/leases.
//
// Entries for keys outside the caller's patterns fail alone with
// CodeForbidden and never reach the store, and so do entries on new keys of
// a caller that holds Options.MaxKeysPerClient keys, with CodeTooManyKeys.
// The lease owner is the client name and the request's client_id,
// "name/client_id": client names cannot contain '/', so no client can name
// another's leases.
func (s *Server) handleLeases(w http.ResponseWriter, r *http.Request, st *state, who *client) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := protocol.DecodeLeaseRequest(body)
	if err != nil {
		writeProblem(w, problemOf(err))
		return
	}
	// The takes are decided first: should the store fail then, the call is
	// answered 503 before any lease entry changed anything. (Decided after,
	// a failure would lose the answers of grants and settles already made.)
	var takes []protocol.CheckResponse
	if len(req.Takes) > 0 {
		if takes, ok = s.takes(w, r, st, who, req.Takes); !ok {
			return
		}
	}
	entries := req.Leases
	// permitted are the entries the caller may lease; idx maps them back to
	// their position in the request when some are not (nil when all are).
	// results are the engine's own when every entry is permitted.
	var results []protocol.LeaseResult
	permitted, idx := entries, []int(nil)
	if slices.ContainsFunc(entries, func(e protocol.LeaseEntry) bool { return !who.may(e.Key) }) {
		results = make([]protocol.LeaseResult, len(entries))
		permitted = make([]protocol.LeaseEntry, 0, len(entries))
		idx = make([]int, 0, len(entries))
		for i, e := range entries {
			if !who.may(e.Key) {
				results[i] = protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Error: forbidden(who, e.Key, fmt.Sprintf("leases[%d]", i))}
				continue
			}
			permitted = append(permitted, e)
			idx = append(idx, i)
		}
	}
	// held are the key-cap entries the permitted entries referenced (see
	// keyCap), released or recorded by hk.finish.
	var (
		hk   *heldKeys
		held []*heldKey
	)
	if hk = st.heldOf(who); hk != nil && len(permitted) > 0 {
		var buf [8]*heldKey
		switch n := len(permitted); {
		case n <= len(buf):
			held = buf[:0]
		case n <= heldPoolCap:
			p := heldPool.Get().(*[]*heldKey)
			held = (*p)[:0]
			defer heldPool.Put(p) // after finish, which clears held
		default:
			held = make([]*heldKey, 0, n)
		}
		var refused []int
		held, refused = hk.admit(permitted, s.opts.Now().UnixNano(), s.opts.MaxKeysPerClient, st.rules.policy, held)
		if refused != nil {
			results, permitted, idx, held = s.refuseKeys(who, entries, results, permitted, idx, held, refused)
		}
		// Releases the references when the engine panics; a no-op after
		// the finish below.
		defer hk.finish(held, nil, s.opts.Now().UnixNano())
	}
	if len(permitted) > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
		decided, rep, err := st.engine.Lease(ctx, leases.Owner{Client: who.name, Process: req.ClientID}, leaseAsks(permitted))
		cancel()
		var out []protocol.LeaseResult
		if err == nil {
			out = make([]protocol.LeaseResult, len(decided))
			for j := range decided {
				out[j] = leaseResultWire(&decided[j])
			}
		}
		hk.finish(held, out, s.opts.Now().UnixNano())
		if err != nil {
			s.storeFailed(w, r, err)
			return
		}
		s.metrics.record(rep)
		if idx == nil {
			results = out
		} else {
			for j := range out {
				results[idx[j]] = out[j]
			}
		}
	}
	if results == nil {
		results = []protocol.LeaseResult{}
	}
	if len(req.Takes) > 0 {
		writeJSON(w, http.StatusOK, protocol.LeaseResponse{Leases: results, Takes: takes})
		return
	}
	var first *protocol.Problem
	for i := range results {
		if results[i].Error == nil {
			writeJSON(w, http.StatusOK, protocol.LeaseResponse{Leases: results})
			return
		}
		if first == nil {
			first = results[i].Error
		}
	}
	p := *first
	p.Leases = results
	if len(results) > 1 {
		p.Detail = "every entry failed; leases[0]: " + p.Detail
	}
	writeProblem(w, &p)
}

// takes decides the direct takes of a lease call. A take with a key outside
// the caller's patterns fails alone with CodeForbidden and never reaches the
// store. On a store failure it answers the call and returns false.
func (s *Server) takes(w http.ResponseWriter, r *http.Request, st *state, who *client, takes []protocol.CheckRequest) ([]protocol.CheckResponse, bool) {
	out := make([]protocol.CheckResponse, len(takes))
	permitted, idx := takes, []int(nil)
	if slices.ContainsFunc(takes, func(t protocol.CheckRequest) bool { return !all(t.Keys, who.may) }) {
		permitted, idx = make([]protocol.CheckRequest, 0, len(takes)), make([]int, 0, len(takes))
		for i, t := range takes {
			if j := slices.IndexFunc(t.Keys, func(k string) bool { return !who.may(k) }); j >= 0 {
				out[i] = protocol.CheckResponse{Error: forbidden(who, t.Keys[j], fmt.Sprintf("takes[%d].keys[%d]", i, j))}
				continue
			}
			permitted = append(permitted, t)
			idx = append(idx, i)
		}
	}
	if len(permitted) == 0 {
		return out, true
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
	decided, rep, err := st.engine.Take(ctx, takeAsks(permitted))
	cancel()
	if err != nil {
		s.storeFailed(w, r, err)
		return nil, false
	}
	s.metrics.record(rep)
	for j := range decided {
		i := j
		if idx != nil {
			i = idx[j]
		}
		out[i] = takeResultWire(&decided[j])
	}
	return out, true
}

// all reports whether every key satisfies ok.
func all(keys []string, ok func(string) bool) bool {
	return !slices.ContainsFunc(keys, func(k string) bool { return !ok(k) })
}

// refuseKeys fails the permitted entries at the positions refused with
// too_many_keys and takes them out of permitted, and of idx and held, which
// it keeps aligned with permitted. It returns the new results, permitted,
// idx and held.
func (s *Server) refuseKeys(who *client, entries []protocol.LeaseEntry, results []protocol.LeaseResult,
	permitted []protocol.LeaseEntry, idx []int, held []*heldKey, refused []int,
) ([]protocol.LeaseResult, []protocol.LeaseEntry, []int, []*heldKey) {
	if results == nil {
		results = make([]protocol.LeaseResult, len(entries))
	}
	keep := make([]protocol.LeaseEntry, 0, len(permitted)-len(refused))
	keepIdx := make([]int, 0, len(permitted)-len(refused))
	n := 0 // held[:n] are the kept entries' references
	for j, e := range permitted {
		i := j
		if idx != nil {
			i = idx[j]
		}
		if len(refused) > 0 && refused[0] == j {
			refused = refused[1:]
			results[i] = protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Error: protocol.NewProblem(protocol.CodeTooManyKeys, fmt.Sprintf(
				"leases[%d]: client %q holds leases on %d keys through this lease server, the most it may, and key %q is not one of them: let leases on other keys expire, or raise the cap (rateleased -max-keys-per-client, server.Options.MaxKeysPerClient)",
				i, who.name, s.opts.MaxKeysPerClient, e.Key))}
			continue
		}
		keep = append(keep, e)
		keepIdx = append(keepIdx, i)
		held[n] = held[j]
		n++
	}
	clear(held[n:]) // no stale reference for finish to release twice
	return results, keep, keepIdx, held[:n]
}

func forbidden(who *client, key, where string) *protocol.Problem {
	return protocol.NewProblem(protocol.CodeForbidden, fmt.Sprintf(
		"%s: client %q may not use key %q: its key patterns are %q; change the client's keys in the rules file",
		where, who.name, key, who.keys))
}

// handleCheck serves POST /v1/check. A decision is a 200 whether the call
// is allowed or not: a denial is the answer to the question, not an error
// of the request, so it is {"allowed": false} with the Retry-After header
// set. Any key outside the caller's patterns fails the whole call with 403.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request, st *state, who *client) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := protocol.DecodeCheckRequest(body)
	if err != nil {
		writeProblem(w, problemOf(err))
		return
	}
	for i, k := range req.Keys {
		if !who.may(k) {
			writeProblem(w, forbidden(who, k, fmt.Sprintf("keys[%d]", i)))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
	decided, rep, err := st.engine.Check(ctx, req.Keys, req.CostOrDefault())
	cancel()
	if err != nil {
		if _, ok := errors.AsType[*leases.DecisionError](err); ok {
			writeProblem(w, decisionProblem(err))
			return
		}
		s.storeFailed(w, r, err)
		return
	}
	s.metrics.record(rep)
	resp := takeResultWire(&decided)
	if !resp.Allowed {
		w.Header().Set("Retry-After", retryAfterSeconds(resp.RetryAfterMillis))
	}
	writeJSON(w, http.StatusOK, resp)
}

// retryAfterSeconds formats a wait for the Retry-After header: whole
// seconds, rounded up, at least 1.
func retryAfterSeconds(ms int64) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(float64(ms)/1000))), 10)
}

// handleRules serves GET /v1/rules, listing the rules that the caller's key
// patterns can reach (see protocol.RulesResponse).
func (s *Server) handleRules(w http.ResponseWriter, r *http.Request, st *state, who *client) {
	p := st.rules.policy
	rules := p.Rules()
	resp := protocol.RulesResponse{
		Version: st.rules.Version(),
		Default: string(p.Default()),
		Rules:   make([]protocol.RuleInfo, 0, len(rules)),
		Client:  who.name,
		Keys:    who.keys,
	}
	if resp.Keys == nil {
		resp.Keys = []string{"*"}
	}
	scopes := make([][]globToken, len(resp.Keys))
	for i, k := range resp.Keys {
		scopes[i] = parseGlob(k)
	}
	for _, rl := range rules {
		match := parseGlob(rl.Match)
		if !slices.ContainsFunc(scopes, func(scope []globToken) bool {
			return shortestCommonKey(match, scope) <= protocol.MaxKeyBytes
		}) {
			continue
		}
		info := protocol.RuleInfo{
			Name:           rl.Name,
			Match:          rl.Match,
			Limits:         make([]protocol.LimitInfo, len(rl.Limits)),
			LeaseTTL:       formatDuration(rl.LeaseTTL),
			LeaseTTLMillis: rl.LeaseTTL.Milliseconds(),
			Soft:           rl.Soft,
			Shadow:         rl.Shadow,
		}
		for i, l := range rl.Limits {
			info.Limits[i] = protocol.LimitInfo{Algorithm: string(l.Algorithm), Limit: l.Limit, Period: formatDuration(l.Period), PeriodMillis: l.Period.Milliseconds(), Burst: l.Burst}
		}
		first := info.Limits[0]
		info.Algorithm, info.Limit, info.Period, info.PeriodMillis, info.Burst = first.Algorithm, first.Limit, first.Period, first.PeriodMillis, first.Burst
		resp.Rules = append(resp.Rules, info)
	}
	writeJSON(w, http.StatusOK, resp)
}

// formatDuration is time.Duration.String without trailing zero units:
// "1m" rather than "1m0s", "1h" rather than "1h0m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// statusBody is the body of GET /healthz and of a GET /readyz that
// succeeds.
type statusBody struct {
	Status string `json:"status"`
	// Detail says what an operator should know although the server is
	// ready: that the last reload of the rules file failed, say.
	Detail string `json:"detail,omitempty"`
}

// metricsAuth requires the bearer token of Options.MetricsTokenSHA256 for
// h, when it is set.
func (s *Server) metricsAuth(h http.HandlerFunc) http.HandlerFunc {
	if s.opts.MetricsTokenSHA256 == "" {
		return h
	}
	var want [sha256.Size]byte
	_, _ = hex.Decode(want[:], []byte(s.opts.MetricsTokenSHA256)) // validated by withDefaults
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, "send the header \"Authorization: Bearer <token>\": this server requires a token for /metrics (rateleased -metrics-token-sha256)")
			return
		}
		got := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			unauthorized(w, "the bearer token is not the metrics token (rateleased -metrics-token-sha256)")
			return
		}
		h(w, r)
	}
}

// handleHealthz serves GET /healthz: the process is alive.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, statusBody{Status: "ok"})
}

// handleReadyz serves GET /readyz: the server can serve leases, that is
// the store answers a ping within ReadyTimeout and the server is not
// shutting down. When the last reload of the rules file failed, the server
// is still ready (the rules in force serve), and the body's detail says
// that the file on disk is not in force, and why.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeShuttingDown, "the server is shutting down: use another lease server"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
	err := s.opts.Store.Ping(ctx)
	cancel()
	if err != nil {
		s.log.WarnContext(r.Context(), "readiness check: store ping failed", "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeStoreUnavailable, "the store does not answer a ping: the server cannot serve leases until it does"))
		return
	}
	body := statusBody{Status: "ok"}
	if err := s.ReloadError(); err != nil {
		body.Detail = fmt.Sprintf("the last reload of the rules file failed; the rules in force (version %s) still serve: %v", s.Rules().Version(), err)
	}
	writeJSON(w, http.StatusOK, body)
}
