package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// FuzzAdminBody feeds arbitrary bodies to the decoding of the admin API's
// PUTs (a rule, a client, an override, the settings). It must never
// panic; a body it refuses gets a 4xx problem. A body it accepts must be
// one JSON value and nothing after it, valid UTF-8, name each member of an
// object once and every field exactly as its JSON name (encoding/json
// takes "LIMIT" for "limit", and the last of two), and decode to what it
// says: no string holds a U+FFFD the body did not send (encoding/json
// puts one, silently, for a byte that is not UTF-8 or a lone surrogate
// escape, so that "user:\xff*" would be stored as another pattern than the
// one sent). What it decodes must encode to a body that decodes to the same, and
// the rule database's validation must refuse it with ErrInvalidRules or
// compile it to rules within their bounds (a rule or client named by the
// body's name, as the path must then be, or "r" and "c"): no accepted rule
// name holds a control character or is longer than
// leases.MaxRuleNameBytes.
func FuzzAdminBody(f *testing.F) {
	h := sha("t")
	for _, s := range []string{
		`{"match":"user:*","limit":100,"period":"1s"}`,
		`{"name":"r","match":"login:*","limits":[{"limit":3,"period":"1m","algorithm":"sliding_window_log"},{"limit":100,"period":"1h"}],"lease_ttl":"2s","soft":0.05,"shadow":true,"reserve":{"critical":0.2}}`,
		`{"match":"user:*","limit":-1,"period":"-1s"}`,
		`{"match":"user:*","limit":99999999999999999999,"period":"1s"}`,
		`{"match":"user:*","limit":1e3,"period":"1s"}`,
		`{"match":"user:*","limt":100,"period":"1s"}`,
		`{"token_sha256":"` + h + `","keys":["user:*"],"admin":true}`,
		`{"token_sha256":"` + h + `","keys":["user:\u00e9*"]}`,
		`{"key":"user:1","limit":5,"period":"1s"}`,
		`{"default":"deny"}`,
		`{"default":"allow","version":7}`,
		`null`,
		`[]`,
		``,
		`{`,
		`{"match":"a:*"} {"match":"b:*"}`,
		`{"match":"a:*"}]`,
		`{"match":"a:*"}garbage`,
		"{\"match\":\"user:\xff*\",\"limit\":1,\"period\":\"1s\"}",
		"{\"token_sha256\":\"" + h + "\",\"keys\":[\"a\xc0\xaf\"]}",
		`{"match":"user:\ud800*","limit":1,"period":"1s"}`,
		`{"match":"user:\ud83d\ude00*","limit":1,"period":"1s"}`,
		`{"match":"user:\ufffd*","limit":1,"period":"1s"}`,
		"{\"match\":\"user:\uFFFD*\",\"limit\":1,\"period\":\"1s\"}",
		`{"MATCH":"user:*","Limit":1,"period":"1s"}`,
		`{"match":"user:*","limit":1,"period":"1s","limit":1000}`,
		`{"match":"user:*","limit":1,"\u006cimit":1000,"period":"1s"}`,
		`{"match":"user:*","limits":[{"limit":1,"PERIOD":"1s"}]}`,
		`{"match":"user:*","limit":1,"period":"1s","reserve":{"critical":0.1,"critical":0.9}}`,
		`{"match":"user:*","limit":1,"period":"1s","ſhadow":true}`,
		`{"token_sha256":"` + h + `","Keys":["*"],"keys":["a:*"]}`,
		`{"DEFAULT":"deny"}`,
		`{"name":"a\nb","match":"user:*","limit":1,"period":"1s"}`,
		`{"name":"\u001b[2J\u0085\u0000","match":"user:*","limit":1,"period":"1s"}`,
		`{"name":"` + strings.Repeat("n", leases.MaxRuleNameBytes) + `","match":"user:*","limit":1,"period":"1s"}`,
		`{"name":"` + strings.Repeat("n", leases.MaxRuleNameBytes+1) + `","match":"user:*","limit":1,"period":"1s"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var rule protocol.AdminRule
		if decodedAdmin(t, body, &rule) {
			// A body's name must equal the path's, which the handler
			// then uses: any string, as a percent-encoded path holds.
			if rule.Name == "" {
				rule.Name = "r"
			}
			checkSnapshot(t, body, &ruleSetSnapshot{rules: []protocol.AdminRule{rule}})
		}
		var c protocol.AdminClient
		if decodedAdmin(t, body, &c) {
			if c.Name == "" {
				c.Name = "c"
			}
			checkSnapshot(t, body, &ruleSetSnapshot{clients: []protocol.AdminClient{c}})
		}
		var st protocol.AdminSettings
		if decodedAdmin(t, body, &st) {
			checkSnapshot(t, body, &ruleSetSnapshot{settings: st})
		}
		var o protocol.AdminOverride
		if decodedAdmin(t, body, &o) {
			o.Key = "user:1"
			if r, err := overrideRule(&o); err != nil {
				if !errors.Is(err, leases.ErrInvalidRules) {
					t.Fatalf("override %q: error %v does not wrap ErrInvalidRules", body, err)
				}
			} else if err := r.Validate(); err != nil {
				t.Fatalf("override %q accepted as %+v, which does not validate: %v", body, r, err)
			}
		}
	})
}

// decodedAdmin decodes body into v as the admin API does and checks what
// FuzzAdminBody says of it; it returns whether body was accepted.
func decodedAdmin(t *testing.T, body []byte, v any) bool {
	t.Helper()
	p := decodeAdminBody(body, v)
	if p != nil {
		if p.Status < 400 || p.Status > 499 || p.Status != p.Code.Status() || p.Code == "" || p.Detail == "" {
			t.Fatalf("%T: bad problem for %q: %+v", v, body, p)
		}
		return false
	}
	if !json.Valid(body) {
		t.Fatalf("%T: accepted %q, which is not one JSON value", v, body)
	}
	if !utf8.Valid(body) {
		t.Fatalf("%T: accepted %q, which is not UTF-8", v, body)
	}
	sent := bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	for _, s := range stringsOf(reflect.ValueOf(v)) {
		if !utf8.ValidString(s) || (!sent && strings.ContainsRune(s, utf8.RuneError)) {
			t.Fatalf("%T: accepted %q as %+v: %q is not what was sent", v, body, v, s)
		}
	}
	enc, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%T: marshal %+v: %v", v, v, err)
	}
	// Field names are exact and given once: each member the body sets is
	// in the re-encoding, by its name.
	tree, err := jsonTree(json.NewDecoder(bytes.NewReader(body)))
	if err != nil {
		t.Fatalf("%T: accepted %q: %v", v, body, err)
	}
	var got any
	if err := json.Unmarshal(enc, &got); err != nil {
		t.Fatalf("%T: re-encoded %q: %v", v, enc, err)
	}
	if where := missingMember(tree, got, ""); where != "" {
		t.Fatalf("%T: accepted %q, decoded as %s: its member %s is not there by that name", v, body, enc, where)
	}
	again := reflect.New(reflect.TypeOf(v).Elem()).Interface()
	if p := decodeAdminBody(enc, again); p != nil {
		t.Fatalf("%T: re-encoded %q is refused: %v", v, enc, p)
	}
	if enc2, err := json.Marshal(again); err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("%T: round trip changed %s into %s (%v)", v, enc, enc2, err)
	}
	return true
}

// checkSnapshot fails unless s is refused with ErrInvalidRules or compiles
// to rules within their bounds.
func checkSnapshot(t *testing.T, body []byte, s *ruleSetSnapshot) {
	t.Helper()
	r, err := s.compile()
	if err != nil {
		if !errors.Is(err, leases.ErrInvalidRules) {
			t.Fatalf("%q: error %v does not wrap ErrInvalidRules", body, err)
		}
		return
	}
	checkPolicy(t, r)
}

// stringsOf returns every string in v: fields, elements, map keys and
// values.
func stringsOf(v reflect.Value) []string {
	switch v.Kind() {
	case reflect.String:
		return []string{v.String()}
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return stringsOf(v.Elem())
	case reflect.Struct:
		var out []string
		for i := range v.NumField() {
			out = append(out, stringsOf(v.Field(i))...)
		}
		return out
	case reflect.Slice, reflect.Array:
		var out []string
		for i := range v.Len() {
			out = append(out, stringsOf(v.Index(i))...)
		}
		return out
	case reflect.Map:
		var out []string
		for it := v.MapRange(); it.Next(); {
			out = append(out, stringsOf(it.Key())...)
			out = append(out, stringsOf(it.Value())...)
		}
		return out
	}
	return nil
}

// jsonTree reads the next JSON value from dec as json.Unmarshal into an
// any would, numbers as json.Number, and fails on an object that names a
// member twice.
func jsonTree(dec *json.Decoder) (any, error) {
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		obj := map[string]any{}
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k := name.(string)
			if _, dup := obj[k]; dup {
				return nil, fmt.Errorf("member %q given twice", k)
			}
			if obj[k], err = jsonTree(dec); err != nil {
				return nil, err
			}
		}
		_, err = dec.Token()
		return obj, err
	case json.Delim('['):
		arr := []any{}
		for dec.More() {
			el, err := jsonTree(dec)
			if err != nil {
				return nil, err
			}
			arr = append(arr, el)
		}
		_, err = dec.Token()
		return arr, err
	}
	return tok, nil
}

// missingMember returns where (a path) a member of sent whose value is
// not empty (null, false, zero, "", [] or {}) is missing from got at the
// same place, or "".
func missingMember(sent, got any, path string) string {
	switch s := sent.(type) {
	case map[string]any:
		g, _ := got.(map[string]any)
		for k, v := range s {
			if isEmptyJSON(v) {
				continue
			}
			gv, ok := g[k]
			if !ok {
				return fmt.Sprintf("%s%q", path, k)
			}
			if where := missingMember(v, gv, fmt.Sprintf("%s%q.", path, k)); where != "" {
				return where
			}
		}
	case []any:
		g, _ := got.([]any)
		for i, v := range s {
			if i < len(g) {
				if where := missingMember(v, g[i], fmt.Sprintf("%s[%d].", path, i)); where != "" {
					return where
				}
			}
		}
	}
	return ""
}

func isEmptyJSON(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case string:
		return v == ""
	case json.Number:
		f, err := v.Float64()
		return err == nil && f == 0
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}
