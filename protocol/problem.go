package protocol

import (
	"fmt"
	"net/http"
)

// ContentTypeProblem is the media type of a Problem body (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// Code is a stable, machine-readable error code. Callers branch on codes,
// never on titles or details, which may change.
type Code string

// The error codes of protocol v1. Each has a fixed HTTP status, returned by
// [Code.Status].
const (
	// CodeInvalidJSON: the body is not JSON of the expected shape (400).
	CodeInvalidJSON Code = "invalid_json"
	// CodeInvalidRequest: the request is well-formed JSON but incomplete,
	// for example no entries (422).
	CodeInvalidRequest Code = "invalid_request"
	// CodeInvalidKey: a key breaks the key rules (422).
	CodeInvalidKey Code = "invalid_key"
	// CodeDuplicateKey: a key appears twice in one call (422).
	CodeDuplicateKey Code = "duplicate_key"
	// CodeInvalidCount: want, used or cost is negative, too large, or used
	// without a lease_id (422).
	CodeInvalidCount Code = "invalid_count"
	// CodeInvalidClientID: client_id is missing or malformed (422).
	CodeInvalidClientID Code = "invalid_client_id"
	// CodeInvalidLeaseID: lease_id is malformed (422).
	CodeInvalidLeaseID Code = "invalid_lease_id"
	// CodeTooManyEntries: more than MaxEntries entries or keys (413).
	CodeTooManyEntries Code = "too_many_entries"
	// CodeBodyTooLarge: the body is larger than MaxBodyBytes (413).
	CodeBodyTooLarge Code = "body_too_large"
	// CodeUnsupportedMediaType: the body is not application/json (415).
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	// CodeUnauthorized: no bearer token, or an unknown one (401).
	CodeUnauthorized Code = "unauthorized"
	// CodeForbidden: the client may not lease this key (403).
	CodeForbidden Code = "forbidden"
	// CodeNoRule: no rule matches the key and the server's default is deny
	// (403).
	CodeNoRule Code = "no_rule"
	// CodeUnknownLease: the lease_id names no open lease of this client and
	// key: it expired, was settled already, or never existed. Nothing was
	// settled and nothing granted; ask again without lease_id (409).
	CodeUnknownLease Code = "unknown_lease"
	// CodeUsedExceedsGranted: used is larger than the lease's grant (422).
	CodeUsedExceedsGranted Code = "used_exceeds_granted"
	// CodeTooManyLeases: the entry would open a lease beyond the server's
	// cap on the open leases of the key, or on the processes of one client
	// holding leases on it (429). Renewals, settles and returns are never
	// refused; the caller should take tokens directly (POST /v1/check)
	// instead of leasing this key.
	CodeTooManyLeases Code = "too_many_leases"
	// CodeCostExceedsBurst: a check's cost is larger than a key's bucket,
	// so it could never be allowed (422).
	CodeCostExceedsBurst Code = "cost_exceeds_burst"
	// CodeNotFound: no such route (404).
	CodeNotFound Code = "not_found"
	// CodeMethodNotAllowed: the route exists with another method (405).
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeStoreUnavailable: the store (Redis) did not answer; retry after
	// the Retry-After header (503).
	CodeStoreUnavailable Code = "store_unavailable"
	// CodeShuttingDown: the server is stopping; use another one (503).
	CodeShuttingDown Code = "shutting_down"
	// CodeInternal: a bug; the server logged it (500).
	CodeInternal Code = "internal"
)

var codeStatus = map[Code]int{
	CodeInvalidJSON:          http.StatusBadRequest,
	CodeInvalidRequest:       http.StatusUnprocessableEntity,
	CodeInvalidKey:           http.StatusUnprocessableEntity,
	CodeDuplicateKey:         http.StatusUnprocessableEntity,
	CodeInvalidCount:         http.StatusUnprocessableEntity,
	CodeInvalidClientID:      http.StatusUnprocessableEntity,
	CodeInvalidLeaseID:       http.StatusUnprocessableEntity,
	CodeTooManyEntries:       http.StatusRequestEntityTooLarge,
	CodeBodyTooLarge:         http.StatusRequestEntityTooLarge,
	CodeUnsupportedMediaType: http.StatusUnsupportedMediaType,
	CodeUnauthorized:         http.StatusUnauthorized,
	CodeForbidden:            http.StatusForbidden,
	CodeNoRule:               http.StatusForbidden,
	CodeUnknownLease:         http.StatusConflict,
	CodeUsedExceedsGranted:   http.StatusUnprocessableEntity,
	CodeCostExceedsBurst:     http.StatusUnprocessableEntity,
	CodeTooManyLeases:        http.StatusTooManyRequests,
	CodeNotFound:             http.StatusNotFound,
	CodeMethodNotAllowed:     http.StatusMethodNotAllowed,
	CodeStoreUnavailable:     http.StatusServiceUnavailable,
	CodeShuttingDown:         http.StatusServiceUnavailable,
	CodeInternal:             http.StatusInternalServerError,
}

// Status returns the HTTP status of the code, 500 for an unknown code.
func (c Code) Status() int {
	if s, ok := codeStatus[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Problem is an RFC 9457 problem detail. It implements error, so validation
// functions return it directly and callers can recover it with errors.As.
type Problem struct {
	// Type is a URI reference naming the problem type. The server uses
	// "https://ratelease.dev/problems/<code>"; clients should branch on Code.
	Type string `json:"type,omitempty"`
	// Title is a short human-readable summary of the problem type.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence, naming the field or key at fault and
	// what to do.
	Detail string `json:"detail,omitempty"`
	// Code is the stable machine-readable error code.
	Code Code `json:"code"`
	// Leases carries the per-entry results when every entry of a lease
	// request failed (an RFC 9457 extension member).
	Leases []LeaseResult `json:"leases,omitempty"`
}

// NewProblem returns a Problem for code with the code's status and title and
// the given detail.
func NewProblem(code Code, detail string) *Problem {
	return &Problem{
		Type:   "https://ratelease.dev/problems/" + string(code),
		Title:  code.Title(),
		Status: code.Status(),
		Detail: detail,
		Code:   code,
	}
}

// Title returns the human-readable title of the code.
func (c Code) Title() string {
	switch c {
	case CodeInvalidJSON:
		return "Malformed JSON body"
	case CodeInvalidRequest:
		return "Invalid request"
	case CodeInvalidKey:
		return "Invalid key"
	case CodeDuplicateKey:
		return "Duplicate key"
	case CodeInvalidCount:
		return "Invalid count"
	case CodeInvalidClientID:
		return "Invalid client_id"
	case CodeInvalidLeaseID:
		return "Invalid lease_id"
	case CodeTooManyEntries:
		return "Too many entries"
	case CodeBodyTooLarge:
		return "Request body too large"
	case CodeUnsupportedMediaType:
		return "Unsupported media type"
	case CodeUnauthorized:
		return "Unauthorized"
	case CodeForbidden:
		return "Key not permitted for this client"
	case CodeNoRule:
		return "No rule matches the key"
	case CodeUnknownLease:
		return "Unknown lease"
	case CodeUsedExceedsGranted:
		return "Used exceeds granted"
	case CodeCostExceedsBurst:
		return "Cost exceeds burst"
	case CodeTooManyLeases:
		return "Too many open leases on the key"
	case CodeNotFound:
		return "Not found"
	case CodeMethodNotAllowed:
		return "Method not allowed"
	case CodeStoreUnavailable:
		return "Store unavailable"
	case CodeShuttingDown:
		return "Server shutting down"
	case CodeInternal:
		return "Internal server error"
	}
	return "Error"
}

// Error formats the problem as "code (status): detail".
func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("%s (%d): %s", p.Code, p.Status, p.Title)
	}
	return fmt.Sprintf("%s (%d): %s", p.Code, p.Status, p.Detail)
}
