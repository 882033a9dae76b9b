package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// FuzzLeaseHandler feeds arbitrary bodies to POST /v1/leases and
// POST /v1/check: the server must answer every one without a panic or a
// 5xx, with a JSON body. A body it serves (200) must be valid UTF-8, and
// the keys it answers for valid UTF-8 without a U+FFFD the body did not
// send, so that no two distinct keys ever share a bucket.
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
		// Not UTF-8, or a lone surrogate: 422 invalid_utf8.
		"{\"client_id\":\"c\",\"leases\":[{\"key\":\"user:\xff\",\"want\":1}]}",
		"{\"client_id\":\"c\",\"leases\":[{\"key\":\"user:\x80\",\"want\":1}]}",
		"{\"client_id\":\"c\xc0\xaf\",\"leases\":[{\"key\":\"user:1\",\"want\":1}]}",
		"{\"keys\":[\"user:\xed\xa0\x80\"]}",
		"{\"keys\":[\"user:\xe0\x80\x80\"]}",
		`{"keys":["user:\ud800"]}`,
		`{"client_id":"c","leases":[{"key":"user:\ud83d\ude00","want":1},{"key":"user:\udc00","want":1}]}`,
		"{\"keys\":[\"user:日本\",\"user:\xef\xbf\xbd\"]}",
		`{"client_id":"c","leases":[` + strings.Repeat(`{"key":"k","want":1},`, 50) + `{"key":"z","want":1}]}`,
		// Direct takes in a lease call.
		`{"client_id":"c","takes":[{"keys":["user:1","user:2"],"cost":2},{"keys":["user:1"]}]}`,
		`{"client_id":"c","leases":[{"key":"user:1","want":3}],"takes":[{"keys":["user:1"],"cost":0},{"keys":[]}]}`,
		`{"client_id":"c","takes":[{"keys":["user:1","user:1"]}],"leases":[]}`,
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
			if rec.Code == http.StatusOK {
				checkServedText(t, path, body, rec.Body.Bytes())
			} else {
				var p protocol.Problem
				if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != rec.Code || p.Code == "" {
					t.Fatalf("%s answered %d with a bad problem for %q: %s", path, rec.Code, body, rec.Body)
				}
			}
		}
	})
}

// checkServedText fails unless body, which path served with 200 and answer,
// is valid UTF-8 and every key in answer is valid UTF-8 with no U+FFFD that
// the body did not send.
func checkServedText(t *testing.T, path string, body, answer []byte) {
	t.Helper()
	if !utf8.Valid(body) {
		t.Fatalf("%s served a body that is not UTF-8: %q", path, body)
	}
	var keys []string
	if path == protocol.PathLeases {
		var lr protocol.LeaseResponse
		if err := json.Unmarshal(answer, &lr); err != nil {
			t.Fatalf("%s answered 200 with %s: %v", path, answer, err)
		}
		for _, l := range lr.Leases {
			keys = append(keys, l.Key)
		}
	} else {
		var cr protocol.CheckResponse
		if err := json.Unmarshal(answer, &cr); err != nil {
			t.Fatalf("%s answered 200 with %s: %v", path, answer, err)
		}
		for _, k := range cr.Keys {
			keys = append(keys, k.Key)
		}
	}
	sent := bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	for _, k := range keys {
		if !utf8.ValidString(k) || (!sent && strings.ContainsRune(k, utf8.RuneError)) {
			t.Fatalf("%s served key %q for body %q", path, k, body)
		}
	}
}
