package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// AdminPrincipal is the name the admin API logs, and writes in the change
// log, for the bootstrap admin (Options.AdminTokenSHA256) when
// Options.AdminName is empty. Admin clients are named by their client
// names (see admins.go).
const AdminPrincipal = "admin"

// adminRoutes registers the admin API (/v1/admin/...) on mux. Every route
// needs an admin's token: the bootstrap admin's (Options.AdminTokenSHA256)
// or that of a client with the admin scope (see admins.go). A request
// without a token, or with an unknown one, gets 401; the token of a client
// without the admin scope gets 403 admin_forbidden. A server without a
// RuleDB answers 404 no_rule_db.
//
//	GET    /v1/admin/rules             every rule (protocol.AdminRules)
//	GET    /v1/admin/rules/{name}      one rule, with ETag
//	PUT    /v1/admin/rules/{name}      create or replace it (protocol.AdminRule)
//	DELETE /v1/admin/rules/{name}
//	GET    /v1/admin/clients           every client (protocol.AdminClients)
//	GET|PUT|DELETE /v1/admin/clients/{name}     (protocol.AdminClient)
//	GET    /v1/admin/overrides         a page of the overrides (protocol.AdminOverrides; ?prefix=&cursor=&limit=)
//	GET|PUT|DELETE /v1/admin/overrides/{key}    (protocol.AdminOverride)
//	GET    /v1/admin/changes           the newest changes (protocol.AdminChanges; ?n=, at most 1000)
//	GET|PUT /v1/admin/settings         the rule set's settings: its default (protocol.AdminSettings)
//
// A malformed query parameter (the prefix, cursor or limit of the
// override listing, n of the changes) gets 400 invalid_query. A PUT body with an unknown field, a field name in another
// case than its own ("LIMIT") or a field given twice gets 400 invalid_json
// naming it (protocol.DecodeAdmin), and changes nothing.
// PUT and DELETE honour If-Match ("<version>" from an ETag, or *) and PUT
// If-None-Match: *; a stale one gets 412 precondition_failed and changes
// nothing. The settings, never stored, are answered with ETag "0", and
// If-Match "0" means "not stored yet": the write succeeds only if nothing
// is stored (as If-None-Match: *). A rule or client change that would leave the rule set invalid
// gets 422 invalid_rule, with the rule or client and field named as
// loading a rules file names them, and changes nothing. A stored item
// that does not decode (written behind the API's back) gets 422
// invalid_rule naming it, to a GET of it, to the listing of its kind
// (the rules' listing for the settings too, as it holds the default; a
// listing that left it out would hide it) or a page of overrides that
// holds it, and to a rule set change that
// leaves it in place; a DELETE or PUT of it is served. So does a change
// log entry that does not decode, to GET /v1/admin/changes, until newer
// changes push it out of the log. A stored override that does not decode
// is not applied (the key is limited by its rule) and is logged at ERROR.
func (s *Server) adminRoutes(mux *http.ServeMux) {
	type route struct {
		methods []string
		path    string
		h       map[string]adminHandler
	}
	routes := []route{
		{[]string{http.MethodGet}, protocol.PathAdminRules, map[string]adminHandler{http.MethodGet: s.adminListRules}},
		{[]string{http.MethodGet, http.MethodPut, http.MethodDelete}, protocol.PathAdminRules + "/{name}", map[string]adminHandler{
			http.MethodGet: s.adminGetRule, http.MethodPut: s.adminPutRule, http.MethodDelete: s.adminDeleteRule}},
		{[]string{http.MethodGet}, protocol.PathAdminClients, map[string]adminHandler{http.MethodGet: s.adminListClients}},
		{[]string{http.MethodGet, http.MethodPut, http.MethodDelete}, protocol.PathAdminClients + "/{name}", map[string]adminHandler{
			http.MethodGet: s.adminGetClient, http.MethodPut: s.adminPutClient, http.MethodDelete: s.adminDeleteClient}},
		{[]string{http.MethodGet}, protocol.PathAdminOverrides, map[string]adminHandler{http.MethodGet: s.adminListOverrides}},
		{[]string{http.MethodGet, http.MethodPut, http.MethodDelete}, protocol.PathAdminOverrides + "/{key...}", map[string]adminHandler{
			http.MethodGet: s.adminGetOverride, http.MethodPut: s.adminPutOverride, http.MethodDelete: s.adminDeleteOverride}},
		{[]string{http.MethodGet}, protocol.PathAdminChanges, map[string]adminHandler{http.MethodGet: s.adminChanges}},
		{[]string{http.MethodGet, http.MethodPut}, protocol.PathAdminSettings, map[string]adminHandler{
			http.MethodGet: s.adminGetSettings, http.MethodPut: s.adminPutSettings}},
	}
	for _, rt := range routes {
		allow := []string{}
		for _, m := range rt.methods {
			s.handle(mux, m+" "+rt.path, s.adminAuthed(rt.h[m]))
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
		}
		s.handle(mux, rt.path, methodNotAllowed(strings.Join(allow, ", ")))
	}
}

// adminHandler serves an admin request of principal who.
type adminHandler func(w http.ResponseWriter, r *http.Request, db *RuleDB, who string)

// adminAuthed authenticates the admin (see adminRoutes and authAdmin).
func (s *Server) adminAuthed(h adminHandler) http.HandlerFunc {
	boot := s.bootstrapAdmin()
	return func(w http.ResponseWriter, r *http.Request) {
		if who, ok := s.authAdmin(w, r, boot); ok {
			h(w, r, s.opts.RuleDB, who)
		}
	}
}

// adminFailed answers a failed rule database call.
func (s *Server) adminFailed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, leases.ErrInvalidRules), errors.Is(err, ErrInsecureListen):
		detail := err.Error()
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			detail += ": nothing was stored"
		}
		writeProblem(w, protocol.NewProblem(protocol.CodeInvalidRule, detail))
	case errors.Is(err, ErrPrecondition):
		writeProblem(w, protocol.NewProblem(protocol.CodePreconditionFailed, err.Error()+
			": someone changed it since you read it; GET it again, then retry with its ETag in If-Match. Nothing was stored"))
	case errors.Is(err, ErrNoSuchItem):
		writeProblem(w, protocol.NewProblem(protocol.CodeNoSuchItem, err.Error()+": it does not exist"))
	case errors.Is(err, ErrContention):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeStoreUnavailable, err.Error()+": retry"))
	default:
		s.storeFailed(w, r, err)
	}
}

// ifMatch returns the precondition of a write: "" none, "*" the item must
// exist, "!" it must not (If-None-Match: *, or If-Match "0": the ETag of
// settings never stored, which GET answers with version 0), or the version
// an If-Match ETag names. It writes a problem and returns false for a
// malformed one.
func ifMatch(w http.ResponseWriter, r *http.Request) (string, bool) {
	if v := strings.TrimSpace(r.Header.Get("If-None-Match")); v != "" {
		if v != "*" {
			writeProblem(w, protocol.NewProblem(protocol.CodeInvalidRequest, "If-None-Match: only * (create, never replace) is supported"))
			return "", false
		}
		return "!", true
	}
	v := strings.TrimSpace(r.Header.Get("If-Match"))
	if v == "" || v == "*" {
		return v, true
	}
	v = strings.TrimPrefix(v, "W/")
	n, err := strconv.ParseInt(strings.Trim(v, `"`), 10, 64)
	if err == nil && n == 0 {
		return "!", true // the ETag of an item not stored yet: it still must not be
	}
	if err != nil || n < 0 {
		writeProblem(w, protocol.NewProblem(protocol.CodeInvalidRequest, fmt.Sprintf(
			"If-Match %q is not an ETag of this API: send the ETag header of a GET, such as \"12\"", v)))
		return "", false
	}
	return strconv.FormatInt(n, 10), true
}

// writeItem writes an admin item with its version as ETag.
func writeItem(w http.ResponseWriter, version int64, v any) {
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(version, 10)))
	writeJSON(w, http.StatusOK, v)
}

// decodeAdmin decodes a PUT body strictly (see decodeAdminBody).
func (s *Server) decodeAdmin(w http.ResponseWriter, r *http.Request, v any) bool {
	body, ok := s.readBody(w, r)
	if !ok {
		return false
	}
	if p := decodeAdminBody(body, v); p != nil {
		writeProblem(w, p)
		return false
	}
	return true
}

// decodeAdminBody decodes the body of an admin PUT into v strictly (see
// protocol.DecodeAdmin).
func decodeAdminBody(body []byte, v any) *protocol.Problem {
	if err := protocol.DecodeAdmin(body, v); err != nil {
		if p, ok := errors.AsType[*protocol.Problem](err); ok {
			return p
		}
		return protocol.NewProblem(protocol.CodeInvalidJSON, "body: "+err.Error())
	}
	return nil
}

// nameMatches checks that the name in a body, when given, is the path's.
func nameMatches(w http.ResponseWriter, field, body, path string) bool {
	if body != "" && body != path {
		writeProblem(w, protocol.NewProblem(protocol.CodeInvalidRequest, fmt.Sprintf(
			"%s %q in the body is not %q in the path: leave it out or make them equal", field, body, path)))
		return false
	}
	return true
}

// setCheck is the extra check of a rule set change: it must keep an admin
// (checkAdmins), and in database mode the new set must not leave a
// non-loopback listener without clients.
func (s *Server) setCheck(r *Rules) error {
	if err := s.checkAdmins(r); err != nil {
		return err
	}
	if s.db == nil {
		return nil
	}
	if addr := *s.listenAddr.Load(); addr != "" {
		return checkExposure(addr, r, s.opts.Insecure)
	}
	return nil
}

// changed logs a change and, in database mode, syncs the server at once,
// so that the caller's next request sees it here.
func (s *Server) changed(ctx context.Context, who, op, kind, name string, version int64) {
	s.log.InfoContext(ctx, "rule database changed", "who", who, "op", op, "kind", kind, "name", name, "version", version)
	if s.db != nil {
		if err := s.SyncRuleDB(ctx); err != nil {
			s.log.WarnContext(ctx, "rule database: sync after a change failed; the periodic check will retry", "err", err)
		}
		s.noteSelfDemotion(ctx, who, kind, name)
	}
}

func (s *Server) adminListRules(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	snap, err := db.snapshot(r.Context())
	if err == nil {
		err = snap.faults(KindRule, KindSetting) // a listing without them would hide them
	}
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	out := protocol.AdminRules{Version: snap.version, Default: cmp.Or(snap.settings.Default, string(leases.DefaultAllow)), Rules: snap.rules}
	if out.Rules == nil {
		out.Rules = []protocol.AdminRule{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) adminGetRule(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	rule, err := db.Rule(r.Context(), r.PathValue("name"))
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	writeItem(w, rule.Version, rule)
}

func (s *Server) adminPutRule(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	name := r.PathValue("name")
	var rule protocol.AdminRule
	cond, ok := ifMatch(w, r)
	if !ok || !s.decodeAdmin(w, r, &rule) || !nameMatches(w, "name", rule.Name, name) {
		return
	}
	rule.Name = name
	v, err := db.PutRule(r.Context(), who, rule, cond, s.setCheck)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "put", KindRule, name, v)
	rule.Version = v
	writeItem(w, v, rule)
}

func (s *Server) adminDeleteRule(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	name := r.PathValue("name")
	cond, ok := ifMatch(w, r)
	if !ok {
		return
	}
	v, err := db.DeleteRule(r.Context(), who, name, cond, s.setCheck)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "delete", KindRule, name, v)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) adminGetSettings(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	st, err := db.Settings(r.Context())
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	writeItem(w, st.Version, st)
}

func (s *Server) adminPutSettings(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	var st protocol.AdminSettings
	cond, ok := ifMatch(w, r)
	if !ok || !s.decodeAdmin(w, r, &st) {
		return
	}
	v, err := db.PutSettings(r.Context(), who, st, cond, s.setCheck)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "put", KindSetting, SettingsName, v)
	st.Version = v
	writeItem(w, v, st)
}

func (s *Server) adminListClients(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	snap, err := db.snapshot(r.Context())
	if err == nil {
		err = snap.faults(KindClient) // a listing without them would hide them
	}
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	out := protocol.AdminClients{Version: snap.version, Clients: snap.clients}
	if out.Clients == nil {
		out.Clients = []protocol.AdminClient{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) adminGetClient(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	c, err := db.ClientNamed(r.Context(), r.PathValue("name"))
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	writeItem(w, c.Version, c)
}

func (s *Server) adminPutClient(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	name := r.PathValue("name")
	var c protocol.AdminClient
	cond, ok := ifMatch(w, r)
	if !ok || !s.decodeAdmin(w, r, &c) || !nameMatches(w, "name", c.Name, name) {
		return
	}
	c.Name = name
	v, err := db.PutClient(r.Context(), who, c, cond, s.setCheck)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "put", KindClient, name, v)
	c.Version = v
	writeItem(w, v, c)
}

func (s *Server) adminDeleteClient(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	name := r.PathValue("name")
	cond, ok := ifMatch(w, r)
	if !ok {
		return
	}
	v, err := db.DeleteClient(r.Context(), who, name, cond, s.setCheck)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "delete", KindClient, name, v)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) adminGetOverride(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	o, err := db.Override(r.Context(), r.PathValue("key"))
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	writeItem(w, o.Version, o)
}

func (s *Server) adminPutOverride(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	key := r.PathValue("key")
	var o protocol.AdminOverride
	cond, ok := ifMatch(w, r)
	if !ok || !s.decodeAdmin(w, r, &o) || !nameMatches(w, "key", o.Key, key) {
		return
	}
	o.Key = key
	v, err := db.PutOverride(r.Context(), who, o, cond)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "put", KindOverride, key, v)
	o.Version = v
	writeItem(w, v, o)
}

func (s *Server) adminDeleteOverride(w http.ResponseWriter, r *http.Request, db *RuleDB, who string) {
	key := r.PathValue("key")
	cond, ok := ifMatch(w, r)
	if !ok {
		return
	}
	v, err := db.DeleteOverride(r.Context(), who, key, cond)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	s.changed(r.Context(), who, "delete", KindOverride, key, v)
	w.WriteHeader(http.StatusNoContent)
}

// maxChanges is the most changes GET /v1/admin/changes returns.
const maxChanges = 1000

func (s *Server) adminChanges(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	n := 100
	if q := r.URL.Query().Get("n"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 1 {
			writeProblem(w, protocol.NewProblem(protocol.CodeInvalidQuery, fmt.Sprintf("n=%q: want a whole number from 1 (larger ones are read as %d)", q, maxChanges)))
			return
		}
		n = min(v, maxChanges)
	}
	out, err := db.Changes(r.Context(), n)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
