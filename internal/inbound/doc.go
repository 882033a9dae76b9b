// Package inbound is what the two inbound limiters of ratelease share:
// client/httplimit (net/http middleware) and the grpclimit module (gRPC
// server interceptors). Both check the same configuration (key templates
// and their fallbacks, trusted proxies, the IPv6 and IPv4 prefix lengths of
// {ip}, the header mode, MaxWait and MaxQueue), make keys the same way, and
// take the same decision on each request or call: ask the client, admit
// what the limit denies in shadow mode, hold a denial in a bounded wait
// queue up to MaxWait, and count every outcome. Both write the same
// RateLimit fields (draft-ietf-httpapi-ratelimit-headers) on their answers,
// as HTTP header fields or as gRPC metadata: RateLimitFields serializes
// them, Limiter.Fields serves them from a cache each limiter holds (a
// leased key's are serialized once a second, not on every request), and
// SetValues puts them in an http.Header or a metadata.MD with one
// allocation. This package does all of that once. What differs, and stays
// in each package, is the transport: where a part's value comes from (a
// header or gRPC metadata), and how an admission or a denial is written (a
// 429 with RateLimit header fields, or a ResourceExhausted status with
// RateLimit metadata).
//
// It is internal so that its types never become part of the SDK's public
// API: each limiter keeps its own documented Config, Result and Stats, and
// converts to and from this package's. grpclimit may import it because its
// import path, github.com/ratelease/ratelease/grpclimit, lies under this
// module's root, although it is a module of its own.
//
// Errors returned by New, and by Limiter.MakeKeys for an invalid key,
// begin with the prefix the limiter gave (Config.Prefix: "httplimit" or
// "grpclimit"), as they did before this package existed.
package inbound
