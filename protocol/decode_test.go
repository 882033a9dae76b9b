package protocol

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeStrict(t *testing.T) {
	for _, body := range []string{"", " ", "\r\n\t "} {
		_, err := DecodeCheckRequest([]byte(body))
		var p *Problem
		require.ErrorAs(t, err, &p, "%q", body)
		assert.Equal(t, CodeInvalidJSON, p.Code)
		assert.Equal(t, "body is empty: send a JSON object", p.Detail, "%q", body)
	}
	for _, body := range []string{`{"keys":["a"]} {}`, `{"keys":["a"]}x`, `{"keys":["a"]}]`, `{"keys":["a"]} null`} {
		_, err := DecodeCheckRequest([]byte(body))
		var p *Problem
		require.ErrorAs(t, err, &p, body)
		assert.Equal(t, CodeInvalidJSON, p.Code, body)
		assert.Contains(t, p.Detail, "after top-level value", body)
	}
	// A body that is JSON but no object: null decoded into an empty
	// request, and was refused by its validation (invalid_client_id for a
	// lease call, found by review), not as what it is.
	for _, body := range []string{"null", " null\n", "[]", `"keys"`, "1", "true"} {
		for name, decode := range map[string]func([]byte) error{
			"check": func(b []byte) error { _, err := DecodeCheckRequest(b); return err },
			"lease": func(b []byte) error { _, err := DecodeLeaseRequest(b); return err },
		} {
			err := decode([]byte(body))
			var p *Problem
			require.ErrorAs(t, err, &p, "%s %q", name, body)
			assert.Equal(t, CodeInvalidJSON, p.Code, "%s %q", name, body)
			assert.Contains(t, p.Detail, "send a JSON object", "%s %q", name, body)
		}
	}
	r, err := DecodeCheckRequest([]byte(" {\"keys\":[\"a\"]}\r\n\t "))
	require.NoError(t, err, "whitespace around the object is fine")
	assert.Equal(t, []string{"a"}, r.Keys)
}

// TestDecodeRequestFieldNames: a lease or check request that gives a
// member twice in one object, or a field's name in another case than its
// own, is refused with invalid_json naming it (encoding/json, which the
// decoder leaves such bodies to, kept the last "want" and took "WANT" for
// "want"); unknown fields are still ignored, so that newer clients can
// talk to older servers.
func TestDecodeRequestFieldNames(t *testing.T) {
	for _, tc := range []struct {
		name, body, detail string
		check              bool
	}{
		{name: "duplicate want", body: `{"client_id":"a","leases":[{"key":"k","want":1,"want":1000}]}`, detail: `leases[0]: the field "want" is given twice`},
		{name: "duplicate by escape", body: `{"client_id":"a","leases":[{"key":"k","key":"other"}]}`, detail: `leases[0]: the field "key" is given twice`},
		{name: "duplicate client_id", body: `{"client_id":"a","client_id":"b"}`, detail: `the field "client_id" is given twice`},
		{name: "duplicate in a take", body: `{"client_id":"a","takes":[{"keys":["k"],"cost":1,"cost":5}]}`, detail: `takes[0]: the field "cost" is given twice`},
		{name: "upper-case key", body: `{"client_id":"a","leases":[{"KEY":"k","want":1}]}`, detail: `leases[0]: the field "KEY" is not "key": field names are case-sensitive`},
		{name: "check: duplicate keys", body: `{"keys":["a"],"keys":["b"]}`, detail: `the field "keys" is given twice`, check: true},
		{name: "check: upper-case cost", body: `{"keys":["a"],"Cost":2}`, detail: `the field "Cost" is not "cost"`, check: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.check {
				_, err = DecodeCheckRequest([]byte(tc.body))
			} else {
				_, err = DecodeLeaseRequest([]byte(tc.body))
			}
			var p *Problem
			require.ErrorAs(t, err, &p)
			assert.Equal(t, CodeInvalidJSON, p.Code)
			assert.Contains(t, p.Detail, tc.detail)
		})
	}
	r, err := DecodeLeaseRequest([]byte(`{"client_id":"a","leases":[{"key":"k","want":1,"future":{"x":1}}],"later":true}`))
	require.NoError(t, err, "unknown fields are ignored")
	assert.Equal(t, "k", r.Leases[0].Key)
	c, err := DecodeCheckRequest([]byte(`{"keys":["a\u0062"],"cost":2}`))
	require.NoError(t, err, "an escape leaves the plain form; the names are fine")
	assert.Equal(t, []string{"ab"}, c.Keys)
}

// TestDecodeInvalidUTF8: a body with bytes that are not UTF-8, or a string
// that escapes a lone surrogate, is refused with invalid_utf8 (422) naming
// the offset of the first fault, by both decoders; it is never decoded with
// U+FFFD in place of the fault.
func TestDecodeInvalidUTF8(t *testing.T) {
	const lease = `{"client_id":"c","leases":[{"key":"user:%s","want":1}]}`
	const check = `{"keys":["user:%s"]}`
	tests := []struct {
		name   string
		key    string // raw bytes of the key's text after "user:"
		offset int    // of the first fault, from the start of the key's text
		detail string // also in the detail
	}{
		{"0xff", "a\xffb", 1, "byte 0xff"},
		{"0xfe", "\xfe", 0, "byte 0xfe"},
		{"lone continuation byte", "a\x80", 1, "byte 0x80"},
		{"truncated sequence", "\xe6\x97", 0, "byte 0xe6"},
		{"overlong slash", "\xc0\xaf", 0, "byte 0xc0"},
		{"overlong NUL", "\xe0\x80\x80", 0, "byte 0xe0"},
		{"UTF-8 encoded high surrogate", "\xed\xa0\x80", 0, "byte 0xed"},
		{"UTF-8 encoded low surrogate", "x\xed\xbf\xbf", 1, "byte 0xed"},
		{"beyond U+10FFFF", "\xf4\x90\x80\x80", 0, "byte 0xf4"},
		{"escaped lone high surrogate", `\ud800`, 0, `escape \ud800`},
		{"escaped lone low surrogate", `é\uDC00`, 2, `escape \uDC00`},
		{"escaped high surrogate before a non-surrogate", `\ud83d\u0041`, 0, `escape \ud83d`},
		{"escaped high surrogates twice", `\ud83d\ud83d`, 0, `escape \ud83d`},
		{"escaped pair then lone", `\ud83d\ude00\udc00`, 12, `escape \udc00`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, format := range []string{lease, check} {
				body := []byte(fmt.Sprintf(format, tt.key))
				off := strings.Index(format, "%s") + tt.offset
				var err error
				if format == lease {
					_, err = DecodeLeaseRequest(body)
				} else {
					_, err = DecodeCheckRequest(body)
				}
				var p *Problem
				require.ErrorAs(t, err, &p, "%q", body)
				assert.Equal(t, CodeInvalidUTF8, p.Code)
				assert.Equal(t, 422, p.Status)
				assert.Equal(t, 422, p.Code.Status())
				assert.Contains(t, p.Detail, fmt.Sprintf("offset %d", off), "%q", body)
				assert.Contains(t, p.Detail, tt.detail)
			}
		})
	}

	// Valid text passes: multibyte characters as UTF-8 and as escapes
	// (a surrogate pair included), and escapes that merely look like
	// surrogates.
	for key, want := range map[string]string{
		"日本:ü":                             "user:日本:ü",
		"😀":                                "user:😀",
		`\u00e9\u65e5`:                     "user:é日",
		`\ud83d\ude00`:                     "user:😀",
		`\uD83D\uDE00x`:                    "user:😀x",
		`\\ud800`:                          `user:\ud800`,
		`\"\ud83d\ude00\\`:                 `user:"😀\`,
		"\u00a0\u2028\U0010fffd":           "user:\u00a0\u2028\U0010fffd",
		`\u0041\\\\\\ud800 \\\ud83d\ude00`: `user:A\\\ud800 \😀`,
	} {
		r, err := DecodeLeaseRequest([]byte(fmt.Sprintf(lease, key)))
		require.NoError(t, err, "%q", key)
		assert.Equal(t, want, r.Leases[0].Key)
		c, err := DecodeCheckRequest([]byte(fmt.Sprintf(check, key)))
		require.NoError(t, err, "%q", key)
		assert.Equal(t, []string{want}, c.Keys)
	}

	// The UTF-8 check comes before JSON: invalid bytes anywhere, even
	// outside a string, are invalid_utf8; a body too large stays
	// body_too_large.
	_, err := DecodeCheckRequest([]byte("{\"keys\":[\"a\"]}\xff"))
	var p *Problem
	require.ErrorAs(t, err, &p)
	assert.Equal(t, CodeInvalidUTF8, p.Code)
	assert.Contains(t, p.Detail, "offset 14")
	_, err = DecodeCheckRequest(append(make([]byte, MaxBodyBytes), 0xff))
	require.ErrorAs(t, err, &p)
	assert.Equal(t, CodeBodyTooLarge, p.Code)
	// Broken JSON with a lone surrogate escape is a JSON error.
	_, err = DecodeCheckRequest([]byte(`{"keys":["\ud800"]`))
	require.ErrorAs(t, err, &p)
	assert.Equal(t, CodeInvalidJSON, p.Code)
}

func TestLoneSurrogateNeverPanics(t *testing.T) {
	for _, s := range []string{`"\`, `"\u`, `"\ud8`, `"\ud800`, `"\ud800\`, `"\ud800\u`, `"\ud800\udc`, `\ud800`, `"\uzzzz"`} {
		assert.NotPanics(t, func() { loneSurrogate([]byte(s)) }, s)
	}
	assert.Equal(t, 1, loneSurrogate([]byte(`"\ud800`)))
	assert.Equal(t, -1, loneSurrogate([]byte(`\ud800`)), "outside a string")
}

// TestDecodeAdmin is the regression test of the admin API's decoding of a
// PUT body, which FuzzAdminBody (package server) found took a body that
// is not UTF-8, or that escapes a lone surrogate, storing U+FFFD in place
// of what was sent ("user:\xff*" became the pattern "user:\uFFFD*"), and
// ignored whatever followed the first JSON value ("{}0", a second object).
// Both are refused now; a body of one value, whitespace around it, is not.
func TestDecodeAdmin(t *testing.T) {
	long := strings.Repeat("k", 100_000)
	tests := []struct {
		name      string
		body      string
		code      Code   // "" when the body decodes
		detail    string // in the problem's detail
		match     string // the decoded Match
		maxDetail int    // the detail's longest length, when checked
	}{
		{name: "plain", body: `{"match":"user:*","limit":1,"period":"1s"}`, match: "user:*"},
		{name: "whitespace around", body: " \r\n{\"match\":\"a:*\"}\t\n ", match: "a:*"},
		{name: "escaped non-ASCII", body: `{"match":"\u00e9\ud83d\ude00:*"}`, match: "é😀:*"},
		{name: "replacement character sent", body: `{"match":"\ufffd:*"}`, match: "\uFFFD:*"},
		{name: "invalid byte", body: "{\"match\":\"user:\xff*\"}", code: CodeInvalidUTF8, detail: "byte 0xff at offset 15"},
		{name: "overlong", body: "{\"match\":\"\xc0\xaf\"}", code: CodeInvalidUTF8, detail: "offset 10"},
		{name: "utf-8 encoded surrogate", body: "{\"match\":\"\xed\xa0\x80\"}", code: CodeInvalidUTF8, detail: "offset 10"},
		{name: "invalid byte outside strings", body: "{\"match\":\"a\"}\xff", code: CodeInvalidUTF8, detail: "offset 13"},
		{name: "lone high surrogate", body: `{"match":"user:\ud800*"}`, code: CodeInvalidUTF8, detail: `\ud800 at offset 15`},
		{name: "lone low surrogate", body: `{"match":"\udc00"}`, code: CodeInvalidUTF8, detail: `\udc00 at offset 10`},
		{name: "number after", body: `{}0`, code: CodeInvalidJSON, detail: "after the JSON value, which ends at offset 2"},
		{name: "second object", body: `{"match":"a:*"} {"limit":1000}`, code: CodeInvalidJSON, detail: "after the JSON value"},
		{name: "stray bracket", body: `{"match":"a:*"}]`, code: CodeInvalidJSON, detail: "after the JSON value"},
		{name: "garbage", body: `{"match":"a:*"}garbage`, code: CodeInvalidJSON, detail: "after the JSON value"},
		{name: "unknown field", body: `{"match":"a:*","limt":5}`, code: CodeInvalidJSON, detail: `unknown field "limt"`},
		// Field names are exact and given once (encoding/json takes
		// "LIMIT" for "limit", and the last of two).
		{name: "upper-case field", body: `{"MATCH":"a:*"}`, code: CodeInvalidJSON, detail: `the field "MATCH" is not "match": field names are case-sensitive`},
		{name: "mixed-case field", body: `{"match":"a:*","Limit":1000}`, code: CodeInvalidJSON, detail: `the field "Limit" is not "limit"`},
		{name: "folded field", body: `{"match":"a:*","ſhadow":true}`, code: CodeInvalidJSON, detail: `the field "ſhadow" is not "shadow"`},
		{name: "escaped upper-case field", body: `{"match":"a:*","\u004cimit":1}`, code: CodeInvalidJSON, detail: `the field "Limit" is not "limit"`},
		{name: "nested case", body: `{"match":"a:*","limits":[{"limit":1,"period":"1s"},{"limit":2,"PERIOD":"1h"}]}`, code: CodeInvalidJSON, detail: `limits[1]: the field "PERIOD" is not "period"`},
		{name: "duplicate field", body: `{"match":"a:*","limit":1,"limit":1000}`, code: CodeInvalidJSON, detail: `the field "limit" is given twice: send each field once`},
		{name: "duplicate by escape", body: `{"match":"a:*","limit":1,"\u006cimit":1000}`, code: CodeInvalidJSON, detail: `the field "limit" is given twice`},
		{name: "duplicate null", body: `{"match":"a:*","match":null}`, code: CodeInvalidJSON, detail: `the field "match" is given twice`},
		{name: "nested duplicate", body: `{"match":"a:*","limits":[{"limit":1,"period":"1s","limit":9}]}`, code: CodeInvalidJSON, detail: `limits[0]: the field "limit" is given twice`},
		{name: "duplicate map key", body: `{"match":"a:*","reserve":{"critical":0.1,"critical":0.9}}`, code: CodeInvalidJSON, detail: `reserve: the key "critical" is given twice`},
		{name: "map keys of other case", body: `{"match":"a:*","reserve":{"critical":0.1,"CRITICAL":0.2}}`, match: "a:*"},
		{name: "empty", body: ``, code: CodeInvalidJSON, detail: "EOF"},
		{name: "null", body: `null`, code: CodeInvalidJSON, detail: "send a JSON object"},
		{name: "null with whitespace", body: " null\n", code: CodeInvalidJSON, detail: "send a JSON object"},
		{name: "array", body: `[]`, code: CodeInvalidJSON, detail: "send a JSON object"},
		{name: "string", body: `"a:*"`, code: CodeInvalidJSON, detail: "send a JSON object"},
		{name: "truncated", body: `{"match":`, code: CodeInvalidJSON, detail: "EOF"},
		// A duplicate key of 100,000 bytes was quoted whole (a 100,080-byte
		// detail; found by the final review): cut to 64 bytes.
		{name: "long duplicate map key", body: `{"match":"a:*","reserve":{"` + long + `":0.1,"` + long + `":0.2}}`, code: CodeInvalidJSON,
			detail: `reserve: the key "` + long[:64] + `…" is given twice`, maxDetail: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r AdminRule
			err := DecodeAdmin([]byte(tt.body), &r)
			if tt.code == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.match, r.Match)
				return
			}
			var p *Problem
			require.ErrorAs(t, err, &p)
			assert.Equal(t, tt.code, p.Code)
			assert.Equal(t, tt.code.Status(), p.Status)
			assert.Contains(t, p.Detail, tt.detail)
			if tt.maxDetail > 0 {
				assert.LessOrEqual(t, len(p.Detail), tt.maxDetail)
			}
		})
	}
}
