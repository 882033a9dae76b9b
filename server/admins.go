package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// The admin principals. The admin API accepts two kinds of token:
//
//   - the bootstrap admin's (Options.AdminTokenSHA256, rateleased
//     -admin-token-sha256), named Options.AdminName ("admin" unless
//     rateleased -admin-name says otherwise);
//   - the token of any client of the rules in force that has the admin scope
//     (admin: true in protocol.AdminClient or in a rules file's client),
//     named by its client name.
//
// So several operators each have their own token, and the change log says
// which of them made each change. Admin clients are clients like the others:
// they may also lease the keys their patterns allow (an admin client may
// have none). Their tokens are checked against the rules in force at each
// request, so a change of a client — promoted, demoted, deleted, its token
// replaced — holds on the server that made it from the next request on, and
// on every other server once it has synced: at once through pub/sub, and
// within Options.DBCheckInterval (one second by default) at the latest. In
// file mode the admin clients are those of the rules file, and a change
// holds once the file is reloaded (Options.ReloadInterval).
//
// An admin may demote or delete its own client. The change is stored and
// logged like any other (and logged again at WARN, since the caller's next
// admin request gets 401 or 403); other admins, or the bootstrap admin, can
// restore it. What is refused, with 422 invalid_rule and nothing stored, is a
// change that would leave no admin at all: in database mode, on a server
// without a bootstrap admin, a change after which no client of the rule set
// has the admin scope. (Such a server could not reach its own admin API
// again; a server with a bootstrap token can, so there the change is
// allowed.) The check is this server's: a fleet where only some servers
// carry the bootstrap token is still reachable through those.

// ErrAdminLockout is wrapped, with leases.ErrInvalidRules, by the error of a
// rule database change that would leave no admin principal: no admin client
// in the rule set, on a server in database mode without a bootstrap admin.
var ErrAdminLockout = errors.New("the change would leave no admin")

// bootstrapAdmin returns the SHA-256 of the bootstrap admin's token, nil
// when there is none.
func (s *Server) bootstrapAdmin() *[sha256.Size]byte {
	if s.opts.AdminTokenSHA256 == "" {
		return nil
	}
	var sum [sha256.Size]byte
	_, _ = hex.Decode(sum[:], []byte(s.opts.AdminTokenSHA256)) // validated by withDefaults
	return &sum
}

// authAdmin authenticates an admin request and returns the name of its
// principal: the bootstrap admin's when its token matches boot (nil: no
// bootstrap admin), else an admin client's. Otherwise it answers the
// request (404 without a rule database, 401 for a missing or unknown token,
// 403 for the token of a client without the admin scope) and returns false.
func (s *Server) authAdmin(w http.ResponseWriter, r *http.Request, boot *[sha256.Size]byte) (string, bool) {
	if s.opts.RuleDB == nil {
		writeProblem(w, protocol.NewProblem(protocol.CodeNoRuleDB,
			"the admin API is off: it needs a rule database (rateleased -redis)"))
		return "", false
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		unauthorized(w, "send the header \"Authorization: Bearer <admin token>\": the admin API needs the token of an admin client or of the bootstrap admin")
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	isBoot := 0
	if boot != nil {
		isBoot = subtle.ConstantTimeCompare(sum[:], boot[:])
	}
	// Every client's hash is compared, whether or not the bootstrap
	// token matched, so that the time taken tells nothing.
	st := s.state.Load()
	c := st.rules.authenticateSum(sum)
	switch {
	case isBoot == 1:
		return s.opts.AdminName, true
	case st.pending:
		s.rulesPending(w) // the admin clients are not known yet
		return "", false
	case c != nil && c.admin:
		return c.name, true
	case c != nil:
		writeProblem(w, protocol.NewProblem(protocol.CodeAdminForbidden, fmt.Sprintf(
			"client %q has no admin scope: the admin API needs an admin client's token (admin: true) or the bootstrap admin's (rateleased -admin-token-sha256)", c.name)))
		return "", false
	case boot == nil && !s.hasAdminClient():
		unauthorized(w, "this server knows no admin: no client of the rules in force has admin: true and it has no bootstrap admin; start it with -admin-token-sha256 to create one")
		return "", false
	default:
		unauthorized(w, "the bearer token is neither an admin client's nor the bootstrap admin's")
		return "", false
	}
}

// hasAdminClient reports whether a client of the rules in force has the
// admin scope.
func (s *Server) hasAdminClient() bool { return s.state.Load().rules.admins() > 0 }

// admins returns the number of clients with the admin scope.
func (r *Rules) admins() int {
	n := 0
	for i := range r.clients {
		if r.clients[i].admin {
			n++
		}
	}
	return n
}

// checkAdmins is the admin part of a rule set change's check (setCheck):
// no admin client may bear the bootstrap admin's name while there is one,
// and in database mode a server without a bootstrap admin refuses a set
// without admin clients (ErrAdminLockout). Errors wrap
// leases.ErrInvalidRules.
func (s *Server) checkAdmins(r *Rules) error {
	boot := s.opts.AdminTokenSHA256 != ""
	if boot {
		for i := range r.clients {
			if c := &r.clients[i]; c.admin && c.name == s.opts.AdminName {
				return fmt.Errorf("%w: client %q: admin: %q is the name of the bootstrap admin (rateleased -admin-name): give the client another name, so that the change log tells them apart",
					leases.ErrInvalidRules, c.name, c.name)
			}
		}
	}
	if s.db != nil && !boot && r.admins() == 0 {
		return fmt.Errorf("%w: %w: no client of the rule set would have admin: true, and this server has no bootstrap admin (rateleased -admin-token-sha256) to create one again; give another client admin: true first",
			leases.ErrInvalidRules, ErrAdminLockout)
	}
	return nil
}

// noteSelfDemotion logs at WARN when the admin client who has just removed
// its own admin scope (kind client, name who): its next admin request will
// be refused. The rules in force are read after the change's sync.
func (s *Server) noteSelfDemotion(ctx context.Context, who, kind, name string) {
	if s.db == nil || kind != KindClient || name != who || (s.opts.AdminTokenSHA256 != "" && who == s.opts.AdminName) {
		return // file mode, another item, or the bootstrap admin
	}
	if c := s.state.Load().rules.client(name); c != nil && c.admin {
		return
	}
	s.log.WarnContext(ctx, "admin removed its own admin scope: its token no longer opens the admin API; another admin can restore it",
		"who", who)
}

// client returns the client named name, or nil.
func (r *Rules) client(name string) *principal {
	for i := range r.clients {
		if r.clients[i].name == name {
			return &r.clients[i]
		}
	}
	return nil
}
