package server

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

const priorityRulesYAML = `
rules:
  - name: api
    match: "api:*"
    limit: 10
    period: 1h
    reserve: {critical: 20%, high: 0.1}
`

func TestParseRulesReserve(t *testing.T) {
	rules, err := ParseRules([]byte(priorityRulesYAML))
	require.NoError(t, err)
	r := rules.Policy().Rules()[0]
	assert.InDelta(t, 0.2, r.Reserve["critical"], 1e-12)
	assert.InDelta(t, 0.1, r.Reserve["high"], 1e-12)
	assert.EqualValues(t, 3, r.Floor("low", 10))

	tests := []struct {
		name, yaml, want string
	}{
		{"unknown class", "rules:\n- {name: a, match: x, limit: 1, period: 1s, reserve: {urgent: 5%}}", `rule "a": reserve: names "urgent"`},
		{"share above 100%", "rules:\n- {name: a, match: x, limit: 1, period: 1s, reserve: {critical: 150%}}", `rule "a": reserve.critical: is 1.5`},
		{"sum of 100%", "rules:\n- {name: a, match: x, limit: 1, period: 1s, reserve: {critical: 50%, high: 50%}}", `rule "a": reserve: shares sum to 100%`},
		{"not a percentage", "rules:\n- {name: a, match: x, limit: 1, period: 1s, reserve: {critical: lots}}", `"lots" is not a percentage`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRules([]byte(tt.yaml))
			require.Error(t, err)
			assert.True(t, errors.Is(err, leases.ErrInvalidRules), "wraps ErrInvalidRules: %v", err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestPriorityOnTheWire: an unknown class is refused with 422
// invalid_priority on both routes; a low take stops at the reserve, a
// critical one takes it; a lease entry's class sets its floor; GET
// /v1/rules shows the reserve.
func TestPriorityOnTheWire(t *testing.T) {
	f := newFixture(t, priorityRulesYAML, nil, Options{})
	tests := []struct {
		name, path, body string
		code             protocol.Code
	}{
		{"check", protocol.PathCheck, `{"keys":["api:1"],"priority":"urgent"}`, protocol.CodeInvalidPriority},
		{"lease entry", protocol.PathLeases, `{"client_id":"p","leases":[{"key":"api:1","want":1,"priority":"HIGH"}]}`, protocol.CodeInvalidPriority},
		{"take in a lease call", protocol.PathLeases, `{"client_id":"p","takes":[{"keys":["api:1"],"priority":"best-effort"}]}`, protocol.CodeInvalidPriority},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.postJSON(tt.path, "", tt.body)
			assert.Equal(t, 422, r.status)
			var p protocol.Problem
			require.NoError(t, json.Unmarshal(r.body, &p))
			assert.Equal(t, tt.code, p.Code)
			assert.Contains(t, p.Detail, "priority")
			assert.Contains(t, p.Detail, "critical, high, normal or low")
		})
	}

	check := func(priority string, cost int64) protocol.CheckResponse {
		t.Helper()
		r := f.postJSON(protocol.PathCheck, "", protocol.CheckRequest{Keys: []string{"api:1"}, Cost: &cost, Priority: priority})
		require.Equal(t, 200, r.status, string(r.body))
		var out protocol.CheckResponse
		require.NoError(t, json.Unmarshal(r.body, &out))
		return out
	}
	assert.True(t, check("low", 7).Allowed, "10 less the 3 reserved above low")
	assert.False(t, check("normal", 1).Allowed, "normal's floor is low's")
	assert.True(t, check("high", 1).Allowed, "3 left, high's floor is 2")
	assert.False(t, check("high", 1).Allowed, "high is at its floor")
	assert.True(t, check("critical", 2).Allowed, "critical takes the rest")

	res := f.lease("", "p", protocol.LeaseEntry{Key: "api:2", Want: 10, Priority: protocol.PriorityHigh})
	assert.EqualValues(t, 8, res[0].Granted, "a lease of class high stops at its floor of 2")

	r := f.do("GET", protocol.PathRules, "", "", nil)
	require.Equal(t, 200, r.status)
	assert.Contains(t, string(r.body), `"reserve":{"critical":0.2,"high":0.1}`)
}
