package clientmetrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/clientmetrics"
)

// A *client.Client is a Source.
var _ clientmetrics.Source = (*client.Client)(nil)

type fakeSource struct{ s client.Stats }

func (f *fakeSource) Stats() client.Stats { return f.s }

func TestCollector(t *testing.T) {
	src := &fakeSource{client.Stats{
		Allowed: 120, Denied: 7, ServerCalls: 30, ServerErrors: 2, Refusals: 1,
		FallbackDecisions: 5, DirectDecisions: 9, KeysHeld: 3, MaxKeysHeld: 4, Online: true, TokensHeld: 250,
	}}
	c := clientmetrics.New(src, clientmetrics.Options{ConstLabels: prometheus.Labels{"limiter": "billing"}})

	tests := []struct {
		name, want string
	}{
		{"ratelease_client_allowed_total", `ratelease_client_allowed_total{limiter="billing"} 120`},
		{"ratelease_client_denied_total", `ratelease_client_denied_total{limiter="billing"} 7`},
		{"ratelease_client_decisions_total", `ratelease_client_decisions_total{limiter="billing",source="direct"} 9
ratelease_client_decisions_total{limiter="billing",source="fallback"} 5`},
		{"ratelease_client_server_calls_total", `ratelease_client_server_calls_total{limiter="billing"} 30`},
		{"ratelease_client_server_errors_total", `ratelease_client_server_errors_total{limiter="billing"} 2`},
		{"ratelease_client_refusals_total", `ratelease_client_refusals_total{limiter="billing"} 1`},
		{"ratelease_client_keys_held", `ratelease_client_keys_held{limiter="billing"} 3`},
		{"ratelease_client_max_keys_held", `ratelease_client_max_keys_held{limiter="billing"} 4`},
		{"ratelease_client_online", `ratelease_client_online{limiter="billing"} 1`},
		{"ratelease_client_tokens_held", `ratelease_client_tokens_held{limiter="billing"} 250`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var exp strings.Builder
			for line := range strings.SplitSeq(tt.want, "\n") {
				exp.WriteString(line + "\n")
			}
			// Only the sample lines are compared: HELP and TYPE come from
			// the collector itself.
			got, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, tt.name)
			require.NoError(t, err)
			var samples []string
			for line := range strings.SplitSeq(strings.TrimSpace(string(got)), "\n") {
				if !strings.HasPrefix(line, "#") {
					samples = append(samples, line)
				}
			}
			assert.Equal(t, strings.TrimSpace(exp.String()), strings.Join(samples, "\n"))
		})
	}
	assert.Equal(t, 11, testutil.CollectAndCount(c))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)

	src.s.Online = false
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelease_client_online 1 while the client takes the lease servers for up, 0 while direct takes or lease calls go unanswered.
# TYPE ratelease_client_online gauge
ratelease_client_online{limiter="billing"} 0
`), "ratelease_client_online"), "the gauge follows Stats")
}
