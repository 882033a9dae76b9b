package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

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
	jsonHeaders(w.Header())
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func jsonHeaders(h http.Header) {
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
}

// respBufs recycles the buffers of the answers to lease calls and checks.
// A buffer that grew beyond maxPooledResp (an answer for many entries) is
// left to the collector.
type respBufs struct{ pool sync.Pool }

const maxPooledResp = 16 << 10

// writeEncoded answers 200 with the JSON that encode appends to a pooled
// buffer (a hand-written encoder of package protocol), followed by a
// newline as json.Encoder writes it, with its Content-Length. Should
// encode fail (a value encoding/json refuses too), the answer is a 500
// problem.
func (b *respBufs) writeEncoded(w http.ResponseWriter, encode func([]byte) ([]byte, error)) {
	bp, _ := b.pool.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	body, err := encode((*bp)[:0])
	if err != nil {
		writeProblem(w, protocol.NewProblem(protocol.CodeInternal, "the server failed to encode its answer: "+err.Error()))
		return
	}
	body = append(body, '\n')
	h := w.Header()
	jsonHeaders(h)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	if cap(body) <= maxPooledResp {
		*bp = body
		b.pool.Put(bp)
	}
}

// writeLeaseResponse answers a lease call with r.
func (b *respBufs) writeLeaseResponse(w http.ResponseWriter, r *protocol.LeaseResponse) {
	b.writeEncoded(w, func(dst []byte) ([]byte, error) { return protocol.AppendLeaseResponse(dst, r) })
}

// writeCheckResponse answers a check with r.
func (b *respBufs) writeCheckResponse(w http.ResponseWriter, r *protocol.CheckResponse) {
	b.writeEncoded(w, func(dst []byte) ([]byte, error) { return protocol.AppendCheckResponse(dst, r) })
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

// storeFailedFor logs the entries or takes of a call that the store
// failed for alone (errAt(i) for i below n: the engine's per-entry errors,
// those wrapping leases.ErrStoreUnavailable counted), with the first cause:
// a Redis Cluster node down fails its keys' entries while the others are
// decided. It logs at most once a second, with the number of such calls
// not logged since (ratelease_store_errors_total counts each). It returns
// how many failed so.
func (s *Server) storeFailedFor(r *http.Request, n int, errAt func(i int) error) int {
	failed := 0
	var first error
	for i := range n {
		if err := errAt(i); errors.Is(err, leases.ErrStoreUnavailable) {
			if failed == 0 {
				first = err
			}
			failed++
		}
	}
	if failed == 0 || r.Context().Err() != nil {
		return failed
	}
	now := s.opts.Now().UnixNano()
	last := s.keysFailed.loggedAt.Load()
	if last != 0 && now-last < int64(time.Second) || !s.keysFailed.loggedAt.CompareAndSwap(last, now) {
		s.keysFailed.suppressed.Add(1)
		return failed
	}
	cause := first
	if c := errors.Unwrap(first); c != nil {
		cause = c
	}
	s.log.WarnContext(r.Context(), "store unavailable for some keys; the others were decided", "route", r.Pattern, "failed", failed, "err", cause,
		"detail", first.Error(), "calls_not_logged", s.keysFailed.suppressed.Swap(0))
	return failed
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
