package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// errDebugNotLoopback is wrapped by the error of a -debug-addr that is not a
// loopback address.
var errDebugNotLoopback = errors.New("the debug address is not loopback")

// debugMux serves the net/http/pprof handlers under /debug/pprof/, on a mux
// of its own: importing net/http/pprof registers them on
// http.DefaultServeMux too, which rateleased never serves. All but
// /debug/pprof/cmdline: the command line may carry secrets (-redis
// redis://user:password@…), and any process on the host can reach a
// loopback port; go tool pprof does not need it.
func debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", http.NotFound)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// checkDebugAddr refuses, before anything starts, a -debug-addr that is no
// host:port, or whose host is empty or an IP address that is not loopback
// (both listen on other interfaces). A host name is judged by
// listenDebug, once it resolves.
func checkDebugAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-debug-addr %q: want host:port, such as 127.0.0.1:6060: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && !ip.IsLoopback()) {
		return fmt.Errorf("-debug-addr %s: %w: the debug endpoint (pprof) shows the process's internals; listen on 127.0.0.1 or [::1] and reach it through an SSH tunnel", addr, errDebugNotLoopback)
	}
	return nil
}

// listenDebug opens the -debug-addr listener. It refuses an address that
// does not resolve to loopback: profiles and goroutine dumps show the
// process's internals (keys, rules, tokens in memory) and a CPU profile
// costs CPU, so the endpoint is for an operator on the machine (or an SSH
// tunnel), never for the network.
func listenDebug(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-debug-addr %s: %w", addr, err)
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); !ok || !ta.IP.IsLoopback() {
		_ = ln.Close()
		return nil, fmt.Errorf("-debug-addr %s: %w: the debug endpoint (pprof) shows the process's internals; listen on 127.0.0.1 or [::1] and reach it through an SSH tunnel", addr, errDebugNotLoopback)
	}
	return ln, nil
}

// serveDebug serves debugMux on ln until ctx ends, then closes it (a CPU
// profile in progress is cut short). It returns once the server has stopped.
func serveDebug(ctx context.Context, ln net.Listener, log *slog.Logger) {
	srv := &http.Server{
		Handler:           debugMux(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("debug endpoint stopped", "err", err)
	}
}
