package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// maxScanSteps bounds the HSCAN calls of one page of the override listing,
// so that a page costs Redis a bounded number of entries looked at (HSCAN
// COUNT c looks at no more than about 10·c buckets) whatever the prefix: a
// prefix that matches few overrides gives short pages (and a cursor), not
// a long call.
const maxScanSteps = 16

// globEscape returns s with the glob metacharacters of Redis's MATCH ('*',
// '?', '[', ']' and '\') escaped by a backslash, so that the pattern
// globEscape(s) + "*" matches exactly the strings that start with s.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// ListOverrides returns one page of the overrides whose key starts with
// prefix (every override when it is empty), read with HSCAN from cursor (0
// starts a listing): it scans until the page holds at least limit
// overrides, the scan is complete, or maxScanSteps steps were taken, each
// asking Redis for what the page still lacks (Redis may return a few more,
// and a hash small enough to be stored compactly whole). The page's Cursor continues the listing; it is empty once
// the scan is complete. See protocol.AdminOverrides for what a listing
// guarantees.
func (db *RuleDB) ListOverrides(ctx context.Context, prefix string, cursor uint64, limit int) (protocol.AdminOverrides, error) {
	if limit < 1 {
		return protocol.AdminOverrides{}, fmt.Errorf("list overrides: limit %d: want at least 1", limit)
	}
	match := ""
	if prefix != "" {
		match = globEscape(prefix) + "*"
	}
	out := protocol.AdminOverrides{Overrides: []protocol.AdminOverride{}}
	for step := 0; step < maxScanSteps && len(out.Overrides) < limit; step++ {
		// Ask for what the page lacks, so that it ends near limit.
		kv, next, err := db.rdb.HScan(ctx, db.OverridesKey(), cursor, match, int64(limit-len(out.Overrides))).Result()
		if err != nil {
			return protocol.AdminOverrides{}, fmt.Errorf("list overrides: %w", unavailable(err))
		}
		for i := 0; i+1 < len(kv); i += 2 {
			o := protocol.AdminOverride{}
			if err := decodeItem(kv[i+1], &o, &o.Version); err != nil {
				return protocol.AdminOverrides{}, fmt.Errorf("%w: override of key %q: %w: DELETE or PUT it through the admin API", leases.ErrInvalidRules, kv[i], err)
			}
			o.Key = kv[i]
			out.Overrides = append(out.Overrides, o)
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
	out.Cursor = strconv.FormatUint(cursor, 10)
	return out, nil
}

// adminListOverrides serves GET /v1/admin/overrides?prefix=&cursor=&limit=
// (protocol.AdminOverrides). A malformed parameter gets 400 invalid_query.
func (s *Server) adminListOverrides(w http.ResponseWriter, r *http.Request, db *RuleDB, _ string) {
	q := r.URL.Query()
	bad := func(name, value, want string) {
		writeProblem(w, protocol.NewProblem(protocol.CodeInvalidQuery, fmt.Sprintf("%s=%q: %s", name, value, want)))
	}
	prefix := q.Get(protocol.QueryPrefix)
	if prefix != "" {
		if err := protocol.ValidateKey(prefix); err != nil {
			bad(protocol.QueryPrefix, prefix, fmt.Sprintf("%v: a prefix is the start of a key, percent-encoded", err))
			return
		}
	}
	var cursor uint64
	if v := q.Get(protocol.QueryCursor); v != "" {
		c, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			bad(protocol.QueryCursor, v, "want the cursor of the previous page, as it was given")
			return
		}
		cursor = c
	}
	limit := protocol.DefaultOverridesPage
	if v := q.Get(protocol.QueryLimit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > protocol.MaxOverridesPage {
			bad(protocol.QueryLimit, v, fmt.Sprintf("want a whole number from 1 to %d", protocol.MaxOverridesPage))
			return
		}
		limit = n
	}
	page, err := db.ListOverrides(r.Context(), prefix, cursor, limit)
	if err != nil {
		s.adminFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}
