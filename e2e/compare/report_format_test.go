package compare

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fixedResults is a full set of results with made-up figures.
func fixedResults() []result {
	row := func(sys, label, wl string, perSec, calls, p50, p99, cpu float64) result {
		return result{
			System: sys, Label: label, Workload: wl, N: 1000, Goroutines: 2,
			Elapsed: time.Second, PerSecond: perSec, Calls1000: calls, P50: p50, P99: p99,
			ClientCPU: cpu, ServerCPU: cpu / 2, RedisCPU: cpu / 4, DaemonCPU: cpu / 4,
			SerialP50: p50 / 2, SerialP99: p99 / 2,
			UsesRedis: sys[0] != 'd', UsesDaemon: sys[0] == 'a' || sys[0] == 'c',
		}
	}
	var rs []result
	for _, wl := range []string{"hot", "zipf"} {
		rs = append(rs,
			row("a-lease-sdk", "(a) leases", wl, 30e6, 0.002, 80, 300, 70),
			row("b-redis-gcra", "(b) redis_rate", wl, 60e3, 1000, 250e3, 700e3, 17e3),
			row("c-http-check", "(c) check", wl, 11e3, 1000, 1.2e6, 4.8e6, 53e3),
			row("d-x-time-rate", "(d) x/time/rate", wl, 9e6, 0, 140, 1750, 200),
		)
	}
	return rs
}

func TestFormats(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{fmtSI(27_348_364), "27.3 M"},
		{fmtSI(9_995_732), "10.0 M"},
		{fmtSI(999_700), "1.00 M"},
		{fmtSI(59_633), "59.6 k"},
		{fmtSI(950), "950"},
		{fmtSI(1e9), "1.00 G"},
		{fmtDecade(1e3), "1 k"},
		{fmtDecade(1e8), "100 M"},
		{fmtDecade(1), "1"},
		{fmtNs(0), "0 ns"},
		{fmtNs(0.0867), "0.087 ns"},
		{fmtNs(80), "80 ns"},
		{fmtNs(999.7), "1.00 µs"},
		{fmtNs(1752), "1.75 µs"},
		{fmtNs(246_784), "247 µs"},
		{fmtNs(4_816_896), "4.82 ms"},
		{fmtCalls(0), "0"},
		{fmtCalls(0.0001169), "0.00012"},
		{fmtCalls(3.247), "3.2"},
		{fmtCalls(1000), "1,000"},
		{fmtRatio(459.2), "459×"},
		{fmtRatio(0.188), "0.19×"},
		{fmtInt(1234567), "1,234,567"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestHistQuantiles(t *testing.T) {
	// Buckets are contiguous and each value falls in its own bucket.
	for v := uint64(0); v < 1<<20; v += 1 + v/1000 {
		i := bucketOf(v)
		low, width := bucketRange(i)
		if v < low || v >= low+width {
			t.Fatalf("value %d in bucket %d = [%d, %d)", v, i, low, low+width)
		}
		if width > 1 && float64(width)/float64(low) > 1.0/subCount+1e-9 {
			t.Fatalf("bucket %d: width %d at %d is too coarse", i, width, low)
		}
	}
	var h hist
	for v := int64(1); v <= 1000; v++ {
		h.record(v)
	}
	h.record(-5) // a clock step back counts as 0
	var o hist
	for range 10 {
		o.record(1_000_000)
	}
	h.merge(&o)
	if h.n != 1011 {
		t.Fatalf("n = %d", h.n)
	}
	if p50 := h.quantile(0.50); math.Abs(p50-505) > 505*0.01 {
		t.Errorf("p50 = %v, want about 505", p50)
	}
	if p99 := h.quantile(0.999); math.Abs(p99-1e6) > 1e6*0.01 {
		t.Errorf("p99.9 = %v, want about 1e6", p99)
	}
	var empty hist
	if q := empty.quantile(0.99); q != 0 {
		t.Errorf("empty quantile = %v", q)
	}
}

func TestTargets(t *testing.T) {
	rs := fixedResults()
	ts := evalTargets(rs)
	if len(ts) != 6 {
		t.Fatalf("%d targets, want 6: %+v", len(ts), ts)
	}
	for _, tg := range ts {
		if !tg.Pass {
			t.Errorf("%s (%s): %s should pass", tg.Name, tg.Workload, tg.Got)
		}
	}
	// Make (a) on zipf miss all three.
	for i := range rs {
		if rs[i].System == "a-lease-sdk" && rs[i].Workload == "zipf" {
			rs[i].PerSecond, rs[i].Calls1000, rs[i].P99 = 5e6, 12, 1001
		}
	}
	fails := 0
	for _, tg := range evalTargets(rs) {
		if !tg.Pass {
			fails++
			if tg.Workload != "zipf" {
				t.Errorf("%s fails on %s", tg.Name, tg.Workload)
			}
		}
	}
	if fails != 3 {
		t.Errorf("%d targets fail, want 3", fails)
	}
	if md := limitsText(rs, 2); !strings.Contains(md, "**Missed:") {
		t.Errorf("a missed target is not explained:\n%s", md)
	}
}

func TestMarkdown(t *testing.T) {
	d := reportData{
		Results:  fixedResults(),
		Machine:  machine{CPU: "Test CPU", Cores: 2, GOMAXPROCS: 2, Go: "go1.26", Redis: "7.0.15", OS: "linux/amd64"},
		Command:  command(),
		Date:     time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
		FloorP50: 30, FloorP99: 31,
	}
	md := renderMarkdown(d)
	for _, want := range []string{
		"| a-lease-sdk | hot | 30.0 M | 500× | 0.0020 |",
		"| b-redis-gcra | zipf | 60.0 k | 1.00× | 1,000 |",
		"| d-x-time-rate | hot | 9.00 M | 150× | 0 | — |",
		"Test CPU, 2 cores",
		"redis-server: 7.0.15",
		"2026-01-02 03:04 UTC",
		"RATELEASE_BENCH_REPORT=$PWD go test -run '^$' -bench Compare",
		"](docs/benchmarks.svg)",
		"| (a) p99 decision latency on a live lease at most 1 µs | hot | ≤ 1 µs | 300 ns | ✅ pass |",
		"Little's law",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	checkTables(t, md) // every row has as many cells as its header
}

// checkTables checks that each Markdown table's rows have the header's
// number of cells.
func checkTables(t *testing.T, md string) {
	t.Helper()
	cols := 0
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(line, "|") - 1
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("row has %d cells, header %d: %s", n, cols, line)
		}
	}
}

func TestSVG(t *testing.T) {
	rs := fixedResults()
	svg := renderSVG(rs, "Test CPU, 2 cores & <more>")
	// Well-formed XML, with one bar per result whose height grows with
	// the value (log scale) and whose label is the value.
	dec := xml.NewDecoder(bytes.NewReader(svg))
	type bar struct {
		value, height float64
	}
	var bars []bar
	texts := map[string]bool{}
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inText = tok.Name.Local == "text"
			if tok.Name.Local != "rect" {
				continue
			}
			attrs := map[string]string{}
			for _, a := range tok.Attr {
				attrs[a.Name.Local] = a.Value
			}
			if attrs["class"] != "bar" {
				continue
			}
			v, err1 := strconv.ParseFloat(attrs["data-value"], 64)
			h, err2 := strconv.ParseFloat(attrs["height"], 64)
			if err1 != nil || err2 != nil || h <= 0 {
				t.Fatalf("bad bar %v", attrs)
			}
			bars = append(bars, bar{v, h})
		case xml.CharData:
			if inText {
				texts[string(tok)] = true
			}
		case xml.EndElement:
			inText = false
		}
	}
	if len(bars) != len(rs) {
		t.Fatalf("%d bars, want %d", len(bars), len(rs))
	}
	for i := range bars {
		for j := range bars {
			if bars[i].value > bars[j].value && bars[i].height <= bars[j].height {
				t.Errorf("bar %v is not taller than %v", bars[i], bars[j])
			}
		}
	}
	for _, want := range []string{"30.0 M", "60.0 k", "11.0 k", "9.00 M", "hot: one key", "zipf: 1,000 keys",
		"(a) leases", "10 k", "100 M", "(a) makes 500× the decisions/s of (b)", "Test CPU, 2 cores & <more>"} {
		if !texts[want] {
			t.Errorf("SVG has no text %q", want)
		}
	}
}
