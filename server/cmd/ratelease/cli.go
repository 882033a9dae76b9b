package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelease/ratelease/protocol"
	"github.com/ratelease/ratelease/server"
)

// errUsage is wrapped by the errors of bad command lines.
var errUsage = errors.New("usage")

// errCall is wrapped by the error of an API call the server refused.
var errCall = errors.New("call failed")

// api is the admin API of one server.
type api struct {
	base  string
	token string
	http  *http.Client
}

// run is the CLI: args without the program name; flag defaults from env.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelease", flag.ContinueOnError)
	fs.SetOutput(stderr)
	a := &api{http: &http.Client{Timeout: 30 * time.Second, CheckRedirect: noRedirects}}
	fs.StringVar(&a.base, "server", cmp.Or(env("RATELEASE_SERVER"), "http://127.0.0.1:8080"), "`URL` of a rateleased (env RATELEASE_SERVER)")
	// No default from the environment: flag prints a flag's default in the
	// usage text (on -h, after a bad flag or command), and this is a
	// secret. RATELEASE_ADMIN_TOKEN applies after parsing instead.
	fs.StringVar(&a.token, "token", "", "admin bearer `token`; prefer the environment, which ps does not show (env RATELEASE_ADMIN_TOKEN, never printed here)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: ratelease [-server URL] [-token TOKEN] COMMAND
commands:
  rules apply -f FILE [-prune]    put the file's rules and clients into the rule database
  rules diff -f FILE [-prune]     what apply would change
  rules list                      the database's rules
  override set KEY -limit N -period D [-burst B] [-algorithm A] [-lease-ttl D]
  override get KEY
  override list [-prefix P] [-limit N]   every override (of the keys starting with P), a page at a time
  override delete KEY
  key show KEY                    a key's state
flags:`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	tokenSet := false
	fs.Visit(func(f *flag.Flag) { tokenSet = tokenSet || f.Name == "token" })
	if !tokenSet {
		a.token = env("RATELEASE_ADMIN_TOKEN")
	}
	a.base = strings.TrimSuffix(a.base, "/")
	rest := fs.Args()
	if len(rest) < 2 {
		fs.Usage()
		return fmt.Errorf("%w: want a command and a subcommand", errUsage)
	}
	cmd := rest[0] + " " + rest[1]
	var err error
	switch cmd {
	case "rules apply", "rules diff":
		err = a.rulesApply(ctx, rest[1], rest[2:], stdout, stderr)
	case "rules list":
		err = a.rulesList(ctx, stdout)
	case "override set":
		err = a.overrideSet(ctx, rest[2:], stdout, stderr)
	case "override list":
		err = a.overrideList(ctx, rest[2:], stdout, stderr)
	case "override get", "override delete", "key show":
		if len(rest) != 3 {
			return fmt.Errorf("%w: %s takes one KEY", errUsage, cmd)
		}
		switch cmd {
		case "override get":
			err = a.show(ctx, protocol.PathAdminOverrides+"/"+pathSegment(rest[2]), stdout)
		case "override delete":
			err = a.call(ctx, http.MethodDelete, protocol.PathAdminOverrides+"/"+pathSegment(rest[2]), nil, nil, nil)
			if err == nil {
				fmt.Fprintf(stdout, "deleted override of %s\n", rest[2])
			}
		default:
			err = a.show(ctx, "/v1/keys/"+pathSegment(rest[2]), stdout)
		}
	default:
		fs.Usage()
		return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelease: %v\n", err)
	}
	return err
}

// pathSegment escapes a key or a name as one segment of a path: '/' as
// %2F, so that no "//", "/./" or "/../" in a key reaches the path (the
// server refuses such a path with 400 invalid_path; a proxy may clean it
// into another key's), and a key that is "." or ".." as %2E or %2E%2E.
func pathSegment(k string) string {
	e := url.PathEscape(k)
	if e == "." || e == ".." {
		return strings.ReplaceAll(e, ".", "%2E")
	}
	return e
}

// noRedirects is the CheckRedirect of the CLI's HTTP client: the admin API
// never redirects, and following a redirect would re-send a PUT or DELETE,
// with the admin token, to another path (another key's override) or
// another host. The redirect is answered as the error of the call.
func noRedirects(req *http.Request, via []*http.Request) error {
	return fmt.Errorf("%w: answered a redirect to %s, not followed: the admin API never redirects; check -server", errCall, req.URL.Redacted())
}

// call sends one request; out, when set, receives a 2xx JSON body; hdr,
// when set, receives the response headers. A problem response is an
// error wrapping errCall with its status, code and detail.
func (a *api) call(ctx context.Context, method, path string, body any, headers map[string]string, out any, hdr ...*http.Header) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var p protocol.Problem
		if json.Unmarshal(data, &p) == nil && p.Code != "" {
			return fmt.Errorf("%w: %s %s: %d %s: %s", errCall, method, path, resp.StatusCode, p.Code, p.Detail)
		}
		return fmt.Errorf("%w: %s %s: %s: %s", errCall, method, path, resp.Status, bytes.TrimSpace(data))
	}
	for _, h := range hdr {
		*h = resp.Header
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode response: %w", method, path, err)
		}
	}
	return nil
}

// show prints a GET's JSON body, indented.
func (a *api) show(ctx context.Context, path string, stdout io.Writer) error {
	var v json.RawMessage
	if err := a.call(ctx, http.MethodGet, path, nil, nil, &v); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, v, "", "  "); err != nil {
		return fmt.Errorf("indent response: %w", err)
	}
	buf.WriteByte('\n')
	_, err := stdout.Write(buf.Bytes())
	return err
}

// parseInterleaved parses args whose positional arguments may come before,
// between or after the flags, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func (a *api) overrideSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("override set", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o protocol.AdminOverride
	var period, ttl time.Duration
	fs.Int64Var(&o.Limit, "limit", 0, "tokens per period (required)")
	fs.DurationVar(&period, "period", 0, "the period, such as 1s or 1m (required)")
	fs.Int64Var(&o.Burst, "burst", 0, "bucket size; 0: the limit")
	fs.StringVar(&o.Algorithm, "algorithm", "", "algorithm; empty: token_bucket")
	fs.DurationVar(&ttl, "lease-ttl", 0, "lease TTL; 0: the default")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if len(pos) != 1 || o.Limit == 0 || period == 0 {
		return fmt.Errorf("%w: override set KEY -limit N -period D", errUsage)
	}
	o.Period = period.String()
	if ttl > 0 {
		o.LeaseTTL = ttl.String()
	}
	var got protocol.AdminOverride
	if err := a.call(ctx, http.MethodPut, protocol.PathAdminOverrides+"/"+pathSegment(pos[0]), o, nil, &got); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "override of %s: %d per %s (version %d)\n", pos[0], o.Limit, o.Period, got.Version)
	return nil
}

// overrideList prints every override, or those whose key starts with
// -prefix, one a line: the key, a tab, the override as JSON. It pages
// through GET /v1/admin/overrides until the cursor is empty, and ends with
// the count on stderr.
func (a *api) overrideList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("override list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("prefix", "", "list only the keys that start with this `prefix` (taken literally: * ? [ are no patterns)")
	limit := fs.Int("limit", protocol.MaxOverridesPage, "overrides per page (1 to 1000)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if len(pos) != 0 {
		return fmt.Errorf("%w: override list takes no KEY: use -prefix", errUsage)
	}
	n, err := a.listOverrides(ctx, *prefix, *limit, func(o protocol.AdminOverride) error {
		b, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("encode override of %q: %w", o.Key, err)
		}
		_, err = fmt.Fprintf(stdout, "%s\t%s\n", o.Key, b)
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d overrides\n", n)
	return nil
}

// listOverrides calls fn on every override whose key starts with prefix,
// limit per page, and returns how many it listed.
func (a *api) listOverrides(ctx context.Context, prefix string, limit int, fn func(protocol.AdminOverride) error) (int, error) {
	q := url.Values{}
	if prefix != "" {
		q.Set(protocol.QueryPrefix, prefix)
	}
	q.Set(protocol.QueryLimit, strconv.Itoa(limit))
	n := 0
	for {
		var page protocol.AdminOverrides
		if err := a.call(ctx, http.MethodGet, protocol.PathAdminOverrides+"?"+q.Encode(), nil, nil, &page); err != nil {
			return n, err
		}
		for _, o := range page.Overrides {
			if err := fn(o); err != nil {
				return n, err
			}
			n++
		}
		if page.Cursor == "" {
			return n, nil
		}
		q.Set(protocol.QueryCursor, page.Cursor)
	}
}

func (a *api) rulesList(ctx context.Context, stdout io.Writer) error {
	var rs protocol.AdminRules
	if err := a.call(ctx, http.MethodGet, protocol.PathAdminRules, nil, nil, &rs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "database version %d, %d rules, default %s\n", rs.Version, len(rs.Rules), rs.Default)
	for _, r := range rs.Rules {
		b, _ := json.Marshal(r)
		fmt.Fprintf(stdout, "%s\t%s\n", r.Name, b)
	}
	return nil
}

// step is one write of apply.
type step struct {
	op, kind, name string // op: "+" create, "~" change, "-" delete
	path           string
	body           any
	ifMatch        string
}

func (a *api) rulesApply(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rules "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "rules `file` (YAML)")
	prune := fs.Bool("prune", false, "delete the database's rules and clients that the file does not list")
	if _, err := parseInterleaved(fs, args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *file == "" {
		return fmt.Errorf("%w: rules %s needs -f FILE", errUsage, sub)
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("read rules file: %w", err)
	}
	rf, err := server.ReadRulesFile(data)
	if err != nil {
		return fmt.Errorf("rules file %s: %w", *file, err)
	}
	var curRules protocol.AdminRules
	if err := a.call(ctx, http.MethodGet, protocol.PathAdminRules, nil, nil, &curRules); err != nil {
		return err
	}
	var curClients protocol.AdminClients
	if err := a.call(ctx, http.MethodGet, protocol.PathAdminClients, nil, nil, &curClients); err != nil {
		return err
	}
	var curSettings protocol.AdminSettings
	if err := a.call(ctx, http.MethodGet, protocol.PathAdminSettings, nil, nil, &curSettings); err != nil {
		return err
	}
	steps := plan(rf, curRules.Rules, curClients.Clients, *prune)
	if want := cmp.Or(string(rf.Default), "allow"); want != curSettings.Default {
		st := step{op: "~", kind: "settings", name: "default " + want, path: protocol.PathAdminSettings, body: protocol.AdminSettings{Default: want}}
		if curSettings.Version > 0 {
			st.ifMatch = strconv.FormatInt(curSettings.Version, 10)
		}
		steps = append(steps, st)
	}
	if len(steps) == 0 {
		fmt.Fprintln(stdout, "no changes")
		return nil
	}
	for _, s := range steps {
		if sub == "diff" {
			fmt.Fprintf(stdout, "%s %s %s\n", s.op, s.kind, s.name)
			continue
		}
		h := map[string]string{}
		if s.ifMatch == "" {
			h["If-None-Match"] = "*"
		} else {
			h["If-Match"] = strconv.Quote(s.ifMatch)
		}
		method := http.MethodPut
		if s.op == "-" {
			method = http.MethodDelete
		}
		if err := a.call(ctx, method, s.path, s.body, h, nil); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s %s\n", s.op, s.kind, s.name)
	}
	return nil
}

// plan returns the writes that make the database's rules and clients the
// file's: deletions first (with prune), so that a rule renamed with the
// same match never collides with its old self, then creations and changes.
func plan(rf *server.RulesFile, rules []protocol.AdminRule, clients []protocol.AdminClient, prune bool) []step {
	wantRules := make([]protocol.AdminRule, len(rf.Rules))
	for i, rc := range rf.Rules {
		wantRules[i] = server.AdminRuleOf(rc)
	}
	wantClients := make([]protocol.AdminClient, len(rf.Clients))
	for i, cc := range rf.Clients {
		wantClients[i] = protocol.AdminClient{Name: cc.Name, TokenSHA256: cc.TokenSHA256, Keys: cc.Keys, Admin: cc.Admin}
	}
	ruleDels, rulePuts := planSet("rule", protocol.PathAdminRules, rules, wantRules, prune,
		func(r *protocol.AdminRule) (string, *int64) { return r.Name, &r.Version })
	clientDels, clientPuts := planSet("client", protocol.PathAdminClients, clients, wantClients, prune,
		func(c *protocol.AdminClient) (string, *int64) { return c.Name, &c.Version })
	return slices.Concat(ruleDels, clientDels, rulePuts, clientPuts)
}

// planSet returns the deletions (with prune) and the creations and changes
// that make the stored items cur the wanted ones, under base + "/" + name.
// id returns an item's name and its version field, which the comparison
// ignores and a change or deletion names in If-Match.
func planSet[T any](kind, base string, cur, want []T, prune bool, id func(*T) (string, *int64)) (dels, puts []step) {
	stored := make(map[string]T, len(cur))
	for _, c := range cur {
		name, _ := id(&c)
		stored[name] = c
	}
	wanted := make(map[string]bool, len(want))
	for _, w := range want {
		name, _ := id(&w)
		wanted[name] = true
		path := base + "/" + pathSegment(name)
		old, ok := stored[name]
		if !ok {
			puts = append(puts, step{op: "+", kind: kind, name: name, path: path, body: w})
			continue
		}
		_, v := id(&old)
		version := *v
		*v = 0
		if !reflect.DeepEqual(old, w) {
			puts = append(puts, step{op: "~", kind: kind, name: name, path: path, body: w, ifMatch: strconv.FormatInt(version, 10)})
		}
	}
	if prune {
		for _, c := range cur {
			name, v := id(&c)
			if !wanted[name] {
				dels = append(dels, step{op: "-", kind: kind, name: name, path: base + "/" + pathSegment(name), ifMatch: strconv.FormatInt(*v, 10)})
			}
		}
	}
	return dels, puts
}
