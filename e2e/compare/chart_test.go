package compare

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// barColors colours each system by its letter.
var barColors = map[string]string{"a": "#1f77b4", "b": "#d95f02", "c": "#7570b3", "d": "#8c8c8c"}

// panel is one chart of the figure: one value per result, bars grouped by
// workload.
type panel struct {
	title string
	log   bool // log scale; else linear from 0
	value func(r result) float64
	label func(v float64) string
}

var panels = []panel{
	{
		title: "Admissions lost against an exact token bucket (% of its admissions; lower is better)",
		value: func(r result) float64 { return r.LostPct },
		label: fmtPct,
	},
	{
		title: "Redis commands per decision, gross (log scale; lower is better)",
		log:   true,
		value: func(r result) float64 { return r.RedisCmds },
		label: fmtPerDecision,
	},
	{
		title: "p99 decision latency (log scale; lower is better)",
		log:   true,
		value: func(r result) float64 { return r.P99 },
		label: fmtNs,
	},
}

// chartResults returns the results the chart shows: the open-loop
// workloads, systems (a), (b) and (c).
func chartResults(rs []result) (out []result, wls, syss []string) {
	for _, r := range rs {
		if r.Capacity || !strings.ContainsAny(r.System[:1], "abc") {
			continue
		}
		out = append(out, r)
		if !contains(wls, r.Workload) {
			wls = append(wls, r.Workload)
		}
		if !contains(syss, r.System) {
			syss = append(syss, r.System)
		}
	}
	return out, wls, syss
}

// renderSVG draws the matrix: a panel per figure (lost %, Redis commands
// per decision, p99 latency), in each a group of bars per workload, a bar
// per system labelled with its value.
func renderSVG(all []result, subtitle string) []byte {
	rs, wls, syss := chartResults(all)
	const (
		width        = 960
		left, right  = 80, 20
		head         = 112 // title, subtitle, legend, capacity note
		panelH       = 230 // each panel, its title and labels included
		plotTop      = 34  // from a panel's top to its plot
		plotH        = 150
		barW, barGap = 36, 6
	)
	height := head + panelH*len(panels) + 10
	plotW := float64(width - left - right)
	groupW := plotW / float64(max(1, len(wls)))

	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	esc := html.EscapeString
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="26" font-size="18" font-weight="bold">Each system on the same arrivals, per workload</text>`+"\n", left)
	p(`<text x="%d" y="46" font-size="11" fill="#555555">%s</text>`+"\n", left, esc(subtitle))
	if note := capacityNote(all); note != "" {
		p(`<text x="%d" y="%d" font-size="12" fill="#333333">%s</text>`+"\n", left, head-4, esc(note))
	}
	for i, name := range syss {
		label := name
		for _, r := range rs {
			if r.System == name {
				label = r.Label
				break
			}
		}
		lx, ly := float64(left+(i%2)*440), 58+float64(i/2)*18
		p(`<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", lx, ly, barColors[name[:1]])
		p(`<text x="%.1f" y="%.1f" font-size="12">%s</text>`+"\n", lx+17, ly+10, esc(label))
	}

	for pi, pn := range panels {
		top := float64(head + pi*panelH)
		y0 := top + plotTop // plot top
		p(`<text x="%d" y="%.1f" font-size="14" font-weight="bold">%s</text>`+"\n", left, top+20, esc(pn.title))
		lo, hi := scaleOf(pn, rs)
		y := func(v float64) float64 {
			if pn.log {
				if v <= 0 {
					return y0 + plotH
				}
				f := (math.Log10(v) - lo) / (hi - lo)
				return y0 + plotH*(1-math.Min(1, math.Max(0, f)))
			}
			return y0 + plotH*(1-v/hi)
		}
		// Grid and axis labels.
		for _, g := range gridOf(pn, lo, hi) {
			yy := y(g)
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#dddddd" stroke-width="1"/>`+"\n", left, yy, width-right, yy)
			p(`<text x="%d" y="%.1f" font-size="11" text-anchor="end" fill="#333333">%s</text>`+"\n", left-6, yy+4, esc(pn.label(g)))
		}
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333333" stroke-width="1"/>`+"\n", left, y0, left, y0+plotH)
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333333" stroke-width="1"/>`+"\n", left, y0+plotH, width-right, y0+plotH)
		for gi, wl := range wls {
			var bars []result
			for _, r := range rs {
				if r.Workload == wl {
					bars = append(bars, r)
				}
			}
			total := float64(len(bars))*barW + float64(len(bars)-1)*barGap
			x0 := float64(left) + groupW*float64(gi) + (groupW-total)/2
			for bi, r := range bars {
				v := pn.value(r)
				x := x0 + float64(bi)*(barW+barGap)
				yy := y(v)
				h := y0 + plotH - yy
				if h < 1 {
					h, yy = 1, y0+plotH-1 // a hairline, so a zero still shows
				}
				p(`<rect class="bar" data-panel="%d" data-system="%s" data-workload="%s" data-value="%g" x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s"/>`+"\n",
					pi, esc(r.System), esc(r.Workload), v, x, yy, barW, h, barColors[r.System[:1]])
				p(`<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s</text>`+"\n", x+barW/2, yy-4, esc(pn.label(v)))
			}
			p(`<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" font-weight="bold">%s</text>`+"\n",
				float64(left)+groupW*(float64(gi)+0.5), y0+plotH+18, esc(wl))
		}
	}
	p("</svg>\n")
	return []byte(s.String())
}

// capacityNote states the hot-path (closed-loop) result, which the panels
// do not show.
func capacityNote(rs []result) string {
	for _, r := range rs {
		if !r.Capacity || !strings.HasPrefix(r.System, "a-") {
			continue
		}
		b, ok := find(rs, "b-", r.Workload)
		if !ok || b.PerSecond <= 0 {
			return ""
		}
		return fmt.Sprintf("%s, closed loop on one key: (a) makes %s decisions/s, (b) %s: %s.",
			r.Workload, fmtSI(r.PerSecond), fmtSI(b.PerSecond), fmtRatio(r.PerSecond/b.PerSecond))
	}
	return ""
}

// scaleOf returns a panel's axis range: for a log panel the decades (as
// exponents) around its positive values, else 0 to a round maximum.
func scaleOf(pn panel, rs []result) (lo, hi float64) {
	if pn.log {
		lo, hi = math.Inf(1), math.Inf(-1)
		for _, r := range rs {
			if v := pn.value(r); v > 0 {
				lo = math.Min(lo, math.Floor(math.Log10(v)))
				hi = math.Max(hi, math.Ceil(math.Log10(v)))
			}
		}
		if math.IsInf(lo, 0) {
			return 0, 1
		}
		if hi <= lo {
			hi = lo + 1
		}
		return lo, hi
	}
	top := 0.0
	for _, r := range rs {
		top = math.Max(top, pn.value(r))
	}
	return 0, niceCeil(math.Max(top*1.15, 1))
}

// gridOf returns the values of a panel's grid lines.
func gridOf(pn panel, lo, hi float64) []float64 {
	var out []float64
	if pn.log {
		for e := lo; e <= hi; e++ {
			out = append(out, math.Pow(10, e))
		}
		return out
	}
	step := niceCeil(hi / 5)
	for v := 0.0; v <= hi+step/1e6 && len(out) < 12; v += step {
		out = append(out, v)
	}
	return out
}

// niceCeil returns the smallest of 1, 2, 2.5, 4, 5, 6, 8 × a power of ten that is
// at least v > 0.
func niceCeil(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 4, 5, 6, 8, 10} {
		if m*e >= v*(1-1e-12) {
			return m * e
		}
	}
	return 10 * e
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
