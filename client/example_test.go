package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/ratelease/ratelease/client"
)

// The examples without an "Output:" comment need a lease server, for
// example the one of the README:
//
//	go run ./server/cmd/rateleased -rules examples/rules.yaml
//
// so they are compiled by go test but not run.

// A client leases tokens in batches and decides locally.
func Example() {
	c, err := client.New(client.Config{
		Servers:  []string{"http://127.0.0.1:8080"},
		Token:    os.Getenv("RATELEASE_TOKEN"),
		Fallback: client.FallbackSafeRate,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	defer c.Close(ctx) // settles and returns every unused token

	// All or nothing across keys.
	if d := c.Allow(ctx, "user:42", "api:createURL"); d.Allowed {
		fmt.Println("create the short URL")
	} else {
		fmt.Printf("denied by %s, retry in %v\n", d.Source, d.RetryAfter)
	}

	// The hot path: a handle for a fixed key set.
	l := c.Limiter("user:42")
	if l.Allow() {
		fmt.Println("serve the request")
	}
}

func ExampleClient_Allow() {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	handler := func(w http.ResponseWriter, r *http.Request) {
		d := c.Allow(r.Context(), "user:"+r.Header.Get("X-User"))
		if !d.Allowed {
			w.Header().Set("Retry-After", fmt.Sprint(int(d.RetryAfter.Seconds()+0.999)))
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "hello")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", handler)
	log.Fatal(http.ListenAndServe("127.0.0.1:8081", mux))
}

func ExampleClient_Limiter() {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	// Create the handle once and keep it: Allow on a live lease is one
	// atomic operation, without a lock or an allocation.
	l := c.Limiter("api:createURL")
	if err := l.Err(); err != nil {
		log.Fatal(err)
	}
	admitted := 0
	for range 1000 {
		if l.Allow() {
			admitted++
		}
	}
	fmt.Println("admitted", admitted)
}

func ExampleClient_Wait() {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i := range 100 {
		// Blocks until svc:payments has budget, or fails early when the
		// deadline would pass first.
		if err := c.Wait(ctx, "svc:payments"); err != nil {
			fmt.Println("stopped:", err)
			return
		}
		fmt.Println("charge", i)
	}
}

// An outgoing HTTP client limited per upstream host: a request over budget
// fails without being sent, and an upstream 429 with Retry-After holds
// back the following requests to that host locally.
func ExampleClient_Transport() {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	hc := &http.Client{
		Transport: c.Transport(nil, func(req *http.Request) []string {
			return []string{"host:" + req.URL.Host}
		}),
		Timeout: 5 * time.Second,
	}
	resp, err := hc.Get("http://127.0.0.1:9000/status")
	var rl *client.RateLimitedError
	switch {
	case errors.As(err, &rl):
		fmt.Println("over budget; retry in", rl.RetryAfter)
	case err != nil:
		log.Fatal(err)
	default:
		defer resp.Body.Close()
		_, _ = io.Copy(os.Stdout, resp.Body)
	}
}

// With TransportOptions.Wait, a request waits for budget (within its
// context) instead of failing.
func ExampleClient_Transport_wait() {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	hc := &http.Client{Transport: c.Transport(nil,
		func(*http.Request) []string { return []string{"svc:payments"} },
		client.TransportOptions{Wait: true, MaxUpstreamRetryAfter: 10 * time.Second},
	)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:9000/charge", nil)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
}

// Every attempt of a go-retryablehttp client, retries included, spends from
// the budget; a budget denial stops the retries.
func ExampleClient_RetryableClient() {
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	rc := c.RetryableClient(func(req *http.Request) []string {
		return []string{"host:" + req.URL.Host}
	})
	rc.RetryMax = 3
	rc.RetryWaitMax = 2 * time.Second // also caps an upstream's Retry-After
	defer rc.HTTPClient.CloseIdleConnections()

	resp, err := rc.Get("http://127.0.0.1:9000/report")
	if errors.Is(err, client.ErrRateLimited) {
		fmt.Println("over budget, not retried:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
}

func ExampleRetryAfterBackoff() {
	tooMany := &http.Response{
		StatusCode: http.StatusTooManyRequests,
		Header:     http.Header{"Retry-After": []string{"120"}},
	}
	// Retry-After is honoured up to max.
	fmt.Println(client.RetryAfterBackoff(100*time.Millisecond, 5*time.Minute, 0, tooMany))
	fmt.Println(client.RetryAfterBackoff(100*time.Millisecond, 30*time.Second, 0, tooMany))
	// Without one: exponential from min, capped at max.
	fmt.Println(client.RetryAfterBackoff(100*time.Millisecond, 30*time.Second, 3, nil))
	// Output:
	// 2m0s
	// 30s
	// 800ms
}

func ExampleRetryPolicy() {
	denied := &client.RateLimitedError{Keys: []string{"host:api.example.com"}, RetryAfter: 1500 * time.Millisecond, Source: client.SourceRetryAfter}
	retry, err := client.RetryPolicy(context.Background(), nil, fmt.Errorf("Get: %w", denied))
	fmt.Println(retry, errors.Is(err, client.ErrRateLimited))

	var rl *client.RateLimitedError
	if errors.As(err, &rl) {
		fmt.Println(rl.RetryAfter, rl.Source)
	}

	retry, _ = client.RetryPolicy(context.Background(), &http.Response{StatusCode: http.StatusBadGateway, Status: "502 Bad Gateway"}, nil)
	fmt.Println(retry)
	// Output:
	// false true
	// 1.5s retry_after
	// true
}
