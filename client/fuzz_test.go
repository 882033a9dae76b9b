package client

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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

// FuzzParseRetryAfter feeds arbitrary Retry-After values, as a lying or
// broken upstream sends them, to parseRetryAfter and RetryAfterBackoff.
// Neither may panic. parseRetryAfter answers 0 for what it refuses, and
// for what it takes a wait that is never negative: for delay-seconds (ASCII
// digits only) exactly that many seconds, saturated at the largest
// time.Duration; for an HTTP date the time until it, 0 once it has passed,
// so never longer for a later now. RetryAfterBackoff never waits less than
// 0 or more than its max, whatever the header says.
func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{
		"0", "1", "120", " 5 ", "\t7\r\n", "-1", "+5", "1.5", "1e3", "0x10", "1_000", "٣", "１",
		"9223372036", "9223372037", "18446744073709551615", "18446744073709551616", "99999999999999999999999999",
		now.Add(90 * time.Second).Format(http.TimeFormat), now.Add(-time.Hour).Format(http.TimeFormat),
		"Fri, 31 Dec 1999 23:59:59 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "Tue, 24 Nov 2026 12:01:30 PST",
		"Tuesday, 24-Nov-26 12:01:30 GMT", "Tue Nov 24 12:01:30 2026", "Tue, 24 Nov 2026 25:61:61 GMT",
		"soon", "", " ", "\x00", "1\x00", "\xff",
	} {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, v string, offset int64) {
		at := now.Add(time.Duration(offset))
		d, ok := parseRetryAfter(v, at)
		if !ok {
			if d != 0 {
				t.Fatalf("parseRetryAfter(%q) refused with %v", v, d)
			}
		} else if d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %v", v, d)
		}
		s := strings.TrimSpace(v)
		if s != "" && strings.Trim(s, "0123456789") == "" {
			n, err := strconv.ParseUint(s, 10, 64)
			want := time.Duration(math.MaxInt64)
			if err == nil && n <= uint64(math.MaxInt64/int64(time.Second)) {
				want = time.Duration(n) * time.Second
			}
			if !ok || d != want {
				t.Fatalf("parseRetryAfter(%q) = %v, %v; want %v", v, d, ok, want)
			}
		} else if ok {
			if s[0] >= '0' && s[0] <= '9' {
				t.Fatalf("parseRetryAfter(%q) took delay-seconds that are not digits only: %v", v, d)
			}
			date, err := http.ParseTime(s)
			if err != nil {
				date, err = time.Parse(time.RFC1123, s)
			}
			if err != nil || d != max(date.Sub(at), 0) {
				t.Fatalf("parseRetryAfter(%q) = %v for the date %v (%v) at %v", v, d, date, err, at)
			}
			if later, ok := parseRetryAfter(v, at.Add(time.Second)); !ok || later > d {
				t.Fatalf("parseRetryAfter(%q) is %v a second later, %v now", v, later, d)
			}
		}

		for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusOK} {
			resp := &http.Response{StatusCode: status, Header: http.Header{"Retry-After": []string{v}}}
			for _, maxWait := range []time.Duration{0, time.Millisecond, 30 * time.Second} {
				w := RetryAfterBackoff(time.Millisecond, maxWait, int(offset%64), resp)
				if w < 0 || w > maxWait {
					t.Fatalf("RetryAfterBackoff(max %v) after %d with Retry-After %q = %v", maxWait, status, v, w)
				}
			}
		}
	})
}
