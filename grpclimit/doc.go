// Package grpclimit protects a gRPC server with ratelease: unary and stream
// server interceptors that make keys from each call with the key templates
// of client/httplimit (package client/keytemplate: same grammar, same
// escaping, same hashing), decide them with a client.Client, and fail a
// call over the limit with codes.ResourceExhausted, a RetryInfo detail and
// the RateLimit fields of draft-ietf-httpapi-ratelimit-headers as response
// metadata.
//
// It is a module of its own, github.com/ratelease/ratelease/grpclimit, so
// that google.golang.org/grpc never enters the SDK's dependencies.
//
//	l, err := grpclimit.New(grpclimit.Config{
//	    Client: c,
//	    Keys: []grpclimit.Key{
//	        {Template: "user:{user}", Fallback: "ip:{ip}"},
//	        {Template: "rpc:{method}"},
//	    },
//	})
//	if err != nil { ... }                       // a bad template: an error here, never a limit later
//	s := grpc.NewServer(
//	    grpc.ChainUnaryInterceptor(auth, l.UnaryServerInterceptor()),
//	    grpc.ChainStreamInterceptor(authStream, l.StreamServerInterceptor()),
//	)
//
// # Keys
//
//	{ip}        the peer's address (IPv6 reduced to Config.IPv6Prefix,
//	            default /64); the x-forwarded-for metadata's right-most
//	            untrusted address only when the peer is in
//	            Config.TrustedProxies, ignored otherwise
//	{method}    the full method, "/pkg.Service/Method"
//	{service}   its service, "pkg.Service"
//	{md:name}   the first value of the incoming metadata key name (an API
//	            key, say; lower case)
//	{user}      the identity an earlier interceptor put in the context with
//	            WithIdentity (the same as httplimit.WithIdentity)
//
// {md:name} is the caller's to choose, and so are {method} and {service}
// on a server with a grpc.UnknownServiceHandler (the interceptors see any
// method name a caller sends): a key made of such parts alone limits a
// caller only as far as their values are checked before the interceptor,
// since a caller can send a new value with each call, a bucket each.
// Verify an API key first and key on the identity ({user}), or give the
// call an {ip} key beside it (a second entry of Config.Keys).
//
// A part the call lacks makes the key's Fallback be used; without one the
// call fails with Unauthenticated ({user}), InvalidArgument ({md:name}) or
// Internal ({ip}: no IP peer, as on a Unix socket or bufconn), or what
// Config.MissingError returns — never ResourceExhausted.
//
// # Responses
//
// A denied call fails with codes.ResourceExhausted; its status carries an
// errdetails.RetryInfo with the delay the servers gave (1 s when unknown),
// and its header metadata holds
//
//	retry-after: 8
//	ratelimit-policy: "5-per-10s";q=5;w=10
//	ratelimit: "5-per-10s";r=0;t=8
//
// the fields exactly as httplimit writes them (structured-field lists, the
// fleet-wide state). Allowed calls carry the two RateLimit fields too unless
// Config.Headers says otherwise. A call the lease servers refuse this
// service (Decision.Err: a wrong token, a key it may not use) fails with
// codes.Unavailable, never ResourceExhausted: a misconfiguration is not a
// rate limit, and the caller should not back off and retry on it as on
// one. So does a call while the client is closing.
//
// # Streams
//
// A stream takes one decision, when it opens, before its handler runs
// (Config.Cost tokens; its RateLimit fields go in the stream's header).
// Messages are free unless Config.MessageCost prices them: then each
// message the handler receives takes its cost from the stream's keys, and a
// denial makes RecvMsg return the ResourceExhausted status (its fields in
// the trailer, since the header may have been sent).
//
// # Shadow and waiting
//
// Config.Shadow admits what the limit denies and reports it (OnDecision's
// OutcomeShadow, Stats.Shadow, an Info log). Config.MaxWait holds a denied
// call up to that long for its tokens (at most Config.MaxQueue at once); a
// call whose context ends while it waits fails with its context's status.
package grpclimit
