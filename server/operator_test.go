package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/tlstest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// readyDetail returns the detail of a GET /readyz that must answer 200.
func (f *fixture) readyDetail() string {
	f.t.Helper()
	r := f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
	require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
	var b statusBody
	require.NoError(f.t, json.Unmarshal(r.body, &b))
	require.Equal(f.t, "ok", b.Status)
	return b.Detail
}

// TestReloadFailureVisible: a server whose last reload failed stays ready
// (its rules serve) and says so in /readyz, in a gauge and in an ERROR log
// naming the rule and the field; a good reload clears all of it.
func TestReloadFailureVisible(t *testing.T) {
	f := newFixture(t, rulesYAML, nil, Options{ReloadInterval: -1})
	assert.Empty(t, f.readyDetail())
	assert.Equal(t, "1", f.metric("ratelease_rules_last_reload_success"))
	require.NoError(t, f.srv.ReloadError())

	tests := []struct {
		name       string
		content    string // "" with remove: the file is deleted
		wantDetail []string
	}{
		{"bad limit", strings.Replace(rulesYAML, "limit: 100", "limit: -3", 1), []string{`rule "per-user"`, "limit"}},
		{"unknown field", strings.Replace(rulesYAML, "burst: 100", "burts: 100", 1), []string{"burts"}},
		{"bad client", rulesYAML + "clients:\n  - {name: x, token_sha256: nothex, keys: [\"*\"]}\n", []string{`client "x"`, "token_sha256"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.writeRules(tt.content)
			require.Error(t, f.srv.Reload())
			detail := f.readyDetail()
			assert.Contains(t, detail, "the last reload of the rules file failed")
			for _, w := range tt.wantDetail {
				assert.Contains(t, detail, w)
			}
			assert.Equal(t, "0", f.metric("ratelease_rules_last_reload_success"))
			assert.Regexp(t, `level=ERROR msg="rules reload failed`, f.logs.String())
			assert.EqualValues(t, 100, f.rulesLimit(""), "the old rules serve")

			// Back to the rules in force: nothing failed any more.
			f.writeRules(rulesYAML)
			require.NoError(t, f.srv.Reload())
			assert.Empty(t, f.readyDetail())
			assert.Equal(t, "1", f.metric("ratelease_rules_last_reload_success"))
		})
	}
	// A good new file clears a failure too.
	f.writeRules("nope: [")
	require.Error(t, f.srv.Reload())
	f.writeRules(strings.Replace(rulesYAML, "limit: 100", "limit: 200", 1))
	require.NoError(t, f.srv.Reload())
	assert.Empty(t, f.readyDetail())
	assert.Equal(t, "1", f.metric("ratelease_rules_last_reload_success"))
	assert.EqualValues(t, 200, f.rulesLimit(""))
}

// TestMetricsToken: with Options.MetricsTokenSHA256, /metrics needs that
// bearer token; without, it is open. The API's clients do not apply.
func TestMetricsToken(t *testing.T) {
	const token = "scrape-token"
	tests := []struct {
		name       string
		opts       Options
		rules      string
		token      string
		wantStatus int
	}{
		{"open by default", Options{}, rulesYAML, "", http.StatusOK},
		{"open by default, clients configured", Options{}, authRulesYAML(), "", http.StatusOK},
		{"token required, none sent", Options{MetricsTokenSHA256: sha(token)}, rulesYAML, "", http.StatusUnauthorized},
		{"token required, wrong one", Options{MetricsTokenSHA256: sha(token)}, rulesYAML, "wrong", http.StatusUnauthorized},
		{"a client's token is not the metrics token", Options{MetricsTokenSHA256: sha(token)}, authRulesYAML(), alphaToken, http.StatusUnauthorized},
		{"token required, right one", Options{MetricsTokenSHA256: sha(token)}, rulesYAML, token, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.rules, nil, tt.opts)
			r := f.do(http.MethodGet, protocol.PathMetrics, tt.token, "", nil)
			require.Equal(t, tt.wantStatus, r.status, "body: %s", r.body)
			if tt.wantStatus == http.StatusOK {
				assert.Contains(t, string(r.body), "ratelease_build_info")
				return
			}
			assert.Equal(t, protocol.CodeUnauthorized, r.problem(t).Code)
			assert.NotContains(t, string(r.body), "ratelease_")
			// The other routes keep their own authentication.
			assert.Equal(t, http.StatusOK, f.do(http.MethodGet, protocol.PathHealthz, "", "", nil).status)
		})
	}
	_, err := New(Options{Store: leases.NewMemoryStore(leases.MemoryOptions{}), MetricsTokenSHA256: "abc"})
	assert.ErrorContains(t, err, "MetricsTokenSHA256")
}

// TestBuildInfo: /metrics names the build serving.
func TestBuildInfo(t *testing.T) {
	f := newFixture(t, "", nil, Options{})
	r := f.do(http.MethodGet, protocol.PathMetrics, "", "", nil)
	b := ReadBuild()
	assert.NotEmpty(t, b.Version)
	assert.NotEmpty(t, b.Revision)
	assert.True(t, strings.HasPrefix(b.GoVersion, "go"), b.GoVersion)
	assert.Regexp(t, regexp.MustCompile(`(?m)^ratelease_build_info\{goversion="`+regexp.QuoteMeta(b.GoVersion)+`",revision="[^"]+",version="[^"]+"\} 1$`), string(r.body))
}

// TestStoreErrorsCounted: a failed store call is counted per operation,
// not dropped.
func TestStoreErrorsCounted(t *testing.T) {
	ms := leases.NewMemoryStore(leases.MemoryOptions{})
	f := newFixture(t, rulesYAML, ms, Options{})
	f.lease("", "c", protocol.LeaseEntry{Key: "user:1", Want: 1})
	assert.Equal(t, "0", f.metric(`ratelease_store_errors_total{op="lease"}`))
	require.NoError(t, ms.Close())
	for range 2 {
		r := f.postJSON(protocol.PathLeases, "", `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`)
		require.Equal(t, http.StatusServiceUnavailable, r.status)
	}
	r := f.postJSON(protocol.PathCheck, "", `{"keys":["user:1"]}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, "2", f.metric(`ratelease_store_errors_total{op="lease"}`))
	assert.Equal(t, "1", f.metric(`ratelease_store_errors_total{op="take"}`))
}

// TestRunTLS: with Options.TLSConfig, Run serves HTTPS (HTTP/2 by ALPN) on
// 127.0.0.1, and a client that trusts the certificate is served; a plain
// HTTP request is not.
func TestRunTLS(t *testing.T) {
	cert := tlstest.SelfSigned(t)
	ms := leases.NewMemoryStore(leases.MemoryOptions{})
	t.Cleanup(func() { _ = ms.Close() })
	srv, err := New(Options{Store: ms, TLSConfig: cert.ServerConfig()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	base := ln.Addr().String()

	tests := []struct {
		name      string
		transport *http.Transport
		url       string
		wantProto int // 0: the request fails or is refused
	}{
		{"HTTP/2 over TLS", &http.Transport{TLSClientConfig: cert.ClientConfig(), ForceAttemptHTTP2: true}, "https://" + base, 2},
		{"HTTP/1.1 over TLS", &http.Transport{TLSClientConfig: cert.ClientConfig(), TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}, "https://" + base, 1},
		{"untrusted certificate", &http.Transport{}, "https://" + base, 0},
		{"plain HTTP", &http.Transport{}, "http://" + base, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hc := &http.Client{Transport: tt.transport, Timeout: 5 * time.Second}
			defer tt.transport.CloseIdleConnections()
			resp, err := hc.Get(tt.url + protocol.PathHealthz)
			if tt.wantProto == 0 {
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a plain request to a TLS port")
				}
				return
			}
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, tt.wantProto, resp.ProtoMajor)
		})
	}

	_, err = New(Options{Store: ms, TLSConfig: &tls.Config{}})
	assert.ErrorContains(t, err, "no certificate")
}

// TestBuildOf: the version and revision of the builds rateleased comes
// from: go install module@version, a source build, an embedding program,
// and a binary without build information.
func TestBuildOf(t *testing.T) {
	tests := []struct {
		name string
		info *debug.BuildInfo
		want Build
	}{
		{"go install @version", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: modulePath, Version: "v1.2.3"}},
			Build{Version: "v1.2.3", Revision: "unknown", GoVersion: "go1.26.0"}},
		{"source build", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: modulePath, Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"}}},
			Build{Version: "(devel)", Revision: "abc123", GoVersion: "go1.26.0"}},
		{"source build with changes", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: modulePath, Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}},
			Build{Version: "(devel)", Revision: "abc123-dirty", GoVersion: "go1.26.0"}},
		{"embedded in another program", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "example.com/app", Version: "v9.0.0"},
			Deps: []*debug.Module{{Path: "example.com/other", Version: "v1.0.0"}, {Path: modulePath, Version: "v0.4.0"}}},
			Build{Version: "v0.4.0", Revision: "unknown", GoVersion: "go1.26.0"}},
		{"no build information", nil, Build{Version: "unknown", Revision: "unknown", GoVersion: runtime.Version()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, buildOf(tt.info))
		})
	}
}
