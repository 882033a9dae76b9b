package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/ratelease/ratelease/client"
	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// offlineClient is a client that is never asked anything: the identifier
// tests make keys only.
func offlineClient(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Servers: []string{"http://127.0.0.1:1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func newMW(t testing.TB, cfg Config) *Middleware {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = offlineClient(t)
	}
	m, err := New(cfg)
	require.NoError(t, err)
	return m
}

func req(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/hello", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestClientIPSpoofing(t *testing.T) {
	trusted, err := ParsePrefixes("10.0.0.0/8, 2001:db8:ffff::/48, 192.0.2.7")
	require.NoError(t, err)
	tests := []struct {
		name    string
		header  string // ProxyHeader
		trusted bool
		remote  string
		headers []string
		want    string
	}{
		{"no proxy trusted: XFF ignored", "", false, "203.0.113.9:5000", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.9"},
		{"no proxy trusted: Forwarded ignored", HeaderForwarded, false, "203.0.113.9:5000", []string{"Forwarded", "for=198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer: XFF ignored", "", true, "203.0.113.9:5000", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.9"},
		{"trusted peer: XFF read", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"trusted peer, no header", "", true, "10.1.2.3:5000", nil, "10.1.2.3"},
		{"client-forged left entries skipped", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "1.1.1.1, 2.2.2.2, 198.51.100.1"}, "198.51.100.1"},
		{"trusted chain walked right to left", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "6.6.6.6, 198.51.100.1, 10.9.9.9, 192.0.2.7"}, "198.51.100.1"},
		{"several header lines in order", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.1, 10.0.0.5"}, "198.51.100.1"},
		{"all trusted: the left-most", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "10.0.0.1, 10.0.0.2"}, "10.0.0.1"},
		{"garbage entry: the last trusted hop", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "198.51.100.1, nonsense"}, "10.1.2.3"},
		{"XFF with port", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "198.51.100.1:4711"}, "198.51.100.1"},
		{"XFF IPv6 bracketed with port", "", true, "10.1.2.3:5000", []string{"X-Forwarded-For", "[2001:db8:1:2::9]:4711"}, "2001:db8:1:2::9"},
		{"Forwarded not read when XFF configured", "", true, "10.1.2.3:5000", []string{"Forwarded", "for=198.51.100.1"}, "10.1.2.3"},
		{"XFF not read when Forwarded configured", HeaderForwarded, true, "10.1.2.3:5000", []string{"X-Forwarded-For", "198.51.100.1"}, "10.1.2.3"},
		{"Forwarded token", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", "for=198.51.100.1"}, "198.51.100.1"},
		{"Forwarded quoted with port", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="198.51.100.1:4711"`}, "198.51.100.1"},
		{"Forwarded IPv6", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `For="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded pairs and case", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `proto=https;FOR=198.51.100.1;by=10.0.0.1`}, "198.51.100.1"},
		{"Forwarded chain", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=6.6.6.6, for=198.51.100.1;proto=http, for=10.2.2.2`}, "198.51.100.1"},
		{"Forwarded several lines", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=6.6.6.6`, "Forwarded", `for=198.51.100.1`}, "198.51.100.1"},
		{"Forwarded quoted comma is not a separator", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=198.51.100.1, for="10.0.0.9,6.6.6.6"`}, "10.1.2.3"},
		{"Forwarded unknown: last trusted hop", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=198.51.100.1, for=unknown`}, "10.1.2.3"},
		{"Forwarded obfuscated: last trusted hop", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=_hidden`}, "10.1.2.3"},
		{"Forwarded element without for", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=6.6.6.6, proto=https`}, "10.1.2.3"},
		{"Forwarded unterminated quote", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="198.51.100.1`}, "10.1.2.3"},
		// FuzzClientIP: a quote the client left open hid the element the
		// proxy appended on the same line, so the client was identified
		// as the proxy (its bucket shared by all) instead of itself.
		{"Forwarded client's open quote, proxy's IPv4 after", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="6.6.6.6, for=198.51.100.1`}, "198.51.100.1"},
		{"Forwarded client's open quote closed by the proxy's", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https`}, "2001:db8:cafe::17"},
		{"Forwarded client's open quote without a name", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `=", for="[2001:db8:cafe::17]:4711";proto=https`}, "2001:db8:cafe::17"},
		{"Forwarded client's escape before the proxy's comma", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for=6.6.6.6;by="\, for=198.51.100.1`}, "198.51.100.1"},
		{"Forwarded client's open quotes, two proxies", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="a, b="c, for=198.51.100.1, for=10.0.0.7`}, "198.51.100.1"},
		{"Forwarded junk after a quoted value", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="198.51.100.9"x, for=198.51.100.1`}, "198.51.100.1"},
		{"Forwarded quoted value, space, then pairs", HeaderForwarded, true, "10.1.2.3:5000", []string{"Forwarded", `for="198.51.100.1" ;proto=https`}, "198.51.100.1"},
		{"trusted IPv6 proxy", "", true, "[2001:db8:ffff::1]:443", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"trusted proxy as mapped IPv4", "", true, "[::ffff:10.1.2.3]:443", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"trusted single address", "", true, "192.0.2.7:1", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"neighbour of a trusted address is not trusted", "", true, "192.0.2.8:1", []string{"X-Forwarded-For", "198.51.100.1"}, "192.0.2.8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{ProxyHeader: tt.header}
			if tt.trusted {
				cfg.TrustedProxies = trusted
			}
			m := newMW(t, cfg)
			a, ok := m.ClientIP(req(tt.remote, tt.headers...))
			require.True(t, ok)
			assert.Equal(t, tt.want, a.String())
		})
	}
}

func TestIPKeyForms(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		remote string
		want   string
	}{
		{"IPv4 whole", Config{}, "198.51.100.1:80", "ip:198.51.100.1"},
		{"IPv4 prefix", Config{IPv4Prefix: 24}, "198.51.100.77:80", "ip:198.51.100.0/24"},
		{"IPv6 /64 by default", Config{}, "[2001:db8:1:2:3:4:5:6]:80", "ip:2001:db8:1:2::/64"},
		{"IPv6 same /64, other host", Config{}, "[2001:db8:1:2:ffff::1]:80", "ip:2001:db8:1:2::/64"},
		{"IPv6 zone dropped", Config{}, "[fe80::1%eth0]:80", "ip:fe80::/64"},
		{"IPv6 /128", Config{IPv6Prefix: 128}, "[2001:db8::1]:80", "ip:2001:db8::1"},
		{"IPv6 /48", Config{IPv6Prefix: 48}, "[2001:db8:1:2::1]:80", "ip:2001:db8:1::/48"},
		{"mapped IPv4 is IPv4", Config{}, "[::ffff:198.51.100.1]:80", "ip:198.51.100.1"},
		{"no port", Config{}, "198.51.100.1", "ip:198.51.100.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMW(t, tt.cfg)
			keys, err := m.Keys(req(tt.remote))
			require.NoError(t, err)
			assert.Equal(t, []string{tt.want}, keys)
		})
	}
}

func userReq(user string) *http.Request {
	r := req("198.51.100.1:1")
	return r.WithContext(WithIdentity(r.Context(), user))
}

// TestMethodPartCallerCannotChoose: {method} is the request's method
// when it is a standard one, else "OTHER": a caller limited per method
// (at a route that serves every method) cannot make a bucket per made-up
// method. Kept as sent, "GET0" to "GET7" had eight buckets and were
// served eight times under a limit of five (found by review).
func TestMethodPartCallerCannotChoose(t *testing.T) {
	m := newMW(t, Config{Keys: []Key{{Template: "user:{user}|api:{method}:{route}"}}})
	key := func(method string) string {
		r := userReq("alice")
		r.Method, r.Pattern = method, "/hello"
		keys, err := m.Keys(r)
		require.NoError(t, err)
		return keys[0]
	}
	for _, tc := range []struct{ method, part string }{
		{http.MethodGet, "GET"}, {http.MethodHead, "HEAD"}, {http.MethodPost, "POST"}, {http.MethodPut, "PUT"},
		{http.MethodPatch, "PATCH"}, {http.MethodDelete, "DELETE"}, {http.MethodConnect, "CONNECT"},
		{http.MethodOptions, "OPTIONS"}, {http.MethodTrace, "TRACE"},
		{"GET0", "OTHER"}, {"GET7", "OTHER"}, {"get", "OTHER"}, {"PROPFIND", "OTHER"}, {"X" + strings.Repeat("Y", 200), "OTHER"},
	} {
		assert.Equal(t, "user:alice|api:"+tc.part+":/hello", key(tc.method), "method %q", tc.method)
	}
}

func TestKeyInjection(t *testing.T) {
	m := newMW(t, Config{Keys: []Key{{Template: "user:{user}"}, {Template: "user:{user}|api:{method}:{route}"}}})
	key := func(user string, pattern string) []string {
		r := userReq(user)
		r.Pattern = pattern
		keys, err := m.Keys(r)
		require.NoError(t, err)
		for _, k := range keys {
			require.NoError(t, protocol.ValidateKey(k), "%q", k)
		}
		return keys
	}
	// The user "1|api:x" must not reach user 1's composite bucket, nor
	// anyone's.
	evil := key("1|api:GET /x", "GET /hello")
	one := key("1", "GET /x")
	assert.Equal(t, "user:1%7Capi%3AGET /x", evil[0])
	assert.NotEqual(t, one[1], evil[0])
	assert.NotEqual(t, one[0], evil[0])
	assert.NotEqual(t, key("1|api:GET /x", "GET /hello")[1], key("1", "GET /x|api:GET /hello")[1])

	distinct := []string{"1", "1|api:x", "1:", "1%7C", "1%", "%", "{user}", "1\x00", "1\n", "a\u0085b", "a\u00a0b", "é", "e\u0301", "\xff", "%FF", "1 ", " 1"}
	seen := map[string]string{}
	for _, u := range distinct {
		k := key(u, "GET /hello")[0]
		if prev, ok := seen[k]; ok {
			t.Errorf("users %q and %q share key %q", prev, u, k)
		}
		seen[k] = u
		assert.NotContains(t, strings.TrimPrefix(k, "user:"), ":", "%q", u)
		assert.NotContains(t, k, "|", "%q", u)
	}
	// The route pattern's braces are escaped, not read as a template.
	r := userReq("u")
	r.Pattern = "GET /hello/{id}"
	keys, err := m.Keys(r)
	require.NoError(t, err)
	assert.Equal(t, "user:u|api:GET:GET /hello/%7Bid%7D", keys[1])
}

func TestInvalidUTF8(t *testing.T) {
	m := newMW(t, Config{Keys: []Key{{Template: "key:{header:X-API-Key}"}}})
	for _, v := range []string{"\xff", "a\xc3", "\xed\xa0\x80", "ok\xffok"} {
		keys, err := m.Keys(req("198.51.100.1:1", "X-API-Key", v))
		require.NoError(t, err)
		require.NoError(t, protocol.ValidateKey(keys[0]), "%q", keys[0])
		assert.Contains(t, keys[0], "%")
	}
}

func TestOversizeValues(t *testing.T) {
	m := newMW(t, Config{Keys: []Key{{Template: "key:{header:X-API-Key}|user:{user}"}}})
	long := strings.Repeat("a", 300)
	mk := func(apiKey, user string) string {
		r := req("198.51.100.1:1", "X-API-Key", apiKey)
		r = r.WithContext(WithIdentity(r.Context(), user))
		keys, err := m.Keys(r)
		require.NoError(t, err)
		require.NoError(t, protocol.ValidateKey(keys[0]), "%q", keys[0])
		return keys[0]
	}
	k1 := mk(long+"1", "bob")
	k2 := mk(long+"2", "bob")
	assert.NotEqual(t, k1, k2, "values sharing a long prefix stay apart: hashed, not truncated")
	assert.True(t, strings.HasPrefix(k1, "key:%~"), k1)
	assert.True(t, strings.HasSuffix(k1, "|user:bob"), "the short part is kept: %s", k1)
	assert.Equal(t, k1, mk(long+"1", "bob"), "deterministic")
	// Both long: both hashed.
	k3 := mk(long, strings.Repeat("é", 200))
	assert.Len(t, k3, len("key:|user:")+2*keytemplate.HashLen)
	// A value needing escapes that grows past the limit.
	k4 := mk(strings.Repeat("|", 100), "bob")
	assert.True(t, strings.HasPrefix(k4, "key:%~"), k4)
	// Short enough: left as it is.
	assert.Equal(t, "key:"+strings.Repeat("a", 200)+"|user:bob", mk(strings.Repeat("a", 200), "bob"))
}

func TestFallbackAndMissing(t *testing.T) {
	m := newMW(t, Config{Keys: []Key{{Template: "user:{user}", Fallback: "ip:{ip}"}, {Template: "key:{header:X-API-Key}"}}})
	r := req("198.51.100.1:1", "X-API-Key", "k1")
	keys, err := m.Keys(r)
	require.NoError(t, err)
	assert.Equal(t, []string{"ip:198.51.100.1", "key:k1"}, keys)
	r = r.WithContext(WithIdentity(r.Context(), "bob"))
	keys, err = m.Keys(r)
	require.NoError(t, err)
	assert.Equal(t, []string{"user:bob", "key:k1"}, keys)

	_, err = m.Keys(req("198.51.100.1:1"))
	var mp *MissingPartError
	require.ErrorAs(t, err, &mp)
	assert.Equal(t, "{header:X-API-Key}", mp.Part)
	assert.Equal(t, "header", mp.Kind)

	_, err = m.Keys(req("not-an-address", "X-API-Key", "k"))
	require.ErrorAs(t, err, &mp)
	assert.Equal(t, "ip", mp.Kind, "the fallback lacks a part too")
}

func TestTemplateErrors(t *testing.T) {
	bad := []string{
		"", "user:{user", "user:user}", "{nope}", "x:{header:}", "x:{header:X Y}",
		"{user}{method}", "{user}-{method}", "{ip}:{user}", "a%b:{user}", "a\x00:{user}",
		"\xff:{user}", "{user}|{{method}}", strings.Repeat("x", 250) + "{user}",
		strings.Repeat("{user}|", 6) + "{user}",
	}
	c := offlineClient(t)
	for _, tmpl := range bad {
		_, err := New(Config{Client: c, Keys: []Key{{Template: tmpl}}})
		assert.Error(t, err, "%q", tmpl)
		_, err = New(Config{Client: c, Keys: []Key{{Template: "ip:{ip}", Fallback: tmpl}}})
		if tmpl != "" {
			assert.Error(t, err, "fallback %q", tmpl)
		}
	}
	good := []string{"ip:{ip}", "{user}", "{ip}|{user}", "{user}:{method}", "api:{method}:{route}", "k:{header:x-api-key}", "const"}
	for _, tmpl := range good {
		_, err := New(Config{Client: c, Keys: []Key{{Template: tmpl}}})
		assert.NoError(t, err, "%q", tmpl)
	}
	for _, cfg := range []Config{
		{Client: c, ProxyHeader: "X-Real-IP"},
		{Client: c, TrustedProxies: []netip.Prefix{{}}},
		{Client: c, IPv6Prefix: 129},
		{Client: c, IPv4Prefix: -1},
		{Client: c, Headers: 9},
		{Client: c, MaxWait: -1},
		{},
	} {
		_, err := New(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
}

func TestRouteFromMux(t *testing.T) {
	m := newMW(t, Config{Keys: []Key{{Template: "api:{route}"}}})
	var got []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello/{id}", func(w http.ResponseWriter, r *http.Request) {
		got, _ = m.Keys(r)
	})
	// Keys made inside the route see r.Pattern.
	mux.ServeHTTP(httptest.NewRecorder(), req("198.51.100.1:1"))
	r := httptest.NewRequest(http.MethodGet, "/hello/42", nil)
	mux.ServeHTTP(httptest.NewRecorder(), r)
	assert.Equal(t, []string{"api:GET /hello/%7Bid%7D"}, got)
	// Wrapping the mux: the mux is asked; no route -> 404, not 429.
	in := m.in
	in.mux = mux
	keys, err := m.makeKeys(httptest.NewRequest(http.MethodGet, "/hello/7", nil), &in)
	require.NoError(t, err)
	assert.Equal(t, []string{"api:GET /hello/%7Bid%7D"}, keys)
	rec := httptest.NewRecorder()
	m.Handler(mux).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/nowhere", nil))
	assert.Equal(t, http.StatusNotFound, rec.Code)
	// Wrapping something no mux routed: a misconfiguration, 500.
	rec = httptest.NewRecorder()
	m.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"plain":    "plain",
		"a:b|c":    "a%3Ab%7Cc",
		"{x}":      "%7Bx%7D",
		"100%":     "100%25",
		"a\tb":     "a%09b",
		"a\x7fb":   "a%7Fb",
		"\xff":     "%FF",
		"é":        "é",
		"a\u0085b": "a%C2%85b",
		"a\u200bb": "a%E2%80%8Bb",
		"sp ace":   "sp ace",
	} {
		assert.Equal(t, want, keytemplate.Escape(in), "%q", in)
	}
}
