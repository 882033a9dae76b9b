package httplimit

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/ratelease/ratelease/client/keytemplate"
)

// partKind is what a template part reads from the request: the Kind of its
// keytemplate.Segment. The grammar, separators, escaping and hashing of
// templates are package keytemplate's, shared with the gRPC interceptors;
// the parts are this package's.
type partKind uint8

const (
	partLiteral partKind = iota // keytemplate.Literal
	partIP
	partUser
	partMethod
	partRoute
	partHeader
)

// String returns the part as written in a template, without braces.
func (k partKind) String() string {
	switch k {
	case partIP:
		return "ip"
	case partUser:
		return "user"
	case partMethod:
		return "method"
	case partRoute:
		return "route"
	case partHeader:
		return "header"
	}
	return "literal"
}

// resolvePart is the keytemplate.Resolver of this package's parts, {ip},
// {user}, {method}, {route} and {header:Name}. {ip} is raw: its value is
// the middleware's own canonical text, not escaped.
func resolvePart(name string) (keytemplate.Segment, error) {
	switch name {
	case "ip":
		return keytemplate.Segment{Kind: uint8(partIP), Raw: true}, nil
	case "user":
		return keytemplate.Segment{Kind: uint8(partUser)}, nil
	case "method":
		return keytemplate.Segment{Kind: uint8(partMethod)}, nil
	case "route":
		return keytemplate.Segment{Kind: uint8(partRoute)}, nil
	}
	if h, ok := strings.CutPrefix(name, "header:"); ok {
		if !validHeaderName(h) {
			return keytemplate.Segment{}, fmt.Errorf("{%s}: %q is not a header name", name, h)
		}
		return keytemplate.Segment{Kind: uint8(partHeader), Text: http.CanonicalHeaderKey(h)}, nil
	}
	return keytemplate.Segment{}, fmt.Errorf("unknown part {%s}: want {ip}, {user}, {method}, {route} or {header:Name}", name)
}

// validHeaderName reports whether h is an RFC 9110 token.
func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// MissingPartError says a request lacks a part a key template needs: no
// identity in the context for {user}, no such header for {header:Name},
// no route pattern for {route}, no usable remote address for {ip}.
type MissingPartError struct {
	// Template is the template that could not be filled (the fallback's,
	// when the primary template fell back to it).
	Template string
	// Part is the missing part as written, "{user}", "{header:X-API-Key}".
	Part string
	// Kind is the part's name: "ip", "user", "method", "route" or "header".
	Kind string
}

func (e *MissingPartError) Error() string {
	return fmt.Sprintf("httplimit: key template %q: the request has no %s", e.Template, e.Part)
}
