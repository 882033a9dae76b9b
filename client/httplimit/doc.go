// Package httplimit protects an HTTP API with ratelease: net/http
// middleware that makes keys from each request, decides them with a
// client.Client (leased keys in nanoseconds, the others by one coalesced
// call), and answers a request over the limit with 429, Retry-After and the
// RateLimit fields of draft-ietf-httpapi-ratelimit-headers.
//
//	c, err := client.New(client.Config{Servers: servers, Token: token})
//	if err != nil { ... }
//	defer c.Close(ctx)
//	m, err := httplimit.New(httplimit.Config{
//	    Client: c,
//	    Keys: []httplimit.Key{
//	        {Template: "key:{header:X-API-Key}", Fallback: "ip:{ip}"},
//	        {Template: "route:{route}"},
//	    },
//	})
//	if err != nil { ... }                      // a bad template: an error here, never a limit later
//	mux := http.NewServeMux()
//	mux.HandleFunc("GET /hello", hello)
//	http.ListenAndServe(addr, m.Handler(mux)) // or mux.Handle("GET /hello", m.Handler(h))
//
// The idiom is New, which checks the whole Config once and returns an
// error, then Middleware.Handler, a func(http.Handler) http.Handler that
// can wrap several handlers and share one queue and one set of counters.
// Config follows the style of go-retryablehttp: every field documented,
// every zero value a working default, behaviour changed by hooks
// (Cost, DenyHandler, MissingHandler, OnDecision) rather than flags.
//
// # Keys
//
// A key template is literal text and parts in braces:
//
//	{ip}            the client's address: the direct peer's; IPv6 reduced to
//	                Config.IPv6Prefix (default /64, one host's usual share),
//	                IPv4 whole; zones dropped, IPv4-mapped IPv6 as IPv4
//	{user}          the identity the application put in the context after
//	                authentication (WithIdentity)
//	{header:Name}   the first value of a request header, e.g. an API key
//	{method}        the request method: GET, HEAD, POST, PUT, PATCH, DELETE,
//	                CONNECT, OPTIONS or TRACE, any other "OTHER"
//	{route}         the pattern of the http.ServeMux route, "GET /hello/{id}"
//
// for example "user:{user}", "ip:{ip}", "user:{user}|api:{method}:{route}",
// "key:{header:X-API-Key}". Config.Keys may hold several; a request takes
// its tokens from all of them or none (one Client.AllowN).
//
// A part the caller sends is the caller's to choose: {header:Name}, and
// {route} and {method} as far as the mux lets any path or method through
// (a method other than the standard ones is "OTHER" for that reason). A
// key made of such parts alone limits a caller only as far as the value
// is checked before the middleware runs: an API key the application has
// not verified can be made up afresh for each request, each with a bucket
// of its own (the fallback, say "ip:{ip}", applies only when the header is
// missing). Verify it first and key on the identity (WithIdentity,
// {user}), or give the request an {ip} key beside it (a second entry of
// Config.Keys: a request takes its tokens from every key).
//
// Forwarding headers are read only when the direct peer is in
// Config.TrustedProxies, and then only the one header the proxies write
// (Config.ProxyHeader: X-Forwarded-For, or RFC 7239 Forwarded): the client
// is the right-most address that is not itself a trusted proxy. Everything
// to its left was written by the client and is ignored.
//
// A part the request lacks (no identity before login, no such header, no
// route, no remote address) makes the key's Fallback template be used
// (say "ip:{ip}" for "user:{user}"); without one, or if the fallback lacks
// a part as well, the request is refused by Config.MissingHandler, by
// default with a problem+json of status 401 ({user}), 400 (a header) or
// 500 (no route pattern or no remote address: the server is wired
// wrongly), or, when the wrapped mux has no route for the request, the
// mux's own 404 (or 405 with Allow, for a path it serves for other
// methods); never 429.
//
// # Escaping: one caller cannot forge another's key
//
// Every part value but {ip} (which is the middleware's own canonical text)
// is percent-escaped: '%', ':', '|', '{', '}', control characters, other
// non-printable runes and the bytes of invalid UTF-8 become %XX, byte by
// byte. Escaping is injective and its output holds no separator, and a
// template must put '|' (or ':', where neither neighbour is {ip}) between
// two parts, so a key splits back into its parts one way only: the user
// "1|api:x" has the key "user:1%7Capi%3Ax", which no other user has. A key
// longer than protocol.MaxKeyBytes (256 bytes) has its longest parts
// replaced by "%~" and the base64url SHA-256 of their raw value (45 bytes),
// longest first, until it fits: hashed, never truncated, so two long
// values that share a prefix stay apart. A template whose keys could not fit
// even so is an error at New. Every key is checked with
// protocol.ValidateKey.
//
// # Responses
//
// A denied request gets 429 with Retry-After (whole seconds, rounded up, at
// least 1) and, from Decision.Limits — the fleet-wide state of every limit
// of the key's rule as the lease servers last answered —
//
//	RateLimit-Policy: "5-per-10s";q=5;w=10
//	RateLimit: "5-per-10s";r=0;t=8
//
// one list item per limit: q the limit, w its period in seconds, r what it
// still admits fleet-wide (not what is left in this process's lease; at
// most q), t the seconds until it is whole again. A period that is not a
// whole number of seconds is rounded up and q scaled with it (5 per 100
// ms: q=50;w=1), and a token bucket whose burst exceeds its limit is
// described by its size and fill time (10 per minute, burst 100:
// q=100;w=600), so that q/w is the rule's rate and r never exceeds q. Each limit is named after itself,
// "<limit>-per-<period>" (PolicyName), so every process and every rule
// with the same limit names it alike. Allowed responses carry the same
// fields unless Config.Headers says otherwise. For a key decided directly
// the fields are the answer to this very request; for a leased key they are
// those of the answer that granted the lease (up to half a lease TTL old).
// The body is an RFC 9457 problem of type ProblemTypeQuotaExceeded, or what
// Config.DenyHandler writes.
//
// # Shadow and queueing
//
// Config.Shadow admits what the limit denies, and reports it (OnDecision's
// OutcomeShadow, Stats.Shadow, an Info log); a request whose keys the
// servers refuse it admits as OutcomeRefused, a misconfiguration rather
// than a limit. Config.MaxWait holds a denied request up to that long for
// its tokens (Client.WaitN under a context deadline, and MaxWait bounds a
// shaping rule's slot as well, see client.WithMaxWait; at most
// Config.MaxQueue requests wait at once) before the 429; a request whose
// context ends while it waits spends nothing, but under a shaping rule
// (leaky_bucket), whose slot is taken when the wait for it begins.
//
// A key the lease servers refuse this service (a wrong token, a key
// outside its patterns, a cost beyond the rule's burst) is answered 503,
// never 429, whether the first decision or the wait met the refusal
// (OutcomeRefused, Stats.Refused); so is a request after the client was
// closed (503, "shutting down").
package httplimit
