package client

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/ratelease/ratelease/protocol"
)

// FuzzDecodeLeaseResponse feeds arbitrary server answers to the client's
// decoder: it must never panic, and whatever it accepts must be a possible
// answer to the request (no grant above want, no grant without a lease ID,
// every entry answered in order).
func FuzzDecodeLeaseResponse(f *testing.F) {
	f.Add(200, []byte(`{"leases":[{"key":"user:1","lease_id":"abc","granted":5,"ttl_ms":2000}]}`))
	f.Add(409, []byte(`{"code":"unknown_lease","status":409,"title":"x","leases":[{"key":"user:1","error":{"code":"unknown_lease","status":409}}]}`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1","granted":50}]}`))
	f.Add(401, []byte(`{"code":"unauthorized","status":401}`))
	f.Add(500, []byte(`<html>`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1","slot":1,"granted":-1,"safe_rate":1e999}]}`))
	req := &protocol.LeaseRequest{ClientID: "c", Leases: []protocol.LeaseEntry{{Key: "user:1", Want: 10}}}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 599 {
			return
		}
		resp := &http.Response{StatusCode: status, Body: io.NopCloser(bytes.NewReader(body))}
		res, err := decodeLeaseResponse(resp, req)
		if err != nil {
			return
		}
		if len(res) != len(req.Leases) {
			t.Fatalf("accepted %d results for %d entries", len(res), len(req.Leases))
		}
		for i, r := range res {
			e := req.Leases[i]
			if r.Key != e.Key || r.Slot != e.Slot {
				t.Fatalf("accepted an answer for another key: %+v", r)
			}
			if r.Error == nil && (r.Granted < 0 || r.Granted > e.Want || (r.Granted > 0 && !r.Unlimited && r.LeaseID == "") || (r.Granted > 0 && r.TTLMillis <= 0)) {
				t.Fatalf("accepted an impossible grant: %+v", r)
			}
		}
	})
}
