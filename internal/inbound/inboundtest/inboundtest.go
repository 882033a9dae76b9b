// Package inboundtest holds what the tests of the two inbound limiters,
// client/httplimit and the grpclimit module, share: clients of a lease
// server made the same way, and a parser of the RateLimit fields both
// write (as HTTP header fields or as gRPC metadata). It is internal, like
// package inbound, so that it never becomes API.
package inboundtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/require"
)

// DirectClient returns a client of srv that decides every key by a direct
// take, never from a lease, so that every answer is the server's state.
// The test's end closes it.
func DirectClient(t testing.TB, srv *leasetest.Server) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, LeaseMinTokens: 1 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// RestrictedClient starts a lease server with rules and one service,
// whose token may use only the keys that match patterns ("hello:*"), and
// returns a client with that token: a key outside them is refused, a
// misconfiguration rather than a rate limit. The test's end closes it.
func RestrictedClient(t testing.TB, rules string, patterns ...string) *client.Client {
	t.Helper()
	const token = "s3cret-token"
	sum := sha256.Sum256([]byte(token))
	srv := leasetest.Start(t, rules+`
clients:
  - name: api
    token_sha256: "`+hex.EncodeToString(sum[:])+`"
    keys: ["`+strings.Join(patterns, `", "`)+`"]
`, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}, Token: token})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// LeasedClient starts a lease server whose one rule lets a billion
// requests a second through every key "ip:*", and returns a client of it
// that holds a lease of key (an "ip:" key) already: the benchmarks'
// client, whose decisions on key are the process's own. The test's end
// closes it.
func LeasedClient(t testing.TB, key string) *client.Client {
	t.Helper()
	srv := leasetest.Start(t, `
rules:
  - {name: bench, match: "ip:*", limit: 1000000000, period: 1s}
`, leasetest.Options{})
	c, err := client.New(client.Config{Servers: []string{srv.URL()}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	deadline := time.Now().Add(10 * time.Second)
	for c.Allow(context.Background(), key).Source != client.SourceLease {
		require.True(t, time.Now().Before(deadline), "the key never leased")
	}
	return c
}

// Field is one item of a RateLimit or RateLimit-Policy list: the name of
// a limit, and its integer parameters (q and w, or r and t).
type Field struct {
	// Name is the item's string, the limit's name, "5-per-1h".
	Name string
	// Params are the item's parameters by name.
	Params map[string]int64
}

// ParseFields parses the values of a RateLimit or RateLimit-Policy field
// (name, for messages) with a structured-field parser. It fails the test
// unless there are values, and they are a list of string items with
// integer parameters.
func ParseFields(t testing.TB, name string, vals []string) []Field {
	t.Helper()
	require.NotEmpty(t, vals, "no %s field", name)
	list, err := httpsfv.UnmarshalList(vals)
	require.NoError(t, err, "%s: %q", name, vals)
	out := make([]Field, 0, len(list))
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		require.True(t, ok, "%s: an inner list", name)
		s, ok := it.Value.(string)
		require.True(t, ok, "%s: item %v is not a string", name, it.Value)
		f := Field{Name: s, Params: map[string]int64{}}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			n, ok := v.(int64)
			require.True(t, ok, "%s: %s=%v is not an integer", name, k, v)
			f.Params[k] = n
		}
		out = append(out, f)
	}
	return out
}
