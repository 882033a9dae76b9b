package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/protocol"
)

// listOverrides pages through GET /v1/admin/overrides on f with prefix and
// limit and returns how often each key was listed, the number of pages and
// the largest page.
func (f *fixture) listOverrides(prefix string, limit int) (seen map[string]int, pages, largest int) {
	f.t.Helper()
	seen = map[string]int{}
	q := url.Values{protocol.QueryPrefix: {prefix}, protocol.QueryLimit: {strconv.Itoa(limit)}}
	for pages = 1; ; pages++ {
		r := f.admin(http.MethodGet, protocol.PathAdminOverrides+"?"+q.Encode(), "", nil)
		require.Equal(f.t, http.StatusOK, r.status, "body: %s", r.body)
		var page protocol.AdminOverrides
		require.NoError(f.t, json.Unmarshal(r.body, &page))
		largest = max(largest, len(page.Overrides))
		for _, o := range page.Overrides {
			seen[o.Key]++
			assert.Positive(f.t, o.Limit, o.Key)
			assert.Positive(f.t, o.Version, o.Key)
		}
		if page.Cursor == "" {
			return seen, pages, largest
		}
		q.Set(protocol.QueryCursor, page.Cursor)
		require.Less(f.t, pages, 10_000, "the listing ends")
	}
}

// TestListOverrides: GET /v1/admin/overrides pages through 2,500 overrides
// and lists each exactly once; a prefix selects the keys that start with
// it, its glob metacharacters taken literally; bad parameters get 400; a
// client's token gets 403.
func TestListOverrides(t *testing.T) {
	rs := redistest.Start(t)
	f := newDBFixture(t, rs, Options{})
	ctx := context.Background()
	db := f.srv.opts.RuleDB
	const n = 2500
	var keys []string
	for i := range n {
		keys = append(keys, "user:"+strconv.Itoa(i))
	}
	// Keys full of glob metacharacters, and a decoy that the unescaped
	// pattern a*[b]?\* would match.
	special := []string{`a*[b]?\1`, `a*[b]?\2`, `azzb!*`, `[x]`, `?q`}
	for _, k := range append(keys, special...) {
		_, err := db.PutOverride(ctx, "test", protocol.AdminOverride{Key: k, Limit: 5, Period: "1s"}, "")
		require.NoError(t, err, k)
	}

	t.Run("every override exactly once", func(t *testing.T) {
		for _, limit := range []int{100, 1000} {
			seen, pages, largest := f.listOverrides("user:", limit)
			assert.Len(t, seen, n, "limit %d", limit)
			for _, k := range keys {
				assert.Equal(t, 1, seen[k], "%s listed once with limit %d", k, limit)
			}
			t.Logf("limit %d: %d pages, the largest of %d", limit, pages, largest)
			assert.GreaterOrEqual(t, pages, n/largest, "paged")
			assert.LessOrEqual(t, largest, limit+limit/10, "a page ends near its limit")
		}
	})

	t.Run("an override as GET gives it", func(t *testing.T) {
		// A rare prefix: pages may come empty, with a cursor, before the
		// one that holds it.
		var found []json.RawMessage
		q := url.Values{protocol.QueryPrefix: {"user:2499"}}
		for range 100 {
			r := f.admin(http.MethodGet, protocol.PathAdminOverrides+"?"+q.Encode(), "", nil)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var page struct {
				Overrides []json.RawMessage `json:"overrides"`
				Cursor    string            `json:"cursor"`
			}
			require.NoError(t, json.Unmarshal(r.body, &page))
			found = append(found, page.Overrides...)
			if page.Cursor == "" {
				break
			}
			q.Set(protocol.QueryCursor, page.Cursor)
		}
		one := f.admin(http.MethodGet, protocol.PathAdminOverrides+"/user:2499", "", nil)
		require.Equal(t, http.StatusOK, one.status, "body: %s", one.body)
		require.Len(t, found, 1)
		assert.JSONEq(t, string(one.body), string(found[0]))
	})

	t.Run("prefix", func(t *testing.T) {
		userOne := 1 + 10 + 100 + 1000 // user:1, user:1x, user:1xx, user:1xxx
		tests := []struct {
			prefix string
			want   []string // nil: count only
			count  int
		}{
			{prefix: "", count: n + len(special)},
			{prefix: "user:1", count: userOne},
			{prefix: "user:2499", want: []string{"user:2499"}},
			{prefix: `a*[b]?\`, want: []string{`a*[b]?\1`, `a*[b]?\2`}},
			{prefix: `a*`, want: []string{`a*[b]?\1`, `a*[b]?\2`}},
			{prefix: "[", want: []string{"[x]"}},
			{prefix: "?", want: []string{"?q"}},
			{prefix: "nobody", want: []string{}},
		}
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%q", tt.prefix), func(t *testing.T) {
				seen, _, _ := f.listOverrides(tt.prefix, 200)
				if tt.want == nil {
					assert.Len(t, seen, tt.count)
					return
				}
				got := []string{}
				for k, c := range seen {
					assert.Equal(t, 1, c, k)
					got = append(got, k)
				}
				assert.ElementsMatch(t, tt.want, got)
			})
		}
	})

	t.Run("bad parameters", func(t *testing.T) {
		tests := []struct{ query, detail string }{
			{"cursor=abc", "cursor"},
			{"cursor=-1", "cursor"},
			{"cursor=18446744073709551616", "cursor"},
			{"limit=0", "1 to 1000"},
			{"limit=1001", "1 to 1000"},
			{"limit=ten", "limit"},
			{"prefix=%00", "prefix"},
			{"prefix=%ff", "prefix"},
		}
		for _, tt := range tests {
			r := f.admin(http.MethodGet, protocol.PathAdminOverrides+"?"+tt.query, "", nil)
			require.Equal(t, http.StatusBadRequest, r.status, "%s: body: %s", tt.query, r.body)
			p := r.problem(t)
			assert.Equal(t, protocol.CodeInvalidQuery, p.Code, tt.query)
			assert.Contains(t, p.Detail, tt.detail, tt.query)
		}
	})

	t.Run("admin token required", func(t *testing.T) {
		r := f.admin(http.MethodPut, protocol.PathAdminClients+"/alpha", "", protocol.AdminClient{TokenSHA256: sha(alphaToken), Keys: []string{"user:*"}})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		r = f.admin(http.MethodGet, protocol.PathAdminOverrides, alphaToken, nil)
		require.Equal(t, http.StatusForbidden, r.status, "body: %s", r.body)
		assert.Equal(t, protocol.CodeAdminForbidden, r.problem(t).Code)
		r = f.do(http.MethodGet, protocol.PathAdminOverrides, "", "", nil)
		assert.Equal(t, http.StatusUnauthorized, r.status)
		r = f.admin(http.MethodPost, protocol.PathAdminOverrides, "", nil)
		assert.Equal(t, http.StatusMethodNotAllowed, r.status)
	})
}

func TestGlobEscape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"user:1", "user:1"},
		{`a*[b]?\`, `a\*\[b\]\?\\`},
		{"", ""},
		{"ü*", `ü\*`},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, globEscape(tt.in), tt.in)
	}
}
