package server

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// handleRules serves GET /v1/rules, listing the rules that the caller's key
// patterns can reach (see protocol.RulesResponse).
func (s *Server) handleRules(w http.ResponseWriter, r *http.Request, st *state, who *principal) {
	p := st.rules.policy
	rules := p.Rules()
	resp := protocol.RulesResponse{
		Version: st.rules.Version(),
		Default: string(p.Default()),
		Rules:   make([]protocol.RuleInfo, 0, len(rules)),
		Client:  who.name,
		Keys:    who.keys,
	}
	if resp.Keys == nil {
		resp.Keys = []string{"*"}
	}
	scopes := make([][]globToken, len(resp.Keys))
	for i, k := range resp.Keys {
		scopes[i] = parseGlob(k)
	}
	for _, rl := range rules {
		match := parseGlob(rl.Match)
		if !slices.ContainsFunc(scopes, func(scope []globToken) bool {
			return shortestCommonKey(match, scope) <= protocol.MaxKeyBytes
		}) {
			continue
		}
		resp.Rules = append(resp.Rules, ruleInfo(&rl))
	}
	writeJSON(w, http.StatusOK, resp)
}

// ruleInfo describes rl on the wire.
func ruleInfo(rl *leases.Rule) protocol.RuleInfo {
	info := protocol.RuleInfo{
		Name:           rl.Name,
		Match:          rl.Match,
		Limits:         make([]protocol.LimitInfo, len(rl.Limits)),
		LeaseTTL:       formatDuration(rl.LeaseTTL),
		LeaseTTLMillis: rl.LeaseTTL.Milliseconds(),
		Soft:           rl.Soft,
		Shadow:         rl.Shadow,
		Elastic:        rl.Elastic,
		Reserve:        rl.Reserve,
	}
	for i, l := range rl.Limits {
		info.Limits[i] = protocol.LimitInfo{Algorithm: string(l.Algorithm), Limit: l.Limit, Period: formatDuration(l.Period), PeriodMillis: l.Period.Milliseconds(), Burst: l.Burst}
	}
	first := info.Limits[0]
	info.Algorithm, info.Limit, info.Period, info.PeriodMillis, info.Burst = first.Algorithm, first.Limit, first.Period, first.PeriodMillis, first.Burst
	return info
}

// formatDuration is time.Duration.String without trailing zero units:
// "1m" rather than "1m0s", "1h" rather than "1h0m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
