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
	// CodeInvalidUTF8: the body is not valid UTF-8, or a JSON string in it
	// escapes a lone UTF-16 surrogate (\ud800 to \udfff without its pair),
	// which names no character. The detail gives the byte offset of the
	// first fault. Such a body is refused rather than decoded with U+FFFD in
	// place of the bad bytes, which would let distinct keys share a bucket
	// (422).
	CodeInvalidUTF8 Code = "invalid_utf8"
	// CodeInvalidRequest: the request is well-formed JSON but incomplete,
	// for example no entries (422).
	CodeInvalidRequest Code = "invalid_request"
	// CodeInvalidQuery: a query parameter of the URL is malformed or out
	// of range, such as the cursor or limit of a listing; the detail
	// names it (400).
	CodeInvalidQuery Code = "invalid_query"
	// CodeInvalidPath: the URL path is not canonical: it holds "//",
	// "/./" or "/../", or ends in "/." or "/..". Such a path is refused,
	// never redirected to its cleaned form, which would name another key
	// or item; escape each '/' of a key or name in a path as %2F (400).
	CodeInvalidPath Code = "invalid_path"
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
	// CodeInvalidPriority: priority names no class; the classes are
	// critical, high, normal and low (422).
	CodeInvalidPriority Code = "invalid_priority"
	// CodeTooManyEntries: more than MaxEntries entries or keys (413).
	CodeTooManyEntries Code = "too_many_entries"
	// CodeTooManyKeys: the client holds leases on as many distinct keys
	// through this lease server as it may, and the entry asks for tokens on
	// another key. The entry fails alone; the detail names the cap and how
	// to raise it. Leases on other keys must expire first (429).
	CodeTooManyKeys Code = "too_many_keys"
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
	// CodeInvalidRule: an admin PUT or DELETE would leave the rule
	// database's rules or clients invalid; the detail names the rule or
	// client and the field, as loading a rules file does. Nothing was
	// stored (422).
	CodeInvalidRule Code = "invalid_rule"
	// CodeAdminForbidden: the caller authenticated, but not as an admin:
	// the admin API needs the admin token (403).
	CodeAdminForbidden Code = "admin_forbidden"
	// CodePreconditionFailed: If-Match names a version of the item that is
	// not the current one (or the item does not exist, or, for
	// If-None-Match: *, it does): someone else changed it first. GET it
	// again and retry. Nothing was stored (412).
	CodePreconditionFailed Code = "precondition_failed"
	// CodeNoSuchItem: the rule, client or override named in an admin path
	// does not exist (404).
	CodeNoSuchItem Code = "no_such_item"
	// CodeNoRuleDB: the server has no rule database (it runs without
	// Redis, or no admin token is configured), so the admin API is off
	// (404).
	CodeNoRuleDB Code = "no_rule_db"
	// CodeNotFound: no such route (404).
	CodeNotFound Code = "not_found"
	// CodeMethodNotAllowed: the route exists with another method (405).
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeStoreUnavailable: the store (Redis) did not answer; retry after
	// the Retry-After header (503). As an entry's or a take's error, it
	// did not answer for that key alone (a Redis Cluster node down) while
	// it did for others; a lease call every entry of which failed so is a
	// 503 whose Problem carries every entry's result (Leases), which a 503
	// of the store down never does.
	CodeStoreUnavailable Code = "store_unavailable"
	// CodeShuttingDown: the server is stopping; use another one (503).
	CodeShuttingDown Code = "shutting_down"
	// CodeInternal: a bug; the server logged it (500).
	CodeInternal Code = "internal"
)

// codeInfo is the HTTP status and title of a code.
type codeInfo struct {
	status int
	title  string
}

// codes is the table of every code of protocol v1: its status and title.
var codes = map[Code]codeInfo{
	CodeInvalidJSON:          {http.StatusBadRequest, "Malformed JSON body"},
	CodeInvalidUTF8:          {http.StatusUnprocessableEntity, "Body is not valid UTF-8"},
	CodeInvalidRequest:       {http.StatusUnprocessableEntity, "Invalid request"},
	CodeInvalidQuery:         {http.StatusBadRequest, "Invalid query parameter"},
	CodeInvalidPath:          {http.StatusBadRequest, "Path not canonical"},
	CodeInvalidKey:           {http.StatusUnprocessableEntity, "Invalid key"},
	CodeDuplicateKey:         {http.StatusUnprocessableEntity, "Duplicate key"},
	CodeInvalidCount:         {http.StatusUnprocessableEntity, "Invalid count"},
	CodeInvalidClientID:      {http.StatusUnprocessableEntity, "Invalid client_id"},
	CodeInvalidLeaseID:       {http.StatusUnprocessableEntity, "Invalid lease_id"},
	CodeInvalidPriority:      {http.StatusUnprocessableEntity, "Invalid priority"},
	CodeTooManyEntries:       {http.StatusRequestEntityTooLarge, "Too many entries"},
	CodeTooManyKeys:          {http.StatusTooManyRequests, "Too many keys for this client"},
	CodeBodyTooLarge:         {http.StatusRequestEntityTooLarge, "Request body too large"},
	CodeUnsupportedMediaType: {http.StatusUnsupportedMediaType, "Unsupported media type"},
	CodeUnauthorized:         {http.StatusUnauthorized, "Unauthorized"},
	CodeForbidden:            {http.StatusForbidden, "Key not permitted for this client"},
	CodeNoRule:               {http.StatusForbidden, "No rule matches the key"},
	CodeUnknownLease:         {http.StatusConflict, "Unknown lease"},
	CodeUsedExceedsGranted:   {http.StatusUnprocessableEntity, "Used exceeds granted"},
	CodeCostExceedsBurst:     {http.StatusUnprocessableEntity, "Cost exceeds burst"},
	CodeTooManyLeases:        {http.StatusTooManyRequests, "Too many open leases on the key"},
	CodeInvalidRule:          {http.StatusUnprocessableEntity, "Invalid rule"},
	CodeAdminForbidden:       {http.StatusForbidden, "Admin token required"},
	CodePreconditionFailed:   {http.StatusPreconditionFailed, "Precondition failed"},
	CodeNoSuchItem:           {http.StatusNotFound, "No such item"},
	CodeNoRuleDB:             {http.StatusNotFound, "No rule database"},
	CodeNotFound:             {http.StatusNotFound, "Not found"},
	CodeMethodNotAllowed:     {http.StatusMethodNotAllowed, "Method not allowed"},
	CodeStoreUnavailable:     {http.StatusServiceUnavailable, "Store unavailable"},
	CodeShuttingDown:         {http.StatusServiceUnavailable, "Server shutting down"},
	CodeInternal:             {http.StatusInternalServerError, "Internal server error"},
}

// Status returns the HTTP status of the code, 500 for an unknown code.
func (c Code) Status() int {
	if info, ok := codes[c]; ok {
		return info.status
	}
	return http.StatusInternalServerError
}

// Title returns the human-readable title of the code, "Error" for an
// unknown code.
func (c Code) Title() string {
	if info, ok := codes[c]; ok {
		return info.title
	}
	return "Error"
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

// Error formats the problem as "code (status): detail".
func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("%s (%d): %s", p.Code, p.Status, p.Title)
	}
	return fmt.Sprintf("%s (%d): %s", p.Code, p.Status, p.Detail)
}
