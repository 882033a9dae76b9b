package httplimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/internal/inbound"
	"github.com/ratelease/ratelease/protocol"
)

// fill returns a value per part of t: {ip} a canonical address (the
// middleware makes it, never the caller), the others v, with i appended to
// tell parts apart.
func fill(t *keytemplate.Template, v string) []string {
	var vals []string
	for _, s := range t.Segments() {
		switch partKind(s.Kind) {
		case partLiteral:
		case partIP:
			vals = append(vals, "2001:db8::/64")
		default:
			vals = append(vals, v)
		}
	}
	return vals
}

// FuzzTemplate: any template either fails to parse or makes valid keys for
// any values, without panicking; distinct values make distinct keys.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"user:{user}", "ip:{ip}", "user:{user}|api:{method}:{route}", "key:{header:X-API-Key}", "{user}", "a{", "}", "{ip}|{ip}", "x:{header:}"} {
		f.Add(s, "1|api:x", "1")
	}
	f.Add("user:{user}", strings.Repeat("a", 300)+"1", strings.Repeat("a", 300)+"2")
	f.Add("u:{user}|k:{header:K}", "\xff\x00:", "%FF%00%3A")
	f.Fuzz(func(t *testing.T, src, a, b string) {
		tm, err := keytemplate.Parse(src, resolvePart)
		if err != nil || a == "" || b == "" {
			return // an empty value is a missing part: no key is made
		}
		ka := tm.Build(fill(tm, a))
		kb := tm.Build(fill(tm, b))
		for _, k := range []string{ka, kb} {
			if err := protocol.ValidateKey(k); err != nil {
				t.Fatalf("template %q: key %q: %v", src, k, err)
			}
		}
		if a != b && tm.Parts() > 0 && hasFreePart(tm) && ka == kb {
			t.Fatalf("template %q: values %q and %q share key %q", src, a, b, ka)
		}
	})
}

func hasFreePart(t *keytemplate.Template) bool {
	for _, s := range t.Segments() {
		if k := partKind(s.Kind); k != partLiteral && k != partIP {
			return true
		}
	}
	return false
}

// FuzzEscape: two parts, filled independently: distinct pairs make
// distinct keys, and every key is valid.
func FuzzEscape(f *testing.F) {
	f.Add("1|api:x", "y", "1", "api:x|y")
	f.Add("", "", "a", "b")
	f.Add(strings.Repeat("é", 200), "x", strings.Repeat("é", 199)+"e", "x")
	tm, err := keytemplate.Parse("user:{user}|api:{header:X}", resolvePart)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a1, b1, a2, b2 string) {
		k1 := tm.Build([]string{a1, b1})
		k2 := tm.Build([]string{a2, b2})
		if err := protocol.ValidateKey(k1); err != nil {
			t.Fatalf("key %q: %v", k1, err)
		}
		if (a1 != a2 || b1 != b2) && k1 == k2 {
			t.Fatalf("(%q, %q) and (%q, %q) share key %q", a1, b1, a2, b2, k1)
		}
		if e := keytemplate.Escape(a1); strings.ContainsAny(e, ":|{}") {
			t.Fatalf("escape(%q) = %q holds a separator", a1, e)
		}
	})
}

// FuzzClientIP feeds forged forwarding headers to the {ip} part: a
// request from remote carries the header value forged (X-Forwarded-For or
// Forwarded, as configured), and trusted lists the trusted proxies. It
// must never panic, and:
//
//   - a peer that is not a trusted proxy is the client, whatever the
//     headers say;
//   - the client is always a valid, normalized address (no zone, IPv4 not
//     mapped): the peer's or one a header names; and {ip} its text, which
//     parses back as the address or its prefix;
//   - behind trusted proxies, a client that forges any header value gets
//     its own address all the same: each proxy appends the address it
//     received the request from (to the client's value, on the same line,
//     as net/http/httputil does, or on a line of its own), and nothing the
//     client wrote left of those may change what they say.
func FuzzClientIP(f *testing.F) {
	for _, s := range []struct {
		trusted, remote, forged, client string
		forwarded, sameLine             bool
	}{
		{"10.0.0.0/8", "10.1.2.3:443", "", "198.51.100.1", false, true},
		{"10.0.0.0/8", "10.1.2.3:443", "6.6.6.6, 7.7.7.7", "198.51.100.1", false, true},
		{"10.0.0.0/8", "203.0.113.9:5000", "198.51.100.1", "198.51.100.1", false, true},
		{"10.0.0.0/8", "10.1.2.3:443", "10.9.9.9", "2001:db8::9", false, false},
		{"10.0.0.0/8", "10.1.2.3:443", "nonsense, [", "198.51.100.1", false, true},
		{"10.0.0.0/8", "10.1.2.3:443", "for=6.6.6.6", "198.51.100.1", true, true},
		{"10.0.0.0/8, 2001:db8:ffff::/48", "[2001:db8:ffff::1]:443", `for="[2001:db8::1]:80";proto=https`, "2001:db8:cafe::17", true, true},
		{"10.0.0.0/8", "10.1.2.3:443", `for="6.6.6.6`, "198.51.100.1", true, true},
		{"10.0.0.0/8", "10.1.2.3:443", `for="6.6.6.6`, "2001:db8:cafe::17", true, true},
		{"10.0.0.0/8", "10.1.2.3:443", `for=6.6.6.6;by="\`, "198.51.100.1", true, true},
		{"10.0.0.0/8", "10.1.2.3:443", `"`, "198.51.100.1", true, false},
		{"::ffff:10.0.0.0/104, 192.0.2.7", "[::ffff:10.1.2.3]:443", "", "198.51.100.1", false, true},
		{"192.0.2.7", "192.0.2.7", "", "fe80::1%eth0", false, true},
		{"0.0.0.0/0, ::/0", "10.1.2.3:443", "garbage", "198.51.100.1", false, true},
		{"", "10.1.2.3:443", "198.51.100.1", "198.51.100.1", false, true},
		{"10.0.0.0/8", "not an address", "198.51.100.1", "198.51.100.1", false, true},
		{"10.0.0.0/8", "[::1%lo]:80", "", "198.51.100.1", false, true},
	} {
		f.Add(s.trusted, s.remote, s.forged, s.client, s.forwarded, s.sameLine, uint8(0), uint8(0))
	}
	f.Fuzz(func(t *testing.T, trustedList, remote, forged, clientText string, forwarded, sameLine bool, bits4, bits6 uint8) {
		trusted, err := ParsePrefixes(trustedList)
		if err != nil {
			return
		}
		for i, p := range trusted {
			trusted[i] = keytemplate.NormalizePrefix(p)
		}
		in := &inputs{peers: &inbound.Peers{Trusted: trusted, V4Bits: 1 + int(bits4)%32, V6Bits: 1 + int(bits6)%128}}
		header := HeaderXForwardedFor
		if forwarded {
			header = HeaderForwarded
		}
		if err := in.setProxyHeader(header, len(trusted) > 0); err != nil {
			t.Fatal(err)
		}
		check := func(r *http.Request, want netip.Addr) {
			t.Helper()
			peer, ok := keytemplate.ParsePeer(r.RemoteAddr)
			got, gotOK := in.clientAddr(r)
			part := in.ip(r)
			if !ok {
				if gotOK || part != "" {
					t.Fatalf("peer %q is no address, yet the client is %v (%q)", r.RemoteAddr, got, part)
				}
				return
			}
			if !gotOK || !got.IsValid() || got != keytemplate.NormalizeAddr(got) {
				t.Fatalf("peer %q, %s %q: client %v is not a normalized address", r.RemoteAddr, header, r.Header.Values(header), got)
			}
			if !keytemplate.Trusted(trusted, peer) && got != peer {
				t.Fatalf("untrusted peer %v: the client is %v, from %s %q", peer, got, header, r.Header.Values(header))
			}
			if want.IsValid() && got != want {
				t.Fatalf("trusted %v, peer %v, %s %q: the client is %v, not %v", trusted, peer, header, r.Header.Values(header), got, want)
			}
			if a, err := netip.ParseAddr(part); err == nil {
				if a != got {
					t.Fatalf("{ip} %q of %v", part, got)
				}
			} else if p, err := netip.ParsePrefix(part); err != nil || !p.Contains(got) || p != p.Masked() {
				t.Fatalf("{ip} %q of %v is neither the address nor a prefix of it", part, got)
			}
			if strings.Contains(part, "|") || protocol.ValidateKey(part) != nil {
				t.Fatalf("{ip} %q is no key part", part)
			}
		}

		// A request straight from remote, with the forged header.
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if forged != "" {
			r.Header.Add(header, forged)
		}
		check(r, netip.Addr{})

		// The client at clientText, behind one or two trusted proxies.
		client, ok := keytemplate.ParseNodeAddr(clientText)
		if !ok || keytemplate.Trusted(trusted, client) || len(trusted) == 0 {
			return
		}
		var hops []netip.Addr
		for _, p := range trusted[:min(2, len(trusted))] {
			if a := keytemplate.NormalizeAddr(p.Addr()); keytemplate.Trusted(trusted, a) {
				hops = append(hops, a)
			}
		}
		if len(hops) == 0 {
			return
		}
		r = httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = netip.AddrPortFrom(hops[len(hops)-1], 443).String()
		if forged != "" {
			r.Header.Add(header, forged)
		}
		from := client
		for _, hop := range hops {
			node := from.String()
			if forwarded {
				node = "for=" + node
				if from.Is6() {
					node = `for="[` + from.String() + `]:4711";proto=https`
				}
			}
			vals := r.Header.Values(header)
			if sameLine && len(vals) > 0 {
				vals[len(vals)-1] += ", " + node
			} else {
				r.Header.Add(header, node)
			}
			from = hop
		}
		check(r, client)
	})
}

// FuzzParsePrefixes: any list of trusted proxies either fails to parse,
// with an error naming the entry, or gives valid, masked prefixes, which
// written back as a list parse to themselves; never a panic.
func FuzzParsePrefixes(f *testing.F) {
	for _, s := range []string{"", "10.0.0.0/8", "10.0.0.0/8, 192.0.2.7, 2001:db8::/32", " , ,", "10.1.2.3/8", "::ffff:10.0.0.0/104",
		"::ffff:10.1.2.3", "fe80::1%eth0", "fe80::/10%eth0", "10.0.0.0/33", "10.0.0.0/-1", "1.2.3", "::/0", "0.0.0.0/0", "10.0.0.0/08"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParsePrefixes(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "httplimit: trusted proxy ") {
				t.Fatalf("ParsePrefixes(%q): error %q names no entry", s, err)
			}
			return
		}
		texts := make([]string, len(ps))
		for i, p := range ps {
			if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" {
				t.Fatalf("ParsePrefixes(%q): %v is not a valid masked prefix", s, p)
			}
			texts[i] = p.String()
		}
		again, err := ParsePrefixes(strings.Join(texts, ","))
		if err != nil || !slices.Equal(again, ps) {
			t.Fatalf("ParsePrefixes(%q) = %v, written back %q, parsed %v, %v", s, ps, texts, again, err)
		}
	})
}
