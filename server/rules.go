package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ratelease/ratelease/leases"
	"go.yaml.in/yaml/v3"
)

// AnonymousClient is the client name of every caller when the rules file
// configures no clients. Leases are then owned by "anonymous/<client_id>".
const AnonymousClient = "anonymous"

// maxClientNameBytes is the longest client name.
const maxClientNameBytes = 64

// RulesFile is a rules file as written: the default, the rules, and the
// clients that may call the API.
//
//	default: allow
//	rules:
//	  - name: per-user
//	    match: "user:*"
//	    limit: 100
//	    period: 1s
//	  - name: login
//	    match: "login:*"
//	    limits:
//	      - {limit: 3, period: 1m, algorithm: sliding_window_log}
//	      - {limit: 100, period: 1h}
//	clients:
//	  - name: checkout
//	    token_sha256: "<64 hex digits: printf %s "$TOKEN" | sha256sum | cut -d' ' -f1>"
//	    keys: ["user:*", "api:*"]
//
// Unknown fields are an error, so that a typo is reported rather than
// silently ignored, and so is a second YAML document (after a "---" line)
// that holds anything: a decoder reads the first alone.
type RulesFile struct {
	// Default applies to keys that match no rule: "allow" (the default) or
	// "deny".
	Default leases.Default `yaml:"default"`
	// Rules in file order.
	Rules []RuleConfig `yaml:"rules"`
	// Clients are the callers allowed to use the API. When the list is
	// empty, the API needs no authentication.
	Clients []ClientConfig `yaml:"clients"`
}

// RuleConfig is one entry of a rules file's rules section (see
// leases.Rule for the meaning and bounds of each field). A rule with one
// limit gives it in algorithm, limit, period and burst; a rule with several
// gives them in limits, and a request needs all of them.
type RuleConfig struct {
	// Name identifies the rule in answers, metrics, logs and the admin
	// API's paths: required, unique, and 1 to leases.MaxRuleNameBytes (128)
	// bytes of UTF-8 without control characters (no tab, newline, NUL, ESC,
	// DEL or U+0080 to U+009F).
	Name      string           `yaml:"name"`
	Match     string           `yaml:"match"`
	Algorithm leases.Algorithm `yaml:"algorithm"`
	Limit     int64            `yaml:"limit"`
	Period    time.Duration    `yaml:"period"`
	Burst     int64            `yaml:"burst"`
	Limits    []LimitConfig    `yaml:"limits"`
	LeaseTTL  time.Duration    `yaml:"lease_ttl"`
	// Soft is soft throttling, as a percentage ("5%": each limit admits
	// 5% more) or a fraction (0.05).
	Soft Percent `yaml:"soft"`
	// Shadow runs the rule in shadow mode (see leases.Rule.Shadow).
	Shadow bool `yaml:"shadow"`
	// Elastic names a pool key its requests may borrow from when their own
	// limits deny (see leases.Rule.Elastic).
	Elastic string `yaml:"elastic"`
	// Reserve keeps shares of each limit for the priority classes above a
	// request's, per class, as percentages or fractions:
	// "reserve: {critical: 20%, high: 10%}" (see leases.Rule.Reserve).
	Reserve map[string]Percent `yaml:"reserve"`
}

// Percent is a fraction written in a rules file as a percentage ("5%") or
// as a number (0.05).
type Percent float64

// UnmarshalYAML implements yaml.Unmarshaler.
func (p *Percent) UnmarshalYAML(n *yaml.Node) error {
	v := strings.TrimSpace(n.Value)
	pct, isPct := strings.CutSuffix(v, "%")
	f, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
	if err != nil || n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %q is not a percentage (\"5%%\") or a fraction (0.05)", n.Line, v)
	}
	if isPct {
		f /= 100
	}
	*p = Percent(f)
	return nil
}

// reserveOf converts a rules file's reserve to leases.Rule.Reserve.
func reserveOf(m map[string]Percent) map[string]float64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]float64, len(m))
	for c, p := range m {
		out[c] = float64(p)
	}
	return out
}

// LimitConfig is one entry of a rule's limits (see leases.Limit).
type LimitConfig struct {
	Algorithm leases.Algorithm `yaml:"algorithm"`
	Limit     int64            `yaml:"limit"`
	Period    time.Duration    `yaml:"period"`
	Burst     int64            `yaml:"burst"`
}

// RuleSet returns the file's rules as package leases takes them.
func (f *RulesFile) RuleSet() leases.RuleSet {
	rs := leases.RuleSet{Default: f.Default, Rules: make([]leases.Rule, len(f.Rules))}
	for i, rc := range f.Rules {
		r := leases.Rule{Name: rc.Name, Match: rc.Match, Algorithm: rc.Algorithm, Limit: rc.Limit, Period: rc.Period, Burst: rc.Burst, LeaseTTL: rc.LeaseTTL, Soft: float64(rc.Soft), Shadow: rc.Shadow, Elastic: rc.Elastic, Reserve: reserveOf(rc.Reserve)}
		for _, lc := range rc.Limits {
			r.Limits = append(r.Limits, leases.Limit{Algorithm: lc.Algorithm, Limit: lc.Limit, Period: lc.Period, Burst: lc.Burst})
		}
		rs.Rules[i] = r
	}
	return rs
}

// decodeYAMLStrict decodes one YAML document into v, refusing unknown
// fields. An empty document decodes to the zero value. A second document
// that holds anything is refused, rather than ignored as a decoder does:
// clients after a "---" were dropped without a word, and authentication
// with them. Errors wrap leases.ErrInvalidRules.
func decodeYAMLStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err == nil {
		return onlyDocument(dec)
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		// Name the rule (or client) and field of each error, as
		// validation does: "line 4: cannot unmarshal ..." alone makes the
		// reader count lines.
		var root yaml.Node
		if yaml.Unmarshal(data, &root) == nil {
			msgs := make([]string, len(te.Errors))
			for i, m := range te.Errors {
				msgs[i] = locateYAMLError(&root, m)
			}
			return fmt.Errorf("%w: %s", leases.ErrInvalidRules, strings.Join(msgs, "; "))
		}
	}
	return fmt.Errorf("%w: %w", leases.ErrInvalidRules, err)
}

// onlyDocument returns nil when the documents dec has left are empty
// (nothing but comments, or "---" and "..." markers), and an error naming
// the line of the first content otherwise.
func onlyDocument(dec *yaml.Decoder) error {
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return fmt.Errorf("%w: the file holds more than one YAML document (a \"---\" line starts another), and a later one does not parse: %w; a rules file is one document", leases.ErrInvalidRules, err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		if c := doc.Content[0]; len(doc.Content) == 1 && c.Kind == yaml.ScalarNode && c.Tag == "!!null" && c.Value == "" {
			continue // empty
		}
		return fmt.Errorf("%w: the file holds more than one YAML document (a \"---\" line starts another), and the one at line %d is not empty: a rules file is one document, its default, rules and clients in it, or the later ones would be ignored", leases.ErrInvalidRules, doc.Content[0].Line)
	}
}

// locateYAMLError rewrites a yaml.v3 error message "line N: what" as
// `rule "name": field: what (line N)` when line N holds a field of an entry
// of the rules or clients section; otherwise it returns msg as it is.
func locateYAMLError(root *yaml.Node, msg string) string {
	var line int
	rest, ok := strings.CutPrefix(msg, "line ")
	if !ok {
		return msg
	}
	num, what, ok := strings.Cut(rest, ": ")
	if !ok {
		return msg
	}
	line, err := strconv.Atoi(num)
	if err != nil {
		return msg
	}
	doc := root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if doc.Kind != yaml.MappingNode {
		return msg
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		section, items := doc.Content[i].Value, doc.Content[i+1]
		if (section != "rules" && section != "clients") || items.Kind != yaml.SequenceNode {
			continue
		}
		for j, item := range items.Content {
			if item.Kind != yaml.MappingNode {
				continue
			}
			name := ""
			for k := 0; k+1 < len(item.Content); k += 2 {
				if item.Content[k].Value == "name" {
					name = item.Content[k+1].Value
				}
			}
			if field := fieldAt(item, line, errorMatcher(what)); field != "" {
				kind := strings.TrimSuffix(section, "s")
				if name == "" {
					name = fmt.Sprintf("%s[%d]", section, j)
				}
				return fmt.Sprintf("%s %q: %s: %s (line %d)", kind, name, field, what, line)
			}
		}
	}
	return msg
}

// errorMatcher returns whether a field (its key and value nodes) is the
// one a yaml.v3 error message is about: the unknown field it names, the
// value it quotes, or a sequence or mapping it could not decode. Several
// fields may share the line (flow style: {name: a, limit: x}).
func errorMatcher(what string) func(key, val *yaml.Node) bool {
	if name, ok := strings.CutPrefix(what, "field "); ok {
		name, _, _ = strings.Cut(name, " not found")
		return func(key, _ *yaml.Node) bool { return key.Value == name }
	}
	if _, q, ok := strings.Cut(what, "`"); ok {
		q, _, _ = strings.Cut(q, "`")
		return func(_, val *yaml.Node) bool { return val.Kind == yaml.ScalarNode && val.Value == q }
	}
	switch {
	case strings.Contains(what, "!!seq"):
		return func(_, val *yaml.Node) bool { return val.Kind == yaml.SequenceNode }
	case strings.Contains(what, "!!map"):
		return func(_, val *yaml.Node) bool { return val.Kind == yaml.MappingNode }
	}
	return func(*yaml.Node, *yaml.Node) bool { return true }
}

// fieldAt returns the path ("period", "limits[1].limit") of the field of
// mapping m on line that match accepts, or "".
func fieldAt(m *yaml.Node, line int, match func(key, val *yaml.Node) bool) string {
	for k := 0; k+1 < len(m.Content); k += 2 {
		key, val := m.Content[k], m.Content[k+1]
		if (key.Line == line || val.Line == line) && match(key, val) {
			return key.Value
		}
		if val.Kind == yaml.SequenceNode {
			for i, el := range val.Content {
				if el.Kind == yaml.MappingNode {
					if f := fieldAt(el, line, match); f != "" {
						return fmt.Sprintf("%s[%d].%s", key.Value, i, f)
					}
				}
			}
		}
	}
	return ""
}

// ClientConfig is one entry of a rules file's clients section.
type ClientConfig struct {
	// Name identifies the client in leases, logs and GET /v1/rules. It is
	// required, unique, and 1 to 64 bytes of ASCII letters, digits, '.',
	// '_' and '-'. A lease belongs to the client's name and the request's
	// client_id together, so a client can never settle another's lease.
	Name string `yaml:"name"`
	// TokenSHA256 is the SHA-256 of the client's bearer token, as 64 hex
	// digits. The token itself is never stored; compute the hash with
	// `printf %s "$TOKEN" | sha256sum | cut -d' ' -f1`.
	TokenSHA256 string `yaml:"token_sha256"`
	// Keys are the glob patterns of the keys the client may lease and
	// check, with the syntax of rule patterns (see leases.ValidateGlob); at
	// least one, unless the client is an admin. ["*"] allows every key.
	Keys []string `yaml:"keys"`
	// Admin gives the client the admin scope: the admin API
	// (/v1/admin/...) accepts its token, and the change log names it. An
	// admin client with no Keys uses the admin API only.
	Admin bool `yaml:"admin"`
}

// Rules is a validated, compiled rules file: the policy the engine runs and
// the clients that may call the API. It is immutable and safe for
// concurrent use; a reload builds new Rules.
type Rules struct {
	policy  *leases.Policy
	clients []principal
	digest  [sha256.Size]byte
}

// ParseRules decodes and validates a rules file. Errors wrap
// leases.ErrInvalidRules and name the rule or client and the field at fault.
func ParseRules(data []byte) (*Rules, error) {
	var f RulesFile
	if err := decodeYAMLStrict(data, &f); err != nil {
		return nil, err
	}
	p, err := leases.NewPolicy(f.RuleSet())
	if err != nil {
		return nil, err
	}
	clients, err := compileClients(f.Clients)
	if err != nil {
		return nil, err
	}
	return &Rules{policy: p, clients: clients, digest: sha256.Sum256(data)}, nil
}

// LoadRules reads and parses the rules file at path. Errors name the file.
func LoadRules(path string) (*Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read rules file: %w", err)
	}
	r, err := ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("rules file %s: %w", path, err)
	}
	return r, nil
}

// noRules returns the rules of a server without a rules file: no rules,
// default allow, no clients.
func noRules() *Rules {
	r, err := ParseRules(nil)
	if err != nil {
		panic("server: empty rules do not compile: " + err.Error()) // unreachable
	}
	return r
}

func compileClients(cfgs []ClientConfig) ([]principal, error) {
	out := make([]principal, 0, len(cfgs))
	names := make(map[string]bool, len(cfgs))
	hashes := make(map[[sha256.Size]byte]string, len(cfgs))
	for i, c := range cfgs {
		who := fmt.Sprintf("clients[%d]", i)
		if c.Name != "" {
			who = fmt.Sprintf("client %q", c.Name)
		}
		fail := func(field, format string, args ...any) error {
			return fmt.Errorf("%w: %s: %s: %s", leases.ErrInvalidRules, who, field, fmt.Sprintf(format, args...))
		}
		if c.Name == "" {
			return nil, fail("name", "is required")
		}
		if !validClientName(c.Name) {
			return nil, fail("name", "must be 1 to %d bytes of ASCII letters, digits, '.', '_' and '-'", maxClientNameBytes)
		}
		if names[c.Name] {
			return nil, fail("name", "is used by more than one client")
		}
		names[c.Name] = true
		if len(c.TokenSHA256) != hex.EncodedLen(sha256.Size) {
			return nil, fail("token_sha256", "is %d characters; it must be the %d hex digits of the token's SHA-256: compute it with printf %%s \"$TOKEN\" | sha256sum | cut -d' ' -f1",
				len(c.TokenSHA256), hex.EncodedLen(sha256.Size))
		}
		var cl principal
		if _, err := hex.Decode(cl.hash[:], []byte(c.TokenSHA256)); err != nil {
			return nil, fail("token_sha256", "is not hex: %v", err)
		}
		if other, dup := hashes[cl.hash]; dup {
			return nil, fail("token_sha256", "is also the hash of client %q: give every client its own token", other)
		}
		hashes[cl.hash] = c.Name
		if len(c.Keys) == 0 && !c.Admin {
			return nil, fail("keys", "is empty: list the key patterns the client may use, or [\"*\"] for all")
		}
		for j, k := range c.Keys {
			if err := leases.ValidateGlob(k); err != nil {
				return nil, fail(fmt.Sprintf("keys[%d]", j), "%q: %v", k, err)
			}
		}
		cl.index = len(out)
		cl.name = c.Name
		cl.admin = c.Admin
		// Never nil: a principal without key patterns may use every key,
		// and an admin client without any may use none.
		cl.keys = append(make([]string, 0, len(c.Keys)), c.Keys...)
		out = append(out, cl)
	}
	return out, nil
}

// CheckClientName returns nil when name may name a client
// (ClientConfig.Name) or the bootstrap admin (Options.AdminName), and else
// an error saying what a name must be: 1 to 64 bytes of ASCII letters,
// digits, '.', '_' and '-'. rateleased checks -admin-name with it.
func CheckClientName(name string) error {
	if !validClientName(name) {
		return fmt.Errorf("must be 1 to %d bytes of ASCII letters, digits, '.', '_' and '-'", maxClientNameBytes)
	}
	return nil
}

func validClientName(s string) bool {
	if s == "" || len(s) > maxClientNameBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Policy returns the compiled rules the engine runs.
func (r *Rules) Policy() *leases.Policy { return r.policy }

// Clients returns the names of the configured clients, in file order. It is
// empty when the API needs no authentication.
func (r *Rules) Clients() []string {
	names := make([]string, len(r.clients))
	for i := range r.clients {
		names[i] = r.clients[i].name
	}
	return names
}

// Version returns the hex SHA-256 of the rules file's content, which
// identifies the rules in force (GET /v1/rules reports it).
func (r *Rules) Version() string { return hex.EncodeToString(r.digest[:]) }
