package e2eproc_test

import (
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ratelease/ratelease/e2e/e2eproc"
	"github.com/stretchr/testify/require"
)

func TestDaemonLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds rateleased")
	}
	dir := t.TempDir()
	bin, err := e2eproc.Build(dir, "github.com/ratelease/ratelease/server/cmd/rateleased")
	require.NoError(t, err)
	rules := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(rules, []byte("rules: []\n"), 0o600))
	d := e2eproc.StartDaemon(t, bin, "-rules", rules)
	get := func() error {
		resp, err := http.Get(d.URL() + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	require.NoError(t, get())
	addr, pid := d.Addr(), d.PID()
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, 0), "PID names the running daemon")
	d.Kill()
	require.Error(t, get())
	d.Restart()
	require.Equal(t, addr, d.Addr(), "a restart keeps the port")
	require.NotEqual(t, pid, d.PID(), "PID names the new process")
	require.NoError(t, get())
	d.Term()
	require.Error(t, get())
	require.Contains(t, d.Output(), "shut down")
}
