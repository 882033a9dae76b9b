package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// principal is an authenticated caller of the API: one client of the rules
// file, or anonymous when the rules configure no clients.
type principal struct {
	index int // position in Rules.clients; -1 for anonymous
	name  string
	hash  [sha256.Size]byte
	keys  []string // glob patterns of the keys it may use; nil: every key
	admin bool     // it may use the admin API (ClientConfig.Admin)
}

// apiHandler serves an authenticated /v1 request with one version of the
// rules; who is the principal that sent it: a client of the rules, or
// anonymous.
type apiHandler func(w http.ResponseWriter, r *http.Request, st *state, who *principal)

// authed loads the rules in force and authenticates the caller: when the
// rules configure clients, the request needs "Authorization: Bearer
// <token>" with the token of one of them, or it gets 401.
func (s *Server) authed(h apiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := s.state.Load()
		if st.pending {
			s.rulesPending(w)
			return
		}
		if !st.rules.authRequired() {
			h(w, r, st, anonymous)
			return
		}
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, "send the header \"Authorization: Bearer <token>\": this server authenticates its clients")
			return
		}
		c := st.rules.authenticate(token)
		if c == nil {
			unauthorized(w, "the bearer token is not the token of any client of "+s.rulesSource())
			return
		}
		h(w, r, st, c)
	}
}

// rulesPending answers a call while the rule database has not been read
// (state.pending): 503 store_unavailable, as while the store does not
// answer. The detail says why, by kind only (the error itself, which may
// name rules and clients, is in the log): Redis does not answer, refuses
// the server's commands (a misconfiguration), or holds a rule set this
// server cannot put in force.
func (s *Server) rulesPending(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeProblem(w, protocol.NewProblem(protocol.CodeStoreUnavailable, s.pendingReason()+": this server serves once they are; use another lease server"))
}

// pendingReason says, by kind only, why a pending server has read no
// rules yet (see rulesPending).
func (s *Server) pendingReason() string {
	switch err := s.ReloadError(); {
	case err == nil:
	case redisRefuses(err):
		return "Redis refuses this server's commands on the rule database (a misconfiguration: see the server's log), so its rules have not been read yet"
	case !errors.Is(err, leases.ErrStoreUnavailable):
		return "the rule database's rule set cannot be put in force on this server (see its log), and no rules have been read yet"
	}
	return "the rule database did not answer when this server started, and its rules have not been read yet"
}

func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ratelease"`)
	writeProblem(w, protocol.NewProblem(protocol.CodeUnauthorized, detail))
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header value. The scheme is case-insensitive (RFC 9110).
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// metricsAuth requires the bearer token of Options.MetricsTokenSHA256 for
// h, when it is set. It guards /metrics and the status page (/status).
func (s *Server) metricsAuth(h http.HandlerFunc) http.HandlerFunc {
	if s.opts.MetricsTokenSHA256 == "" {
		return h
	}
	var want [sha256.Size]byte
	_, _ = hex.Decode(want[:], []byte(s.opts.MetricsTokenSHA256)) // validated by withDefaults
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, "send the header \"Authorization: Bearer <token>\": this server requires a token for /metrics (rateleased -metrics-token-sha256)")
			return
		}
		got := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			unauthorized(w, "the bearer token is not the metrics token (rateleased -metrics-token-sha256)")
			return
		}
		h(w, r)
	}
}

// forbidden is the problem of a key outside the caller's patterns, at
// where in the request.
func (s *Server) forbidden(who *principal, key, where string) *protocol.Problem {
	fix := "change the client's keys in the rules file"
	if s.db != nil {
		fix = fmt.Sprintf("change the client's keys in the rule database (PUT %s/%s)", protocol.PathAdminClients, who.name)
	}
	return protocol.NewProblem(protocol.CodeForbidden, fmt.Sprintf(
		"%s: client %q may not use key %q: its key patterns are %q; %s",
		where, who.name, key, who.keys, fix))
}

// rulesSource names where the rules in force come from, for the messages
// that tell a caller what to change.
func (s *Server) rulesSource() string {
	if s.db != nil {
		return "the rule database"
	}
	return "the rules file"
}

// authRequired reports whether callers must present a bearer token.
func (r *Rules) authRequired() bool { return len(r.clients) > 0 }

// authenticate returns the principal whose token hash matches token, or nil.
// It compares the hash with every client's, in constant time each and
// without stopping at a match, so the time taken does not reveal which
// client (if any) matched.
func (r *Rules) authenticate(token string) *principal {
	return r.authenticateSum(sha256.Sum256([]byte(token)))
}

// authenticateSum is authenticate for the SHA-256 of the token.
func (r *Rules) authenticateSum(sum [sha256.Size]byte) *principal {
	found := -1
	for i := range r.clients {
		eq := subtle.ConstantTimeCompare(sum[:], r.clients[i].hash[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return nil
	}
	return &r.clients[found]
}

// anonymous is the caller of every request when the rules configure no
// clients: it may use every key.
var anonymous = &principal{index: -1, name: AnonymousClient}

// may reports whether the principal may use key. A principal without key
// patterns (anonymous) may use every key.
func (c *principal) may(key string) bool {
	if c.keys == nil {
		return true
	}
	for _, p := range c.keys {
		if leases.MatchGlob(p, key) {
			return true
		}
	}
	return false
}
