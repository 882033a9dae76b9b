package server

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/protocol"
)

// TestLeaseCallTakes: direct takes ride in a lease call beside lease
// entries; each take is all or nothing across its keys and fails alone.
func TestLeaseCallTakes(t *testing.T) {
	f := newFixture(t, authRulesYAML(), nil, Options{})
	one, three := int64(1), int64(3)
	r := f.postJSON(protocol.PathLeases, betaToken, protocol.LeaseRequest{
		ClientID: "b1",
		Leases:   []protocol.LeaseEntry{{Key: "user:1", Want: 5}},
		Takes: []protocol.CheckRequest{
			{Keys: []string{"user:1", "user:2"}, Cost: &three}, // allowed
			{Keys: []string{"user:3", "tiny:1"}, Cost: &one},   // beta may not use tiny:*
			{Keys: []string{"user:4"}, Cost: new(int64(101))},  // more than the bucket
		},
	})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var resp protocol.LeaseResponse
	require.NoError(t, json.Unmarshal(r.body, &resp))
	require.Len(t, resp.Leases, 1)
	assert.EqualValues(t, 5, resp.Leases[0].Granted)
	require.Len(t, resp.Takes, 3)

	ok := resp.Takes[0]
	assert.True(t, ok.Allowed)
	require.Len(t, ok.Keys, 2)
	assert.Equal(t, "per-user", ok.Keys[0].Rule)
	assert.EqualValues(t, 2000, ok.Keys[0].LeaseTTLMillis, "a direct take learns the rule's lease TTL")
	assert.EqualValues(t, 100-3, ok.Keys[0].Remaining, "the takes are decided before the lease entries")
	assert.EqualValues(t, 97, ok.Keys[1].Remaining)

	require.NotNil(t, resp.Takes[1].Error)
	assert.Equal(t, protocol.CodeForbidden, resp.Takes[1].Error.Code)
	assert.False(t, resp.Takes[1].Allowed)
	assert.Equal(t, 100.0, f.state("user:3").Level, "a forbidden take touches none of its keys")

	require.NotNil(t, resp.Takes[2].Error)
	assert.Equal(t, protocol.CodeCostExceedsBurst, resp.Takes[2].Error.Code)
}

// TestLeaseCallTakesAllOrNothing: a take denied by one key gives back what
// it took from the others, and says when to retry.
func TestLeaseCallTakesAllOrNothing(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	take := func(keys ...string) protocol.CheckResponse {
		t.Helper()
		r := f.postJSON(protocol.PathLeases, "", protocol.LeaseRequest{ClientID: "c", Takes: []protocol.CheckRequest{{Keys: keys}}})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var resp protocol.LeaseResponse
		require.NoError(t, json.Unmarshal(r.body, &resp))
		require.Empty(t, resp.Leases)
		require.Len(t, resp.Takes, 1)
		return resp.Takes[0]
	}
	free := take("free:1")
	assert.True(t, free.Allowed)
	assert.True(t, free.Keys[0].Unlimited, "no rule, default allow")
	require.True(t, take("tiny:a").Allowed)
	d := take("user:1", "tiny:a")
	assert.False(t, d.Allowed)
	assert.Greater(t, d.RetryAfterMillis, int64(3_000_000), "tiny refills one token an hour")
	assert.True(t, d.Keys[0].Allowed)
	assert.False(t, d.Keys[1].Allowed)
	assert.InDelta(t, 100, f.state("user:1").Level, 0.5, "user:1's token was given back")
}

// TestLeaseCallTakesValidation: takes count against the entry limit and
// are validated like POST /v1/check, naming the take at fault.
func TestLeaseCallTakesValidation(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{})
	for _, tc := range []struct {
		name, body string
		code       protocol.Code
	}{
		{"empty call", `{"client_id":"c","leases":[],"takes":[]}`, protocol.CodeInvalidRequest},
		{"empty take", `{"client_id":"c","takes":[{"keys":[]}]}`, protocol.CodeInvalidRequest},
		{"duplicate key in a take", `{"client_id":"c","takes":[{"keys":["user:1","user:1"]}]}`, protocol.CodeDuplicateKey},
		{"negative cost", `{"client_id":"c","takes":[{"keys":["user:1"],"cost":-1}]}`, protocol.CodeInvalidCount},
		{"bad key", `{"client_id":"c","takes":[{"keys":[""]}]}`, protocol.CodeInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.postJSON(protocol.PathLeases, "", tc.body)
			assert.Equal(t, tc.code, r.problem(t).Code, "body: %s", r.body)
		})
	}
	// 600 lease entries and a take of 401 keys are more than 1,000 entries.
	req := protocol.LeaseRequest{ClientID: "c"}
	for i := range 600 {
		req.Leases = append(req.Leases, protocol.LeaseEntry{Key: "user:" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Want: 1})
	}
	var keys []string
	for i := range 401 {
		keys = append(keys, "k:"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	req.Takes = []protocol.CheckRequest{{Keys: keys}}
	r := f.postJSON(protocol.PathLeases, "", req)
	assert.Equal(t, protocol.CodeTooManyEntries, r.problem(t).Code)
	assert.Zero(t, f.state("user:aa").Leases, "a refused call changes nothing")
}
