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
// every entry answered in order; every take answered, none allowed with a
// key that denied).
func FuzzDecodeLeaseResponse(f *testing.F) {
	f.Add(200, []byte(`{"leases":[{"key":"user:1","lease_id":"abc","granted":5,"ttl_ms":2000}]}`))
	f.Add(409, []byte(`{"code":"unknown_lease","status":409,"title":"x","leases":[{"key":"user:1","error":{"code":"unknown_lease","status":409}}]}`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1","granted":50}]}`))
	f.Add(401, []byte(`{"code":"unauthorized","status":401}`))
	f.Add(500, []byte(`<html>`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1","slot":1,"granted":-1,"safe_rate":1e999}]}`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1","lease_id":"abc","granted":5,"ttl_ms":2000}],"takes":[{"allowed":true,"keys":[{"key":"user:2","allowed":true},{"key":"api:x","allowed":true}]}]}`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1"}],"takes":[{"allowed":true,"keys":[{"key":"user:2","allowed":false},{"key":"api:x","allowed":true}]}]}`))
	f.Add(200, []byte(`{"leases":[{"key":"user:1"}],"takes":[{"allowed":false,"error":{"code":"forbidden","status":403}}]}`))
	req := &protocol.LeaseRequest{ClientID: "c", Leases: []protocol.LeaseEntry{{Key: "user:1", Want: 10}},
		Takes: []protocol.CheckRequest{{Keys: []string{"user:2", "api:x"}}}}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 599 {
			return
		}
		resp := &http.Response{StatusCode: status, Body: io.NopCloser(bytes.NewReader(body))}
		out, err := decodeLeaseResponse(resp, req)
		if err != nil {
			return
		}
		res := out.Leases
		if len(out.Takes) != len(req.Takes) {
			t.Fatalf("accepted %d take results for %d takes", len(out.Takes), len(req.Takes))
		}
		for i, tr := range out.Takes {
			if tr.Error != nil {
				if tr.Allowed {
					t.Fatalf("accepted an allowed take with an error: %+v", tr)
				}
				continue
			}
			if len(tr.Keys) != len(req.Takes[i].Keys) {
				t.Fatalf("accepted %d key results for %d keys", len(tr.Keys), len(req.Takes[i].Keys))
			}
			for j, k := range tr.Keys {
				if k.Key != req.Takes[i].Keys[j] || (tr.Allowed && !k.Allowed) {
					t.Fatalf("accepted an impossible take: %+v", tr)
				}
			}
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
