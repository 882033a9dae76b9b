// Package keytemplate is the key template language of the inbound
// middlewares (client/httplimit, and the grpclimit module): literal text
// and parts in braces, "user:{user}|api:{method}", with each part's value
// percent-escaped so that one caller cannot forge another's key, and a key
// over protocol.MaxKeyBytes hashed part by part rather than truncated.
//
// The grammar, the separator rule, escaping and hashing live here; which
// parts exist ({ip}, {header:Name}, {md:name}, ...) and where their values
// come from is the caller's: Parse takes a resolver of part names. It also
// holds the client-address logic both middlewares share (ClientAddr): the
// peer's address, or the right-most untrusted address a trusted proxy
// forwarded.
package keytemplate

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ratelease/ratelease/protocol"
)

// Literal is the Kind of a segment of literal text. The kinds of parts are
// the resolver's, and must not be Literal.
const Literal uint8 = 0

// Segment is a literal run of a template or one part.
type Segment struct {
	// Kind is Literal for literal text; for a part, what the resolver
	// said (its own enumeration, never Literal).
	Kind uint8
	// Text is the literal text; for a part, the argument the resolver kept
	// (say the canonical header name of {header:Name}).
	Text string
	// Written is the part as written, "{header:X-API-Key}", for errors;
	// "" for literal text.
	Written string
	// Raw says the part's value is written as it is, not escaped: text the
	// middleware makes itself in a canonical form (an address), never a
	// value the caller chose. A raw value may hold ':' but never '|', so a
	// raw part must be separated from its neighbours by '|'.
	Raw bool
}

// IsPart reports whether s is a part rather than literal text.
func (s Segment) IsPart() bool { return s.Kind != Literal }

// Resolver turns the name of a part, the text between its braces ("ip",
// "header:X-API-Key"), into its Segment: Kind (not Literal), Text (an
// argument, canonicalized) and Raw. An error for a name it does not know.
type Resolver func(name string) (Segment, error)

// Template is a parsed key template. It is immutable and safe for
// concurrent use.
type Template struct {
	src      string
	segs     []Segment
	parts    int // segments that are parts
	literals int // bytes of literal text
}

// HashLen is the length of a hashed part: "%~" and the base64url (no
// padding) of its SHA-256.
const HashLen = 2 + 43

// Parse parses a key template: literal text and parts in braces, each
// resolved by resolve. Literal text must be printable UTF-8 without '%';
// two parts must be separated by literal text holding '|', or ':' where
// neither part is raw, so that a key splits back into its parts one way
// only; and the template's keys must fit protocol.MaxKeyBytes with every
// part hashed.
func Parse(src string, resolve Resolver) (*Template, error) {
	t := &Template{src: src}
	if src == "" {
		return nil, errors.New("empty template")
	}
	rest := src
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.segs = append(t.segs, Segment{Kind: Literal, Text: rest})
			break
		}
		if rest[i] == '}' {
			return nil, fmt.Errorf("%q: '}' without '{' at byte %d", src, len(src)-len(rest)+i)
		}
		if i > 0 {
			t.segs = append(t.segs, Segment{Kind: Literal, Text: rest[:i]})
		}
		end := strings.IndexAny(rest[i+1:], "{}")
		if end < 0 || rest[i+1+end] != '}' {
			return nil, fmt.Errorf("%q: '{' at byte %d is not closed", src, len(src)-len(rest)+i)
		}
		name := rest[i+1 : i+1+end]
		seg, err := resolve(name)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", src, err)
		}
		if seg.Kind == Literal {
			return nil, fmt.Errorf("%q: part {%s} resolved to literal text", src, name)
		}
		seg.Written = "{" + name + "}"
		t.segs = append(t.segs, seg)
		rest = rest[i+1+end+1:]
	}
	for i, s := range t.segs {
		if s.IsPart() {
			t.parts++
			continue
		}
		t.literals += len(s.Text)
		if strings.ContainsRune(s.Text, '%') {
			return nil, fmt.Errorf("%q: '%%' is reserved for escapes and may not appear in literal text", src)
		}
		if err := validLiteral(s.Text); err != nil {
			return nil, fmt.Errorf("%q: literal %q: %w", src, s.Text, err)
		}
		// Between two parts, a separator the values cannot hold, so that
		// a key splits back into its parts one way only.
		if i > 0 && i < len(t.segs)-1 {
			prev, next := t.segs[i-1], t.segs[i+1]
			if !strings.ContainsRune(s.Text, '|') && (prev.Raw || next.Raw || !strings.ContainsRune(s.Text, ':')) {
				return nil, fmt.Errorf("%q: the text between %s and %s must hold '|' (or ':' where neither is %s), so that parts cannot run into each other", src, prev.Written, next.Written, rawNames(t.segs))
			}
		}
	}
	for i := 1; i < len(t.segs); i++ {
		if t.segs[i].IsPart() && t.segs[i-1].IsPart() {
			return nil, fmt.Errorf("%q: parts %s and %s touch; put a separator ('|' or ':') between them", src, t.segs[i-1].Written, t.segs[i].Written)
		}
	}
	if min := t.literals + t.parts*HashLen; min > protocol.MaxKeyBytes {
		return nil, fmt.Errorf("%q: even with every part hashed (%d bytes each) its keys would be %d bytes, over the %d of a key", src, HashLen, min, protocol.MaxKeyBytes)
	}
	return t, nil
}

// rawNames names the raw parts of segs for an error: "{ip}".
func rawNames(segs []Segment) string {
	var names []string
	for _, s := range segs {
		if s.Raw && !contains(names, s.Written) {
			names = append(names, s.Written)
		}
	}
	if len(names) == 0 {
		return "a raw part"
	}
	return strings.Join(names, " or ")
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// String returns the template as written.
func (t *Template) String() string { return t.src }

// Segments returns the template's segments, in order. The slice is shared:
// do not modify it.
func (t *Template) Segments() []Segment { return t.segs }

// Parts returns the number of parts.
func (t *Template) Parts() int { return t.parts }

// MissingPartError says a part had no value (Template.Expand).
type MissingPartError struct {
	// Template is the template as written.
	Template string
	// Segment is the missing part.
	Segment Segment
}

// Error names the template and the part that had no value.
func (e *MissingPartError) Error() string {
	return fmt.Sprintf("key template %q: no value for %s", e.Template, e.Segment.Written)
}

// Expand returns the template's key with each part's value from value; a
// value of "" (or false) is a missing part, reported as a
// *MissingPartError for the first one.
func (t *Template) Expand(value func(s Segment) (string, bool)) (string, error) {
	var buf [4]string
	vals := buf[:0]
	for _, s := range t.segs {
		if !s.IsPart() {
			continue
		}
		v, ok := value(s)
		if !ok || v == "" {
			return "", &MissingPartError{Template: t.src, Segment: s}
		}
		vals = append(vals, v)
	}
	return t.Build(vals), nil
}

// Build writes the key of the template with the given part values (one per
// part, in order, none empty). Each value but a raw part's is escaped; if
// the key would be longer than protocol.MaxKeyBytes, the longest parts are
// replaced by their hash, longest first, until it fits (Parse made sure it
// then does).
func (t *Template) Build(vals []string) string {
	var escBuf [4]string
	esc := escBuf[:0]
	total := t.literals
	p := 0
	for _, s := range t.segs {
		if !s.IsPart() {
			continue
		}
		e := vals[p]
		if !s.Raw {
			e = Escape(e)
		}
		esc = append(esc, e)
		total += len(e)
		p++
	}
	for total > protocol.MaxKeyBytes {
		// Hash the longest part not hashed yet (the first of equals).
		longest := -1
		for i, e := range esc {
			if len(e) > HashLen && !isHashed(e) && (longest < 0 || len(e) > len(esc[longest])) {
				longest = i
			}
		}
		if longest < 0 {
			break // cannot happen: Parse bounded literals + parts·HashLen
		}
		total -= len(esc[longest]) - HashLen
		esc[longest] = HashPart(vals[longest])
	}
	var b strings.Builder
	b.Grow(total)
	p = 0
	for _, s := range t.segs {
		if !s.IsPart() {
			b.WriteString(s.Text)
			continue
		}
		b.WriteString(esc[p])
		p++
	}
	return b.String()
}

func isHashed(e string) bool { return strings.HasPrefix(e, "%~") }

// HashPart returns the hashed form of a part's raw value: "%~" and the
// base64url SHA-256 of the value. No escaped value contains "%~" (an
// escape is '%' and two hex digits), so a hashed part never equals an
// escaped one.
func HashPart(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "%~" + base64.RawURLEncoding.EncodeToString(sum[:])
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

// mustEscape reports whether the ASCII byte c is escaped in a part: the key
// separators ':' and '|', the template braces, the escape character '%'
// itself, and control characters.
func mustEscape(c byte) bool {
	return c < 0x20 || c == 0x7f || c == '%' || c == ':' || c == '|' || c == '{' || c == '}'
}

// Escape percent-escapes a part value so that it holds none of the key
// separators: '%', ':', '|', '{', '}', control characters and other
// non-printable runes, and the bytes of invalid UTF-8, become %XX (upper
// case hex) for each of their bytes. Printable runes are kept as they are.
// Escaping is injective, and its output is valid UTF-8 without control
// characters, as keys must be.
func Escape(v string) string {
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
