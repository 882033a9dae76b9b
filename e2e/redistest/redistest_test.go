package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/internal/proc"
)

func ping(ctx context.Context, s *Server) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	return c.Ping(ctx).Err()
}

// requireGone checks that the process with the given id no longer exists
// (it has exited and been reaped).
func requireGone(t *testing.T, pid int) {
	t.Helper()
	err := syscall.Kill(pid, 0)
	require.ErrorIs(t, err, syscall.ESRCH, "redis-server pid %d still exists", pid)
}

func pidOf(t *testing.T, s *Server) int {
	t.Helper()
	p := s.current()
	require.NotNil(t, p)
	return p.cmd.Process.Pid
}

func TestStartPingSetGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)

	host, port, ok := splitAddr(s.Addr())
	require.True(t, ok, s.Addr())
	require.Equal(t, "127.0.0.1", host)
	require.NotEqual(t, 6379, port)
	require.Equal(t, "redis://"+s.Addr()+"/0", s.URL())

	opt, err := redis.ParseURL(s.URL())
	require.NoError(t, err)
	require.Equal(t, s.Addr(), opt.Addr)
	require.Equal(t, 0, opt.DB)

	c := s.Client(t)
	require.Equal(t, "PONG", c.Ping(ctx).Val())
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	got, err := c.Get(ctx, "k").Result()
	require.NoError(t, err)
	require.Equal(t, "v", got)

	// Persistence is off and the server runs in its own directory.
	cfg, err := c.ConfigGet(ctx, "*").Result()
	require.NoError(t, err)
	require.Equal(t, "", cfg["save"])
	require.Equal(t, "no", cfg["appendonly"])
	require.Equal(t, "yes", cfg["protected-mode"])
	require.Equal(t, s.dir, cfg["dir"])
}

func TestStopRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	addr := s.Addr()
	c := s.Client(t)
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())

	pid := pidOf(t, s)
	s.Stop(t)
	requireGone(t, pid)
	require.Error(t, ping(ctx, s))
	s.Stop(t) // idempotent
	s.Kill(t) // no-op on a stopped server

	s.Restart(t)
	require.Equal(t, addr, s.Addr())
	require.NoError(t, ping(ctx, s))
	require.NotEqual(t, pid, pidOf(t, s))

	// The client made before the restart reconnects; nothing was persisted.
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil)
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	addr := s.Addr()

	pid := pidOf(t, s)
	s.Kill(t)
	requireGone(t, pid)
	require.Error(t, ping(ctx, s))
	s.Kill(t) // idempotent

	s.Restart(t)
	require.Equal(t, addr, s.Addr())
	require.NoError(t, ping(ctx, s))
}

func TestRestartRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	pid := pidOf(t, s)

	s.Restart(t)
	requireGone(t, pid)
	require.NoError(t, ping(ctx, s))
	require.NotEqual(t, pid, pidOf(t, s))
}

func TestParallelServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var servers [2]*Server
	var started sync.WaitGroup
	started.Add(len(servers))
	checked := make(chan struct{}) // closed when subtest 0 is done with both servers
	t.Run("group", func(t *testing.T) {
		for i := range servers {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				if i == 0 {
					defer close(checked)
				}
				func() {
					defer started.Done()
					servers[i] = Start(t)
				}()
				started.Wait()
				if i != 0 {
					<-checked // keep this server running until subtest 0 is done
					return
				}
				a, b := servers[0], servers[1]
				require.NotNil(t, b)
				require.NotEqual(t, a.Addr(), b.Addr())
				require.NotEqual(t, a.dir, b.dir)
				// Separate data sets.
				require.NoError(t, a.Client(t).Set(ctx, "k", "a", 0).Err())
				require.ErrorIs(t, b.Client(t).Get(ctx, "k").Err(), redis.Nil)
			})
		}
	})
}

func TestCleanupKillsServer(t *testing.T) {
	t.Parallel()
	var pid int
	var s *Server
	t.Run("inner", func(t *testing.T) {
		s = Start(t)
		pid = pidOf(t, s)
	})
	requireGone(t, pid)
	require.Error(t, ping(context.Background(), s))
}

// TestPortClash checks that a server that cannot bind its port is not
// mistaken for the one already listening there.
func TestPortClash(t *testing.T) {
	t.Parallel()
	a := Start(t)
	b := &Server{bin: a.bin, dir: t.TempDir(), port: a.port, out: proc.NewTail(maxOutput)}
	t.Cleanup(func() { b.kill() })

	err := b.launch()
	require.ErrorIs(t, err, errExited)
	require.NoError(t, ping(context.Background(), a))
	require.Contains(t, b.tail(), "--port "+strconv.Itoa(a.port))
}

// fakeTB records Fatalf instead of failing the real test.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	fatals []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

// startFake calls Start(f) as a test would, and returns its failure message.
func startFake(t *testing.T) (*Server, string) {
	t.Helper()
	f := &fakeTB{TB: t}
	var s *Server
	done := make(chan struct{})
	go func() {
		defer close(done)
		s = Start(f)
	}()
	<-done
	require.LessOrEqual(t, len(f.fatals), 1)
	if len(f.fatals) == 0 {
		return s, ""
	}
	return s, f.fatals[0]
}

func TestStartMissingBinary(t *testing.T) {
	t.Setenv(envServer, "")
	t.Setenv("PATH", t.TempDir())
	s, msg := startFake(t)
	require.Nil(t, s)
	require.Equal(t, "redistest: redis-server not found on PATH: run `make test` "+
		"(installs it with apt-get as root) or `apt-get install redis-server`", msg)
}

func TestStartBinaryFails(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "fake-redis-server")
	script := "#!/bin/sh\necho \"fake: Could not create server TCP listening socket: bind: Address already in use\" >&2\nexit 1\n"
	require.NoError(t, os.WriteFile(bin, []byte(script), 0o755))
	t.Setenv(envServer, bin)

	s, msg := startFake(t)
	require.Nil(t, s)
	require.Contains(t, msg, "could not start "+bin)
	require.Contains(t, msg, fmt.Sprintf("attempt %d", startAttempts))
	require.Contains(t, msg, "exited before answering PING")
	require.Contains(t, msg, "bind: Address already in use")
}

func TestLookPathEnvMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-redis-server")
	t.Setenv(envServer, missing)
	_, err := lookPath()
	require.Error(t, err)
	require.Contains(t, err.Error(), "redis-server not found at "+envServer+"=")
	require.Contains(t, err.Error(), missing)
	require.Contains(t, err.Error(), "`make test`")
	require.Contains(t, err.Error(), "`apt-get install redis-server`")
}

func TestLookPathNotOnPATH(t *testing.T) {
	t.Setenv(envServer, "")
	t.Setenv("PATH", t.TempDir())
	_, err := lookPath()
	require.EqualError(t, err, "redis-server not found on PATH: run `make test` "+
		"(installs it with apt-get as root) or `apt-get install redis-server`")
}

func TestLookPathEnvOverride(t *testing.T) {
	t.Setenv(envServer, "")
	bin, err := lookPath()
	require.NoError(t, err)
	t.Setenv(envServer, bin)
	t.Setenv("PATH", t.TempDir())
	got, err := lookPath()
	require.NoError(t, err)
	require.Equal(t, bin, got)
}

func TestLookPathOnPATH(t *testing.T) {
	t.Setenv(envServer, "")
	got, err := lookPath()
	require.NoError(t, err)
	want, err := exec.LookPath("redis-server")
	require.NoError(t, err)
	require.Equal(t, want, got)
}

func TestTail(t *testing.T) {
	s := &Server{out: proc.NewTail(maxOutput)}
	require.Equal(t, "(no output)", s.tail())
	line := make([]byte, 1000)
	for i := range line {
		line[i] = 'x'
	}
	for range 1000 {
		_, err := s.out.Write(line)
		require.NoError(t, err)
	}
	_, err := s.out.Write([]byte("end\n"))
	require.NoError(t, err)
	require.LessOrEqual(t, len(s.out.String()), maxOutput)
	require.Len(t, s.tail(), tailOutput)
	require.Equal(t, "end\n", s.tail()[tailOutput-4:])
}

// TestProbe checks that probe reports the pid of the server on the port,
// and an error when nothing listens there.
func TestProbe(t *testing.T) {
	t.Parallel()
	s := Start(t)
	pid, err := probe(s.Addr())
	require.NoError(t, err)
	require.Equal(t, pidOf(t, s), pid)
	s.Kill(t)
	_, err = probe(s.Addr())
	require.Error(t, err)
}

func splitAddr(addr string) (string, int, bool) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			port, err := strconv.Atoi(addr[i+1:])
			return addr[:i], port, err == nil
		}
	}
	return "", 0, false
}

func TestPersistAcrossRestart(t *testing.T) {
	s := StartWith(t, Options{Persist: true})
	c := s.Client(t)
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	s.Stop(t)
	s.Restart(t)
	v, err := c.Get(ctx, "k").Result()
	require.NoError(t, err)
	require.Equal(t, "v", v)
}
