package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// FuzzLeaseHandler feeds arbitrary bodies to POST /v1/leases and
// POST /v1/check: the server must answer every one without a panic or a
// 5xx, with a JSON body.
func FuzzLeaseHandler(f *testing.F) {
	seeds := []string{
		`{"client_id":"c","leases":[{"key":"user:1","want":10}]}`,
		`{"client_id":"c","leases":[{"key":"user:1","want":0,"lease_id":"abc","used":1}]}`,
		`{"client_id":"c","leases":[{"key":"tiny:1","want":1},{"key":"free","want":5}]}`,
		`{"client_id":"c","leases":[{"key":"user:1","want":1000000000}]}`,
		`{"client_id":"c","leases":[{"key":"user:1","want":99999999999999999999}]}`,
		`{"client_id":"c","leases":[{"key":"user:1","want":-1}]}`,
		`{"keys":["user:1","tiny:1"],"cost":1}`,
		`{"keys":["user:1"],"cost":1000000000}`,
		`{"client_id":`,
		`[]`,
		`null`,
		``,
		"{\"client_id\":\"c\",\"leases\":[{\"key\":\"\x00\",\"want\":1}]}",
		`{"client_id":"c","leases":[` + strings.Repeat(`{"key":"k","want":1},`, 50) + `{"key":"z","want":1}]}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	f.Cleanup(func() { _ = store.Close() })
	srv, err := New(Options{Store: store, RulesPath: writeTemp(f, rulesYAML), ReloadInterval: -1, Registry: prometheus.NewRegistry()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Close() })
	h := srv.Handler()

	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{protocol.PathLeases, protocol.PathCheck} {
			req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s answered %d for %q: %s", path, rec.Code, body, rec.Body)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s answered a body that is not JSON for %q: %s", path, body, rec.Body)
			}
			if rec.Code != http.StatusOK {
				var p protocol.Problem
				if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != rec.Code || p.Code == "" {
					t.Fatalf("%s answered %d with a bad problem for %q: %s", path, rec.Code, body, rec.Body)
				}
			}
		}
	})
}
