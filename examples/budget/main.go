// Command budget shares a service-to-service call budget between workers:
// every call to a (fake) payments service spends from the key
// svc:payments, which the payments rule of examples/rules.yaml limits to 50
// calls per second (burst 50) across every process that uses the same lease
// server.
//
// Start a lease server with the example rules, then the program:
//
//	go run ./server/cmd/rateleased -rules examples/rules.yaml
//	go run ./examples/budget -servers http://127.0.0.1:8080 -workers 8 -clients 2
//
// -workers goroutines call the payments service as fast as the budget lets
// them for -duration. With -clients above 1 they use that many separate
// Clients, each with a client ID of its own, as separate processes would.
// By default a worker blocks in Limiter.Wait until the budget admits its
// call; with -wait=false it asks Limiter.Decide and, when denied, sleeps the
// RetryAfter it was given. At the end the program prints what each worker
// got, the total and achieved rate against 50/s, and checks the bound of
// the design, at most burst + rate·T calls in a stretch of time T, for two
// stretches: the whole run, and its busiest one-second window. Each line
// says "held" or "EXCEEDED".
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
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratelease/ratelease/client"
)

// key is the budget every worker spends from.
const key = "svc:payments"

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
		fmt.Fprintln(os.Stderr, "budget:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	servers  []string
	token    string
	workers  int
	clients  int
	duration time.Duration
	wait     bool
	rate     float64
	burst    int
}

func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("budget", flag.ContinueOnError)
	fs.SetOutput(out)
	servers := fs.String("servers", cmp.Or(os.Getenv("RATELEASE_SERVER"), "http://127.0.0.1:8080"), "lease server URLs, comma-separated (env RATELEASE_SERVER)")
	// No default from the environment: flag prints a flag's default on -h
	// and after a bad flag, and a token is a secret. RATELEASE_TOKEN
	// applies after parsing, when -token is not given.
	token := fs.String("token", "", "bearer token for the lease servers (env RATELEASE_TOKEN, never printed here)")
	workers := fs.Int("workers", 8, "goroutines calling the payments service")
	clients := fs.Int("clients", 1, "separate Clients the workers are spread over, as separate processes would be")
	duration := fs.Duration("duration", 3*time.Second, "how long the workers run")
	wait := fs.Bool("wait", true, "block in Limiter.Wait until admitted; false: ask Limiter.Decide, and sleep the RetryAfter when denied")
	rate := fs.Float64("rate", 50, "the payments rule's rate per second, for the check of the bound")
	burst := fs.Int("burst", 50, "the payments rule's burst, for the check of the bound")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if !flagGiven(fs, "token") {
		*token = os.Getenv("RATELEASE_TOKEN")
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *workers < 1 || *clients < 1 || *clients > *workers || *duration <= 0 || *rate <= 0 || *burst < 1 {
		return config{}, fmt.Errorf("-workers (%d), -duration (%v), -rate (%g) and -burst (%d) must be positive, and -clients (%d) from 1 to -workers",
			*workers, *duration, *rate, *burst, *clients)
	}
	return config{
		servers: strings.Split(*servers, ","), token: *token, workers: *workers, clients: *clients,
		duration: *duration, wait: *wait, rate: *rate, burst: *burst,
	}, nil
}

// payments is the fake downstream service: it records when each call
// arrived, and from which worker.
type payments struct {
	mu    sync.Mutex
	calls []time.Time
	per   []int
}

func (p *payments) charge(worker int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, time.Now())
	p.per[worker]++
}

// busiest returns the most calls in any window of length w.
func (p *payments) busiest(w time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := slices.Clone(p.calls)
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	most, lo := 0, 0
	for hi := range at {
		for at[hi].Sub(at[lo]) >= w {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

// run parses args (without the program name), taking flag defaults from the
// environment, runs the workers and prints the outcome to stdout.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args, stdout)
	if err != nil {
		return err
	}
	clients := make([]*client.Client, 0, cfg.clients)
	defer func() {
		// Close settles and returns every unused token.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, c := range clients {
			_ = c.Close(ctx)
		}
	}()
	for range cfg.clients {
		c, err := client.New(client.Config{Servers: cfg.servers, Token: cfg.token})
		if err != nil {
			return explain(err)
		}
		clients = append(clients, c)
	}

	svc := &payments{per: make([]int, cfg.workers)}
	denied := make([]int, cfg.workers)
	errs := make([]error, cfg.workers)
	runCtx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range cfg.workers {
		l := clients[w%cfg.clients].Limiter(key)
		wg.Go(func() { denied[w], errs[w] = work(runCtx, l, cfg.wait, func() { svc.charge(w) }) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return err // interrupted
	}
	if err := errors.Join(errs...); err != nil {
		return explain(err)
	}
	total := 0
	for _, n := range svc.per {
		total += n
	}
	if total == 0 {
		return fmt.Errorf("no call was admitted: is a lease server running at %s? (%d failed calls to it)", strings.Join(cfg.servers, ","), clients[0].Stats().ServerErrors)
	}

	mode := "Wait"
	if !cfg.wait {
		mode = "Allow"
	}
	fmt.Fprintf(stdout, "%d workers on %d client(s) shared %s for %.2fs (%s; lease server %s)\n",
		cfg.workers, cfg.clients, key, elapsed.Seconds(), mode, strings.Join(cfg.servers, ","))
	fmt.Fprintln(stdout, "worker  client  admitted  denied")
	for w, n := range svc.per {
		fmt.Fprintf(stdout, "%6d  %6d  %8d  %6d\n", w, w%cfg.clients, n, denied[w])
	}
	bound := float64(cfg.burst) + cfg.rate*elapsed.Seconds()
	fmt.Fprintf(stdout, "total    %d admitted: %.1f/s against %g/s\n", total, float64(total)/elapsed.Seconds(), cfg.rate)
	fmt.Fprintf(stdout, "bound    burst + rate·T = %d + %g·%.2f = %.0f: %s\n", cfg.burst, cfg.rate, elapsed.Seconds(), bound, verdict(total, bound))
	busiest, secondBound := svc.busiest(time.Second), float64(cfg.burst)+cfg.rate
	fmt.Fprintf(stdout, "busiest  %d calls in one second, bound burst + rate·1s = %g: %s\n", busiest, secondBound, verdict(busiest, secondBound))
	return nil
}

// explain says what to fix when a lease server refused the client: the
// token, or the keys its token may use, rather than whether a server runs.
func explain(err error) error {
	switch {
	case errors.Is(err, client.ErrUnauthorized):
		return fmt.Errorf("unauthorized: check -token (or RATELEASE_TOKEN): %w", err)
	case errors.Is(err, client.ErrForbidden):
		return fmt.Errorf("forbidden: the token may not use %s: check the client's keys in the rules file: %w", key, err)
	}
	return err
}

// verdict says whether calls kept within bound.
func verdict(calls int, bound float64) string {
	if float64(calls) > bound {
		return "EXCEEDED"
	}
	return "held"
}

// work calls pay whenever l admits it, until ctx ends, and returns how many
// times it was denied (always 0 with wait: Wait does not give up until ctx
// would end first). It fails when the server refuses the key.
func work(ctx context.Context, l *client.Limiter, wait bool, pay func()) (denied int, err error) {
	for ctx.Err() == nil {
		if wait {
			err := l.Wait(ctx)
			var rl *client.RateLimitedError
			switch {
			case err == nil:
				pay()
				continue
			case errors.Is(err, client.ErrServerRefused):
				return denied, err // a misconfiguration: explained by run
			case errors.As(err, &rl) && rl.Source == client.SourceDenied:
				return denied, fmt.Errorf("the lease server refused %s: %w", key, err)
			}
			// ctx ended, or Wait gave up early (client.ErrRateLimited)
			// because the deadline would pass before the budget allows:
			// the run is over for this worker either way.
			return denied, nil
		}
		d := l.Decide(ctx, 1)
		if d.Allowed {
			pay()
			continue
		}
		if ctx.Err() != nil {
			return denied, nil // the run is over (d.Err may say so)
		}
		if d.Err != nil {
			return denied, d.Err // a misconfiguration: explained by run
		}
		if d.Source == client.SourceDenied {
			return denied, fmt.Errorf("the lease server refused %s", key)
		}
		denied++
		pause := d.RetryAfter
		if pause <= 0 {
			pause = 10 * time.Millisecond
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return denied, nil
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
