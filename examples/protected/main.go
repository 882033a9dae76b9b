// Command protected is an HTTP API protected per caller and per route by
// ratelease's inbound middleware, client/httplimit.
//
// Start a lease server with the example rules, then one or more copies of
// the API (each is a process of the fleet; the limit is shared):
//
//	go run ./server/cmd/rateleased -rules examples/rules.yaml
//	go run ./examples/protected                          # on 127.0.0.1:8090
//	go run ./examples/protected -listen 127.0.0.1:8091   # a second process
//
//	for i in 1 2 3 4 5 6 7; do curl -si -H 'X-API-Key: alice' localhost:8090/hello | grep -E '^(HTTP|RateLimit|Retry-After)'; done
//
// Routes: GET /hello answers "hello, <caller>"; GET /healthz is not
// limited (the Cost hook exempts it); other paths get the mux's 404.
//
// The caller is its X-API-Key header, else its IP address, and each route
// has its own bucket per caller: the key template is
// "api:{route}|key:{header:X-API-Key}", falling back to
// "api:{route}|ip:{ip}" when the header is missing. The hello rule of
// examples/rules.yaml matches "api:GET /hello|*" and allows 5 requests per
// 10 s (a burst of 5, then one every 2 s). Every response /hello gives
// carries the RateLimit-Policy and RateLimit fields, with what remains for
// the caller across every process; the sixth request in a burst gets 429
// with Retry-After and an application/problem+json body.
//
// The example does not verify the API key, so it limits only callers that
// keep theirs: one that makes up a fresh X-API-Key for each request gets a
// bucket each time. A real API verifies the key before the middleware and
// keys on the identity it proves (httplimit.WithIdentity, {user}), or adds
// an "ip:{ip}" key beside the header's, from which every request takes a
// token too.
//
// No proxy is trusted: X-Forwarded-For is ignored unless -trusted-proxies
// lists the proxies in front of the API, and then only when the request
// comes from one of them.
//
// Flags, with their environment fallbacks:
//
//	-listen           address to serve on (PROTECTED_LISTEN; default 127.0.0.1:8090)
//	-servers          lease server URLs, comma-separated (RATELEASE_SERVER; default http://127.0.0.1:8080)
//	-token            bearer token for the lease servers (RATELEASE_TOKEN)
//	-trusted-proxies  CIDRs or addresses of trusted reverse proxies, comma-separated
//	                  (PROTECTED_TRUSTED_PROXIES; default none)
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/httplimit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second Ctrl-C kills the program
	if err := run(ctx, os.Args[1:], os.Stdout, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "protected:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	listen  string
	servers []string
	token   string
	proxies []netip.Prefix
}

func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("protected", flag.ContinueOnError)
	fs.SetOutput(out)
	listen := fs.String("listen", cmp.Or(os.Getenv("PROTECTED_LISTEN"), "127.0.0.1:8090"), "address to serve on (env PROTECTED_LISTEN)")
	servers := fs.String("servers", cmp.Or(os.Getenv("RATELEASE_SERVER"), "http://127.0.0.1:8080"), "lease server URLs, comma-separated (env RATELEASE_SERVER)")
	// No default from the environment: flag prints a flag's default on -h
	// and after a bad flag, and a token is a secret. RATELEASE_TOKEN
	// applies after parsing, when -token is not given.
	token := fs.String("token", "", "bearer token for the lease servers (env RATELEASE_TOKEN, never printed here)")
	proxies := fs.String("trusted-proxies", os.Getenv("PROTECTED_TRUSTED_PROXIES"), "CIDRs or addresses of trusted reverse proxies, comma-separated; X-Forwarded-For is read only from them (env PROTECTED_TRUSTED_PROXIES)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if !flagGiven(fs, "token") {
		*token = os.Getenv("RATELEASE_TOKEN")
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	p, err := httplimit.ParsePrefixes(*proxies)
	if err != nil {
		return config{}, err
	}
	return config{listen: *listen, servers: strings.Split(*servers, ","), token: *token, proxies: p}, nil
}

// newAPI returns the API's handler behind the limit.
func newAPI(c *client.Client, proxies []netip.Prefix, log *slog.Logger) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		caller := r.Header.Get("X-API-Key")
		if caller == "" {
			caller = r.RemoteAddr
		}
		fmt.Fprintf(w, "hello, %s\n", caller)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	m, err := httplimit.New(httplimit.Config{
		Client: c,
		Keys: []httplimit.Key{{
			Template: "api:{route}|key:{header:X-API-Key}",
			Fallback: "api:{route}|ip:{ip}",
		}},
		TrustedProxies: proxies,
		Cost: func(r *http.Request) int64 {
			if r.URL.Path == "/healthz" {
				return 0 // not limited
			}
			return 1
		},
		OnDecision: func(r *http.Request, res httplimit.Result) {
			if res.Outcome != httplimit.OutcomeAllowed {
				log.Info("limited", "outcome", res.Outcome.String(), "keys", res.Keys, "retry_after", res.Decision.RetryAfter)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return m.Handler(mux), nil
}

// run parses args (without the program name) and serves until ctx ends.
// ready, when not nil, is called with the address once it listens.
func run(ctx context.Context, args []string, stdout io.Writer, ready func(addr string)) error {
	cfg, err := parseFlags(args, stdout)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stdout, nil))
	c, err := client.New(client.Config{Servers: cfg.servers, Token: cfg.token, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx) // returns the unused tokens
	}()
	api, err := newAPI(c, cfg.proxies, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	// The limit is the lease servers' rule for the key, which this process
	// does not know (examples/rules.yaml has one; rules-auth.yaml none).
	fmt.Fprintf(stdout, "serving http://%s (GET /hello, per caller: keys \"api:GET /hello|key:<X-API-Key>\", else \"api:GET /hello|ip:<address>\", limited by the lease servers' rules) with lease servers %s\n",
		ln.Addr(), strings.Join(cfg.servers, ","))
	if ready != nil {
		ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
