package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelease/ratelease/e2e/internal/proc"
)

const (
	// envServer names the environment variable that, when set, gives the
	// redis-server binary to use instead of looking it up on PATH.
	envServer = "RATELEASE_REDIS_SERVER"

	installHint = "run `make test` (installs it with apt-get as root) or `apt-get install redis-server`"

	startAttempts   = 5                      // fresh ports tried by Start
	restartAttempts = 5                      // tries on the same port by Restart
	restartBackoff  = 200 * time.Millisecond // between Restart tries
	readyTimeout    = 10 * time.Second       // until redis-server answers PING
	probeInterval   = 20 * time.Millisecond
	probeTimeout    = time.Second
	stopGrace       = 5 * time.Second // SIGTERM to SIGKILL
	waitDelay       = 2 * time.Second // see exec.Cmd.WaitDelay

	maxOutput  = 256 << 10 // output kept in memory
	tailOutput = 4 << 10   // output shown in failure messages
)

// errExited reports that redis-server exited before answering PING, which
// usually means it could not bind its port.
var errExited = errors.New("redis-server exited before answering PING")

// Server is a redis-server process started for one test.
type Server struct {
	bin   string
	dir   string
	port  int
	out   *proc.Tail
	extra []string // more redis-server arguments

	mu sync.Mutex
	p  *run // latest process; nil before the first launch
}

// run is one run of redis-server.
type run struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // cmd.Wait's result; read only after done is closed
}

func (p *run) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts redis-server on a free 127.0.0.1 port in t.TempDir(), waits
// until it answers PING (timeout 10s), and registers t.Cleanup to stop it. If
// the redis-server binary is not on PATH (or at the path in env
// RATELEASE_REDIS_SERVER), it calls t.Fatalf with a message saying how to
// install it.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

// Options configure StartWith.
type Options struct {
	// Persist makes redis-server save its data set on a graceful Stop
	// (SIGTERM) and load it on Restart, like a production Redis with RDB
	// snapshots. Kill loses what was not saved.
	Persist bool
}

// StartWith is Start with options.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	var extra []string
	if opts.Persist {
		extra = append(extra, "--save", "3600 1", "--dbfilename", "dump.rdb")
	}
	return start(t, extra)
}

func start(t testing.TB, extra []string) *Server {
	t.Helper()
	bin, err := lookPath()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), out: proc.NewTail(maxOutput), extra: extra}
	// Registered after t.TempDir, so it runs before the directory is removed,
	// and before launching, so a half-started process is killed as well.
	t.Cleanup(func() {
		if s.kill() && t.Failed() {
			t.Logf("redistest: redis-server %s output (tail):\n%s", s.Addr(), s.tail())
		}
	})

	var errs []error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		s.port = port
		err = s.launch()
		if err == nil {
			return s
		}
		errs = append(errs, fmt.Errorf("attempt %d, port %d: %w", attempt, port, err))
		if !errors.Is(err, errExited) {
			break // not a port clash: trying another port will not help
		}
	}
	t.Fatalf("redistest: could not start %s in %s:\n%v\nredis-server output (tail):\n%s",
		s.bin, s.dir, errors.Join(errs...), s.tail())
	return nil
}

// Addr returns the server's address, "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server's URL, "redis://127.0.0.1:port/0".
func (s *Server) URL() string {
	return "redis://" + s.Addr() + "/0"
}

// Client returns a new go-redis client to the server, closed at t.Cleanup.
// The client keeps working across Restart (it reconnects). It never
// retries a command: a script retried after a timeout may have run already,
// and a test that counts what a store did would count it twice.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DB: 0, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server: SIGTERM, then SIGKILL if it has not exited after 5s,
// and waits for the process to exit. Stopping a stopped server does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	p := s.current()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		t.Logf("redistest: redis-server %s still running %v after SIGTERM; sending SIGKILL", s.Addr(), stopGrace)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill kills the server with SIGKILL and waits for the process to exit.
// Killing a stopped server does nothing.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.kill()
}

// Pause stops the server's process with SIGSTOP: it keeps its port and
// accepts connections, but answers nothing (a stalled Redis: a full
// machine, a long fork or fsync), until the returned function continues
// it with SIGCONT. Cleanup continues it too, before the server is stopped.
func (s *Server) Pause(t testing.TB) (resume func()) {
	t.Helper()
	p := s.current()
	if p == nil || p.exited() {
		t.Fatalf("redistest: Pause: redis-server %s is not running", s.Addr())
	}
	pid := p.cmd.Process.Pid
	resume = func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(resume)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("redistest: SIGSTOP redis-server %s: %v", s.Addr(), err)
	}
	return resume
}

// Restart starts the server again on the same port and in the same directory,
// and waits until it answers PING. A running server is stopped first. A
// server started with Start comes back with an empty data set; one started
// with StartWith(Options{Persist: true}) loads its last snapshot, which Stop
// saves and Kill does not.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop(t)
	var errs []error
	for attempt := 1; attempt <= restartAttempts; attempt++ {
		err := s.launch()
		if err == nil {
			return
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
		if !errors.Is(err, errExited) {
			break
		}
		// The port may still be held, e.g. by a connection that was bound
		// to it in the meantime; give it a moment.
		time.Sleep(restartBackoff)
	}
	t.Fatalf("redistest: could not restart %s on %s:\n%v\nredis-server output (tail):\n%s",
		s.bin, s.Addr(), errors.Join(errs...), s.tail())
}

func (s *Server) current() *run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// kill kills the current process, if it is running, and waits for it. It
// reports whether a process had been launched at all.
func (s *Server) kill() bool {
	p := s.current()
	if p == nil {
		return false
	}
	if !p.exited() {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
	return true
}

// launch runs redis-server on s.port and waits until it answers PING. On
// failure the process is gone when launch returns.
func (s *Server) launch() error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--protected-mode", "yes",
		"--daemonize", "no",
		"--loglevel", "warning",
	}
	cmd := exec.Command(s.bin, append(args, s.extra...)...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = proc.SysProcAttr()
	cmd.Stdin = nil
	cmd.Stdout = s.out
	cmd.Stderr = s.out
	// Bounds Wait if a forked child (e.g. after an explicit BGSAVE) keeps the
	// output pipe open after redis-server itself has exited.
	cmd.WaitDelay = waitDelay

	fmt.Fprintf(s.out, "--- redistest: %s --port %d\n", s.bin, s.port)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", s.bin, err)
	}
	p := &run{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()

	if err := waitReady(p, s.Addr()); err != nil {
		s.kill()
		return err
	}
	return nil
}

// waitReady waits until the redis-server of p answers PING on addr. It checks
// the process id the server reports, so that another server that already
// listens on addr (which makes p fail to bind and exit) is not mistaken for p.
func waitReady(p *run, addr string) error {
	deadline := time.Now().Add(readyTimeout)
	pid := p.cmd.Process.Pid
	var lastErr error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%w (%v)", errExited, p.err)
		default:
		}
		gotPID, err := probe(addr)
		if err == nil {
			if gotPID == pid {
				return nil
			}
			err = fmt.Errorf("%s is served by another process (pid %d, ours is %d)", addr, gotPID, pid)
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server (pid %d) did not answer PING on %s within %v: %v", pid, addr, readyTimeout, lastErr)
		}
		time.Sleep(probeInterval)
	}
}

// probe sends PING and INFO server to addr, and returns the process id that
// INFO reports. It dials itself, with a short timeout, so that a refused
// connection (the usual answer while redis-server starts) is not logged by
// go-redis, and hands the connection to a go-redis client that is used once.
func probe(addr string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var dialed sync.Once
	c := redis.NewClient(&redis.Options{
		Addr: addr,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			err := errors.New("redistest: probe connection already used")
			dialed.Do(func() { err = nil })
			if err != nil {
				return nil, err
			}
			return conn, nil
		},
		Protocol:        2,
		DisableIdentity: true,
		PoolSize:        1,
		MaxRetries:      -1,
		ReadTimeout:     probeTimeout,
		WriteTimeout:    probeTimeout,
	})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return 0, fmt.Errorf("PING: %w", err)
	}
	info := c.InfoMap(ctx, "server")
	if err := info.Err(); err != nil {
		return 0, fmt.Errorf("INFO server: %w", err)
	}
	v := info.Item("Server", "process_id")
	if v == "" {
		return 0, errors.New("INFO server has no process_id")
	}
	pid, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("INFO server: process_id %q: %w", v, err)
	}
	return pid, nil
}

// lookPath returns the redis-server binary to run: the one named by
// RATELEASE_REDIS_SERVER if that is set, else the one on PATH. Its errors
// say how to install redis-server.
func lookPath() (string, error) {
	if bin := os.Getenv(envServer); bin != "" {
		path, err := exec.LookPath(bin)
		if err != nil {
			return "", fmt.Errorf("redis-server not found at %s=%q (%v): fix or unset %s, "+
				"which overrides PATH; to install redis-server, %s", envServer, bin, err, envServer, installHint)
		}
		return path, nil
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found on PATH: " + installHint)
	}
	return path, nil
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// tail returns the last tailOutput bytes of the server's output, for
// failure messages.
func (s *Server) tail() string {
	if t := s.out.Last(tailOutput); t != "" {
		return t
	}
	return "(no output)"
}
