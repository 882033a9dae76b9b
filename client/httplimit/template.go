package httplimit

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/ratelease/ratelease/client/keytemplate"
)

// partKind is what a template part reads from the request.
type partKind uint8

const (
	partLiteral partKind = iota
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

// segment is a literal run of a template or one part.
type segment struct {
	kind   partKind
	text   string // the literal; the canonical header name of {header:Name}
	writen string // the part as written, "{header:X-API-Key}", for errors
}

// template is a parsed key template: the grammar, separators, escaping and
// hashing are package keytemplate's, shared with the gRPC interceptors;
// the parts are this package's.
type template struct {
	src   string
	segs  []segment
	parts int // segments that are parts
	kt    *keytemplate.Template
}

// hashLen is the length of a hashed part: "%~" and the base64url (no
// padding) of its SHA-256.
const hashLen = keytemplate.HashLen

// parseTemplate parses a key template: literal text and parts in braces,
// {ip}, {user}, {method}, {route} and {header:Name}.
func parseTemplate(src string) (*template, error) {
	kt, err := keytemplate.Parse(src, resolvePart)
	if err != nil {
		return nil, err
	}
	t := &template{src: src, kt: kt, parts: kt.Parts()}
	for _, s := range kt.Segments() {
		t.segs = append(t.segs, segment{kind: partKind(s.Kind), text: s.Text, writen: s.Written})
	}
	return t, nil
}

// resolvePart is the keytemplate.Resolver of this package's parts. {ip} is
// raw: its value is the middleware's own canonical text, not escaped.
func resolvePart(name string) (keytemplate.Segment, error) {
	seg, err := parsePart(name)
	if err != nil {
		return keytemplate.Segment{}, err
	}
	return keytemplate.Segment{Kind: uint8(seg.kind), Text: seg.text, Raw: seg.kind == partIP}, nil
}

func parsePart(name string) (segment, error) {
	switch name {
	case "ip":
		return segment{kind: partIP}, nil
	case "user":
		return segment{kind: partUser}, nil
	case "method":
		return segment{kind: partMethod}, nil
	case "route":
		return segment{kind: partRoute}, nil
	}
	if h, ok := strings.CutPrefix(name, "header:"); ok {
		if !validHeaderName(h) {
			return segment{}, fmt.Errorf("{%s}: %q is not a header name", name, h)
		}
		return segment{kind: partHeader, text: http.CanonicalHeaderKey(h)}, nil
	}
	return segment{}, fmt.Errorf("unknown part {%s}: want {ip}, {user}, {method}, {route} or {header:Name}", name)
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

// values fills the template's parts from the request; it reports the first
// missing part.
func (t *template) values(r *http.Request, in *inputs, vals []string) ([]string, *MissingPartError) {
	vals = vals[:0]
	for _, s := range t.segs {
		var v string
		switch s.kind {
		case partLiteral:
			continue
		case partIP:
			v = in.ip(r)
		case partUser:
			v, _ = IdentityFrom(r.Context())
		case partMethod:
			v = r.Method
		case partRoute:
			v = in.route(r)
		case partHeader:
			v = r.Header.Get(s.text)
		}
		if v == "" {
			return nil, &MissingPartError{Template: t.src, Part: s.writen, Kind: s.kind.String()}
		}
		vals = append(vals, v)
	}
	return vals, nil
}

// build writes the key of the template with the given part values (one per
// part, in order): keytemplate.Template.Build. Each value but {ip}'s
// (canonical text of the middleware's own making) is escaped; if the key
// would be longer than protocol.MaxKeyBytes, the longest parts are replaced
// by their hash, longest first, until it fits.
func (t *template) build(vals []string) string { return t.kt.Build(vals) }

// escape percent-escapes a part value: keytemplate.Escape.
func escape(v string) string { return keytemplate.Escape(v) }
