// Package e2eproc builds and runs the project's real binaries for
// multi-process tests and benchmarks: rateleased daemons on free loopback
// ports, and any other command (the load generator) as a child process that
// can be killed, stopped and continued.
package e2eproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/internal/proc"
)

// Build compiles the main package pkg (an import path such as
// "github.com/ratelease/ratelease/server/cmd/rateleased") into dir and
// returns the binary's path.
func Build(dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = os.Environ()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// Daemon is one rateleased process on 127.0.0.1.
type Daemon struct {
	t    testing.TB
	bin  string
	args []string
	addr string // fixed after the first start, so restarts keep the port

	mu   sync.Mutex
	cmd  *exec.Cmd
	out  *proc.Tail
	done chan struct{}
}

const (
	maxOutput     = 4 << 20 // output kept per process
	startTimeout  = 10 * time.Second
	startAttempts = 50                     // on the same address, while it is in use
	startBackoff  = 100 * time.Millisecond // between them
	pollInterval  = 10 * time.Millisecond
)

var listenRE = regexp.MustCompile(`msg="?rateleased listening"?.*addr=([0-9.]+:[0-9]+)`)

// errAddrInUse reports that rateleased exited because its address was in
// use: the one start failure that a later try may not have.
var errAddrInUse = errors.New("address in use")

// readyClient polls /readyz; each poll has its own connection, so none is
// left open to the daemon.
var readyClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// StartDaemon starts bin (rateleased) with args plus "-listen
// 127.0.0.1:0", waits until it logs its address and answers /readyz (which
// needs its store to answer), and stops it (SIGKILL) at the end of the
// test.
func StartDaemon(t testing.TB, bin string, args ...string) *Daemon {
	t.Helper()
	d := &Daemon{t: t, bin: bin, args: args, addr: "127.0.0.1:0"}
	if err := d.start(); err != nil {
		t.Fatalf("e2eproc: %v", err)
	}
	t.Cleanup(func() { d.Kill() })
	return d
}

// start launches the daemon on d.addr. It tries again, a while, only if
// the address was in use (after a restart, another socket may hold the
// port for a moment); any other failure is returned at once.
func (d *Daemon) start() error {
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = d.launch(); err == nil || !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(startBackoff)
	}
	if err != nil {
		return fmt.Errorf("rateleased did not start on %s: %w", d.addr, err)
	}
	return nil
}

// launch runs the daemon once and waits until it is ready. On failure the
// process is gone, and the error includes its output.
func (d *Daemon) launch() error {
	out := proc.NewTail(maxOutput)
	cmd := exec.Command(d.bin, append(append([]string(nil), d.args...), "-listen", d.addr, "-log-level", "info")...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = proc.SysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", d.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	d.mu.Lock()
	d.cmd, d.out, d.done = cmd, out, done
	d.mu.Unlock()

	addr, err := waitListening(out, done, startTimeout)
	if err == nil {
		if err = waitReady("http://"+addr, done, startTimeout); err == nil {
			d.addr = addr
			return nil
		}
	}
	_ = cmd.Process.Kill()
	<-done
	output := out.String()
	if strings.Contains(output, "address already in use") {
		err = fmt.Errorf("%w: %w", errAddrInUse, err)
	}
	return fmt.Errorf("%w\n%s", err, output)
}

func waitListening(out *proc.Tail, done chan struct{}, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if m := listenRE.FindStringSubmatch(out.String()); m != nil {
			return m[1], nil
		}
		select {
		case <-done:
			return "", errors.New("rateleased exited")
		case <-time.After(pollInterval):
		}
	}
	return "", fmt.Errorf("rateleased did not log its address within %v", timeout)
}

// waitReady polls GET /readyz until it answers 200 OK.
func waitReady(url string, done chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		resp, err := readyClient.Get(url + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		last = err
		select {
		case <-done:
			return errors.New("rateleased exited")
		case <-time.After(pollInterval):
		}
	}
	return fmt.Errorf("rateleased not ready within %v: %v", timeout, last)
}

// Addr returns "127.0.0.1:port"; it stays the same across Restart.
func (d *Daemon) Addr() string { return d.addr }

// URL returns "http://127.0.0.1:port".
func (d *Daemon) URL() string { return "http://" + d.addr }

// Output returns what the process logged so far.
func (d *Daemon) Output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.out == nil {
		return ""
	}
	return d.out.String()
}

// PID returns the process id of the daemon's latest start (which may have
// exited since).
func (d *Daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

func (d *Daemon) signal(sig os.Signal) {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the process to exit.
func (d *Daemon) Kill() {
	d.signal(syscall.SIGKILL)
	d.wait()
}

// Term sends SIGTERM (a graceful shutdown) and waits up to 15 s.
func (d *Daemon) Term() {
	d.signal(syscall.SIGTERM)
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		d.t.Errorf("e2eproc: rateleased %s did not stop on SIGTERM:\n%s", d.addr, d.Output())
		d.Kill()
	}
}

func (d *Daemon) wait() {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Restart starts the daemon again on the same address (after Kill or Term).
func (d *Daemon) Restart() {
	d.t.Helper()
	d.Kill()
	if err := d.start(); err != nil {
		d.t.Fatalf("e2eproc: restart: %v", err)
	}
}

// Process is a child process started by Run.
type Process struct {
	Cmd  *exec.Cmd
	out  *proc.Tail
	done chan struct{}
	err  error
}

// Run starts bin with args; its output is kept for Wait. It is killed at
// the end of the test if still running.
func Run(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	p := &Process{out: proc.NewTail(maxOutput), done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Stdout = p.out
	p.Cmd.Stderr = p.out
	p.Cmd.SysProcAttr = proc.SysProcAttr()
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("e2eproc: start %s: %v", bin, err)
	}
	go func() { p.err = p.Cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.Cmd.Process.Signal(syscall.SIGCONT)
			_ = p.Cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Wait waits for the process to exit, at most until ctx ends, and returns
// its error and output.
func (p *Process) Wait(ctx context.Context) (string, error) {
	select {
	case <-p.done:
		return p.out.String(), p.err
	case <-ctx.Done():
		return p.out.String(), ctx.Err()
	}
}
