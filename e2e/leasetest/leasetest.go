// Package leasetest starts real lease servers (package server, in this
// process, over a real loopback listener) for the tests of other packages:
// the client SDK tests and the examples' tests use it, so none of them
// copies server setup.
package leasetest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/server"
)

// Options configure Start.
type Options struct {
	// Store keeps the buckets; nil means a new memory store. Pass a Redis
	// store, or the same store to several servers, to share buckets.
	Store leases.Store
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// MaxKeysPerClient is server.Options.MaxKeysPerClient; zero means the
	// server's default.
	MaxKeysPerClient int
}

// Server is one lease server on 127.0.0.1. It can be stopped and started
// again on the same address, keeping its store.
type Server struct {
	t         testing.TB
	addr      string
	rulesPath string
	opts      Options

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

// Start writes rules (YAML) to a temporary file and starts a lease server
// on a free loopback port. It is stopped at the end of the test.
func Start(t testing.TB, rules string, opts Options) *Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatalf("leasetest: write rules: %v", err)
	}
	if opts.Store == nil {
		ms := leases.NewMemoryStore(leases.MemoryOptions{})
		t.Cleanup(func() { _ = ms.Close() }) // after Stop: cleanups run last first
		opts.Store = ms
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{t: t, rulesPath: path, opts: opts, addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// URL returns "http://127.0.0.1:port".
func (s *Server) URL() string { return "http://" + s.addr }

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return s.addr }

func (s *Server) start() {
	s.t.Helper()
	var ln net.Listener
	var err error
	// The port may still be held for a moment after a stop.
	for i := 0; i < 50; i++ {
		ln, err = net.Listen("tcp", s.addr)
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("leasetest: listen on %s: %v", s.addr, err)
	}
	s.addr = ln.Addr().String()
	srv, err := server.New(server.Options{
		Store:            s.opts.Store,
		RulesPath:        s.rulesPath,
		ListenAddr:       s.addr,
		Logger:           s.opts.Logger,
		ReloadInterval:   100 * time.Millisecond,
		MaxKeysPerClient: s.opts.MaxKeysPerClient,
	})
	if err != nil {
		ln.Close()
		s.t.Fatalf("leasetest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	s.mu.Lock()
	s.cancel, s.done = cancel, done
	s.mu.Unlock()
}

// Stop shuts the server down (in-flight requests finish) and waits. The
// address refuses connections until Restart. Stop is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		s.t.Errorf("leasetest: server on %s: %v", s.addr, err)
	}
}

// Restart starts the server again on the same address with the same store
// and rules file.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// SetRules replaces the rules file; the server reloads it within 100 ms.
func (s *Server) SetRules(rules string) {
	s.t.Helper()
	tmp := s.rulesPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(rules), 0o600); err != nil {
		s.t.Fatalf("leasetest: write rules: %v", err)
	}
	if err := os.Rename(tmp, s.rulesPath); err != nil {
		s.t.Fatalf("leasetest: replace rules: %v", err)
	}
}
