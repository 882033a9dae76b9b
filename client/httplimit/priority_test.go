package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/ratelease/ratelease/internal/inbound/inboundtest"
	"github.com/stretchr/testify/assert"
)

// TestPriorityHook: the Priority hook gives each request its class; a
// best-effort caller stops at the floor the rule keeps for critical, and
// a critical request on the same key is still admitted.
func TestPriorityHook(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: api, match: "api:*", limit: 10, period: 1h, reserve: {critical: 20%}}
`, leasetest.Options{})
	_, h := newHandler(t, httplimit.Config{
		Client: inboundtest.DirectClient(t, srv),
		Keys:   []httplimit.Key{{Template: "api:shared"}},
		Priority: func(r *http.Request) string {
			return r.Header.Get("X-Priority")
		},
	})
	send := func(class string) int {
		r := httptest.NewRequest(http.MethodGet, "/hello", nil)
		r.RemoteAddr = "198.51.100.1:1234"
		if class != "" {
			r.Header.Set("X-Priority", class)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	tests := []struct {
		name  string
		class string
		n     int
		code  int
	}{
		{"best effort takes what lies above the floor", client.PriorityLow, 8, http.StatusOK},
		{"then it is denied", client.PriorityLow, 1, http.StatusTooManyRequests},
		{"the default class too (normal is below critical)", "", 1, http.StatusTooManyRequests},
		{"an unknown class is the default", "urgent", 1, http.StatusTooManyRequests},
		{"critical takes the reserve", client.PriorityCritical, 2, http.StatusOK},
		{"the limit is spent", client.PriorityCritical, 1, http.StatusTooManyRequests},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.n {
				assert.Equal(t, tt.code, send(tt.class), "request %d", i+1)
			}
		})
	}
}
