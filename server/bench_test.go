package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// discardWriter is a ResponseWriter that keeps nothing but the status, so
// that the benchmark measures the handler rather than a recorder.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }

// BenchmarkLeaseHandler measures POST /v1/leases through the whole handler
// (routing, metrics, authentication, body read and decode, engine over the
// memory store, response encoding) for 1 and 100 entries per call, without
// the network.
func BenchmarkLeaseHandler(b *testing.B) {
	const token = "bench-token"
	rules := `
rules:
  - name: bench
    match: "bench:*"
    limit: 1000000000
    period: 1s
clients:
  - name: bench
    token_sha256: "` + sha(token) + `"
    keys: ["bench:*"]
`
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			store := leases.NewMemoryStore(leases.MemoryOptions{})
			b.Cleanup(func() { _ = store.Close() })
			srv, err := New(Options{Store: store, RulesPath: writeTemp(b, rules), ReloadInterval: -1, Registry: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = srv.Close() })
			h := srv.Handler()

			req := protocol.LeaseRequest{ClientID: "bench-1", Leases: make([]protocol.LeaseEntry, n)}
			for i := range req.Leases {
				// No lease_id: each call replaces the owner's lease of the key.
				req.Leases[i] = protocol.LeaseEntry{Key: fmt.Sprintf("bench:%d", i), Want: 1}
			}
			body, err := json.Marshal(req)
			if err != nil {
				b.Fatal(err)
			}
			u, err := url.Parse("http://127.0.0.1" + protocol.PathLeases)
			if err != nil {
				b.Fatal(err)
			}
			tmpl := http.Request{
				Method: http.MethodPost, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Host: u.Host, RequestURI: u.Path, ContentLength: int64(len(body)),
				Header: http.Header{
					"Content-Type":  {"application/json"},
					"Authorization": {"Bearer " + token},
				},
			}
			tmpl = *tmpl.WithContext(b.Context())
			rd := bytes.NewReader(body)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				rd.Reset(body)
				r := tmpl
				r.Body = io.NopCloser(rd)
				clear(w.h)
				w.status = 0
				h.ServeHTTP(w, &r)
				if w.status != http.StatusOK {
					b.Fatalf("status %d", w.status)
				}
			}
		})
	}
}
