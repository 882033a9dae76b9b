package compare

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCommandCalls(t *testing.T) {
	const info = "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=1000,usec=9000,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=1000,usec=500,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=77,usec=7000,usec_per_call=90.9,rejected_calls=0,failed_calls=0\r\n" +
		"\r\n# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:0.000000\r\n"
	for _, c := range []struct {
		name    string
		info    string
		want    int64
		wantErr bool
	}{
		{name: "every command but INFO", info: info, want: 2002},
		{name: "only INFO so far", info: "cmdstat_info:calls=1,usec=1\n", want: 0},
		{name: "no commandstats section", info: "# CPU\nused_cpu_sys:1\n", wantErr: true},
		{name: "a bad count", info: "cmdstat_get:calls=x,usec=1\n", wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := commandCalls(c.info)
			if c.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
	by, err := commandStats(info)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"evalsha": 1000, "get": 1000, "client|setinfo": 2}, by)

	cpu, err := redisCPU(info)
	require.NoError(t, err)
	assert.Equal(t, 3750*time.Millisecond, cpu)
	_, err = redisCPU("cmdstat_get:calls=1\n")
	assert.Error(t, err)
}

func TestMetricValue(t *testing.T) {
	const text = "# HELP ratelease_owned_buckets token buckets this server owns now\n" +
		"# TYPE ratelease_owned_buckets gauge\n" +
		"ratelease_owned_buckets_other 9\n" +
		"ratelease_owned_buckets 3\n" +
		"ratelease_owned_takes_total 1.5e+06\n"
	for _, c := range []struct {
		name, text, metric string
		want               float64
		ok                 bool
	}{
		{"a gauge, not its longer namesake", text, "ratelease_owned_buckets", 3, true},
		{"exponent notation", text, "ratelease_owned_takes_total", 1.5e6, true},
		{"absent", text, "ratelease_nothing", 0, false},
		{"not a number", "ratelease_owned_buckets x\n", "ratelease_owned_buckets", 0, false},
		{"last line without newline", "ratelease_owned_buckets 0", "ratelease_owned_buckets", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := metricValue(c.text, c.metric)
			assert.Equal(t, c.ok, ok)
			assert.Equal(t, c.want, got)
		})
	}
}
