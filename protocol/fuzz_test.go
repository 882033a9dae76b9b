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
