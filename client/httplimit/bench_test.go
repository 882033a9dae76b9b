package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	sethhttp "github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/stretchr/testify/require"
)

// discardWriter is a ResponseWriter that keeps nothing, so that the
// benchmarks measure the middleware, not a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

func serveLoop(b *testing.B, h http.Handler, r *http.Request) float64 {
	w := &discardWriter{h: http.Header{}}
	// Warm up: a leased key's batches follow its demand (an average), so
	// give the demand time to be measured before the clock starts.
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		for range 1000 {
			h.ServeHTTP(w, r)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// BenchmarkOverhead is the middleware's cost per request on a leased key
// (one "ip:{ip}" key, decided from the process's lease) against a bare
// handler and against sethvargo/go-limiter's httplimit with its memory
// store (a local limiter, no fleet), in one run. The log has the ratios.
//
//	go test ./client/httplimit -run '^$' -bench Overhead -benchtime 2s
func BenchmarkOverhead(b *testing.B) {
	c := inboundtest.LeasedClient(b, "ip:198.51.100.7")
	r := httptest.NewRequest(http.MethodGet, "/hello", nil)
	r.RemoteAddr = "198.51.100.7:4711"
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	})

	ns := map[string]float64{}
	b.Run("bare", func(b *testing.B) { ns["bare"] = serveLoop(b, next, r) })
	for _, mode := range []struct {
		name string
		h    httplimit.HeaderMode
	}{{"ratelease-leased-headers", httplimit.HeadersAll}, {"ratelease-leased-noheaders", httplimit.HeadersNone}} {
		m, err := httplimit.New(httplimit.Config{Client: c, Headers: mode.h})
		require.NoError(b, err)
		h := m.Handler(next)
		b.Run(mode.name, func(b *testing.B) {
			before := m.Stats()
			ns[mode.name] = serveLoop(b, h, r)
			st := m.Stats()
			if d := st.Denied - before.Denied; d > 0 {
				b.Logf("%s: %d of %d requests denied (a lease ran out before its renewal came)", mode.name, d, d+st.Allowed-before.Allowed)
			}
		})
	}
	store, err := memorystore.New(&memorystore.Config{Tokens: 1 << 40, Interval: time.Second})
	require.NoError(b, err)
	defer store.Close(context.Background())
	sm, err := sethhttp.NewMiddleware(store, sethhttp.IPKeyFunc())
	require.NoError(b, err)
	b.Run("sethvargo-memorystore", func(b *testing.B) { ns["sethvargo-memorystore"] = serveLoop(b, sm.Handle(next), r) })

	bare := ns["bare"]
	for _, k := range []string{"ratelease-leased-headers", "ratelease-leased-noheaders", "sethvargo-memorystore"} {
		if v, ok := ns[k]; ok && bare > 0 {
			b.Logf("%-28s %8.0f ns/request, overhead %8.0f ns over bare (%.0f ns), %.1f× bare", k, v, v-bare, bare, v/bare)
		}
	}
	if s, r := ns["sethvargo-memorystore"]-bare, ns["ratelease-leased-headers"]-bare; s > 0 {
		b.Logf("ratelease overhead / sethvargo overhead: %.2f (with RateLimit fields), %.2f (without)", r/s, (ns["ratelease-leased-noheaders"]-bare)/s)
	}
}
