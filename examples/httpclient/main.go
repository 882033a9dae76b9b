// Command httpclient limits an outgoing HTTP client per upstream host with
// ratelease's Client.Transport.
//
// Start a lease server with the example rules, then the program:
//
//	go run ./server/cmd/rateleased -rules examples/rules.yaml
//	go run ./examples/httpclient -servers http://127.0.0.1:8080
//
// It starts an upstream of its own (an httptest server on 127.0.0.1) and
// wraps an http.Client with Client.Transport, keyed "host:" + the request's
// host name without the port (hostKey), which the per-host rule of
// examples/rules.yaml limits to a burst of 20, then 20 requests per second.
// The key is "host:127.0.0.1" whatever port the upstream got, so the limit
// is shared by every process that runs this program against the same lease
// server. It sends -requests requests spread evenly over -duration
// from -workers goroutines and prints how many were admitted, how many were
// denied (they failed with client.ErrRateLimited and never reached the
// upstream), and the admitted rate.
//
// Flags take their defaults from the environment: RATELEASE_SERVER (one or
// more comma-separated URLs) and RATELEASE_TOKEN. With
// examples/rules-auth.yaml, pass -token dev-token-change-me.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelease/ratelease/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default handling: a second
	// Ctrl-C kills the program.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "httpclient:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	servers  []string
	token    string
	requests int
	duration time.Duration
	workers  int
}

func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("httpclient", flag.ContinueOnError)
	fs.SetOutput(out)
	servers := fs.String("servers", cmp.Or(os.Getenv("RATELEASE_SERVER"), "http://127.0.0.1:8080"), "lease server URLs, comma-separated (env RATELEASE_SERVER)")
	// No default from the environment: flag prints a flag's default on -h
	// and after a bad flag, and a token is a secret. RATELEASE_TOKEN
	// applies after parsing, when -token is not given.
	token := fs.String("token", "", "bearer token for the lease servers (env RATELEASE_TOKEN, never printed here)")
	requests := fs.Int("requests", 200, "requests to send")
	duration := fs.Duration("duration", 2*time.Second, "time to spread the requests over")
	workers := fs.Int("workers", 4, "goroutines sending requests")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if !flagGiven(fs, "token") {
		*token = os.Getenv("RATELEASE_TOKEN")
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *requests < 1 || *workers < 1 || *duration <= 0 {
		return config{}, fmt.Errorf("-requests (%d), -workers (%d) and -duration (%v) must be positive", *requests, *workers, *duration)
	}
	return config{servers: strings.Split(*servers, ","), token: *token, requests: *requests, duration: *duration, workers: *workers}, nil
}

// hostKey is the key of a request: "host:" and its host name, without the
// port, in lower case and without a trailing dot, so that every process
// calling the host shares its budget, however it spells the name (kept as
// written, API.example.com and api.example.com. had budgets of their own:
// found by review).
func hostKey(u *url.URL) string {
	return "host:" + strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
}

// run parses args (without the program name), taking flag defaults from the
// environment, sends the requests and prints the outcome to stdout.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args, stdout)
	if err != nil {
		return err
	}

	// The upstream the client calls: counts what reaches it.
	var reached atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "ok\n")
	}))
	defer upstream.Close()

	c, err := client.New(client.Config{Servers: cfg.servers, Token: cfg.token})
	if errors.Is(err, client.ErrUnauthorized) {
		return fmt.Errorf("unauthorized: check -token (or RATELEASE_TOKEN): %w", err)
	}
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx) // returns the unused tokens
	}()

	// The whole integration: every request spends from its host's budget
	// before it is sent.
	perHost := func(req *http.Request) []string { return []string{hostKey(req.URL)} }
	hc := &http.Client{Transport: c.Transport(nil, perHost), Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()

	upstreamURL, err := url.Parse(upstream.URL)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "calling %s (key %q) through lease server %s\n",
		upstream.URL, hostKey(upstreamURL), strings.Join(cfg.servers, ","))
	var admitted, denied atomic.Int64
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(cfg.requests) || ctx.Err() != nil {
					return
				}
				// Request i leaves at start + i·duration/requests.
				if !sleepUntil(ctx, start.Add(time.Duration(i)*cfg.duration/time.Duration(cfg.requests))) {
					return
				}
				err := get(ctx, hc, upstream.URL)
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.Is(err, client.ErrRateLimited):
					denied.Add(1)
				default:
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	if admitted.Load() == 0 {
		return fmt.Errorf("no request was admitted: is a lease server running at %s? (%d failed calls to it)", strings.Join(cfg.servers, ","), c.Stats().ServerErrors)
	}
	sent := admitted.Load() + denied.Load()
	fmt.Fprintf(stdout, "sent     %4d requests in %.2fs from %d workers (%.1f/s)\n", sent, elapsed.Seconds(), cfg.workers, float64(sent)/elapsed.Seconds())
	fmt.Fprintf(stdout, "admitted %4d (%.1f/s)\n", admitted.Load(), float64(admitted.Load())/elapsed.Seconds())
	fmt.Fprintf(stdout, "denied   %4d (client.ErrRateLimited, not sent)\n", denied.Load())
	fmt.Fprintf(stdout, "upstream %4d requests reached it\n", reached.Load())
	fmt.Fprintln(stdout, "the per-host rule of examples/rules.yaml allows a burst of 20, then 20/s")
	return nil
}

// get sends one GET and reads the response; any status but 200 is an error.
func get(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// sleepUntil waits until t; it reports false when ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
