package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"unicode/utf16"
	"unicode/utf8"
)

// DecodeLeaseRequest decodes and validates the body of POST /v1/leases. On
// failure it returns a *Problem: CodeBodyTooLarge for a body larger than
// MaxBodyBytes, CodeInvalidUTF8 for a body that is not valid UTF-8 (or
// escapes a lone surrogate), CodeInvalidJSON for a body that is not one JSON
// object of the right shape (null, which encoding/json would decode as an
// empty request, a member given twice in one object, or a field's name in
// another case than its own, included), or the code of the
// failed validation. Unknown fields are ignored, so that newer clients can
// talk to older servers.
func DecodeLeaseRequest(body []byte) (*LeaseRequest, error) {
	var r LeaseRequest
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// DecodeCheckRequest decodes and validates the body of POST /v1/check, with
// the same error rules as DecodeLeaseRequest.
func DecodeCheckRequest(body []byte) (*CheckRequest, error) {
	var r CheckRequest
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// decodeStrict decodes body, one JSON value and nothing after it but
// whitespace, into v.
//
// The body must be valid UTF-8, and its strings must not escape a lone
// UTF-16 surrogate: encoding/json would decode either silently into U+FFFD,
// so that distinct keys (say "a\xff" and "a\xfe") would name one bucket, and
// a key's UTF-8 check could never fail. Such a body is refused whole with
// CodeInvalidUTF8, whose detail gives the byte offset of the first fault.
func decodeStrict(body []byte, v any) error {
	if len(body) > MaxBodyBytes {
		return NewProblem(CodeBodyTooLarge, fmt.Sprintf("body is %d bytes; the most is %d", len(body), MaxBodyBytes))
	}
	if off := invalidUTF8(body); off >= 0 {
		return invalidUTF8Problem(body, off, "keys and client_id")
	}
	if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
		return NewProblem(CodeInvalidJSON, "body is empty: send a JSON object")
	}
	if err := notObject(body); err != nil {
		return err
	}
	// json.Unmarshal checks that the whole body is one JSON value, so data
	// after it is a syntax error; so does the hand-written decoder, which
	// leaves any body outside its plain form to json.Unmarshal.
	if err := unmarshalRequest(body, v); err != nil {
		return NewProblem(CodeInvalidJSON, "body is not valid JSON for this endpoint: "+err.Error())
	}
	// The body is valid JSON now, which loneSurrogate relies on. A body
	// without a backslash has no escape at all: the common case costs one
	// IndexByte.
	if bytes.IndexByte(body, '\\') >= 0 {
		if off := loneSurrogate(body); off >= 0 {
			return loneSurrogateProblem(body, off)
		}
	}
	return nil
}

// notObject returns a CodeInvalidJSON problem when body, not blank, does
// not begin with an object: encoding/json decodes null into a struct as
// nothing at all, so that a null body was refused by the validation of
// the empty request it became ("client_id is required"), not as what it
// is; arrays and scalars were refused as a mismatch of Go types.
func notObject(body []byte) error {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 || t[0] == '{' {
		return nil
	}
	kind := "not a JSON object"
	switch {
	case bytes.HasPrefix(t, []byte("null")):
		kind = "null"
	case bytes.HasPrefix(t, []byte("true")), bytes.HasPrefix(t, []byte("false")):
		kind = "a boolean"
	case t[0] == '[':
		kind = "an array"
	case t[0] == '"':
		kind = "a string"
	case t[0] == '-' || '0' <= t[0] && t[0] <= '9':
		kind = "a number"
	}
	return NewProblem(CodeInvalidJSON, "body is "+kind+": send a JSON object")
}

// DecodeAdmin decodes the body of an admin API PUT (an AdminRule,
// AdminClient, AdminOverride or AdminSettings), one JSON value and nothing
// after it but whitespace, into v; a body that is not an object (null
// included, which encoding/json would decode as nothing) is refused with
// CodeInvalidJSON. An unknown field is an error
// (CodeInvalidJSON), so that a typo is reported rather than ignored; so are
// a field name in another case than its own ("LIMIT" for "limit", which
// encoding/json takes) and a name given twice in one object (encoding/json
// keeps the last), each named with where it is (see exactFieldNames). As for
// DecodeLeaseRequest, the body must be valid UTF-8 and its strings must not
// escape a lone UTF-16 surrogate (CodeInvalidUTF8): encoding/json would
// decode either silently into U+FFFD, and store, say, the pattern
// "user:\uFFFD*" for "user:\xff*".
func DecodeAdmin(body []byte, v any) error {
	if off := invalidUTF8(body); off >= 0 {
		return invalidUTF8Problem(body, off, "names, patterns and keys")
	}
	if err := notObject(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return NewProblem(CodeInvalidJSON, "body: "+err.Error())
	}
	// Decode reads one value; anything after it but whitespace (a second
	// object, a stray bracket) makes the body malformed, not ignored.
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		return NewProblem(CodeInvalidJSON, fmt.Sprintf("body: data after the JSON value, which ends at offset %d: send one JSON object", end))
	}
	if bytes.IndexByte(body, '\\') >= 0 {
		if off := loneSurrogate(body); off >= 0 {
			return loneSurrogateProblem(body, off)
		}
	}
	return exactFieldNames(body, reflect.TypeOf(v))
}

// invalidUTF8Problem is the problem of a body whose byte at off starts no
// valid UTF-8 sequence; what names the strings to send as UTF-8.
func invalidUTF8Problem(body []byte, off int, what string) *Problem {
	return NewProblem(CodeInvalidUTF8, fmt.Sprintf(
		"body is not valid UTF-8: byte %#02x at offset %d starts no valid UTF-8 sequence; send %s as UTF-8 text",
		body[off], off, what))
}

// loneSurrogateProblem is the problem of a body that escapes a lone
// surrogate at off.
func loneSurrogateProblem(body []byte, off int) *Problem {
	return NewProblem(CodeInvalidUTF8, fmt.Sprintf(
		"the escape %s at offset %d is a lone UTF-16 surrogate, which names no character: send the character as UTF-8, or escape it as a surrogate pair",
		body[off:off+6], off))
}

// invalidUTF8 returns the offset of the first byte of body that does not
// start a valid UTF-8 sequence (an overlong form and a UTF-8 encoded
// surrogate are invalid too), or -1 when body is valid UTF-8.
func invalidUTF8(body []byte) int {
	if utf8.Valid(body) {
		return -1
	}
	for i := 0; i < len(body); {
		r, size := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1 // unreachable: utf8.Valid said otherwise
}

// loneSurrogate returns the offset of the first \uXXXX escape, inside a
// string of the JSON text body, that names a UTF-16 surrogate without its
// pair (a high surrogate not followed by an escaped low one, or a low one on
// its own), or -1 when there is none. body must be valid JSON; loneSurrogate
// does not panic on any other input, but its answer is then meaningless.
func loneSurrogate(body []byte) int {
	inString := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			r, ok := escapedRune(body, i)
			if !ok {
				i++ // a one-character escape such as \" or \\
				continue
			}
			if !utf16.IsSurrogate(r) {
				i += 5
				continue
			}
			if r < 0xdc00 { // a high surrogate: the low one must follow
				if lo, ok := escapedRune(body, i+6); ok && 0xdc00 <= lo && lo <= 0xdfff {
					i += 11
					continue
				}
			}
			return i
		}
	}
	return -1
}

// escapedRune decodes the escape \uXXXX at body[i:], and reports whether
// there is one.
func escapedRune(body []byte, i int) (rune, bool) {
	if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
		return 0, false
	}
	var r rune
	for _, h := range body[i+2 : i+6] {
		switch {
		case '0' <= h && h <= '9':
			r = r<<4 | rune(h-'0')
		case 'a' <= h && h <= 'f':
			r = r<<4 | rune(h-'a'+10)
		case 'A' <= h && h <= 'F':
			r = r<<4 | rune(h-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
