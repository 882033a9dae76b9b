package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		{http.MethodGet, protocol.PathKeysPrefix + "{key...}", s.authed(s.handleKeyState)},
		{http.MethodGet, protocol.PathHealthz, s.handleHealthz},
		{http.MethodGet, protocol.PathReadyz, s.handleReadyz},
		{http.MethodGet, protocol.PathMetrics, s.metricsAuth(metrics.ServeHTTP)},
		{http.MethodGet, protocol.PathStatus, s.metricsAuth(s.handleStatus)},
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
	return canonicalPaths(mux, s.instrument("/", refuseNonCanonical))
}

// canonicalPaths serves a request whose escaped path is not canonical
// (it holds "//", "/./" or "/../", or ends in "/." or "/..") with refuse,
// and every other request with mux. ServeMux would answer such a path with
// a redirect to its cleaned form, which for GET /v1/keys/{key} and
// /v1/admin/overrides/{key} is another key ("path:/a/../b" becomes
// "path:/b"), and a client that follows redirects re-sends its PUT or
// DELETE, and its token, there. A key or name that holds '/' goes in the
// path with each '/' escaped as %2F, which no cleaning touches.
func canonicalPaths(mux *http.ServeMux, refuse http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.EscapedPath(); r.Method != http.MethodConnect && cleanPath(p) != p {
			refuse(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// cleanPath is the canonical form of an escaped path, as ServeMux cleans
// it: rooted, without "." or ".." elements or repeated slashes, and with a
// trailing slash kept.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if strings.HasSuffix(p, "/") && np != "/" {
		np += "/"
	}
	return np
}

// refuseNonCanonical answers a request whose path is not canonical with
// 400 invalid_path, suggesting the path with the '/' of its key escaped
// (and the dots of a key "." or "..") when it is a keyed route's.
func refuseNonCanonical(w http.ResponseWriter, r *http.Request) {
	p := r.URL.EscapedPath()
	hint := "escape each '/' of a key or name in the path as %2F, and the dots of a key \".\" or \"..\" as %2E"
	for _, prefix := range []string{protocol.PathKeysPrefix, protocol.PathAdminOverrides + "/"} {
		if key, ok := strings.CutPrefix(p, prefix); ok {
			esc := strings.ReplaceAll(key, "/", "%2F")
			if esc == "." || esc == ".." {
				// A segment of its own still, '/' or not.
				esc = strings.ReplaceAll(esc, ".", "%2E")
			}
			hint = fmt.Sprintf("escape each '/' of the key as %%2F, and the dots of a key \".\" or \"..\" as %%2E: %s%s", prefix, esc)
		}
	}
	writeProblem(w, protocol.NewProblem(protocol.CodeInvalidPath, fmt.Sprintf(
		"path %s holds //, /./ or /../ (or ends in /. or /..), which clients and proxies may rewrite into another path, so it is refused, never redirected: %s",
		p, hint)))
}

// handle registers h for pattern, wrapped to record metrics, log, and turn a
// panic into a 500 problem. The route's metric children are looked up here,
// once, rather than per request.
func (s *Server) handle(mux *http.ServeMux, pattern string, h http.HandlerFunc) {
	mux.HandleFunc(pattern, s.instrument(pattern, h))
}

// instrument wraps h, served under the route label pattern, as handle
// does.
func (s *Server) instrument(pattern string, h http.HandlerFunc) http.HandlerFunc {
	duration := s.metrics.duration.MustCurryWith(prometheus.Labels{"route": pattern})
	// The child of the usual status is looked up once too, at the first
	// 200 (so that a route that never answers 200 shows no such series):
	// the lookup hashes the labels, and formatting 200 allocates.
	okChild := sync.OnceValue(func() prometheus.Observer { return duration.WithLabelValues(strconv.Itoa(http.StatusOK)) })
	return func(w http.ResponseWriter, r *http.Request) {
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
			if status == http.StatusOK {
				okChild().Observe(elapsed.Seconds())
			} else {
				duration.WithLabelValues(strconv.Itoa(status)).Observe(elapsed.Seconds())
			}
			if ctx := r.Context(); s.log.Enabled(ctx, slog.LevelDebug) {
				s.log.DebugContext(ctx, "request", "method", r.Method, "path", r.URL.Path,
					"route", pattern, "status", status, "elapsed", elapsed)
			}
		}()
		h(sw, r)
	}
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
		"no route for %s %s: the API serves POST %s, POST %s, GET %s, GET %s{key}, GET %s, GET %s, GET %s and GET %s",
		r.Method, r.URL.Path, protocol.PathLeases, protocol.PathCheck, protocol.PathRules, protocol.PathKeysPrefix,
		protocol.PathHealthz, protocol.PathReadyz, protocol.PathMetrics, protocol.PathStatus)))
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, protocol.NewProblem(protocol.CodeMethodNotAllowed, fmt.Sprintf(
			"%s does not serve %s: use %s", r.URL.Path, r.Method, allow)))
	}
}
