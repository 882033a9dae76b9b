package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

// lockedBuffer is a bytes.Buffer safe for a process's writes and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var listeningAddr = regexp.MustCompile(`"msg":"rateleased listening".*"addr":"([0-9.]+:[0-9]+)"`)

// TestRunRedisClientLogsThroughSlog: what the go-redis client logs (a dial
// that failed, say, while Redis is down) goes through the daemon's logger,
// so that with -log-format json every line of the real binary's output is
// a JSON record, and -log-level applies to it. go-redis logs to stderr
// through a log.Logger of its own otherwise, in its own format.
func TestRunRedisClientLogsThroughSlog(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := e2eproc.Build(t.TempDir(), "github.com/ratelease/ratelease/server/cmd/rateleased")
	require.NoError(t, err)
	rs := redistest.Start(t)

	var out lockedBuffer
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-log-format", "json", "-rules", "../../../examples/rules.yaml", "-redis", rs.URL())
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var addr string
	require.Eventually(t, func() bool {
		m := listeningAddr.FindStringSubmatch(out.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "output: %s", &out)

	rs.Stop(t)
	body := `{"client_id":"c","leases":[{"key":"user:1","want":1}]}`
	for range 10 {
		resp, err := http.Post("http://"+addr+protocol.PathLeases, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
		require.NoError(t, waitErr, "exit 0 after SIGTERM")
	case <-time.After(10 * time.Second):
		t.Fatalf("no exit 10 s after SIGTERM; output:\n%s", &out)
	}

	var redisLines int
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var rec map[string]any
		if !assert.NoError(t, json.Unmarshal(sc.Bytes(), &rec), "a line that is no JSON record: %s", sc.Text()) {
			continue
		}
		if rec["msg"] == "redis client" {
			redisLines++
			assert.Equal(t, "WARN", rec["level"])
			assert.Contains(t, rec["log"], "failed to dial")
		}
	}
	assert.Positive(t, redisLines, "go-redis's dial failures are logged, as JSON:\n%s", &out)
}
