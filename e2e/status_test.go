package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

// statusRules are the rules of TestStatusPageInBrowser: status:* admits 2
// an hour, so that the rest of a burst is denied.
const statusRules = `
default: allow
rules:
  - name: status-demo
    match: "status:*"
    limit: 2
    period: 1h
  - name: per-user
    match: "user:*"
    limit: 100
    period: 1s
`

// chromium returns the headless browser the status test drives:
// RATELEASE_CHROMIUM when set, else chromium on PATH. It skips the test,
// saying how to get one, when there is none (`make browser` installs it).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RATELEASE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (nor RATELEASE_CHROMIUM): run `make browser` as root, or `apt-get install chromium`, to test the status page in a browser")
	return ""
}

// runChromium runs the headless browser on url with args and returns its
// standard output.
func runChromium(t *testing.T, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--hide-scrollbars", "--user-data-dir=" + t.TempDir(),
	}, args...)
	cmd := exec.CommandContext(ctx, bin, append(all, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "chromium %v: stderr:\n%s", args, stderr.String())
	return stdout.Bytes()
}

// TestStatusPageInBrowser sends traffic through two rateleased sharing a
// real redis-server, loads /status in headless Chromium, checks the DOM
// for the rules, a key's denials and both servers, and takes a screenshot
// (written to docs/status.png with RATELEASE_UPDATE_SCREENSHOT=1).
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, two rateleased and a browser")
	}
	browser := chromium(t)
	rdb := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(statusRules), 0o600))
	d1 := e2eproc.StartDaemon(t, bins.rateleased, "-rules", path, "-redis", rdb.URL())
	d2 := e2eproc.StartDaemon(t, bins.rateleased, "-rules", path, "-redis", rdb.URL())

	hc := &http.Client{Timeout: 5 * time.Second}
	post := func(url string, v any) int {
		body, err := json.Marshal(v)
		require.NoError(t, err)
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// status:alice: 2 granted then 8 denied, all through d1; user:1 leased
	// through d2.
	for range 10 {
		require.Equal(t, http.StatusOK, post(d1.URL()+protocol.PathCheck, protocol.CheckRequest{Keys: []string{"status:alice"}}))
	}
	require.Equal(t, http.StatusOK, post(d2.URL()+protocol.PathLeases, protocol.LeaseRequest{ClientID: "e2e", Leases: []protocol.LeaseEntry{{Key: "user:1", Want: 10}}}))

	// Both servers record themselves in Redis when they start listening:
	// wait until d1's page lists d2.
	statusURL := d1.URL() + protocol.PathStatus
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Get(statusURL)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), d2.Addr()) {
			break
		}
		require.True(t, time.Now().Before(deadline), "d1's status page never listed d2 (%s):\n%s", d2.Addr(), b)
		time.Sleep(50 * time.Millisecond) // polling observed state
	}

	dom := string(runChromium(t, browser, statusURL, "--dump-dom"))
	require.Contains(t, dom, "rateleased status", "the browser did not render the page:\n%s", dom)
	rules := section(t, dom, `id="rules"`)
	require.Contains(t, rules, `data-rule="status-demo"`)
	require.Contains(t, rules, `data-rule="per-user"`)
	require.Regexp(t, `(?s)data-rule="status-demo".*?class="n granted">2<.*?class="n denied">8<`, rules)
	denied := section(t, dom, `id="denied-keys"`)
	require.Regexp(t, `(?s)data-key="status:alice".*?class="n">8<`, denied, "the denials of status:alice")
	servers := section(t, dom, `id="servers"`)
	require.Contains(t, servers, d1.Addr())
	require.Contains(t, servers, d2.Addr())

	shot := filepath.Join(t.TempDir(), "status.png")
	runChromium(t, browser, statusURL, "--screenshot="+shot, "--window-size=1280,1100")
	png, err := os.ReadFile(shot)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "not a PNG")
	// The screenshot of the README (docs/status.png) is rewritten only on
	// request (RATELEASE_UPDATE_SCREENSHOT=1), so that a test run leaves
	// the checkout clean.
	if os.Getenv("RATELEASE_UPDATE_SCREENSHOT") == "1" {
		require.NoError(t, os.WriteFile(filepath.Join("..", "docs", "status.png"), png, 0o644))
		t.Logf("screenshot of %s: docs/status.png (%d bytes)", statusURL, len(png))
	}
}

// section returns the HTML of the table that starts at marker in dom.
func section(t *testing.T, dom, marker string) string {
	t.Helper()
	_, rest, ok := strings.Cut(dom, marker)
	require.True(t, ok, "%s not in the DOM:\n%s", marker, dom)
	s, _, _ := strings.Cut(rest, "</table>")
	return s
}
