package inbound

import (
	"net/netip"

	"github.com/ratelease/ratelease/client/keytemplate"
)

// Peers is how a limiter makes the {ip} part: which peers are trusted
// proxies, whose forwarded addresses count, and the prefix lengths an
// address is reduced to.
type Peers struct {
	// Trusted are the trusted proxies' prefixes, normalized.
	Trusted []netip.Prefix
	// V4Bits is the prefix length of an IPv4 {ip}, 1 to 32.
	V4Bits int
	// V6Bits is the prefix length of an IPv6 {ip}, 1 to 128.
	V6Bits int
}

// Client returns the client's address: peer, unless peer is a trusted
// proxy; then the right-most address of forwarded() that is not itself a
// trusted proxy (keytemplate.ClientAddr). forwarded returns the addresses
// the proxies wrote, in order; it is called only for a trusted peer, so
// that the forwarding header or metadata of anyone else is never read.
func (p *Peers) Client(peer netip.Addr, forwarded func() []string) netip.Addr {
	if len(p.Trusted) == 0 {
		return peer // the common case, inlined
	}
	return p.forwardedClient(peer, forwarded)
}

func (p *Peers) forwardedClient(peer netip.Addr, forwarded func() []string) netip.Addr {
	if !keytemplate.Trusted(p.Trusted, peer) {
		return peer
	}
	return keytemplate.ClientAddr(peer, forwarded(), p.Trusted)
}

// Part returns the {ip} text of the client's address a: the address
// reduced to V4Bits or V6Bits (keytemplate.IPPart).
func (p *Peers) Part(a netip.Addr) string {
	return keytemplate.IPPart(a, p.V4Bits, p.V6Bits)
}
