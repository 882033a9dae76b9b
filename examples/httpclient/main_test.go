package main

import (
	"bytes"
	"context"
	"flag"
	"net/url"
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

// runAgainst runs the program against a lease server with the rules of
// rulesFile (in ../) and checks the outcome against the per-host rule.
func runAgainst(t *testing.T, rulesFile string, args ...string) {
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
	rules, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	srv := leasetest.Start(t, string(rules), leasetest.Options{})

	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	args = append([]string{"-servers", srv.URL(), "-duration", "1s", "-requests", "100", "-workers", "3"}, args...)
	require.NoError(t, run(ctx, args, &out))
	elapsed := time.Since(start)
	t.Logf("\n%s", out.String())

	assert.Contains(t, out.String(), `(key "host:127.0.0.1")`, "the key has no port")
	admitted, denied, reached := count(t, out.String(), "admitted"), count(t, out.String(), "denied"), count(t, out.String(), "upstream")
	assert.Equal(t, 100, admitted+denied, "every request was admitted or denied")
	assert.Equal(t, admitted, reached, "only admitted requests reached the upstream")
	assert.GreaterOrEqual(t, admitted, hostBurst, "the burst was admitted")
	assert.LessOrEqual(t, float64(admitted), hostBurst+hostRate*elapsed.Seconds()+2, "burst + rate·elapsed")
	assert.Positive(t, denied)
}

func TestRun(t *testing.T) {
	runAgainst(t, "../rules.yaml")
}

// TestRunWithAuth runs against the rules with client authentication, with
// the token they document.
func TestRunWithAuth(t *testing.T) {
	runAgainst(t, "../rules-auth.yaml", "-token", "dev-token-change-me")
}

// TestHostKey: one host, however its name is spelled, has one key (a
// host name is case-insensitive, and a trailing dot names the same host).
func TestHostKey(t *testing.T) {
	for raw, want := range map[string]string{
		"http://127.0.0.1:43117/x":    "host:127.0.0.1",
		"https://api.example.com/v1":  "host:api.example.com",
		"https://API.example.com:443": "host:api.example.com",
		"https://Api.Example.Com/v1":  "host:api.example.com",
		"https://api.example.com./v1": "host:api.example.com",
		"http://[::1]:8080/":          "host:::1",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		assert.Equal(t, want, hostKey(u), raw)
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
		{"zero requests", []string{"-requests", "0"}, nil},
		{"negative duration", []string{"-duration", "-1s"}, nil},
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
