package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/tlstest"
	"github.com/ratelease/ratelease/protocol"
)

// cliResult is what one cli call printed and returned.
type cliResult struct {
	stdout, stderr string
	err            error
}

func runCLI(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cli(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr, nil)
	return cliResult{stdout.String(), stderr.String(), err}
}

// TestCheck: -check validates a rules file without a server or a store:
// exit 0 and a one-line summary, or exit 1 naming the rule (or client) and
// the field at fault.
func TestCheck(t *testing.T) {
	write := func(content string) string {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string // in stdout when 0, in stderr and the error otherwise
	}{
		{"examples/rules.yaml", []string{"-rules", "../../../examples/rules.yaml"}, 0, []string{"is valid", "rules", "0 clients", "default allow"}},
		{"examples/rules-auth.yaml", []string{"-rules", "../../../examples/rules-auth.yaml"}, 0, []string{"is valid", " 1 client, "}},
		{"bad burst", []string{"-rules", write("rules:\n  - {name: per-user, match: \"user:*\", limit: 100, period: 1s, burst: -4}\n")}, 1, []string{`rule "per-user"`, "burst"}},
		{"bad period", []string{"-rules", write("rules:\n  - {name: slow, match: \"a:*\", limit: 1, period: -1s}\n")}, 1, []string{`rule "slow"`, "period"}},
		{"not YAML", []string{"-rules", write("rules: [")}, 1, []string{"yaml"}},
		{"unknown field", []string{"-rules", write("rules:\n  - {name: typo, match: \"a:*\", limit: 1, period: 1s, brust: 3}\n")}, 1, []string{"brust"}},
		{"bad client", []string{"-rules", write("clients:\n  - {name: svc, token_sha256: xyz, keys: [\"*\"]}\n")}, 1, []string{`client "svc"`, "token_sha256"}},
		{"missing file", []string{"-rules", filepath.Join(t.TempDir(), "nope.yaml")}, 1, []string{"nope.yaml"}},
		{"two documents", []string{"-rules", write("rules: []\n---\nclients: []\n")}, 1, []string{"more than one YAML document", "line 3"}},
		{"no -rules", nil, 2, []string{"-check needs -rules"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A Redis that does not exist and an exposed address: -check
			// needs neither, and starts nothing.
			args := append([]string{"-check", "-redis", "redis://127.0.0.1:1", "-listen", "0.0.0.0:0"}, tt.args...)
			r := runCLI(t, nil, args...)
			assert.Equal(t, tt.wantCode, exitCode(r.err), "err: %v", r.err)
			assert.NotContains(t, r.stderr, "listening")
			assert.NotContains(t, r.stderr, "redis")
			if tt.wantCode == 0 {
				require.NoError(t, r.err)
				assert.Equal(t, 1, strings.Count(r.stdout, "\n"), "one line: %q", r.stdout)
				for _, w := range tt.want {
					assert.Contains(t, r.stdout, w)
				}
				return
			}
			require.Error(t, r.err)
			assert.Empty(t, r.stdout)
			for _, w := range tt.want {
				assert.Contains(t, r.stderr, w)
				assert.Contains(t, r.err.Error(), w)
			}
		})
	}
}

var versionLine = regexp.MustCompile(`^rateleased (\S+) \(revision (\S+), (go\S+)\)\n$`)

// TestVersion: -version prints the module version, the VCS revision and
// the Go version, and exits 0; from a binary built from this source tree,
// the revision is the tree's commit.
func TestVersion(t *testing.T) {
	r := runCLI(t, nil, "-version")
	require.NoError(t, r.err)
	assert.Regexp(t, versionLine, r.stdout)
	assert.Empty(t, r.stderr)

	if testing.Short() {
		t.Skip("builds the binary")
	}
	// A real binary built from this tree. (Whether it carries a revision
	// depends on the checkout: go build stamps none in a git worktree or
	// with -buildvcs=false; server's TestBuildOf covers the cases.)
	bin, err := e2eproc.Build(t.TempDir(), "github.com/ratelease/ratelease/server/cmd/rateleased")
	require.NoError(t, err)
	out, err := exec.Command(bin, "-version").Output()
	require.NoError(t, err, "exit 0")
	m := versionLine.FindStringSubmatch(string(out))
	require.NotNil(t, m, "%q", out)
	assert.Equal(t, "(devel)", m[1], "a source build")
}

// TestTLSFlags: -tls-cert and -tls-key (or their environment variables)
// make the daemon serve HTTPS on 127.0.0.1, and the SDK, trusting the
// certificate through its HTTP client, gets decisions from it; one without
// the other is a usage error.
func TestTLSFlags(t *testing.T) {
	cert := tlstest.SelfSigned(t)
	tests := []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"flags", nil, []string{"-tls-cert", cert.CertFile, "-tls-key", cert.KeyFile}},
		{"environment", map[string]string{"RATELEASED_TLS_CERT": cert.CertFile, "RATELEASED_TLS_KEY": cert.KeyFile}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startDaemon(t, tt.env, append([]string{"-rules", "../../../examples/rules.yaml"}, tt.args...)...)
			assert.Equal(t, true, d.start["tls"])

			tr := &http.Transport{TLSClientConfig: cert.ClientConfig(), ForceAttemptHTTP2: true}
			t.Cleanup(tr.CloseIdleConnections)
			c, err := client.New(client.Config{Servers: []string{"https://" + d.addr}, HTTPClient: &http.Client{Transport: tr}})
			require.NoError(t, err)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = c.Close(ctx)
			})
			dec := c.Allow(context.Background(), "user:tls")
			require.True(t, dec.Allowed, "%+v", dec)
			assert.Equal(t, client.SourceDirect, dec.Source)
			assert.Zero(t, c.Stats().ServerErrors)

			// Plain HTTP to the TLS port is not served.
			resp, err := http.Get("http://" + d.addr + protocol.PathHealthz)
			if err == nil {
				resp.Body.Close()
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			}
		})
	}
	for _, args := range [][]string{{"-tls-cert", cert.CertFile}, {"-tls-key", cert.KeyFile}} {
		r := runCLI(t, nil, args...)
		assert.Equal(t, 2, exitCode(r.err), "%v: %v", args, r.err)
		assert.Contains(t, r.stderr, "-tls-cert and -tls-key go together")
	}
	r := runCLI(t, nil, "-listen", "127.0.0.1:0", "-tls-cert", cert.KeyFile, "-tls-key", cert.CertFile)
	assert.Equal(t, 1, exitCode(r.err), "swapped files: %v", r.err)
}

// TestMetricsTokenFlag: -metrics-token-sha256 (or its environment
// variable) makes /metrics require the token.
func TestMetricsTokenFlag(t *testing.T) {
	const token = "scraper-secret"
	sum := sha256.Sum256([]byte(token))
	d := startDaemon(t, map[string]string{"RATELEASED_METRICS_TOKEN_SHA256": hex.EncodeToString(sum[:])})
	url := "http://" + d.addr + protocol.PathMetrics
	tests := []struct {
		name   string
		token  string
		status int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "nope", http.StatusUnauthorized},
		{"right token", token, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, url, nil)
			require.NoError(t, err)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			r := send(t, req)
			assert.Equal(t, tt.status, r.StatusCode)
			if tt.status == http.StatusOK {
				assert.Contains(t, string(r.body), "ratelease_build_info{")
			}
		})
	}
	r := runCLI(t, nil, "-metrics-token-sha256", "not-hex")
	assert.Equal(t, 2, exitCode(r.err))
}
