package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// rulesFileSeeds are rules files, valid and not, for FuzzParseRules.
var rulesFileSeeds = []string{
	rulesYAML,
	authRulesYAML(),
	"",
	"default: deny\n",
	"default: maybe\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1ms}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1000000000, period: 24h, burst: 1000000000, lease_ttl: 1h}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1000000001, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: -1, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 99999999999999999999, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1e3, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: -1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 0s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1000}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 2562047h47m16.854775808s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, lease_ttl: -2s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, soft: 5%}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, soft: NaN}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, soft: -0.0}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1000000000, period: 1s, soft: 1000%}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, reserve: {critical: 20%, high: 0.1}}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, reserve: {critical: 60%, high: 40%}}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, reserve: {bogus: 1%}}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, shadow: true}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, elastic: \"pool\"}\n  - {name: p, match: pool, limit: 10, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, elastic: \"a:1\"}\n",
	"rules:\n  - name: login\n    match: \"login:*\"\n    limits:\n      - {limit: 3, period: 1m, algorithm: sliding_window_log}\n      - {limit: 100, period: 1h}\n",
	"rules:\n  - name: l\n    match: \"l:*\"\n    limit: 1\n    limits:\n      - {limit: 3, period: 1m}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 10, period: 1s, algorithm: leaky_bucket, burst: 20}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 10, period: 1s, algorithm: fixed_window, burst: 20}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 10, period: 1s, algorithm: gcra}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s}\n  - {name: a, match: \"b:*\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s}\n  - {name: b, match: \"a:*\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a\\\\\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: \"\\0\", match: \"\\x01*\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: \"a\\nb\", match: \"a:*\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: \"\\e[2J\\u0085\", match: \"a:*\", limit: 1, period: 1s}\n",
	"rules:\n  - name: |\n      two\n      lines\n    match: \"a:*\"\n    limit: 1\n    period: 1s\n",
	"rules:\n  - {name: " + strings.Repeat("n", leases.MaxRuleNameBytes) + ", match: \"a:*\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: " + strings.Repeat("n", leases.MaxRuleNameBytes+1) + ", match: \"a:*\", limit: 1, period: 1s}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: 1, period: 1s, typo: 1}\n",
	"rules:\n  - {name: a, match: \"a:*\", limit: [1], period: {x: 1}}\n",
	"rules: {name: a}\n",
	"clients:\n  - {name: c, token_sha256: \"" + sha("t") + "\", keys: [\"*\"]}\n",
	"clients:\n  - {name: c, token_sha256: \"" + sha("t") + "\", admin: true}\n",
	"clients:\n  - {name: c, token_sha256: \"" + sha("t") + "\"}\n",
	"clients:\n  - {name: \"c d\", token_sha256: \"" + sha("t") + "\", keys: [\"*\"]}\n",
	"clients:\n  - {name: c, token_sha256: \"" + strings.Repeat("z", 64) + "\", keys: [\"*\"]}\n",
	"clients:\n  - {name: c, token_sha256: \"" + sha("t") + "\", keys: [\"*\"]}\n  - {name: d, token_sha256: \"" + sha("t") + "\", keys: [\"*\"]}\n",
	// Not UTF-8; UTF-16 with a byte order mark; a tab; an alias bomb.
	"rules:\n  - {name: \"a\xff\", match: \"a:*\", limit: 1, period: 1s}\n",
	"\xff\xfer\x00u\x00l\x00e\x00s\x00:\x00 \x00[\x00]\x00\n\x00",
	"rules:\n\t- {}\n",
	"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n",
	"--- \n...\n--- {default: deny}\n",
	"!!binary AAAA",
}

// FuzzParseRules feeds arbitrary rules files to ParseRules: it must never
// panic, and an error must wrap leases.ErrInvalidRules. A file it accepts
// must compile to rules within the bounds leases.Rule documents (names of
// at most leases.MaxRuleNameBytes without control characters, every
// limit 1 to protocol.MaxCount tokens per MinPeriod to MaxPeriod, a lease
// TTL of 1ms to MaxLeaseTTL, soft 0 to MaxSoft, reserve shares 0 to 1),
// unique rule names and patterns, clients with valid names and keys, and
// valid UTF-8 text throughout; and the ratelease CLI's form of it
// (ReadRulesFile, AdminRuleOf, JSON, then the rule database's decoding and
// compile) must be the same rules and clients.
func FuzzParseRules(f *testing.F) {
	for _, s := range rulesFileSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := ParseRules(data)
		if err != nil {
			if !errors.Is(err, leases.ErrInvalidRules) || err.Error() == "" {
				t.Fatalf("ParseRules(%q): error %v does not wrap ErrInvalidRules", data, err)
			}
			if _, err2 := ReadRulesFile(data); err2 == nil {
				t.Fatalf("ReadRulesFile(%q) accepts what ParseRules refuses: %v", data, err)
			}
			return
		}
		sum := sha256.Sum256(data)
		if rules.Version() != hex.EncodeToString(sum[:]) {
			t.Fatalf("version %s is not the file's SHA-256", rules.Version())
		}
		checkPolicy(t, rules)

		// The CLI's path to the rule database.
		rf, err := ReadRulesFile(data)
		if err != nil {
			t.Fatalf("ReadRulesFile(%q) refuses what ParseRules accepts: %v", data, err)
		}
		snap := ruleSetSnapshot{settings: protocol.AdminSettings{Default: string(rf.Default)}}
		for _, rc := range rf.Rules {
			var ar protocol.AdminRule
			storeRoundTrip(t, AdminRuleOf(rc), &ar)
			ar.Name = rc.Name
			back, err := ruleConfigOf(&ar)
			if err != nil {
				t.Fatalf("rule %q: the wire form %+v does not convert back: %v", rc.Name, ar, err)
			}
			if !reflect.DeepEqual(normalRuleConfig(back), normalRuleConfig(rc)) {
				t.Fatalf("rule %q: wire round trip changed it:\n%+v\n%+v", rc.Name, rc, back)
			}
			snap.rules = append(snap.rules, ar)
		}
		for _, cc := range rf.Clients {
			var ac protocol.AdminClient
			storeRoundTrip(t, protocol.AdminClient{Name: cc.Name, TokenSHA256: cc.TokenSHA256, Keys: cc.Keys, Admin: cc.Admin}, &ac)
			ac.Name = cc.Name
			snap.clients = append(snap.clients, ac)
		}
		slices.SortFunc(snap.rules, func(a, b protocol.AdminRule) int { return strings.Compare(a.Name, b.Name) })
		slices.SortFunc(snap.clients, func(a, b protocol.AdminClient) int { return strings.Compare(a.Name, b.Name) })
		db, err := snap.compile()
		if err != nil {
			t.Fatalf("the rule database refuses the rules of %q: %v", data, err)
		}
		checkPolicy(t, db)
		if db.Policy().Default() != rules.Policy().Default() {
			t.Fatalf("default %q in the database, %q in the file", db.Policy().Default(), rules.Policy().Default())
		}
		if !reflect.DeepEqual(rulesByName(db), rulesByName(rules)) {
			t.Fatalf("the database's rules differ from the file's:\n%+v\n%+v", db.Policy().Rules(), rules.Policy().Rules())
		}
		if !reflect.DeepEqual(clientsByName(db), clientsByName(rules)) {
			t.Fatalf("the database's clients differ from the file's:\n%+v\n%+v", db.clients, rules.clients)
		}
	})
}

// storeRoundTrip sends v as the CLI does (JSON), decodes it as the admin
// API does (unknown fields refused), stores it as the rule database does
// ("<version>|<JSON>") and reads it back into into.
func storeRoundTrip(t *testing.T, v, into any) {
	t.Helper()
	body, err := json.Marshal(v)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(into), "%s", body)
	stored, err := json.Marshal(into)
	require.NoError(t, err)
	var version int64
	require.NoError(t, decodeItem("7|"+string(stored), into, &version), "%s", stored)
	require.EqualValues(t, 7, version)
}

// normalRuleConfig is rc with an empty reserve or limits nil, as its wire
// form leaves them out.
func normalRuleConfig(rc RuleConfig) RuleConfig {
	if len(rc.Reserve) == 0 {
		rc.Reserve = nil
	}
	if len(rc.Limits) == 0 {
		rc.Limits = nil
	}
	return rc
}

func rulesByName(r *Rules) map[string]leases.Rule {
	out := map[string]leases.Rule{}
	for _, rl := range r.Policy().Rules() {
		out[rl.Name] = rl
	}
	return out
}

func clientsByName(r *Rules) map[string]principal {
	out := map[string]principal{}
	for _, p := range r.clients {
		p.index = 0
		out[p.name] = p
	}
	return out
}

// checkPolicy fails unless every rule and client of r is within the bounds
// the rules file documents.
func checkPolicy(t *testing.T, r *Rules) {
	t.Helper()
	p := r.Policy()
	if d := p.Default(); d != leases.DefaultAllow && d != leases.DefaultDeny {
		t.Fatalf("default %q", d)
	}
	names, matches := map[string]bool{}, map[string]bool{}
	for _, rl := range p.Rules() {
		if err := rl.Validate(); err != nil {
			t.Fatalf("accepted rule %+v does not validate: %v", rl, err)
		}
		if rl.Name == "" || names[rl.Name] || matches[rl.Match] {
			t.Fatalf("rule %+v: empty or duplicate name or match", rl)
		}
		names[rl.Name], matches[rl.Match] = true, true
		if len(rl.Name) > leases.MaxRuleNameBytes || strings.IndexFunc(rl.Name, unicode.IsControl) >= 0 {
			t.Fatalf("rule name %q: longer than %d bytes or holds a control character", rl.Name, leases.MaxRuleNameBytes)
		}
		for _, s := range []string{rl.Name, rl.Match, rl.Elastic} {
			if !utf8.ValidString(s) {
				t.Fatalf("rule %+v: %q is not UTF-8", rl, s)
			}
		}
		if rl.Algorithm != "" || rl.Limit != 0 || rl.Period != 0 || rl.Burst != 0 {
			t.Fatalf("rule %+v keeps shorthand fields", rl)
		}
		if n := len(rl.Limits); n < 1 || n > leases.MaxLimitsPerRule {
			t.Fatalf("rule %+v has %d limits", rl, n)
		}
		for _, l := range rl.Limits {
			if !leases.Implemented(l.Algorithm) || l.Limit < 1 || l.Limit > protocol.MaxCount ||
				l.Period < leases.MinPeriod || l.Period > leases.MaxPeriod || l.Burst < 1 || l.Burst > protocol.MaxCount {
				t.Fatalf("rule %q: limit %+v out of bounds", rl.Name, l)
			}
		}
		for _, b := range rl.Buckets() {
			if b.Limit < 1 || b.Limit > protocol.MaxCount || b.Burst < 1 || b.Burst > protocol.MaxCount {
				t.Fatalf("rule %q: bucket %+v out of bounds", rl.Name, b)
			}
		}
		if rl.LeaseTTL < time.Millisecond || rl.LeaseTTL > leases.MaxLeaseTTL {
			t.Fatalf("rule %q: lease TTL %v", rl.Name, rl.LeaseTTL)
		}
		if !(rl.Soft >= 0 && rl.Soft <= leases.MaxSoft) {
			t.Fatalf("rule %q: soft %g", rl.Name, rl.Soft)
		}
		sum := 0.0
		for c, v := range rl.Reserve {
			if _, ok := protocol.PriorityRank(c); !ok || !(v >= 0 && v <= 1) || math.IsNaN(v) {
				t.Fatalf("rule %q: reserve %q: %g", rl.Name, c, v)
			}
			sum += v
		}
		if sum >= 1 {
			t.Fatalf("rule %q: reserve sums to %g", rl.Name, sum)
		}
	}
	clients := map[string]bool{}
	for _, c := range r.clients {
		if !validClientName(c.name) || clients[c.name] || (len(c.keys) == 0 && !c.admin) || c.keys == nil {
			t.Fatalf("client %+v", c)
		}
		clients[c.name] = true
		for _, k := range c.keys {
			if err := leases.ValidateGlob(k); err != nil {
				t.Fatalf("client %q: key pattern %q: %v", c.name, k, err)
			}
		}
	}
}
