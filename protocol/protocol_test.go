package protocol

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key  string
		want error
	}{
		{"user:42", nil},
		{"user:42|api:createURL", nil},
		{"日本:ü", nil},
		{strings.Repeat("k", MaxKeyBytes), nil},
		{"", ErrKeyEmpty},
		{strings.Repeat("k", MaxKeyBytes+1), ErrKeyTooLong},
		{strings.Repeat("é", 129), ErrKeyTooLong},
		{"a\x00b", ErrKeyControl},
		{"a\nb", ErrKeyControl},
		{"a\x7fb", ErrKeyControl},
		{"a\u0085b", ErrKeyControl},
		{"a\xffb", ErrKeyUTF8},
	}
	for _, tt := range tests {
		err := ValidateKey(tt.key)
		if tt.want == nil {
			assert.NoError(t, err, "%q", tt.key)
		} else {
			assert.ErrorIs(t, err, tt.want, "%q", tt.key)
		}
	}
}

func entries(n int) []LeaseEntry {
	es := make([]LeaseEntry, n)
	for i := range es {
		es[i] = LeaseEntry{Key: "k:" + strconv.Itoa(i), Want: 1}
	}
	return es
}

func TestLeaseRequestValidate(t *testing.T) {
	ok := LeaseEntry{Key: "user:1", Want: 5}
	tests := []struct {
		name string
		req  LeaseRequest
		code Code
	}{
		{"valid", LeaseRequest{ClientID: "c-1", Leases: []LeaseEntry{ok}}, ""},
		{"settle", LeaseRequest{ClientID: "c-1", Leases: []LeaseEntry{{Key: "k", Want: 0, LeaseID: "abc", Used: 3}}}, ""},
		{"max entries", LeaseRequest{ClientID: "c", Leases: entries(MaxEntries)}, ""},
		{"no client", LeaseRequest{Leases: []LeaseEntry{ok}}, CodeInvalidClientID},
		{"client with space", LeaseRequest{ClientID: "a b", Leases: []LeaseEntry{ok}}, CodeInvalidClientID},
		{"long client", LeaseRequest{ClientID: strings.Repeat("c", 129), Leases: []LeaseEntry{ok}}, CodeInvalidClientID},
		{"no entries", LeaseRequest{ClientID: "c"}, CodeInvalidRequest},
		{"too many", LeaseRequest{ClientID: "c", Leases: entries(MaxEntries + 1)}, CodeTooManyEntries},
		{"bad key", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: strings.Repeat("k", 300), Want: 1}}}, CodeInvalidKey},
		{"dup key", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{ok, ok}}, CodeDuplicateKey},
		{"negative want", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", Want: -1}}}, CodeInvalidCount},
		{"huge want", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", Want: MaxCount + 1}}}, CodeInvalidCount},
		{"negative used", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", LeaseID: "x", Used: -1}}}, CodeInvalidCount},
		{"used without lease", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", Used: 1}}}, CodeInvalidCount},
		{"negative max_delay_ms", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", Want: 1, MaxDelayMillis: -1}}}, CodeInvalidCount},
		{"huge max_delay_ms", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", Want: 1, MaxDelayMillis: MaxCount + 1}}}, CodeInvalidCount},
		{"bad lease id", LeaseRequest{ClientID: "c", Leases: []LeaseEntry{{Key: "k", LeaseID: "a\nb"}}}, CodeInvalidLeaseID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.code == "" {
				require.NoError(t, err)
				return
			}
			var p *Problem
			require.True(t, errors.As(err, &p), "want a *Problem, got %v", err)
			assert.Equal(t, tt.code, p.Code)
			assert.Equal(t, tt.code.Status(), p.Status)
			assert.NotEmpty(t, p.Detail)
		})
	}
}

func TestCheckRequestValidate(t *testing.T) {
	cost := func(n int64) *int64 { return &n }
	tests := []struct {
		name string
		req  CheckRequest
		code Code
	}{
		{"valid", CheckRequest{Keys: []string{"a", "b"}}, ""},
		{"zero cost", CheckRequest{Keys: []string{"a"}, Cost: cost(0)}, ""},
		{"no keys", CheckRequest{}, CodeInvalidRequest},
		{"negative cost", CheckRequest{Keys: []string{"a"}, Cost: cost(-1)}, CodeInvalidCount},
		{"huge cost", CheckRequest{Keys: []string{"a"}, Cost: cost(MaxCount + 1)}, CodeInvalidCount},
		{"dup", CheckRequest{Keys: []string{"a", "a"}}, CodeDuplicateKey},
		{"bad key", CheckRequest{Keys: []string{""}}, CodeInvalidKey},
		{"too many", CheckRequest{Keys: make([]string, MaxEntries+1)}, CodeTooManyEntries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.code == "" {
				require.NoError(t, err)
				return
			}
			var p *Problem
			require.ErrorAs(t, err, &p)
			assert.Equal(t, tt.code, p.Code)
		})
	}
	assert.EqualValues(t, 1, (&CheckRequest{}).CostOrDefault())
}

func TestDecode(t *testing.T) {
	r, err := DecodeLeaseRequest([]byte(`{"client_id":"c","leases":[{"key":"user:42","want":50,"future_field":1}]}`))
	require.NoError(t, err)
	assert.Equal(t, "user:42", r.Leases[0].Key)

	for _, body := range []string{``, `{`, `[]`, `{"client_id":5}`, `{"client_id":"c","leases":[{"key":"k","want":1.5}]}`, `{} {}`, `{"client_id":"c","leases":[{"key":"k","want":99999999999999999999}]}`} {
		_, err := DecodeLeaseRequest([]byte(body))
		var p *Problem
		require.ErrorAs(t, err, &p, body)
		assert.Equal(t, CodeInvalidJSON, p.Code, body)
		assert.Equal(t, 400, p.Status, body)
	}
	_, err = DecodeLeaseRequest([]byte(`{"client_id":"c","leases":[{"key":"k","want":-1}]}`))
	var p *Problem
	require.ErrorAs(t, err, &p)
	assert.Equal(t, 422, p.Status)

	big := make([]byte, MaxBodyBytes+1)
	_, err = DecodeCheckRequest(big)
	require.ErrorAs(t, err, &p)
	assert.Equal(t, CodeBodyTooLarge, p.Code)
	assert.Equal(t, 413, p.Status)

	c, err := DecodeCheckRequest([]byte(`{"keys":["a"],"cost":3}`))
	require.NoError(t, err)
	assert.EqualValues(t, 3, c.CostOrDefault())
}

func TestProblemJSON(t *testing.T) {
	p := NewProblem(CodeUnknownLease, "lease x is not open")
	b, err := json.Marshal(p)
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"https://ratelease.dev/problems/unknown_lease","title":"Unknown lease","status":409,"detail":"lease x is not open","code":"unknown_lease"}`, string(b))
	assert.Equal(t, "unknown_lease (409): lease x is not open", p.Error())
	for code := range codes {
		assert.NotEqual(t, "Error", code.Title(), code)
	}
	assert.Equal(t, 500, Code("nope").Status())
}
