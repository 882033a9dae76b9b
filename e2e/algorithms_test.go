package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// algorithmRules are the rules of the algorithm scenarios, appended to
// rules: one per algorithm, and a rule of two limits.
const algorithmRules = `
  - name: two-limits
    match: "two:*"
    lease_ttl: 1s
    limits:
      - {limit: 5, period: 1s}
      - {limit: 20, period: 10s}
`

// TestTwoLimits: a rule of two limits, 5/s and 20/10s, under demand well
// above both from 4 processes over the 3 servers. Each limit's bound
// (burst + rate·W, for every window from 100 ms to 10 s) holds, and the
// tighter one over the run (20/10s) is used to at least 90%.
func TestTwoLimits(t *testing.T) {
	c := startCluster(t)
	d := scaled(10 * time.Second)
	loads := hotLoads(c, "two", "two:hot", 4, 20, d, "closed")
	startLoads(t, loads)
	waitLoads(t, loads, d+30*time.Second)

	ss := merge(loads, "two:hot", allSlots)
	logWindows(t, "two:hot (5/s)", ss, 5, 5)
	checkBound(t, "two:hot 5/s", ss, 5, 5)
	checkBound(t, "two:hot 20/10s", ss, 2, 20)
	admitted := total(ss)
	want := 20 + 2*d.Seconds()
	t.Logf("admitted %d of the 20/10s limit's burst + rate·T = %.0f", admitted, want)
	assert.GreaterOrEqual(t, float64(admitted), 0.9*want, "utilization of the binding limit")
	for _, l := range loads {
		assert.Zero(t, l.res.Stats.FallbackDecisions, "%s: servers answered; no fallback", l.name)
	}
}
