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

// The payments rule of ../rules.yaml.
const (
	payRate  = 50.0
	payBurst = 50
)

func TestRun(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
	rules, err := os.ReadFile("../rules.yaml")
	require.NoError(t, err)

	tests := []struct {
		name string
		args []string
	}{
		{"Wait, two clients", []string{"-workers", "6", "-clients", "2"}},
		{"Allow, one client", []string{"-workers", "4", "-wait=false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A server of its own: a fresh store, a full bucket.
			srv := leasetest.Start(t, string(rules), leasetest.Options{})
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, run(ctx, append(tt.args, "-servers", srv.URL(), "-duration", "800ms"), &out))
			elapsed := time.Since(start)
			t.Logf("\n%s", out.String())

			m := regexp.MustCompile(`(?m)^total\s+(\d+) admitted`).FindStringSubmatch(out.String())
			require.NotNil(t, m, out.String())
			total, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			assert.LessOrEqual(t, float64(total), payBurst+payRate*elapsed.Seconds()+2, "burst + rate·T holds across the workers")
			assert.GreaterOrEqual(t, total, payBurst, "the workers used the budget")
			assert.Regexp(t, `(?m)^bound .*: held$`, out.String())
			assert.Regexp(t, `(?m)^busiest .*: held$`, out.String())
			assert.NotContains(t, out.String(), "EXCEEDED")
		})
	}
}

func TestRunFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want error // nil: any error
	}{
		{"help", []string{"-h"}, flag.ErrHelp},
		{"unknown flag", []string{"-nope"}, nil},
		{"no workers", []string{"-workers", "0"}, nil},
		{"more clients than workers", []string{"-workers", "2", "-clients", "3"}, nil},
		{"zero duration", []string{"-duration", "0s"}, nil},
		{"extra argument", []string{"extra"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tt.args, &out)
			require.Error(t, err)
			if tt.want != nil {
				assert.ErrorIs(t, err, tt.want)
			}
		})
	}
}

// TestRunUnauthorized: against a server that authenticates its clients, a
// missing or wrong token is reported as such, not as a server that does
// not run.
func TestRunUnauthorized(t *testing.T) {
	rules, err := os.ReadFile("../rules-auth.yaml")
	require.NoError(t, err)
	srv := leasetest.Start(t, string(rules), leasetest.Options{})
	tests := []struct {
		name string
		args []string
	}{
		{"no token", nil},
		{"wrong token", []string{"-token", "wrong"}},
		{"wrong token, Allow", []string{"-token", "wrong", "-wait=false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("RATELEASE_TOKEN", "")
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, append(tt.args, "-servers", srv.URL(), "-duration", "200ms"), &out)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "unauthorized: check -token")
			assert.NotContains(t, err.Error(), "is a lease server running")
		})
	}
	// The right token works.
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"-servers", srv.URL(), "-duration", "200ms", "-token", "dev-token-change-me"}, &out))
}

func TestVerdict(t *testing.T) {
	assert.Equal(t, "held", verdict(100, 100))
	assert.Equal(t, "held", verdict(0, 50))
	assert.Equal(t, "EXCEEDED", verdict(101, 100.5))
}

func TestBusiest(t *testing.T) {
	t0 := time.Now()
	p := &payments{per: make([]int, 1)}
	for _, ms := range []int{0, 100, 900, 999, 1000, 1500, 2600} {
		p.calls = append(p.calls, t0.Add(time.Duration(ms)*time.Millisecond))
	}
	assert.Equal(t, 4, p.busiest(time.Second), "0, 100, 900 and 999 ms; 1000 ms starts the next window")
	assert.Equal(t, 1, p.busiest(time.Millisecond))
	assert.Equal(t, 0, (&payments{}).busiest(time.Second))
}

// TestUsageHidesToken: the usage text, on -h and after a bad flag, never
// prints RATELEASE_TOKEN, as rateleased and ratelease do not: it was
// -token's default, and flag prints a flag's default (a crash log, a
// terminal shared on a call). The variable still applies when -token is
// not given, and -token wins over it.
func TestUsageHidesToken(t *testing.T) {
	const secret = "s3cret-service-token"
	t.Setenv("RATELEASE_TOKEN", secret)
	for _, args := range [][]string{{"-h"}, {"-nope"}} {
		var out bytes.Buffer
		_, err := parseFlags(args, &out)
		require.Error(t, err, "%v", args)
		assert.Contains(t, out.String(), "-token", "%v: the usage text", args)
		assert.NotContains(t, out.String(), secret, "%v", args)
	}
	var out bytes.Buffer
	cfg, err := parseFlags(nil, &out)
	require.NoError(t, err)
	assert.Equal(t, secret, cfg.token, "from the environment")
	cfg, err = parseFlags([]string{"-token", "given"}, &out)
	require.NoError(t, err)
	assert.Equal(t, "given", cfg.token, "the flag wins")
}
