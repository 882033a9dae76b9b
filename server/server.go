package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/leases"
)

// Server is a lease server: the HTTP API of protocol v1 over a
// leases.Store. Create one with New, serve it with Run (or mount Handler in
// your own http.Server), and stop it by canceling Run's context or calling
// Close. A Server is safe for concurrent use.
type Server struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics
	ops     *operator // the operator's view: rule counters, top keys, peers
	handler http.Handler
	resp    respBufs // buffers of the answers to lease calls and checks

	// state holds the rules in force and an engine running them, swapped
	// together so that one request sees one version of both.
	state atomic.Pointer[state]

	// listenAddr is the address checked by checkExposure on reload.
	listenAddr atomic.Pointer[string]

	draining atomic.Bool // Run's context is canceled: /readyz fails
	running  atomic.Bool // Run was called

	// keysFailed logs the calls the store failed for some keys only (see
	// storeFailedFor), at most once a second.
	keysFailed struct {
		loggedAt   atomic.Int64 // Options.Now, Unix ns; 0: never
		suppressed atomic.Int64 // such calls not logged since
	}

	reloadMu   sync.Mutex // serializes reloads
	failedHash [sha256.Size]byte
	failedMsg  string // last reload failure logged, to log each once

	// reloadErr is the error of the last reload while it stands (the file
	// in force is not the one on disk); nil once a reload succeeds or the
	// file is back to the rules in force. /readyz reports it.
	reloadErr atomic.Pointer[error]

	// db is the state of database mode; nil in file mode.
	db *dbMode

	stopOnce sync.Once
	stop     chan struct{} // closed by Close
	done     chan struct{} // closed when the watcher has exited
	opsDone  chan struct{} // closed when the operator's loop has exited
	beatNow  chan struct{} // asks the operator's loop for a heartbeat now
}

// state is one version of the rules with the engine that runs them.
type state struct {
	rules  *Rules
	engine *leases.Engine

	// pending: in database mode, the rule set has not been read yet (the
	// database did not answer New). rules is then noRules, a placeholder
	// that never serves: every API call is answered 503 store_unavailable
	// and /readyz fails, until the syncer has read the rule set.
	pending bool

	// held are the keys each client of rules holds (Options.MaxKeysPerClient),
	// in the order of rules.clients, and anonHeld the anonymous client's;
	// nil when there is no cap.
	held     []*heldKeys
	anonHeld *heldKeys
}

// heldOf returns the keys who holds, nil when there is no cap.
func (st *state) heldOf(who *principal) *heldKeys {
	if who.index < 0 {
		return st.anonHeld
	}
	if st.held == nil {
		return nil // no cap (an authenticated client's lease call panicked here, found by review)
	}
	return st.held[who.index]
}

// New returns a Server. It reads the rules file when Options.RulesPath is
// set, and fails when the file is invalid (the error names the rule or
// client and the field) or when Options.ListenAddr is not loopback and the
// file configures no clients, unless Options.Insecure. When RulesPath is
// set, New starts polling the file for changes; Close stops it.
func New(opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	rules := noRules()
	if opts.RulesPath != "" {
		if rules, err = LoadRules(opts.RulesPath); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	var (
		db        *dbMode
		dbPending error // the database did not answer: wait for it
	)
	if opts.RuleDB != nil && opts.RulesPath == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var r *Rules
		db, r, err = openDBMode(ctx, opts)
		cancel()
		switch {
		case err != nil && db != nil:
			dbPending = err
		case err != nil:
			return nil, err
		default:
			rules = r
		}
	}
	if opts.ListenAddr != "" && dbPending == nil {
		if err := checkExposure(opts.ListenAddr, rules, opts.Insecure); err != nil {
			return nil, err
		}
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	var more []prometheus.Collector
	if db != nil {
		more = append(more, db.cache.collectors()...)
	}
	if st, ok := opts.Store.(owningStats); ok {
		more = append(more, owningCollectors(st)...)
	}
	if pc, ok := opts.Peers.(peerCommands); ok {
		more = append(more, peerCollector(pc))
	}
	for _, c := range more {
		if err := opts.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("server: register metrics (give every Server its own Registry): %w", err)
		}
	}
	ops, err := newOperator(opts.Registry, opts.Peers, opts.Now)
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:    opts,
		log:     opts.Logger,
		metrics: m,
		ops:     ops,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		opsDone: make(chan struct{}),
		beatNow: make(chan struct{}, 1),
		db:      db,
	}
	addr := opts.ListenAddr
	s.listenAddr.Store(&addr)
	s.putRules(rules, dbPending != nil)
	if dbPending != nil {
		// The syncer reads the rule set once the database answers; its
		// exposure is checked then (applyRuleSetLocked).
		db.lastErr = dbPending.Error()
		s.reloadErr.Store(&dbPending)
		s.metrics.reloadSuccess.Set(0)
		if redisRefuses(dbPending) {
			s.log.Error("redis refuses the rule database's commands: check the user of the Redis URL, its password and its ACL (its key patterns must reach the rule database's keys, "+
				opts.RuleDB.prefix+"*); every call is answered 503 until Redis accepts them and the rules are read", "err", dbPending)
		} else {
			s.log.Warn("rule database does not answer: every call is answered 503 until its rules are read", "err", dbPending)
		}
	}
	s.handler = s.routes()
	if opts.RulesPath != "" && opts.ReloadInterval > 0 {
		go s.watch()
	} else {
		close(s.done)
	}
	go s.operatorLoop()
	if db != nil {
		go s.watchDB()
	}
	return s, nil
}

// Handler returns the server's HTTP handler, for mounting in an http.Server
// of your own. Run serves it too.
func (s *Server) Handler() http.Handler { return s.handler }

// Rules returns the rules in force.
func (s *Server) Rules() *Rules { return s.state.Load().rules }

// RulesPending reports whether the server waits for its rule database:
// in database mode, the database did not answer New, and the server
// answers every API call 503 until it has read the rule set (Rules then
// returns a placeholder of no rules that serves nothing).
func (s *Server) RulesPending() bool { return s.state.Load().pending }

func (s *Server) setRules(r *Rules) { s.putRules(r, false) }

// putRules puts r in force; pending marks it a placeholder (see
// state.pending).
func (s *Server) putRules(r *Rules, pending bool) {
	var ov leases.Overrides
	if s.db != nil {
		ov = s.db.cache
	}
	e := leases.NewEngine(leases.EngineOptions{
		Store:       s.opts.Store,
		Policy:      r.policy,
		OnStoreCall: s.metrics.observeStore,
		Overrides:   ov,
	})
	st := &state{rules: r, engine: e, pending: pending}
	if s.opts.MaxKeysPerClient >= 0 {
		// Carry the clients' keys over, by name; a removed client's are
		// dropped.
		prev := s.state.Load()
		byName := map[string]*heldKeys{}
		st.anonHeld = newHeldKeys()
		if prev != nil {
			for i := range prev.rules.clients {
				byName[prev.rules.clients[i].name] = prev.held[i]
			}
			st.anonHeld = prev.anonHeld
		}
		st.held = make([]*heldKeys, len(r.clients))
		for i := range r.clients {
			if st.held[i] = byName[r.clients[i].name]; st.held[i] == nil {
				st.held[i] = newHeldKeys()
			}
		}
	}
	s.state.Store(st)
	s.metrics.rulesLoaded.Set(float64(len(r.policy.Rules())))
	s.metrics.setRulesVersion(r.Version())

}

// Run serves HTTP/1.1 and unencrypted HTTP/2 (h2c, with prior knowledge) on
// ln, or HTTPS (HTTP/1.1 and HTTP/2) when Options.TLSConfig is set, until
// ctx is canceled, then shuts down gracefully:
//
//  1. From the moment ctx is canceled, GET /readyz answers 503 with code
//     shutting_down.
//  2. When Options.DrainDelay is positive, Run keeps serving every route,
//     and accepting connections, for DrainDelay, so that a load balancer
//     that polls /readyz stops sending traffic. With no delay (the default)
//     it goes on to step 3 at once, and only requests already in flight
//     can see the 503.
//  3. It closes ln, so new connections are refused, and closes idle
//     connections.
//  4. It lets in-flight requests finish within Options.ShutdownTimeout, and
//     closes what is left after that.
//
// Run returns nil after a clean shutdown, and an error when serving failed
// or in-flight requests outlived ShutdownTimeout. Run closes ln and, when it returns,
// the Server (see Close); it may be called once.
//
// Run refuses (with an error wrapping ErrInsecureListen) a listener whose
// address is not loopback when the rules configure no clients, unless
// Options.Insecure.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	defer s.Close()
	if !s.running.CompareAndSwap(false, true) {
		ln.Close()
		return errors.New("server: Run called twice: create a new Server")
	}
	addr := ln.Addr().String()
	// Store the address first: a rule set read meanwhile is checked
	// against it (while the rule database has not been read, the rules
	// are a placeholder, and the set is checked once read).
	s.listenAddr.Store(&addr)
	if st := s.state.Load(); !st.pending {
		if err := checkExposure(addr, st.rules, s.opts.Insecure); err != nil {
			ln.Close()
			return err
		}
	}
	s.rebeat() // the peers learn the bound address now, not a beat later

	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.opts.TLSConfig != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	hs := &http.Server{
		Handler:           s.handler,
		Protocols:         &protocols,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	if s.opts.TLSConfig != nil {
		hs.TLSConfig = s.opts.TLSConfig.Clone()
		go func() { serveErr <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- hs.Serve(ln) }()
	}

	select {
	case err := <-serveErr:
		return fmt.Errorf("server: serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	if d := s.opts.DrainDelay; d > 0 {
		s.log.Info("shutting down: /readyz answers 503; serving until the drain delay ends", "addr", addr, "drain_delay", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case err := <-serveErr:
			t.Stop()
			return fmt.Errorf("server: serve %s: %w", addr, err)
		}
	}
	s.log.Info("shutting down: waiting for in-flight requests", "addr", addr, "timeout", s.opts.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
	defer cancel()
	err := hs.Shutdown(sctx)
	<-serveErr // http.ErrServerClosed, as soon as Shutdown began
	if err != nil {
		hs.Close()
		return fmt.Errorf("server: in-flight requests did not finish within %v (Options.ShutdownTimeout); closed their connections: %w", s.opts.ShutdownTimeout, err)
	}
	s.log.Info("shut down", "addr", addr)
	return nil
}

// Close stops polling the rules file and recording the server in
// Options.Peers, and waits for both to exit. It does not close the store, nor connections served by Run (cancel Run's
// context for that). Close is idempotent and always returns nil.
func (s *Server) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	<-s.opsDone
	if s.db != nil {
		<-s.db.done
	}
	return nil
}

// watch polls the rules file until Close.
func (s *Server) watch() {
	defer close(s.done)
	t := time.NewTicker(s.opts.ReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			_ = s.Reload()
		}
	}
}

// Reload reads the rules file now and, when its content changed, puts the
// new rules in force: calls already running finish with the old rules, and
// buckets keep their state. A file that fails to read or validate, that
// removes every client while the server listens on a non-loopback address
// (without Options.Insecure), or that holds nothing but whitespace and
// comments while the rules in force have rules or clients
// (ErrEmptyRulesFile: a file caught while it is rewritten in place),
// leaves the old rules in force; Reload logs why at level error (once per
// distinct failure) and returns the error. Reload returns nil when there
// is no rules file or it did not change.
//
// The server calls Reload every Options.ReloadInterval. Replace the file
// atomically (write a temporary file, then rename it over the old one) so
// that a reload never sees it half written: an empty file is refused, and
// most files cut short fail to parse, but a file cut at the end of a rule
// may parse as fewer rules, and would be put in force.
func (s *Server) Reload() error {
	if s.opts.RulesPath == "" {
		return nil
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()

	data, err := os.ReadFile(s.opts.RulesPath)
	if err != nil {
		return s.reloadFailed([sha256.Size]byte{}, fmt.Errorf("read rules file: %w", err))
	}
	sum := sha256.Sum256(data)
	cur := s.Rules()
	if sum == cur.digest {
		s.reloadSucceeded()
		return nil
	}
	var r *Rules
	if blankYAML(data) && (len(cur.policy.Rules()) > 0 || len(cur.clients) > 0) {
		err = ErrEmptyRulesFile
	} else {
		r, err = ParseRules(data)
	}
	if addr := *s.listenAddr.Load(); err == nil && addr != "" {
		err = checkExposure(addr, r, s.opts.Insecure)
	}
	if err != nil {
		return s.reloadFailed(sum, fmt.Errorf("rules file %s: %w", s.opts.RulesPath, err))
	}
	s.reloadSucceeded()
	s.metrics.reloads.WithLabelValues("ok").Inc()
	s.log.Info("rules reloaded", "path", s.opts.RulesPath,
		"rules", len(r.policy.Rules()), "clients", len(r.clients), "version", r.Version())
	// Published last: whoever sees the new rules also finds the reload
	// counted and logged.
	s.setRules(r)
	return nil
}

// blankYAML reports whether data holds no YAML content: only whitespace,
// comments and document markers.
func blankYAML(data []byte) bool {
	for line := range bytes.Lines(data) {
		l := bytes.TrimSpace(line)
		if len(l) > 0 && l[0] != '#' && !bytes.Equal(l, []byte("---")) && !bytes.Equal(l, []byte("...")) {
			return false
		}
	}
	return true
}

// reloadFailed logs and counts a failed reload, once per distinct failure,
// and returns err. Must be called with reloadMu held.
func (s *Server) reloadFailed(sum [sha256.Size]byte, err error) error {
	msg := err.Error()
	if sum == s.failedHash && msg == s.failedMsg {
		return err
	}
	s.failedHash, s.failedMsg = sum, msg
	s.log.Error("rules reload failed: keeping the rules in force", "path", s.opts.RulesPath,
		"err", err, "version", s.Rules().Version())
	// After the log: who sees the count, the gauge or /readyz finds the log.
	s.reloadErr.Store(&err)
	s.metrics.reloadSuccess.Set(0)
	s.metrics.reloads.WithLabelValues("error").Inc()
	return err
}

// reloadSucceeded clears a reload failure: the rules in force are the
// file's. Must be called with reloadMu held.
func (s *Server) reloadSucceeded() {
	s.failedHash, s.failedMsg = [sha256.Size]byte{}, ""
	if s.reloadErr.Load() != nil {
		s.reloadErr.Store(nil)
		s.metrics.reloadSuccess.Set(1)
	}
}

// ReloadError returns the error of the last reload of the rules file while
// it stands: the file on disk failed to load and the rules in force are
// older. It returns nil once a reload succeeds, or the file is back to the
// rules in force.
func (s *Server) ReloadError() error {
	if p := s.reloadErr.Load(); p != nil {
		return *p
	}
	return nil
}
