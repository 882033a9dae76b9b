package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzSeeds are bodies of both endpoints, valid and not, shared by the
// decoder fuzz tests.
var fuzzSeeds = []string{
	`{"client_id":"checkout-7f3a","leases":[{"key":"user:42","want":50}]}`,
	`{"client_id":"c","takes":[{"keys":["user:1","api:x"],"cost":2},{"keys":["user:1"]}]}`,
	`{"client_id":"c","leases":[{"key":"user:1","want":1}],"takes":[{"keys":["user:é"],"cost":-1}]}`,
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
	// Not UTF-8, or lone surrogates: refused with invalid_utf8.
	"{\"client_id\":\"c\",\"leases\":[{\"key\":\"user:\xff\",\"want\":1}]}",
	"{\"client_id\":\"c\",\"leases\":[{\"key\":\"a\x80b\",\"want\":1}]}",
	"{\"client_id\":\"c\xc0\xaf\",\"leases\":[{\"key\":\"a\",\"want\":1}]}",
	"{\"keys\":[\"\xed\xa0\x80\"]}",
	"{\"keys\":[\"\xe0\x80\x80\",\"\xf4\x90\x80\x80\"]}",
	"{\"keys\":[\"ok\"]}\xfe",
	`{"keys":["\ud83d\ude00","\ud83d","\udc00x"]}`,
	`{"client_id":"c","leases":[{"key":"\\ud800\"\\","want":1}]}`,
	"{\"keys\":[\"日本:ü\",\"\xef\xbf\xbd\",\"\\ufffd\"]}",
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

// checkText fails unless body, which decoded without error into strings
// (keys and the client_id), is valid UTF-8 and every string is valid UTF-8
// with no U+FFFD that the body did not send: a replacement character in a
// decoded string means bytes or an escape were replaced, and two distinct
// keys could share a bucket.
func checkText(t *testing.T, body []byte, strs ...string) {
	t.Helper()
	if !utf8.Valid(body) {
		t.Fatalf("accepted a body that is not UTF-8: %q", body)
	}
	sent := bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	for _, s := range strs {
		if !utf8.ValidString(s) {
			t.Fatalf("accepted %q: %q is not UTF-8", body, s)
		}
		if !sent && strings.ContainsRune(s, utf8.RuneError) {
			t.Fatalf("accepted %q: %q has a U+FFFD the body did not send", body, s)
		}
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
		strs := []string{req.ClientID}
		for _, e := range req.Leases {
			strs = append(strs, e.Key, e.LeaseID)
		}
		entries := len(req.Leases)
		for _, tk := range req.Takes {
			strs = append(strs, tk.Keys...)
			entries += len(tk.Keys)
		}
		if entries == 0 || entries > MaxEntries {
			t.Fatalf("accepted %q with %d entries", body, entries)
		}
		checkText(t, body, strs...)
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
		checkText(t, body, req.Keys...)
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

// codecSeeds are bodies for the hand-written codecs' fuzz tests: the plain
// form they take, and near misses that must go the slow way.
var codecSeeds = []string{
	`{"client_id":"bench-1","leases":null,"takes":[{"keys":["user:1"],"cost":1,"max_delay_ms":0}]}`,
	`{"client_id":"c","leases":[{"key":"a","want":3,"lease_id":"L1","used":2,"slot":1,"priority":"high"}],"takes":[{"keys":["x","y"],"cost":null,"priority":"low"}]}`,
	`{"leases":[],"takes":[{"allowed":true,"retry_after_ms":0,"keys":[{"key":"user:1","allowed":true,"retry_after_ms":0,"remaining":4,"limit":2,"period_ms":1000,"burst":5,"rule":"users","lease_ttl_ms":2000,"algorithm":"token_bucket","limits":[{"algorithm":"token_bucket","limit":2,"period_ms":1000,"burst":5,"remaining":4,"reset_ms":500}]}]}]}`,
	`{"leases":[{"key":"k","slot":1,"lease_id":"id","granted":5,"ttl_ms":2000,"retry_after_ms":0,"limit":10,"period_ms":1000,"burst":10,"remaining":5,"safe_rate":2.5,"rule":"r","algorithm":"leaky_bucket","delay_ms":3,"limits":[],"shadow_denied":true,"borrowed":2,"unlimited":false,"owned":true}]}`,
	`{"leases":[{"key":"k","granted":0,"ttl_ms":0,"retry_after_ms":0,"limit":0,"period_ms":0,"burst":0,"remaining":0,"safe_rate":1e-7,"error":{"title":"t","status":403,"code":"forbidden"}}]}`,
	`{"takes":[{"allowed":false,"retry_after_ms":250,"delay_ms":1,"keys":null,"shadow_denied":false,"borrowed":true}]}`,
	`{"keys":["a","b"],"cost":2,"max_delay_ms":100}`,
	` { "keys" : [ "a" ] , "cost" : -0 } `,
	`{"keys":["a"],"Cost":2}`,
	`{"keys":["a"],"cost":1,"cost":2}`,
	`{"keys":["a"],"cost":1.0}`,
	`{"keys":["a"],"cost":1e2}`,
	`{"keys":["a"],"cost":01}`,
	`{"keys":["a"],"cost":9223372036854775807}`,
	`{"keys":["a"],"cost":-9223372036854775808}`,
	`{"keys":["a"],"cost":9223372036854775808}`,
	`{"keys":["a\u0041"]}`,
	"{\"keys\":[\"a\xffb\"]}",
	`{"keys":[null,"b"]}`,
	`{"leases":[{"key":"k","safe_rate":1e999}]}`,
	`{"leases":[{"key":"k","safe_rate":-0.0}]}`,
	`{"leases":[{"key":"k","granted":true}]}`,
	`{"leases":null}trailing`,
	`null`,
}

// FuzzUnmarshalFast holds the hand-written decoders to encoding/json: a
// body they decode, json.Unmarshal decodes too, into the same value.
func FuzzUnmarshalFast(f *testing.F) {
	for _, s := range append(append([]string(nil), fuzzSeeds...), codecSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(name string, fast, slow any, ok bool) {
			t.Helper()
			if !ok {
				return
			}
			if err := json.Unmarshal(body, slow); err != nil {
				t.Fatalf("%s: the fast decoder took %q, which encoding/json refuses: %v", name, body, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%s: %q decodes as\n%+v\nnot as encoding/json's\n%+v", name, body, fast, slow)
			}
		}
		var lr, lrSlow LeaseRequest
		r := reader{b: body}
		check("LeaseRequest", &lr, &lrSlow, r.leaseRequest(&lr) && r.end())
		var cr, crSlow CheckRequest
		r = reader{b: body}
		check("CheckRequest", &cr, &crSlow, r.checkRequest(&cr) && r.end())
		var resp, respSlow LeaseResponse
		r = reader{b: body}
		check("LeaseResponse", &resp, &respSlow, r.leaseResponse(&resp) && r.end())

		// The exported entry points agree with encoding/json whichever way
		// they go.
		var got, want LeaseResponse
		errGot, errWant := UnmarshalLeaseResponse(body, &got), json.Unmarshal(body, &want)
		if (errGot == nil) != (errWant == nil) || (errGot == nil && !reflect.DeepEqual(got, want)) {
			t.Fatalf("UnmarshalLeaseResponse(%q) = %+v, %v; encoding/json: %+v, %v", body, got, errGot, want, errWant)
		}
	})
}

// FuzzAppendFast holds the hand-written encoders to encoding/json: any
// value (here, whatever encoding/json decodes from the input) encodes to
// the bytes json.Marshal gives.
func FuzzAppendFast(f *testing.F) {
	for _, s := range append(append([]string(nil), fuzzSeeds...), codecSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		same := func(name string, v any, got []byte, err error) {
			t.Helper()
			want, wantErr := json.Marshal(v)
			if (err == nil) != (wantErr == nil) || (err == nil && !bytes.Equal(got, want)) {
				t.Fatalf("%s of %+v:\n%s (%v)\nencoding/json:\n%s (%v)", name, v, got, err, want, wantErr)
			}
		}
		var lr LeaseRequest
		if json.Unmarshal(body, &lr) == nil {
			same("AppendLeaseRequest", &lr, AppendLeaseRequest([]byte{}, &lr), nil)
		}
		var cr CheckRequest
		if json.Unmarshal(body, &cr) == nil {
			same("AppendCheckRequest", &cr, AppendCheckRequest([]byte{}, &cr), nil)
		}
		var resp LeaseResponse
		if json.Unmarshal(body, &resp) == nil {
			got, err := AppendLeaseResponse([]byte{}, &resp)
			same("AppendLeaseResponse", &resp, got, err)
		}
		var cs CheckResponse
		if json.Unmarshal(body, &cs) == nil {
			got, err := AppendCheckResponse([]byte{}, &cs)
			same("AppendCheckResponse", &cs, got, err)
		}
		var p Problem
		if json.Unmarshal(body, &p) == nil {
			got, err := AppendProblem([]byte{}, &p)
			same("AppendProblem", &p, got, err)
		}
		// Strings as they are, invalid UTF-8 included, which decoding
		// never yields.
		s := string(body)
		same("appendString", s, appendString(nil, s), nil)
		req := LeaseRequest{ClientID: s, Leases: []LeaseEntry{{Key: s, LeaseID: s, Priority: s}}, Takes: []CheckRequest{{Keys: []string{s, s}, Priority: s}}}
		same("AppendLeaseRequest", &req, AppendLeaseRequest(nil, &req), nil)
	})
}
