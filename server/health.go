package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/ratelease/ratelease/protocol"
)

// statusBody is the body of GET /healthz and of a GET /readyz that
// succeeds.
type statusBody struct {
	Status string `json:"status"`
	// Detail says what an operator should know although the server is
	// ready: that the last reload of the rules file failed, say.
	Detail string `json:"detail,omitempty"`
}

// handleHealthz serves GET /healthz: the process is alive.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, statusBody{Status: "ok"})
}

// handleReadyz serves GET /readyz: the server can serve leases, that is
// the store answers a ping within ReadyTimeout, the server is not
// shutting down, and in database mode it has read the rules. When the last reload of the rules file failed, the server
// is still ready (the rules in force serve), and the body's detail says
// that the file on disk is not in force, and why.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeShuttingDown, "the server is shutting down: use another lease server"))
		return
	}
	if s.state.Load().pending {
		s.rulesPending(w)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
	err := s.opts.Store.Ping(ctx)
	cancel()
	if err != nil {
		s.log.WarnContext(r.Context(), "readiness check: store ping failed", "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, protocol.NewProblem(protocol.CodeStoreUnavailable, "the store does not answer a ping: the server cannot serve leases until it does"))
		return
	}
	body := statusBody{Status: "ok"}
	if err := s.ReloadError(); err != nil {
		body.Detail = fmt.Sprintf("the last reload of %s failed; the rules in force (version %s) still serve: %v", s.rulesSource(), s.Rules().Version(), err)
	}
	writeJSON(w, http.StatusOK, body)
}
