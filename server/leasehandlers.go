package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// handleLeases serves POST /v1/leases.
//
// Entries for keys outside the caller's patterns fail alone with
// CodeForbidden and never reach the store, and so do entries on new keys of
// a caller that holds Options.MaxKeysPerClient keys, with CodeTooManyKeys.
// The lease owner is the client name and the request's client_id,
// "name/client_id": client names cannot contain '/', so no client can name
// another's leases.
func (s *Server) handleLeases(w http.ResponseWriter, r *http.Request, st *state, who *principal) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := protocol.DecodeLeaseRequest(body)
	if err != nil {
		writeProblem(w, problemOf(err))
		return
	}
	// The takes are decided first: should the store fail then, the call is
	// answered 503 before any lease entry changed anything. (Decided after,
	// a failure would lose the answers of grants and settles already made.)
	var takes []protocol.CheckResponse
	if len(req.Takes) > 0 {
		if takes, ok = s.takes(w, r, st, who, req.Takes); !ok {
			return
		}
	}
	entries := req.Leases
	// permitted are the entries the caller may lease; idx maps them back to
	// their position in the request when some are not (nil when all are).
	// results are the engine's own when every entry is permitted.
	var results []protocol.LeaseResult
	permitted, idx := entries, []int(nil)
	if slices.ContainsFunc(entries, func(e protocol.LeaseEntry) bool { return !who.may(e.Key) }) {
		results = make([]protocol.LeaseResult, len(entries))
		permitted = make([]protocol.LeaseEntry, 0, len(entries))
		idx = make([]int, 0, len(entries))
		for i, e := range entries {
			if !who.may(e.Key) {
				results[i] = protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Error: s.forbidden(who, e.Key, fmt.Sprintf("leases[%d]", i))}
				continue
			}
			permitted = append(permitted, e)
			idx = append(idx, i)
		}
	}
	// held are the key-cap entries the permitted entries referenced (see
	// keyCap), released or recorded by hk.finish.
	var (
		hk   *heldKeys
		held []*heldKey
	)
	if hk = st.heldOf(who); hk != nil && len(permitted) > 0 {
		var buf [8]*heldKey
		switch n := len(permitted); {
		case n <= len(buf):
			held = buf[:0]
		case n <= heldPoolCap:
			p := heldPool.Get().(*[]*heldKey)
			held = (*p)[:0]
			defer heldPool.Put(p) // after finish, which clears held
		default:
			held = make([]*heldKey, 0, n)
		}
		var refused []int
		overridden := s.overriddenUnmatched(r.Context(), st, permitted)
		held, refused = hk.admit(permitted, s.opts.Now().UnixNano(), s.opts.MaxKeysPerClient, st.rules.policy, overridden, held)
		if refused != nil {
			results, permitted, idx, held = s.refuseKeys(who, entries, results, permitted, idx, held, refused)
		}
		// Releases the references when the engine panics; a no-op after
		// the finish below.
		defer hk.finish(held, nil, s.opts.Now().UnixNano())
	}
	if len(permitted) > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
		asks := leaseAsks(permitted)
		decided, rep, err := st.engine.Lease(ctx, leases.Owner{Client: who.name, Process: req.ClientID}, asks)
		cancel()
		var out []protocol.LeaseResult
		if err == nil {
			out = make([]protocol.LeaseResult, len(decided))
			for j := range decided {
				out[j] = leaseResultWire(&decided[j])
			}
		}
		now := s.opts.Now()
		hk.finish(held, out, now.UnixNano())
		if err != nil {
			s.storeFailed(w, r, err)
			return
		}
		s.storeFailedFor(r, len(decided), func(i int) error { return decided[i].Err })
		s.metrics.record(rep)
		s.ops.leases(asks, decided, now)
		if idx == nil {
			results = out
		} else {
			for j := range out {
				results[idx[j]] = out[j]
			}
		}
	}
	if results == nil {
		results = []protocol.LeaseResult{}
	}
	if len(req.Takes) > 0 {
		s.resp.writeLeaseResponse(w, &protocol.LeaseResponse{Leases: results, Takes: takes})
		return
	}
	// Every entry failed: the call answers with the first entry's problem,
	// but a 429 (too_many_keys) gives way to any other: a refusal (403) is
	// never answered as a rate limit, and [too_many_keys, forbidden] was
	// a 429 (found by review).
	var first *protocol.Problem
	at := 0
	for i := range results {
		e := results[i].Error
		if e == nil {
			s.resp.writeLeaseResponse(w, &protocol.LeaseResponse{Leases: results})
			return
		}
		if first == nil || (first.Status == http.StatusTooManyRequests && e.Status != http.StatusTooManyRequests) {
			first, at = e, i
		}
	}
	p := *first
	p.Leases = results
	if len(results) > 1 {
		p.Detail = fmt.Sprintf("every entry failed; leases[%d]: %s", at, p.Detail)
	}
	if p.Code == protocol.CodeStoreUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeProblem(w, &p)
}

// takes decides the direct takes of a lease call. A take with a key outside
// the caller's patterns fails alone with CodeForbidden and never reaches the
// store. On a store failure it answers the call and returns false.
func (s *Server) takes(w http.ResponseWriter, r *http.Request, st *state, who *principal, takes []protocol.CheckRequest) ([]protocol.CheckResponse, bool) {
	out := make([]protocol.CheckResponse, len(takes))
	permitted, idx := takes, []int(nil)
	if slices.ContainsFunc(takes, func(t protocol.CheckRequest) bool { return !all(t.Keys, who.may) }) {
		permitted, idx = make([]protocol.CheckRequest, 0, len(takes)), make([]int, 0, len(takes))
		for i, t := range takes {
			if j := slices.IndexFunc(t.Keys, func(k string) bool { return !who.may(k) }); j >= 0 {
				out[i] = protocol.CheckResponse{Error: s.forbidden(who, t.Keys[j], fmt.Sprintf("takes[%d].keys[%d]", i, j))}
				continue
			}
			permitted = append(permitted, t)
			idx = append(idx, i)
		}
	}
	if len(permitted) == 0 {
		return out, true
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
	decided, rep, err := st.engine.Take(ctx, takeAsks(permitted))
	cancel()
	if err != nil {
		s.storeFailed(w, r, err)
		return nil, false
	}
	s.storeFailedFor(r, len(decided), func(i int) error { return decided[i].Err })
	s.metrics.record(rep)
	s.ops.takes(decided)
	for j := range decided {
		i := j
		if idx != nil {
			i = idx[j]
		}
		out[i] = takeResultWire(&decided[j])
	}
	return out, true
}

// all reports whether every key satisfies ok.
func all(keys []string, ok func(string) bool) bool {
	return !slices.ContainsFunc(keys, func(k string) bool { return !ok(k) })
}

// refuseKeys fails the permitted entries at the positions refused with
// too_many_keys and takes them out of permitted, and of idx and held, which
// it keeps aligned with permitted. It returns the new results, permitted,
// idx and held.
func (s *Server) refuseKeys(who *principal, entries []protocol.LeaseEntry, results []protocol.LeaseResult,
	permitted []protocol.LeaseEntry, idx []int, held []*heldKey, refused []int,
) ([]protocol.LeaseResult, []protocol.LeaseEntry, []int, []*heldKey) {
	if results == nil {
		results = make([]protocol.LeaseResult, len(entries))
	}
	keep := make([]protocol.LeaseEntry, 0, len(permitted)-len(refused))
	keepIdx := make([]int, 0, len(permitted)-len(refused))
	n := 0 // held[:n] are the kept entries' references
	for j, e := range permitted {
		i := j
		if idx != nil {
			i = idx[j]
		}
		if len(refused) > 0 && refused[0] == j {
			refused = refused[1:]
			results[i] = protocol.LeaseResult{Key: e.Key, Slot: e.Slot, Error: protocol.NewProblem(protocol.CodeTooManyKeys, fmt.Sprintf(
				"leases[%d]: client %q holds leases on %d keys through this lease server, the most it may, and key %q is not one of them: let leases on other keys expire, or raise the cap (rateleased -max-keys-per-client, server.Options.MaxKeysPerClient)",
				i, who.name, s.opts.MaxKeysPerClient, e.Key))}
			continue
		}
		keep = append(keep, e)
		keepIdx = append(keepIdx, i)
		held[n] = held[j]
		n++
	}
	clear(held[n:]) // no stale reference for finish to release twice
	return results, keep, keepIdx, held[:n]
}

// handleCheck serves POST /v1/check. A decision is a 200 whether the call
// is allowed or not: a denial is the answer to the question, not an error
// of the request, so it is {"allowed": false} with the Retry-After header
// set. Any key outside the caller's patterns fails the whole call with 403.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request, st *state, who *principal) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := protocol.DecodeCheckRequest(body)
	if err != nil {
		writeProblem(w, problemOf(err))
		return
	}
	for i, k := range req.Keys {
		if !who.may(k) {
			writeProblem(w, s.forbidden(who, k, fmt.Sprintf("keys[%d]", i)))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.StoreTimeout)
	taken, rep, err := st.engine.Take(ctx, takeAsks([]protocol.CheckRequest{*req}))
	cancel()
	if err != nil {
		s.storeFailed(w, r, err)
		return
	}
	s.metrics.record(rep)
	decided := &taken[0]
	if err := decided.Err; err != nil {
		if s.storeFailedFor(r, 1, func(int) error { return err }) > 0 {
			w.Header().Set("Retry-After", "1")
		}
		writeProblem(w, decisionProblem(err))
		return
	}
	s.ops.take(decided)
	resp := takeResultWire(decided)
	if !resp.Allowed {
		w.Header().Set("Retry-After", retryAfterSeconds(resp.RetryAfterMillis))
	}
	s.resp.writeCheckResponse(w, &resp)
}

// retryAfterSeconds formats a wait for the Retry-After header: whole
// seconds, rounded up, at least 1.
func retryAfterSeconds(ms int64) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(float64(ms)/1000))), 10)
}
