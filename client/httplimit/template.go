package httplimit

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ratelease/ratelease/protocol"
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

// template is a parsed key template.
type template struct {
	src      string
	segs     []segment
	parts    int // segments that are parts
	literals int // bytes of literal text
}

// hashLen is the length of a hashed part: "%~" and the base64url (no
// padding) of its SHA-256.
const hashLen = 2 + 43

// parseTemplate parses a key template: literal text and parts in braces,
// {ip}, {user}, {method}, {route} and {header:Name}.
func parseTemplate(src string) (*template, error) {
	t := &template{src: src}
	if src == "" {
		return nil, errors.New("empty template")
	}
	rest := src
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.segs = append(t.segs, segment{kind: partLiteral, text: rest})
			break
		}
		if rest[i] == '}' {
			return nil, fmt.Errorf("%q: '}' without '{' at byte %d", src, len(src)-len(rest)+i)
		}
		if i > 0 {
			t.segs = append(t.segs, segment{kind: partLiteral, text: rest[:i]})
		}
		end := strings.IndexAny(rest[i+1:], "{}")
		if end < 0 || rest[i+1+end] != '}' {
			return nil, fmt.Errorf("%q: '{' at byte %d is not closed", src, len(src)-len(rest)+i)
		}
		name := rest[i+1 : i+1+end]
		seg, err := parsePart(name)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", src, err)
		}
		seg.writen = "{" + name + "}"
		t.segs = append(t.segs, seg)
		rest = rest[i+1+end+1:]
	}
	for i, s := range t.segs {
		if s.kind != partLiteral {
			t.parts++
			continue
		}
		t.literals += len(s.text)
		if strings.ContainsRune(s.text, '%') {
			return nil, fmt.Errorf("%q: '%%' is reserved for escapes and may not appear in literal text", src)
		}
		if err := validLiteral(s.text); err != nil {
			return nil, fmt.Errorf("%q: literal %q: %w", src, s.text, err)
		}
		// Between two parts, a separator the values cannot hold, so that
		// a key splits back into its parts one way only.
		if i > 0 && i < len(t.segs)-1 {
			prev, next := t.segs[i-1].kind, t.segs[i+1].kind
			if !strings.ContainsRune(s.text, '|') && (prev == partIP || next == partIP || !strings.ContainsRune(s.text, ':')) {
				return nil, fmt.Errorf("%q: the text between %s and %s must hold '|' (or ':' where neither is {ip}), so that parts cannot run into each other", src, t.segs[i-1].writen, t.segs[i+1].writen)
			}
		}
	}
	for i := 1; i < len(t.segs); i++ {
		if t.segs[i].kind != partLiteral && t.segs[i-1].kind != partLiteral {
			return nil, fmt.Errorf("%q: parts %s and %s touch; put a separator ('|' or ':') between them", src, t.segs[i-1].writen, t.segs[i].writen)
		}
	}
	if min := t.literals + t.parts*hashLen; min > protocol.MaxKeyBytes {
		return nil, fmt.Errorf("%q: even with every part hashed (%d bytes each) its keys would be %d bytes, over the %d of a key", src, hashLen, min, protocol.MaxKeyBytes)
	}
	return t, nil
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

// validLiteral checks literal template text: valid UTF-8, printable.
func validLiteral(s string) error {
	if !utf8.ValidString(s) {
		return protocol.ErrKeyUTF8
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("character %U is not printable", r)
		}
	}
	return nil
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
// part, in order). Each value but {ip}'s (canonical text of the middleware's
// own making) is escaped; if the key would be longer than
// protocol.MaxKeyBytes, the longest parts are replaced by their hash, longest
// first, until it fits (parseTemplate made sure it then does).
func (t *template) build(vals []string) string {
	var escBuf [4]string
	esc := escBuf[:0]
	total := t.literals
	p := 0
	for _, s := range t.segs {
		if s.kind == partLiteral {
			continue
		}
		e := vals[p]
		if s.kind != partIP {
			e = escape(e)
		}
		esc = append(esc, e)
		total += len(e)
		p++
	}
	for total > protocol.MaxKeyBytes {
		// Hash the longest part not hashed yet (the first of equals).
		longest := -1
		for i, e := range esc {
			if len(e) > hashLen && !isHashed(e) && (longest < 0 || len(e) > len(esc[longest])) {
				longest = i
			}
		}
		if longest < 0 {
			break // cannot happen: parseTemplate bounded literals + parts·hashLen
		}
		total -= len(esc[longest]) - hashLen
		esc[longest] = hashPart(vals[longest])
	}
	var b strings.Builder
	b.Grow(total)
	p = 0
	for _, s := range t.segs {
		if s.kind == partLiteral {
			b.WriteString(s.text)
			continue
		}
		b.WriteString(esc[p])
		p++
	}
	return b.String()
}

func isHashed(e string) bool { return strings.HasPrefix(e, "%~") }

// hashPart returns the hashed form of a part's raw value: "%~" and the
// base64url SHA-256 of the value. No escaped value contains "%~" (an
// escape is '%' and two hex digits), so a hashed part never equals an
// escaped one.
func hashPart(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "%~" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// mustEscape reports whether the ASCII byte c is escaped in a part: the key
// separators ':' and '|', the template braces, the escape character '%'
// itself, and control characters.
func mustEscape(c byte) bool {
	return c < 0x20 || c == 0x7f || c == '%' || c == ':' || c == '|' || c == '{' || c == '}'
}

// escape percent-escapes a part value so that it holds none of the key
// separators: '%', ':', '|', '{', '}', control characters and other
// non-printable runes, and the bytes of invalid UTF-8, become %XX (upper
// case hex) for each of their bytes. Printable runes are kept as they are.
// Escaping is injective, and its output is valid UTF-8 without control
// characters, as keys must be.
func escape(v string) string {
	i := 0
	for i < len(v) {
		c := v[i]
		if c < utf8.RuneSelf {
			if mustEscape(c) {
				break
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(v[i:])
		if (r == utf8.RuneError && size == 1) || !unicode.IsPrint(r) {
			break
		}
		i += size
	}
	if i == len(v) {
		return v // the common case: nothing to escape, no allocation
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+16)
	b = append(b, v[:i]...)
	for i < len(v) {
		c := v[i]
		if c < utf8.RuneSelf {
			if mustEscape(c) {
				b = append(b, '%', hex[c>>4], hex[c&15])
			} else {
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(v[i:])
		if (r == utf8.RuneError && size == 1) || !unicode.IsPrint(r) {
			for j := i; j < i+size; j++ {
				b = append(b, '%', hex[v[j]>>4], hex[v[j]&15])
			}
		} else {
			b = append(b, v[i:i+size]...)
		}
		i += size
	}
	return string(b)
}
