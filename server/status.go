package server

import (
	"bytes"
	"context"
	_ "embed"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The status page (GET /status): a read-only, server-rendered HTML page for
// people, without JavaScript. It shows the rules in force and their
// version, each rule's decisions (totals since the server started, and
// rates over about the last minute), the busiest and the most denied keys
// seen by this server, and the servers sharing the store (Options.Peers).
// It is guarded like /metrics: when Options.MetricsTokenSHA256 is set, the
// page needs that bearer token.

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
	Rules     []statusRule
	Busiest   statusKeys
	Denied    statusKeys
	Peers     []statusPeer
	PeersNote string
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
	MaxErr  int64 // total / k: the most any count can be off
}

// statusPeer is one row of the servers table.
type statusPeer struct {
	Name string
	Ago  time.Duration
	Self bool
}

// handleStatus serves GET /status.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	st := s.state.Load()
	now := s.opts.Now()
	rates, window := s.ops.rates(now)
	page := statusPage{
		Self:      selfName(*s.listenAddr.Load()),
		Version:   st.rules.Version(),
		Build:     ReadBuild(),
		Default:   string(st.rules.policy.Default()),
		Generated: now,
		Uptime:    now.Sub(s.ops.started),
		Window:    window,
	}
	if err := s.ReloadError(); err != nil {
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
			ruleRates: rates[rl.Name],
		})
	}
	page.Busiest = topKeysOf("busiest-keys", s.ops.busiest)
	page.Denied = topKeysOf("denied-keys", s.ops.denied)
	page.Peers, page.PeersNote = s.statusPeers(r.Context(), page.Self, now)

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

// statusPeers lists the servers sharing the store, this one included, and a
// note on how they are known.
func (s *Server) statusPeers(ctx context.Context, self string, now time.Time) ([]statusPeer, string) {
	alone := []statusPeer{{Name: self, Self: true}}
	if s.ops.peers == nil {
		return alone, "This server does not record its peers (no shared store, or Options.Peers unset): it lists itself alone."
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.StoreTimeout)
	defer cancel()
	peers, err := s.ops.peers.List(ctx, now.Add(-PeerWindow))
	if err != nil {
		s.log.WarnContext(ctx, "status page: could not list the peers", "err", err)
		return alone, "The store did not answer: the peers are unknown. " + err.Error()
	}
	out := make([]statusPeer, 0, len(peers)+1)
	found := false
	for _, p := range peers {
		out = append(out, statusPeer{Name: p.Name, Ago: max(0, now.Sub(p.Seen)), Self: p.Name == self})
		found = found || p.Name == self
	}
	if !found {
		out = append(out, alone[0])
	}
	return out, "Servers that recorded themselves in the store in the last " + PeerWindow.String() + " (every " + PeerInterval.String() + ")."
}

// topKeysOf returns the table of t's heaviest keys, with the HTML id id.
func topKeysOf(id string, t *topK) statusKeys {
	entries, total := t.top(topKeysShown)
	return statusKeys{ID: id, Entries: entries, Total: total, MaxErr: total / int64(t.k)}
}

// formatRate formats a rate per second with at most two decimals.
func formatRate(f float64) string {
	if f >= 100 {
		return strconv.FormatFloat(f, 'f', 0, 64) + "/s"
	}
	out := strings.TrimRight(strconv.FormatFloat(f, 'f', 2, 64), "0")
	return strings.TrimSuffix(out, ".") + "/s"
}
