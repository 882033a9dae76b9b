package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The per-host rule of ../rules.yaml.
const (
	hostRate  = 20.0
	hostBurst = 20
)

func count(t *testing.T, out, label string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + label + `\s+(\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "no %q line in:\n%s", label, out)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

func TestRun(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
	rules, err := os.ReadFile("../rules.yaml")
	require.NoError(t, err)
	srv := leasetest.Start(t, string(rules), leasetest.Options{})

	var out bytes.Buffer
	env := map[string]string{"RATELEASE_SERVER": srv.URL()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, run(ctx, []string{"-duration", "1s", "-requests", "100", "-workers", "3"}, func(k string) string { return env[k] }, &out))
	elapsed := time.Since(start)
	t.Logf("\n%s", out.String())

	admitted, denied, reached := count(t, out.String(), "admitted"), count(t, out.String(), "denied"), count(t, out.String(), "upstream")
	assert.Equal(t, 100, admitted+denied, "every request was admitted or denied")
	assert.Equal(t, admitted, reached, "only admitted requests reached the upstream")
	assert.GreaterOrEqual(t, admitted, hostBurst, "the burst was admitted")
	assert.LessOrEqual(t, float64(admitted), hostBurst+hostRate*elapsed.Seconds()+2, "burst + rate·elapsed")
	assert.Positive(t, denied)
}

func TestRunFlags(t *testing.T) {
	env := func(string) string { return "" }
	tests := []struct {
		name string
		args []string
		want error // nil: any error
	}{
		{"help", []string{"-h"}, flag.ErrHelp},
		{"unknown flag", []string{"-nope"}, nil},
		{"zero requests", []string{"-requests", "0"}, nil},
		{"negative duration", []string{"-duration", "-1s"}, nil},
		{"extra argument", []string{"extra"}, nil},
		{"bad server", []string{"-server", "127.0.0.1:8080"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tt.args, env, &out)
			require.Error(t, err)
			if tt.want != nil {
				assert.ErrorIs(t, err, tt.want)
			}
		})
	}
}
