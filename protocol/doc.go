// Package protocol defines version 1 of the ratelease wire protocol: the JSON
// request and response types of the lease server's HTTP API, their validation,
// the limits every server enforces, and the RFC 9457 problem type with its
// stable error codes.
//
// The package holds no logic beyond validation and does no I/O, so that both
// the server (package server) and the client SDK (package client) can import
// it without linking each other.
//
// # Endpoints
//
// POST /v1/leases takes a [LeaseRequest] and answers a [LeaseResponse]. Each
// entry acquires, renews or returns the lease of one (client, key) pair:
//
//   - an entry without LeaseID grants up to Want tokens in a new lease;
//   - an entry with LeaseID first settles that lease (Used of its tokens were
//     spent, the rest go back to the bucket) and then grants up to Want tokens
//     in a new lease, in one atomic step;
//   - Want 0 with a LeaseID is a pure return.
//
// A client may hold two leases per key, in slots 0 and 1 (LeaseEntry.Slot),
// and the same key may appear once per slot in a call. This is an addition
// to the design's protocol: it lets the SDK take its next lease while it
// still spends the current one, then settle the current one once it stopped
// spending it, so that no token is ever spent after the server closed its
// lease (which would break the accuracy bound) and no request waits for a
// renewal. A client that ignores Slot gets the design's behaviour exactly.
//
// A per-entry [Problem] in [LeaseResult.Error] fails that entry alone: for
// example [CodeForbidden] for a key outside the client's patterns, or
// [CodeTooManyKeys] for a new key of a client that holds as many keys
// through the server as it may. When no
// entry of a request succeeds, the server answers the status of the first
// failure with a problem body that still carries the per-entry results in its
// "leases" member, so a client can decode either answer into a LeaseResponse.
//
// POST /v1/check takes a [CheckRequest] and answers a [CheckResponse]: one
// decision for callers that do not embed the SDK, all or nothing across its
// keys.
//
// # Limits
//
// A request body is UTF-8: a body with a byte that starts no valid UTF-8
// sequence (overlong forms and encoded surrogates included), or whose strings
// escape a lone UTF-16 surrogate, is refused whole with [CodeInvalidUTF8]
// (422), whose detail names the byte offset of the first fault. It is never
// decoded with U+FFFD in place of the fault, which would let distinct keys
// share one bucket.
//
// A key is 1 to [MaxKeyBytes] bytes of valid UTF-8 without control characters.
// A call carries at most [MaxEntries] entries or keys. Counts (want, used,
// cost) are between 0 and [MaxCount]. A request body is at most
// [MaxBodyBytes]. Requests that break a limit are refused whole with a 4xx
// problem and change nothing.
package protocol
