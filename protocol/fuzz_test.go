package protocol

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// fuzzSeeds are bodies of both endpoints, valid and not, shared by the
// decoder fuzz tests.
var fuzzSeeds = []string{
	`{"client_id":"checkout-7f3a","leases":[{"key":"user:42","want":50}]}`,
	`{"client_id":"c","leases":[{"key":"user:42","want":0,"lease_id":"abc123","used":12}]}`,
	`{"client_id":"c","leases":[{"key":"a","want":1},{"key":"b","want":2}],"extra":true}`,
	`{"client_id":"c","leases":[{"key":"a","want":1000000000}]}`,
	`{"client_id":"c","leases":[{"key":"a","want":1000000001}]}`,
	`{"client_id":"c","leases":[{"key":"a","want":-1}]}`,
	`{"client_id":"c","leases":[{"key":"a","want":1e3}]}`,
	`{"client_id":"c","leases":[{"key":"\u00e9\ud800","want":1}]}`,
	`{"keys":["user:42","api:search"],"cost":1}`,
	`{"keys":["user:42"]}`,
	`{"keys":["a","a"]}`,
	`{"keys":[],"cost":0}`,
	`{"keys":["a"],"cost":null}`,
	`{"client_id":`,
	`[]`,
	`null`,
	`{} {}`,
	``,
	"{\"keys\":[\"\x7f\"]}",
	`{"client_id":"c","leases":[` + strings.Repeat(`{"key":"k","want":1},`, 20) + `{"key":"z","want":1}]}`,
}

// checkProblem fails unless err is a *Problem with a 4xx status that agrees
// with its code.
func checkProblem(t *testing.T, body []byte, err error) {
	t.Helper()
	var p *Problem
	if !errors.As(err, &p) {
		t.Fatalf("error for %q is %T, not *Problem: %v", body, err, err)
	}
	if p.Status < 400 || p.Status > 499 || p.Status != p.Code.Status() || p.Code == "" || p.Title == "" {
		t.Fatalf("bad problem for %q: %+v", body, p)
	}
}

func FuzzDecodeLeaseRequest(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeLeaseRequest(body)
		if err != nil {
			checkProblem(t, body, err)
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted %q but it does not validate: %v", body, err)
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("marshal %+v: %v", req, err)
		}
		again, err := DecodeLeaseRequest(enc)
		if err != nil {
			t.Fatalf("re-encoded %q is refused: %v", enc, err)
		}
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", req, again)
		}
	})
}

func FuzzDecodeCheckRequest(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeCheckRequest(body)
		if err != nil {
			checkProblem(t, body, err)
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted %q but it does not validate: %v", body, err)
		}
		if c := req.CostOrDefault(); c < 0 || c > MaxCount {
			t.Fatalf("accepted cost %d", c)
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("marshal %+v: %v", req, err)
		}
		again, err := DecodeCheckRequest(enc)
		if err != nil {
			t.Fatalf("re-encoded %q is refused: %v", enc, err)
		}
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", req, again)
		}
	})
}
