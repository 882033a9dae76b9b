package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// handleKeyState serves GET /v1/keys/{key}: the key's rule and the state of
// each of its limits in the store (see protocol.KeyStateResponse). A client
// may see the keys its patterns allow, as for leasing; any other key is
// 403. The call changes nothing.
func (s *Server) handleKeyState(w http.ResponseWriter, r *http.Request, st *state, who *principal) {
	key := r.PathValue("key")
	if err := protocol.ValidateKey(key); err != nil {
		writeProblem(w, protocol.NewProblem(protocol.CodeInvalidKey, fmt.Sprintf(
			"key %q: %v: put the key, percent-encoded, after %s", key, err, protocol.PathKeysPrefix)))
		return
	}
	if !who.may(key) {
		writeProblem(w, s.forbidden(who, key, "key"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
	ks, err := st.engine.KeyState(ctx, key)
	cancel()
	if err != nil {
		s.storeFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keyStateWire(&ks, st.rules))
}

// keyStateWire maps the engine's snapshot of a key to the wire.
func keyStateWire(ks *leases.KeyState, rules *Rules) protocol.KeyStateResponse {
	out := protocol.KeyStateResponse{
		Key:       ks.Key,
		Unlimited: ks.Unlimited,
		Default:   string(rules.policy.Default()),
		Version:   rules.Version(),
		Limits:    make([]protocol.KeyLimitState, len(ks.Limits)),
	}
	if ks.Rule != nil {
		info := ruleInfo(ks.Rule)
		out.Rule = &info
	}
	for i := range ks.Limits {
		out.Limits[i] = limitStateWire(i, &ks.Limits[i])
	}
	return out
}

// limitStateWire maps one limit's snapshot to the wire.
func limitStateWire(i int, ls *leases.LimitState) protocol.KeyLimitState {
	l, bs := ls.Limit, ls.State
	out := protocol.KeyLimitState{
		Index:           i,
		Algorithm:       string(l.Algorithm),
		Limit:           l.Limit,
		PeriodMillis:    l.Period.Milliseconds(),
		Burst:           l.Burst,
		Level:           bs.Level,
		Free:            bs.Free,
		Outstanding:     bs.Outstanding,
		Leases:          bs.Leases,
		Holders:         bs.Holders,
		OwnedBy:         bs.Owner,
		NextTokenMillis: bs.Next.Milliseconds(),
		FullMillis:      bs.Full.Milliseconds(),
		AtUnixMillis:    bs.Now.UnixMilli(),
	}
	if a := ls.Bucket.Algorithm; a == leases.FixedWindow || a == leases.SlidingWindowCounter {
		end := bs.WindowEnd.Milliseconds()
		out.WindowEndMillis = &end
	}
	return out
}
