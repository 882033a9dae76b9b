package server

import (
	"bytes"
	_ "embed"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The status page (GET /status): a read-only, server-rendered HTML page for
// people, without JavaScript. It shows the rules in force and their
// version, each rule's decisions (totals since each server started, and
// rates over about the last minute), the busiest and the most denied keys,
// the open leases, and the servers sharing the store (Options.Peers). The
// figures are the fleet's: those of every server sharing the store, summed
// and merged (see fleet.go), or this server's alone, said so, when the
// others cannot be read. It is guarded like /metrics: when
// Options.MetricsTokenSHA256 is set, the page needs that bearer token.

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"rate": formatRate,
	"ago":  func(d time.Duration) string { return d.Round(time.Second).String() },
}).Parse(statusHTML))

// statusPage is the data of the status page's template.
type statusPage struct {
	Self      string
	Version   string
	Build     Build
	Default   string
	Store     string
	Generated time.Time
	Uptime    time.Duration
	Window    time.Duration
	Reload    string // the last reload's error, while it stands
	Source    string // where the rules come from: "the rules file" or "the rule database"
	// Pending is why the server has read no rules yet (see
	// Server.RulesPending); empty once it has.
	Pending string
	Rules   []statusRule
	// PeerWindow and PeerInterval, for the servers table's note.
	PeerWindow, PeerInterval time.Duration
	fleetView
}

// statusRule is one row of the rules table.
type statusRule struct {
	Name, Match, Limits, LeaseTTL string
	Shadow                        bool
	Soft                          float64
	ruleRates
}

// statusKeys is a top-K table.
type statusKeys struct {
	ID      string // the table's HTML id
	Entries []topKEntry
	Total   int64
	MaxErr  int64 // the sum of each summary's total/k: the most any count can be over
}

// statusPeer is one row of the servers table.
type statusPeer struct {
	Name string
	Ago  time.Duration // since it last recorded itself
	Self bool
	// Counted: its figures are in the page's; Published is then the age
	// of its snapshot (zero for this server, counted live) and OpenLeases
	// its ratelease_open_leases. Missing says why it is not counted.
	Counted    bool
	Published  time.Duration
	OpenLeases int
	Missing    string
}

// handleStatus serves GET /status.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	st := s.state.Load()
	now := s.opts.Now()
	self := selfName(*s.listenAddr.Load())
	_, window := s.ops.rates(now)
	page := statusPage{
		Self:         self,
		Version:      st.rules.Version(),
		Build:        ReadBuild(),
		Default:      string(st.rules.policy.Default()),
		Generated:    now,
		Uptime:       now.Sub(s.ops.started),
		Window:       window,
		PeerWindow:   PeerWindow,
		PeerInterval: PeerInterval,
		fleetView:    s.fleet(r.Context(), self, now),
	}
	page.Source = s.rulesSource()
	switch err := s.ReloadError(); {
	case st.pending:
		page.Pending = s.pendingReason()
	case err != nil:
		page.Reload = err.Error()
	}
	for _, rl := range st.rules.policy.Rules() {
		limits := make([]string, len(rl.Limits))
		for i, l := range rl.Limits {
			limits[i] = strings.Join([]string{string(l.Algorithm), " ", strconv.FormatInt(l.Limit, 10), "/", formatDuration(l.Period), " burst ", strconv.FormatInt(l.Burst, 10)}, "")
		}
		page.Rules = append(page.Rules, statusRule{
			Name: rl.Name, Match: rl.Match, Limits: strings.Join(limits, "; "),
			LeaseTTL: formatDuration(rl.LeaseTTL), Shadow: rl.Shadow, Soft: rl.Soft,
			ruleRates: page.Rates[rl.Name],
		})
	}

	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, page); err != nil {
		s.log.ErrorContext(r.Context(), "status page: template failed", "err", err)
		http.Error(w, "the status page failed to render; the server logged why", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_, _ = w.Write(buf.Bytes())
}

// formatRate formats a rate per second with at most two decimals.
func formatRate(f float64) string {
	if f >= 100 {
		return strconv.FormatFloat(f, 'f', 0, 64) + "/s"
	}
	out := strings.TrimRight(strconv.FormatFloat(f, 'f', 2, 64), "0")
	return strings.TrimSuffix(out, ".") + "/s"
}
