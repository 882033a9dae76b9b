package server

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// Tokens of the admin clients of these tests.
const (
	annToken = "ann-token"
	bobToken = "bob-token"
	svcToken = "svc-token"
)

// newDBServer starts a server in database mode over rs with opts as given:
// unlike newDBFixture, it adds no bootstrap admin.
func newDBServer(t *testing.T, rs *redistest.Server, opts Options) *fixture {
	t.Helper()
	rdb := rs.Client(t)
	opts.RuleDB = NewRuleDB(rdb, RuleDBOptions{})
	return newFixture(t, "", leases.NewRedisStore(rdb, leases.RedisOptions{}), opts)
}

// mustAdmin sends an admin request and requires status want.
func (f *fixture) mustAdmin(want int, method, path, token string, body any) {
	f.t.Helper()
	r := f.admin(method, path, token, body)
	require.Equal(f.t, want, r.status, "%s %s as %q: body: %s", method, path, token, r.body)
}

// changeLog returns the change log read with an admin's token (the
// bootstrap admin's when empty), newest first, as "who op kind name".
func (f *fixture) changeLog(token string) []string {
	f.t.Helper()
	r := f.admin(http.MethodGet, protocol.PathAdminChanges, token, nil)
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	var ch protocol.AdminChanges
	require.NoError(f.t, json.Unmarshal(r.body, &ch))
	out := make([]string, len(ch.Changes))
	for i, c := range ch.Changes {
		out[i] = c.Who + " " + c.Op + " " + c.Kind + " " + c.Name
	}
	return out
}

// TestNamedAdmins: two admin clients each make a change, through two
// servers, and the change log names each, and the bootstrap admin by
// Options.AdminName; a client without the admin scope gets 403 on every
// admin route; a demoted admin loses access at once on the server that
// made the change and within DefaultDBCheckInterval on the other.
func TestNamedAdmins(t *testing.T) {
	rs := redistest.Start(t)
	a := newDBFixture(t, rs, Options{AdminName: "root"})
	b := newDBFixture(t, rs, Options{AdminName: "root"})
	clients := itemPath(protocol.PathAdminClients)
	a.mustAdmin(http.StatusOK, http.MethodPut, clients("ann"), "", protocol.AdminClient{TokenSHA256: sha(annToken), Admin: true})
	a.mustAdmin(http.StatusOK, http.MethodPut, clients("bob"), "", protocol.AdminClient{TokenSHA256: sha(bobToken), Keys: []string{"user:*"}, Admin: true})
	a.mustAdmin(http.StatusOK, http.MethodPut, clients("svc"), "", protocol.AdminClient{TokenSHA256: sha(svcToken), Keys: []string{"user:*"}})
	within(t, DefaultDBCheckInterval, "the clients on b", func() bool { return b.srv.Rules().client("svc") != nil })

	a.mustAdmin(http.StatusOK, http.MethodPut, itemPath(protocol.PathAdminRules)("api"), annToken, protocol.AdminRule{Match: "api:*", Limit: 5, Period: "1s"})
	b.mustAdmin(http.StatusOK, http.MethodPut, itemPath(protocol.PathAdminOverrides)("user:7"), bobToken, protocol.AdminOverride{Limit: 2, Period: "1s"})
	assert.Equal(t, []string{
		"bob put override user:7",
		"ann put rule api",
		"root put client svc",
		"root put client bob",
		"root put client ann",
	}, a.changeLog(""))
	assert.Contains(t, b.logs.String(), `msg="rule database changed" who=bob op=put kind=override name=user:7`)

	// Admin clients are clients: bob leases his keys; ann has none.
	assert.True(t, a.check(bobToken, "user:1").Allowed)
	assert.Equal(t, http.StatusForbidden, a.postJSON(protocol.PathCheck, annToken, protocol.CheckRequest{Keys: []string{"user:1"}}).status)
	// The listing shows the scope.
	got := a.admin(http.MethodGet, clients("ann"), annToken, nil)
	require.Equal(t, http.StatusOK, got.status)
	var ann protocol.AdminClient
	require.NoError(t, json.Unmarshal(got.body, &ann))
	assert.True(t, ann.Admin)

	routes := []struct{ method, path string }{
		{http.MethodGet, protocol.PathAdminRules},
		{http.MethodGet, itemPath(protocol.PathAdminRules)("api")},
		{http.MethodPut, itemPath(protocol.PathAdminRules)("api")},
		{http.MethodDelete, itemPath(protocol.PathAdminRules)("api")},
		{http.MethodGet, protocol.PathAdminClients},
		{http.MethodPut, clients("svc")},
		{http.MethodDelete, clients("ann")},
		{http.MethodGet, itemPath(protocol.PathAdminOverrides)("user:7")},
		{http.MethodPut, itemPath(protocol.PathAdminOverrides)("user:7")},
		{http.MethodGet, protocol.PathAdminChanges},
		{http.MethodPut, protocol.PathAdminSettings},
	}
	for _, rt := range routes {
		t.Run("svc "+rt.method+" "+rt.path, func(t *testing.T) {
			r := a.admin(rt.method, rt.path, svcToken, protocol.AdminRule{Match: "api:*", Limit: 1, Period: "1s"})
			require.Equal(t, http.StatusForbidden, r.status, "body: %s", r.body)
			p := r.problem(t)
			assert.Equal(t, protocol.CodeAdminForbidden, p.Code)
			assert.Contains(t, p.Detail, `client "svc" has no admin scope`)
		})
	}
	assert.Len(t, a.changeLog(""), 5, "svc changed nothing")

	// ann demotes bob through a: refused on a at once, on b within the
	// check interval (pub/sub brings it sooner).
	a.mustAdmin(http.StatusOK, http.MethodPut, clients("bob"), annToken, protocol.AdminClient{TokenSHA256: sha(bobToken), Keys: []string{"user:*"}})
	assert.Equal(t, http.StatusForbidden, a.admin(http.MethodGet, protocol.PathAdminRules, bobToken, nil).status)
	took := within(t, DefaultDBCheckInterval, "bob demoted on b", func() bool {
		return b.admin(http.MethodGet, protocol.PathAdminRules, bobToken, nil).status == http.StatusForbidden
	})
	t.Logf("bob lost admin access on b after %v", took)
	assert.True(t, b.check(bobToken, "user:1").Allowed, "bob is still a client")
}

// itemPath returns a function that appends an item's name to prefix.
func itemPath(prefix string) func(string) string {
	return func(name string) string { return prefix + "/" + name }
}

// TestAdminLockout: an admin may delete its own client while another admin
// remains; on a server without a bootstrap admin, a change that would leave
// no admin client is refused with 422 and stores nothing; with a bootstrap
// admin it is allowed. No admin client may take the bootstrap admin's name.
func TestAdminLockout(t *testing.T) {
	rs := redistest.Start(t)
	boot := newDBFixture(t, rs, Options{})
	clients := itemPath(protocol.PathAdminClients)
	boot.mustAdmin(http.StatusOK, http.MethodPut, clients("ann"), "", protocol.AdminClient{TokenSHA256: sha(annToken), Admin: true})
	boot.mustAdmin(http.StatusOK, http.MethodPut, clients("svc"), "", protocol.AdminClient{TokenSHA256: sha(svcToken), Keys: []string{"*"}})
	r := boot.admin(http.MethodPut, clients(AdminPrincipal), "", protocol.AdminClient{TokenSHA256: sha(bobToken), Admin: true})
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "body: %s", r.body)
	assert.Contains(t, r.problem(t).Detail, "is the name of the bootstrap admin")

	noBoot := newDBServer(t, rs, Options{})
	// The bootstrap token means nothing here.
	assert.Equal(t, http.StatusUnauthorized, noBoot.admin(http.MethodGet, protocol.PathAdminRules, "", nil).status)

	tests := []struct {
		name   string
		method string
		body   any
	}{
		{"ann deletes herself", http.MethodDelete, nil},
		{"ann demotes herself", http.MethodPut, protocol.AdminClient{TokenSHA256: sha(annToken), Keys: []string{"x:*"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := noBoot.admin(tt.method, clients("ann"), annToken, tt.body)
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "body: %s", r.body)
			p := r.problem(t)
			assert.Equal(t, protocol.CodeInvalidRule, p.Code)
			assert.Contains(t, p.Detail, ErrAdminLockout.Error())
			assert.Contains(t, p.Detail, "nothing was stored")
		})
	}
	noBoot.mustAdmin(http.StatusNoContent, http.MethodDelete, clients("svc"), annToken, nil)
	// With a second admin, ann may delete herself: she is out at once.
	noBoot.mustAdmin(http.StatusOK, http.MethodPut, clients("bob"), annToken, protocol.AdminClient{TokenSHA256: sha(bobToken), Admin: true})
	noBoot.mustAdmin(http.StatusNoContent, http.MethodDelete, clients("ann"), annToken, nil)
	assert.Equal(t, http.StatusUnauthorized, noBoot.admin(http.MethodGet, protocol.PathAdminRules, annToken, nil).status)
	assert.Contains(t, noBoot.logs.String(), `msg="admin removed its own admin scope`)
	// On the server with a bootstrap admin, the last admin client may go.
	within(t, DefaultDBCheckInterval, "ann deleted on boot", func() bool { return boot.srv.Rules().client("ann") == nil })
	boot.mustAdmin(http.StatusNoContent, http.MethodDelete, clients("bob"), bobToken, nil)
	assert.Equal(t, http.StatusUnauthorized, boot.admin(http.MethodGet, protocol.PathAdminRules, bobToken, nil).status)
	boot.mustAdmin(http.StatusOK, http.MethodGet, protocol.PathAdminRules, "", nil)
	assert.Equal(t, []string{
		"bob delete client bob", "ann delete client ann", "ann put client bob", "ann delete client svc",
		"admin put client svc", "admin put client ann",
	}, boot.changeLog(""))
}

// TestAdminClientInRulesFile: in file mode the admin clients are those of
// the rules file; one with no keys is valid and may use no key.
func TestAdminClientInRulesFile(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	f := newFixture(t, authRulesYAML()+`
  - name: ops
    token_sha256: "`+sha(annToken)+`"
    admin: true
`, leases.NewRedisStore(rdb, leases.RedisOptions{}), Options{RuleDB: NewRuleDB(rdb, RuleDBOptions{})})
	f.mustAdmin(http.StatusOK, http.MethodPut, itemPath(protocol.PathAdminRules)("r"), annToken, protocol.AdminRule{Match: "r:*", Limit: 1, Period: "1s"})
	assert.Equal(t, []string{"ops put rule r"}, f.changeLog(annToken)[:1])
	assert.Equal(t, http.StatusForbidden, f.admin(http.MethodGet, protocol.PathAdminRules, alphaToken, nil).status)
	assert.Equal(t, http.StatusForbidden, f.postJSON(protocol.PathCheck, annToken, protocol.CheckRequest{Keys: []string{"user:1"}}).status)

	_, err := ParseRules([]byte("clients:\n  - {name: c, token_sha256: \"" + sha("x") + "\"}\n"))
	require.ErrorIs(t, err, leases.ErrInvalidRules, "a client that is not an admin needs keys")
}
