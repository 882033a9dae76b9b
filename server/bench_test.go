package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/e2e/redistest"
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
			lc := newLeaseCaller(b, h, http.Header{
				"Content-Type":  {"application/json"},
				"Authorization": {"Bearer " + token},
			})
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				lc.post(b, body)
			}
		})
	}
}

// leaseCaller posts bodies to POST /v1/leases through a handler, in this
// process, into a discardWriter.
type leaseCaller struct {
	h    http.Handler
	tmpl http.Request
	rd   *bytes.Reader
	w    discardWriter
}

func newLeaseCaller(b *testing.B, h http.Handler, header http.Header) *leaseCaller {
	u, err := url.Parse("http://127.0.0.1" + protocol.PathLeases)
	if err != nil {
		b.Fatal(err)
	}
	lc := &leaseCaller{h: h, rd: bytes.NewReader(nil), w: discardWriter{h: http.Header{}}}
	lc.tmpl = http.Request{
		Method: http.MethodPost, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Host: u.Host, RequestURI: u.Path, Header: header,
	}
	lc.tmpl = *lc.tmpl.WithContext(b.Context())
	return lc
}

// post serves body, and fails b unless the answer is 200.
func (lc *leaseCaller) post(b *testing.B, body []byte) {
	lc.rd.Reset(body)
	r := lc.tmpl
	r.ContentLength = int64(len(body))
	r.Body = io.NopCloser(lc.rd)
	clear(lc.w.h)
	lc.w.status = 0
	lc.h.ServeHTTP(&lc.w, &r)
	if lc.w.status != http.StatusOK {
		b.Fatalf("status %d", lc.w.status)
	}
}

// BenchmarkDirectTake measures a direct take as the SDK sends it for a key
// it rarely uses (POST /v1/leases with one take of one key, a key never
// seen before, on a per-user rule), through the whole handler as
// BenchmarkLeaseHandler does:
//
//   - store=memory: the handler's own work, without I/O;
//
//   - store=redis: over the store rateleased runs (an OwningStore over a
//     RedisStore) on a real redis-server, one take at a time; ns/op is
//     then mostly the round trip to Redis, and cpu-ns/op is the CPU this
//     process spent per take (user + system: the handler and the Redis
//     client, syscalls included; not redis-server's).
//
//     go test -run '^$' -bench DirectTake -benchtime 20000x ./server/
func BenchmarkDirectTake(b *testing.B) {
	rules := `
default: deny
rules:
  - {name: users, match: "user:*", algorithm: token_bucket, limit: 2, period: 1s, burst: 5}
`
	stores := []struct {
		name string
		open func(b *testing.B) leases.Store
	}{
		{"memory", func(b *testing.B) leases.Store {
			s := leases.NewMemoryStore(leases.MemoryOptions{})
			b.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"redis", func(b *testing.B) leases.Store {
			rdb := redistest.Start(b).Client(b)
			s, err := leases.NewOwningStore(leases.NewRedisStore(rdb, leases.RedisOptions{NoEviction: true}), leases.OwningOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return s
		}},
	}
	for _, st := range stores {
		b.Run("store="+st.name, func(b *testing.B) {
			srv, err := New(Options{Store: st.open(b), RulesPath: writeTemp(b, rules), ReloadInterval: -1, Registry: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = srv.Close() })
			lc := newLeaseCaller(b, srv.Handler(), http.Header{"Content-Type": {"application/json"}})
			// The body the SDK sends (see client.sendTakes), on key user:<i>.
			const prefix, suffix = `{"client_id":"bench-1","leases":null,"takes":[{"keys":["user:`, `"],"cost":1,"max_delay_ms":0}]}`
			var body []byte
			var cpu0 time.Duration
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				if i == 0 {
					cpu0 = processCPU(b)
				}
				i++
				body = append(strconv.AppendInt(append(body[:0], prefix...), int64(i), 10), suffix...)
				lc.post(b, body)
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(i), "cpu-ns/op")
		})
	}
}

// processCPU is the CPU time (user + system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
