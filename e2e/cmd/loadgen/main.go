// Command loadgen runs the end-to-end tests' load generator (package
// e2e/loadgen): it asks a lease server for keys at a configured demand and
// writes what it admitted, per key and 10 ms slot, as JSON. SIGTERM or
// SIGINT ends the run early; the result is written either way.
//
//	loadgen -servers http://127.0.0.1:8080 -key acc:hot -rate 500 -duration 10s -out result.json
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratelease/ratelease/e2e/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := loadgen.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}
