package protocol

// Paths of the admin API. Each item path takes the item's name (a rule or
// client name) or key (an override) after the prefix, percent-encoded as
// a path segment (url.PathEscape, which escapes '/' as %2F; a name or key
// that is "." or ".." as %2E or %2E%2E). A path that is not canonical
// (with "//", "/./" or "/../" in it, as a key such as "path:/a/../b" sent
// unescaped makes) is refused with CodeInvalidPath, never redirected to
// its cleaned form, which would name another item. The list paths serve
// GET only.
const (
	// PathAdminRules lists the rules (GET); PathAdminRules + "/{name}"
	// gets, puts and deletes one.
	PathAdminRules = "/v1/admin/rules"
	// PathAdminClients lists the clients (GET); PathAdminClients +
	// "/{name}" gets, puts and deletes one.
	PathAdminClients = "/v1/admin/clients"
	// PathAdminOverrides lists the overrides a page at a time (GET, see
	// AdminOverrides: there may be millions); PathAdminOverrides +
	// "/{key}" gets, puts and deletes the override of one key.
	PathAdminOverrides = "/v1/admin/overrides"
	// PathAdminChanges lists the most recent changes of the rule database
	// (GET), newest first.
	PathAdminChanges = "/v1/admin/changes"
	// PathAdminSettings gets and puts the rule set's settings
	// (AdminSettings).
	PathAdminSettings = "/v1/admin/settings"
)

// AdminSettings are the settings of the rule set in the rule database,
// the body of PUT /v1/admin/settings and of its GET.
type AdminSettings struct {
	// Default says what happens to keys that match no rule: "allow" (the
	// default) or "deny", as in a rules file.
	Default string `json:"default"`
	// Version is the database version of the last change; set in
	// responses (and equal to the ETag), ignored in a PUT. Settings never
	// stored have version 0 and ETag "0", which If-Match takes as "not
	// stored yet".
	Version int64 `json:"version,omitempty"`
}

// AdminRule is one rule of the rule database, the body of PUT
// /v1/admin/rules/{name} and of its GET. It has the fields of a rule of the
// rules file (server.RuleConfig); durations are Go duration strings ("1s",
// "1m30s"). A rule with one limit gives it in Algorithm, Limit, Period and
// Burst; a rule with several gives them in Limits.
type AdminRule struct {
	// Name identifies the rule; in a PUT it may be left out, and must
	// otherwise equal the name in the path. It is 1 to 128 bytes of UTF-8
	// without control characters, and not "override", the name of every
	// per-key override (leases.MaxRuleNameBytes, leases.OverrideRuleName;
	// a rule set with another name is refused, 422 invalid_rule).
	Name string `json:"name"`
	// Match is the glob pattern of the keys the rule governs.
	Match string `json:"match"`
	// Algorithm of the rule's one limit; empty means token_bucket.
	Algorithm string `json:"algorithm,omitempty"`
	// Limit tokens per Period, for a rule with one limit.
	Limit int64 `json:"limit,omitempty"`
	// Period of the rule's one limit, as "1s".
	Period string `json:"period,omitempty"`
	// Burst of the rule's one limit; 0 means Limit.
	Burst int64 `json:"burst,omitempty"`
	// Limits are the limits of a rule with several.
	Limits []AdminLimit `json:"limits,omitempty"`
	// LeaseTTL is the lifetime of a lease, as "2s"; empty means the default.
	LeaseTTL string `json:"lease_ttl,omitempty"`
	// Soft is the soft overage as a fraction (0.05 for 5%).
	Soft float64 `json:"soft,omitempty"`
	// Shadow runs the rule in shadow mode.
	Shadow bool `json:"shadow,omitempty"`
	// Elastic is the pool key the rule's denied requests may borrow from.
	Elastic string `json:"elastic,omitempty"`
	// Reserve keeps shares of each limit for the priority classes, per
	// class, as fractions ({"critical": 0.2} keeps 20% from the classes
	// below critical).
	Reserve map[string]float64 `json:"reserve,omitempty"`
	// Version is the database version of the rule's last change; set in
	// responses (and equal to the ETag), ignored in a PUT.
	Version int64 `json:"version,omitempty"`
}

// AdminLimit is one limit of an AdminRule or an AdminOverride.
type AdminLimit struct {
	// Algorithm; empty means token_bucket.
	Algorithm string `json:"algorithm,omitempty"`
	// Limit tokens per Period.
	Limit int64 `json:"limit"`
	// Period, as "1s".
	Period string `json:"period"`
	// Burst; 0 means Limit.
	Burst int64 `json:"burst,omitempty"`
}

// AdminRules is the body of GET /v1/admin/rules.
type AdminRules struct {
	// Version is the database version the list was read at.
	Version int64 `json:"version"`
	// Default says what happens to keys that match no rule: "allow" or
	// "deny".
	Default string `json:"default"`
	// Rules are every rule of the database, by name.
	Rules []AdminRule `json:"rules"`
}

// AdminClient is one client of the rule database, the body of PUT
// /v1/admin/clients/{name} and of its GET. It has the fields of a client
// of the rules file (server.ClientConfig).
type AdminClient struct {
	// Name identifies the client; in a PUT it may be left out, and must
	// otherwise equal the name in the path.
	Name string `json:"name"`
	// TokenSHA256 is the hex SHA-256 of the client's bearer token.
	TokenSHA256 string `json:"token_sha256"`
	// Keys are the glob patterns of the keys the client may use. An admin
	// client may have none: it then uses the admin API only.
	Keys []string `json:"keys"`
	// Admin gives the client the admin scope: its token is accepted by the
	// admin API (/v1/admin/...), and the change log names the client as
	// who made each of its changes. Without it, the client's token gets
	// 403 admin_forbidden there.
	Admin bool `json:"admin,omitempty"`
	// Version is the database version of the client's last change; set in
	// responses, ignored in a PUT.
	Version int64 `json:"version,omitempty"`
}

// AdminClients is the body of GET /v1/admin/clients.
type AdminClients struct {
	// Version is the database version the list was read at.
	Version int64 `json:"version"`
	// Clients are every client of the database, by name.
	Clients []AdminClient `json:"clients"`
}

// AdminOverride is the override of one key, the body of PUT
// /v1/admin/overrides/{key} and of its GET: the limits that key gets
// instead of its rule's, in the shorthand of one limit or in Limits.
type AdminOverride struct {
	// Key is the key overridden; in a PUT it may be left out, and must
	// otherwise equal the key in the path.
	Key string `json:"key"`
	// Algorithm of the one limit; empty means token_bucket.
	Algorithm string `json:"algorithm,omitempty"`
	// Limit tokens per Period.
	Limit int64 `json:"limit,omitempty"`
	// Period, as "1s".
	Period string `json:"period,omitempty"`
	// Burst; 0 means Limit.
	Burst int64 `json:"burst,omitempty"`
	// Limits are the limits when there are several.
	Limits []AdminLimit `json:"limits,omitempty"`
	// LeaseTTL is the lifetime of a lease, as "2s"; empty means the default.
	LeaseTTL string `json:"lease_ttl,omitempty"`
	// Version is the database version of the override's last change; set
	// in responses, ignored in a PUT.
	Version int64 `json:"version,omitempty"`
}

// AdminChange is one entry of the rule database's change log.
type AdminChange struct {
	// Version is the database version the change made.
	Version int64 `json:"version"`
	// At is when the change was made, in Unix milliseconds.
	At int64 `json:"at_ms"`
	// Who made it: the admin principal's name, that of the admin client
	// whose token was sent or the bootstrap admin's (rateleased
	// -admin-name, "admin" by default).
	Who string `json:"who"`
	// Op is "put" or "delete".
	Op string `json:"op"`
	// Kind is "rule", "client" or "override".
	Kind string `json:"kind"`
	// Name is the rule or client name, or the overridden key.
	Name string `json:"name"`
}

// AdminChanges is the body of GET /v1/admin/changes.
type AdminChanges struct {
	// Version is the database version now.
	Version int64 `json:"version"`
	// Changes are the most recent changes, newest first.
	Changes []AdminChange `json:"changes"`
}

// Query parameters and bounds of GET /v1/admin/overrides, the listing of
// the overrides.
const (
	// QueryPrefix restricts the listing to the keys that start with it,
	// byte for byte (no pattern: '*', '?' and '[' are themselves); empty
	// or absent lists every override.
	QueryPrefix = "prefix"
	// QueryCursor continues a listing where the previous page ended:
	// AdminOverrides.Cursor of that page. Absent (or "0") starts one.
	QueryCursor = "cursor"
	// QueryLimit is the number of overrides a page aims at, 1 to
	// MaxOverridesPage; absent means DefaultOverridesPage.
	QueryLimit = "limit"
	// DefaultOverridesPage is the limit of a listing that gives none.
	DefaultOverridesPage = 100
	// MaxOverridesPage is the largest limit of a listing.
	MaxOverridesPage = 1000
)

// AdminOverrides is the body of GET /v1/admin/overrides: one page of the
// overrides whose key starts with the prefix asked for. The server reads
// them with Redis HSCAN, a page at a time, and never loads them all, so:
//
//   - the overrides come in no particular order;
//   - a page aims at the limit but may hold fewer, none even, before the
//     end (the server scans a bounded number of steps per page, and a
//     prefix may match few of the entries scanned), or more when Redis
//     returns more in one step (a small hash comes whole): page on until
//     Cursor is empty;
//   - an override that exists from the first page to the last is listed;
//     one put or deleted meanwhile may be listed or not, and one may be
//     listed twice if the hash is resized meanwhile (HSCAN's guarantees).
type AdminOverrides struct {
	// Overrides are the page's overrides, each with its Key and Version.
	Overrides []AdminOverride `json:"overrides"`
	// Cursor is the value of QueryCursor for the next page; empty when
	// the listing is complete. It is opaque: pass it back as it is.
	Cursor string `json:"cursor,omitempty"`
}
