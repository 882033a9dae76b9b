package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/internal/inbound"
)

// Proxy headers: the header a trusted proxy writes the client's address in
// (Config.ProxyHeader).
const (
	// HeaderXForwardedFor is "X-Forwarded-For: client, proxy1, proxy2".
	HeaderXForwardedFor = "X-Forwarded-For"
	// HeaderForwarded is RFC 7239's "Forwarded: for=client;proto=https,
	// for=proxy1".
	HeaderForwarded = "Forwarded"
)

// inputs are what a template reads besides the request itself: how to find
// the client's address, and the mux that knows the route.
type inputs struct {
	peers       *inbound.Peers // the trusted proxies and the prefix lengths of {ip}
	proxyHeader string         // canonical; "" when no proxy is trusted
	mux         *http.ServeMux // the handler wrapped, when it is a mux
}

// setProxyHeader checks Config.ProxyHeader, h, and sets the header read
// when the peer is a trusted proxy: none when no proxy is trusted.
func (in *inputs) setProxyHeader(h string, trusted bool) error {
	c := http.CanonicalHeaderKey(h)
	switch c {
	case "":
		c = HeaderXForwardedFor
	case HeaderXForwardedFor, HeaderForwarded:
	default:
		return fmt.Errorf("httplimit: ProxyHeader %q: want %q or %q", h, HeaderXForwardedFor, HeaderForwarded)
	}
	if trusted {
		in.proxyHeader = c
	}
	return nil
}

// value returns the value of the part s of a template for r; false when
// r lacks it.
func (in *inputs) value(r *http.Request, s keytemplate.Segment) (string, bool) {
	var v string
	switch partKind(s.Kind) {
	case partIP:
		v = in.ip(r)
	case partUser:
		v, _ = IdentityFrom(r.Context())
	case partMethod:
		v = methodPart(r.Method)
	case partRoute:
		v = in.route(r)
	case partHeader:
		v = r.Header.Get(s.Text)
	}
	return v, v != ""
}

// methodPart is the {method} part of a request of method m: m when it is
// one of the methods of RFC 9110 or PATCH, else "OTHER". A request's
// method is its sender's to choose: kept as sent, a caller limited on
// "user:{user}|api:{method}:{route}" at a route that serves every method
// had a bucket per made-up method (found by review: GET0 to GET7 served
// eight times under a limit of five).
func methodPart(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "OTHER"
}

// ip returns the {ip} part: the client's address, IPv6 reduced to its
// prefix; "" when the request has no usable address.
func (in *inputs) ip(r *http.Request) string {
	a, ok := in.clientAddr(r)
	if !ok {
		return ""
	}
	return in.peers.Part(a)
}

// route returns the {route} part: the pattern of the mux route that serves
// the request ("GET /hello/{id}"); "" when there is none.
func (in *inputs) route(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	if in.mux != nil {
		_, p := in.mux.Handler(r)
		return p
	}
	return ""
}

// clientAddr returns the client's address: the direct peer's, unless the
// peer is a trusted proxy; then the right-most address of the proxy header
// that is not itself a trusted proxy (inbound.Peers.Client).
func (in *inputs) clientAddr(r *http.Request) (netip.Addr, bool) {
	peer, ok := keytemplate.ParsePeer(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	return in.peers.Client(peer, func() []string { return in.forwarded(r) }), true
}

// forwarded returns the addresses the trusted proxies wrote in the proxy
// header of r, in order.
func (in *inputs) forwarded(r *http.Request) []string {
	vals := r.Header.Values(in.proxyHeader)
	if len(vals) == 0 {
		return nil
	}
	if in.proxyHeader == HeaderForwarded {
		return forwardedFor(vals)
	}
	return keytemplate.SplitXForwardedFor(vals)
}

// forwardedFor returns the for= node of each element of RFC 7239
// Forwarded field values, in order; "" for an element without one (or one
// that does not parse).
func forwardedFor(vals []string) []string {
	var out []string
	for _, v := range vals {
		out = appendForwarded(out, v)
	}
	return out
}

func appendForwarded(out []string, v string) []string {
	// forwarded-element = [ pair ] *( ";" [ pair ] ), elements separated by
	// ","; pair = token "=" ( token / quoted-string ).
	i := 0
	for {
		var node string
		bad := false
		// One element.
		for {
			for i < len(v) && (v[i] == ' ' || v[i] == '\t') {
				i++
			}
			if i >= len(v) || v[i] == ',' {
				break
			}
			if v[i] == ';' {
				i++
				continue
			}
			start := i
			for i < len(v) && v[i] != '=' && v[i] != ';' && v[i] != ',' {
				i++
			}
			name := strings.TrimSpace(v[start:i])
			if i >= len(v) || v[i] != '=' {
				bad = true
				continue
			}
			i++ // '='
			var val string
			if i < len(v) && v[i] == '"' {
				open := i
				i++
				var b strings.Builder
				closed := false
				for i < len(v) {
					c := v[i]
					if c == '\\' && i+1 < len(v) {
						b.WriteByte(v[i+1])
						i += 2
						continue
					}
					i++
					if c == '"' {
						closed = true
						break
					}
					b.WriteByte(c)
				}
				next := i
				for next < len(v) && (v[next] == ' ' || v[next] == '\t') {
					next++
				}
				if !closed || (next < len(v) && v[next] != ';' && v[next] != ',') {
					// An unclosed quoted-string, or one that a quote of
					// a later element closed: the client may write
					// `for="` so that the elements the proxies append
					// (", for=192.0.2.1", `, for="[2001:db8::1]"`) read
					// as part of its string. The element is bad and ends
					// at the first ',' after its opening quote, so that
					// no quote of the client's hides what the proxies
					// wrote.
					bad = true
					if c := strings.IndexByte(v[open:], ','); c >= 0 {
						i = open + c
					} else {
						i = len(v)
					}
				}
				val = b.String()
			} else {
				start := i
				for i < len(v) && v[i] != ';' && v[i] != ',' {
					i++
				}
				val = strings.TrimSpace(v[start:i])
			}
			if strings.EqualFold(name, "for") {
				node = val
			}
		}
		if bad {
			node = ""
		}
		out = append(out, node)
		if i >= len(v) {
			return out
		}
		i++ // ','
	}
}

// ParsePrefixes parses a comma-separated list of CIDR prefixes and bare
// addresses (a bare address is its own /32 or /128), for
// Config.TrustedProxies: "10.0.0.0/8, 192.0.2.7, 2001:db8::/32". An empty
// string is an empty list.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, fmt.Errorf("httplimit: trusted proxy %q: %w", f, err)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q: %w", f, err)
		}
		a = keytemplate.NormalizeAddr(a)
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
