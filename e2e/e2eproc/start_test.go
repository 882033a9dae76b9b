package e2eproc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeDaemon writes a shell script that counts its runs in a file, prints
// msg on stderr and exits 1, and returns a Daemon that runs it and the
// count file.
func fakeDaemon(t *testing.T, msg string) (*Daemon, string) {
	t.Helper()
	dir := t.TempDir()
	count := filepath.Join(dir, "runs")
	bin := filepath.Join(dir, "rateleased")
	script := "#!/bin/sh\necho run >> '" + count + "'\necho '" + msg + "' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Daemon{t: t, bin: bin, addr: "127.0.0.1:1"}, count
}

func runs(t *testing.T, count string) int {
	t.Helper()
	b, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

// A daemon that fails for another reason than its address is not started
// again: the error, with its output, comes at once.
func TestStartFailsAtOnce(t *testing.T) {
	d, count := fakeDaemon(t, `level=ERROR msg="rateleased failed" err="-redis: invalid URL"`)
	t0 := time.Now()
	err := d.start()
	if err == nil {
		t.Fatal("start succeeded")
	}
	if errors.Is(err, errAddrInUse) {
		t.Errorf("error says the address is in use: %v", err)
	}
	if !strings.Contains(err.Error(), "-redis: invalid URL") {
		t.Errorf("error lacks the output: %v", err)
	}
	if n := runs(t, count); n != 1 {
		t.Errorf("ran %d times, want 1", n)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Errorf("took %v", el)
	}
}

// A daemon whose address is in use is reported as such, so start tries
// again.
func TestLaunchAddressInUse(t *testing.T) {
	d, _ := fakeDaemon(t, `level=ERROR msg="rateleased failed" err="listen on 127.0.0.1:1: listen tcp 127.0.0.1:1: bind: address already in use"`)
	err := d.launch()
	if !errors.Is(err, errAddrInUse) {
		t.Fatalf("launch: %v, want errAddrInUse", err)
	}
	if !strings.Contains(err.Error(), "bind: address already in use") {
		t.Errorf("error lacks the output: %v", err)
	}
}
