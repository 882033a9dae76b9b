// Command ratelease is the admin CLI of ratelease lease servers: it edits
// the rule database through a rateleased's admin API (see package server).
//
// Usage:
//
//	ratelease [-server URL] [-token TOKEN] COMMAND [ARGS]
//
//	rules apply -f rules.yaml [-prune]   put the file's rules and clients into the database; print what changed
//	rules diff -f rules.yaml [-prune]    print what apply would change, change nothing
//	rules list                           print the database's rules
//	override set KEY -limit N -period D [-burst B] [-algorithm A] [-lease-ttl D]
//	override get KEY
//	override delete KEY
//	key show KEY                         print a key's state (GET /v1/keys/{key})
//
// -server defaults to $RATELEASE_SERVER, else http://127.0.0.1:8080;
// -token to $RATELEASE_ADMIN_TOKEN (the token whose SHA-256 rateleased's
// -admin-token-sha256 names), which the usage text never prints; prefer
// the variable, since any user of the host can read a command line.
//
// apply is idempotent: a rule or client already as the file says is left
// alone, and a second apply prints "no changes". Each write carries the
// ETag apply read (If-Match, or If-None-Match: * for a new item), so an
// edit made by someone else meanwhile fails the write with 412 rather than
// being overwritten. With -prune, rules and clients of the database that
// the file does not list are deleted (sync); without it they are kept
// (seed). The file's default is stored too (PUT /v1/admin/settings): a
// file with "default: deny" makes every server in database mode refuse
// the keys that match no rule, and a file without a default puts allow
// back.
//
// Exit status: 0 on success, 1 when a call failed, 2 for bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		os.Exit(1)
	}
}
