package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logRecord returns the first JSON log record of d with message msg.
func (d *daemon) logRecord(t *testing.T, msg string) map[string]any {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(d.logs.String()))
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			return rec
		}
	}
	t.Fatalf("no log %q; logs:\n%s", msg, d.logs.String())
	return nil
}

func TestRunDebugAddr(t *testing.T) {
	d := startDaemon(t, map[string]string{"RATELEASED_DEBUG_ADDR": "127.0.0.1:0"})
	addr, _ := d.logRecord(t, "rateleased debug listening")["addr"].(string)
	require.NotEmpty(t, addr)
	require.NotEqual(t, "127.0.0.1:0", addr, "the real port is logged")
	require.NotEqual(t, d.addr, addr, "a listener of its own")

	r := get(t, "http://"+addr+"/debug/pprof/")
	assert.Equal(t, http.StatusOK, r.StatusCode)
	assert.Contains(t, string(r.body), "goroutine")
	r = get(t, "http://"+addr+"/debug/pprof/goroutine?debug=1")
	assert.Equal(t, http.StatusOK, r.StatusCode)
	assert.Contains(t, string(r.body), "goroutine profile")
	r = get(t, "http://"+addr+"/debug/pprof/cmdline")
	assert.Equal(t, http.StatusNotFound, r.StatusCode, "the command line may carry the Redis password")

	r = get(t, "http://"+d.addr+"/debug/pprof/")
	assert.Equal(t, http.StatusNotFound, r.StatusCode, "the API does not serve the profiles")

	require.NoError(t, d.stop(t))
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/debug/pprof/", nil)
	require.NoError(t, err)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	_, err = (&http.Client{Transport: tr}).Do(req) //nolint:bodyclose // it fails
	assert.Error(t, err, "the debug listener closes with the server")
}

func TestRunWithoutDebugAddr(t *testing.T) {
	d := startDaemon(t, nil)
	assert.NotContains(t, d.logs.String(), "rateleased debug listening")
	assert.Equal(t, http.StatusNotFound, get(t, "http://"+d.addr+"/debug/pprof/").StatusCode)
}

func TestRunDebugAddrRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0"} {
		t.Run(addr, func(t *testing.T) {
			err := run(context.Background(), []string{"-listen", "127.0.0.1:0", "-debug-addr", addr}, func(string) string { return "" }, io.Discard)
			require.ErrorIs(t, err, errDebugNotLoopback)
			assert.Contains(t, err.Error(), "-debug-addr")
		})
	}
}
