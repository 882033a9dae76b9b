package keytemplate

import (
	"net/netip"
	"strings"
)

// NormalizeAddr drops an address's zone and turns an IPv4-mapped IPv6
// address into IPv4, so that one host has one address.
func NormalizeAddr(a netip.Addr) netip.Addr {
	return a.WithZone("").Unmap()
}

// ParsePeer parses a peer address, "ip:port" or a bare address, normalized.
func ParsePeer(remote string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return NormalizeAddr(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(remote); err == nil {
		return NormalizeAddr(a), true
	}
	return netip.Addr{}, false
}

// NormalizePrefix masks p and turns an IPv4-mapped IPv6 prefix of at least
// 96 bits into IPv4, as the addresses ClientAddr compares are.
func NormalizePrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// Trusted reports whether a is in one of the prefixes.
func Trusted(trusted []netip.Prefix, a netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// SplitXForwardedFor returns the addresses of X-Forwarded-For values
// ("client, proxy1, proxy2"; several values are one list), trimmed, in
// order.
func SplitXForwardedFor(vals []string) []string {
	var addrs []string
	for _, v := range vals {
		for e := range strings.SplitSeq(v, ",") {
			addrs = append(addrs, strings.TrimSpace(e))
		}
	}
	return addrs
}

// ClientAddr returns the client's address: peer, unless peer is in
// trusted; then the right-most address of forwarded (the addresses the
// proxies wrote, in the header's order) that is not itself trusted. Each
// proxy appends the address it received the request from, so everything
// right of that address was written by trusted proxies and everything left
// of it by the client, who may have written anything. An entry that is
// not an address ("unknown", an obfuscated identifier, garbage) stops the
// walk: the client is then identified by the last trusted hop, the proxy
// that could not tell who sent the request.
func ClientAddr(peer netip.Addr, forwarded []string, trusted []netip.Prefix) netip.Addr {
	if len(trusted) == 0 || !Trusted(trusted, peer) {
		return peer
	}
	cur := peer
	for i := len(forwarded) - 1; i >= 0; i-- {
		a, ok := ParseNodeAddr(forwarded[i])
		if !ok {
			return cur
		}
		if !Trusted(trusted, a) {
			return a
		}
		cur = a
	}
	return cur
}

// ParseNodeAddr parses one forwarded address: "192.0.2.1", "192.0.2.1:80",
// "2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:80".
func ParseNodeAddr(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		rest := s[end+1:]
		if rest != "" {
			if _, err := netip.ParseAddrPort(s); err != nil {
				return netip.Addr{}, false
			}
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil {
			return netip.Addr{}, false
		}
		return NormalizeAddr(a), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return NormalizeAddr(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return NormalizeAddr(ap.Addr()), true
	}
	return netip.Addr{}, false
}

// IPPart returns the {ip} text of an address: IPv4 reduced to v4Bits
// (≥ 32: the whole address, "192.0.2.1"), IPv6 to v6Bits (≥ 128: the whole
// address; else the prefix, "2001:db8::/64").
func IPPart(a netip.Addr, v4Bits, v6Bits int) string {
	if a.Is4() {
		if v4Bits >= 32 {
			return a.String()
		}
		p, _ := a.Prefix(v4Bits)
		return p.String()
	}
	if v6Bits >= 128 {
		return a.String()
	}
	p, _ := a.Prefix(v6Bits)
	return p.String()
}
