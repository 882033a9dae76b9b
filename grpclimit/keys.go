package grpclimit

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/ratelease/ratelease/client/httplimit"
	"github.com/ratelease/ratelease/client/keytemplate"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// The parts of a key template (keytemplate.Segment.Kind).
const (
	partIP uint8 = iota + 1
	partUser
	partMethod
	partService
	partMD
)

var partNames = [...]string{partIP: "ip", partUser: "user", partMethod: "method", partService: "service", partMD: "md"}

// MetadataXForwardedFor is the metadata key trusted proxies write the
// client's address in ("client, proxy1, proxy2"); read only when the direct
// peer is in Config.TrustedProxies.
const MetadataXForwardedFor = "x-forwarded-for"

// resolvePart is the keytemplate.Resolver of the gRPC parts.
func resolvePart(name string) (keytemplate.Segment, error) {
	switch name {
	case "ip":
		return keytemplate.Segment{Kind: partIP, Raw: true}, nil
	case "user":
		return keytemplate.Segment{Kind: partUser}, nil
	case "method":
		return keytemplate.Segment{Kind: partMethod}, nil
	case "service":
		return keytemplate.Segment{Kind: partService}, nil
	}
	if k, ok := strings.CutPrefix(name, "md:"); ok {
		k = strings.ToLower(k)
		if !validMetadataKey(k) {
			return keytemplate.Segment{}, fmt.Errorf("{%s}: %q is not a metadata key", name, k)
		}
		return keytemplate.Segment{Kind: partMD, Text: k}, nil
	}
	return keytemplate.Segment{}, fmt.Errorf("unknown part {%s}: want {ip}, {user}, {method}, {service} or {md:name}", name)
}

// validMetadataKey reports whether k is a gRPC metadata key: lower-case
// letters, digits, '-', '_', '.', not a reserved "grpc-" one.
func validMetadataKey(k string) bool {
	if k == "" || strings.HasPrefix(k, "grpc-") {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// MissingPartError says an RPC lacks a part a key template needs: no
// identity in the context for {user}, no such metadata for {md:name}, no
// IP peer address for {ip} (a Unix socket, an in-memory listener).
type MissingPartError struct {
	// Template is the template that could not be filled (the fallback's,
	// when the primary template fell back to it).
	Template string
	// Part is the missing part as written, "{user}", "{md:x-api-key}".
	Part string
	// Kind is the part's name: "ip", "user", "method", "service" or "md".
	Kind string
}

func (e *MissingPartError) Error() string {
	return fmt.Sprintf("grpclimit: key template %q: the call has no %s", e.Template, e.Part)
}

// call is what the parts of one RPC read.
type call struct {
	ctx    context.Context
	method string // "/pkg.Service/Method"
	md     metadata.MD
	mdOK   bool
}

// value returns the value of the part s of a call; false when the call
// lacks it.
func (l *Limiter) value(c *call, s keytemplate.Segment) (string, bool) {
	var v string
	switch s.Kind {
	case partIP:
		if a, ok := l.clientAddr(c); ok {
			v = l.core.Peers().Part(a)
		}
	case partUser:
		v, _ = httplimit.IdentityFrom(c.ctx)
	case partMethod:
		v = c.method
	case partService:
		v = serviceOf(c.method)
	case partMD:
		if vs := c.metadata().Get(s.Text); len(vs) > 0 {
			v = vs[0]
		}
	}
	return v, v != ""
}

func (c *call) metadata() metadata.MD {
	if !c.mdOK {
		c.md, _ = metadata.FromIncomingContext(c.ctx)
		c.mdOK = true
	}
	return c.md
}

// serviceOf returns the service of a full method: "pkg.Service" of
// "/pkg.Service/Method"; "" when it has no service.
func serviceOf(full string) string {
	s := strings.TrimPrefix(full, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i]
	}
	return ""
}

// clientAddr is the {ip} address before its reduction: the peer's, or the
// x-forwarded-for metadata's when the peer is a trusted proxy.
func (l *Limiter) clientAddr(c *call) (netip.Addr, bool) {
	p, ok := peer.FromContext(c.ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, false
	}
	var a netip.Addr
	switch addr := p.Addr.(type) {
	case interface{ AddrPort() netip.AddrPort }: // *net.TCPAddr, *net.UDPAddr
		a = keytemplate.NormalizeAddr(addr.AddrPort().Addr())
		if !a.IsValid() {
			return netip.Addr{}, false
		}
	default:
		if a, ok = keytemplate.ParsePeer(p.Addr.String()); !ok {
			return netip.Addr{}, false
		}
	}
	return l.core.Peers().Client(a, func() []string {
		return keytemplate.SplitXForwardedFor(c.metadata().Get(MetadataXForwardedFor))
	}), true
}

// makeKeys makes the keys of an RPC, or returns a *MissingPartError.
func (l *Limiter) makeKeys(c *call) ([]string, error) {
	keys, err := l.core.MakeKeys(func(s keytemplate.Segment) (string, bool) { return l.value(c, s) })
	if miss, ok := err.(*keytemplate.MissingPartError); ok {
		return nil, &MissingPartError{Template: miss.Template, Part: miss.Segment.Written, Kind: partNames[miss.Segment.Kind]}
	}
	return keys, err
}
