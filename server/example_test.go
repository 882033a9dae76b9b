package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
	"github.com/ratelease/ratelease/server"
)

// A lease server over the memory store, with one rule, mounted in a test
// server; a client leases 30 tokens of a user's bucket.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "ratelease-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rules := filepath.Join(dir, "rules.yaml")
	err = os.WriteFile(rules, []byte(`
rules:
  - name: per-user
    match: "user:*"
    limit: 100
    period: 1s
`), 0o600)
	if err != nil {
		log.Fatal(err)
	}

	store := leases.NewMemoryStore(leases.MemoryOptions{})
	defer store.Close()
	srv, err := server.New(server.Options{Store: store, RulesPath: rules})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	resp, err := http.Post(ts.URL+protocol.PathLeases, "application/json",
		strings.NewReader(`{"client_id":"checkout-1","leases":[{"key":"user:42","want":30}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var lr protocol.LeaseResponse
	if err := json.NewDecoder(resp.Body).Decode(&lr); err != nil {
		log.Fatal(err)
	}
	l := lr.Leases[0]
	fmt.Printf("%s: granted %d of rule %s (%d per %dms), %d left\n", l.Key, l.Granted, l.Rule, l.Limit, l.PeriodMillis, l.Remaining)
	// Output: user:42: granted 30 of rule per-user (100 per 1000ms), 70 left
}

// Run serves until its context is canceled, then shuts down gracefully.
func ExampleServer_Run() {
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	defer store.Close()
	srv, err := server.New(server.Options{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()

	resp, err := http.Get("http://" + ln.Addr().String() + protocol.PathHealthz)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("healthz:", resp.StatusCode)

	cancel() // in production: signal.NotifyContext for SIGTERM
	fmt.Println("run:", <-done)
	// Output:
	// healthz: 200
	// run: <nil>
}

// ParseRules validates a rules file, naming the rule or client and field at
// fault.
func ExampleParseRules() {
	_, err := server.ParseRules([]byte(`
rules:
  - name: per-user
    match: "user:*"
    limit: 100
    period: 1s
clients:
  - name: checkout
    token_sha256: "not-a-hash"
    keys: ["user:*"]
`))
	fmt.Println(err)
	// Output: invalid rules: client "checkout": token_sha256: is 10 characters; it must be the 64 hex digits of the token's SHA-256: compute it with printf %s "$TOKEN" | sha256sum | cut -d' ' -f1
}
