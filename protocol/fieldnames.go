package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"
)

// exactFieldNames checks the member names of body, one JSON value that
// decodes into a value of type t, against t: a member of an object decoded
// into a struct must be named as the field's JSON name is, exactly, and
// every object (a struct's or a map's) names each member once. It returns
// a problem (CodeInvalidJSON) naming the member and where it is, or nil.
//
// encoding/json matches member names to fields without regard to case
// ("LIMIT" fills Limit), and keeps the last of two members of one name, so
// that {"limit":1,"limit":1000} is a limit of 1000 that the sender may have
// read as 1. Its Decoder's tokens give the names as decoded (escapes
// resolved), so a name spelled with an escape is the name it spells. An
// unknown member is left to DisallowUnknownFields.
func exactFieldNames(body []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := checkNames(dec, t, ""); err != nil {
		return NewProblem(CodeInvalidJSON, "body: "+err.Error())
	}
	return nil
}

// checkNames reads the next value from dec, which must be valid JSON,
// checking its member names against t (nil: any type, every object's names
// given once). path locates the value in messages ("limits[1]").
func checkNames(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		return checkObject(dec, t, path)
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := checkNames(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil // a scalar or null
}

// checkObject checks the members of an object whose '{' dec has just
// read, up to and including its '}'.
func checkObject(dec *json.Decoder, t reflect.Type, path string) error {
	at, what := "", "field"
	if path != "" {
		at = path + ": "
	}
	var fields []jsonField
	var elem reflect.Type // of a map's values
	switch {
	case t != nil && t.Kind() == reflect.Struct:
		fields = jsonFields(t)
	case t != nil && t.Kind() == reflect.Map:
		elem, what = t.Elem(), "key"
	}
	var mask uint32            // the struct's fields given, by index (the first 32)
	given := map[string]bool{} // the other names given
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		i := slices.IndexFunc(fields, func(f jsonField) bool { return f.name == name })
		if i < 0 {
			if j := slices.IndexFunc(fields, func(f jsonField) bool { return strings.EqualFold(f.name, name) }); j >= 0 {
				return fmt.Errorf("%sthe field %q is not %q: field names are case-sensitive", at, name, fields[j].name)
			}
		}
		var once bool
		if i >= 0 && i < 32 {
			once = seen(&mask, 1<<i)
		} else {
			once = !given[name]
			given[name] = true
		}
		if !once {
			return fmt.Errorf("%sthe %s %q is given twice: send each %s once", at, what, shortName(name), what)
		}
		valueType := elem
		if i >= 0 {
			valueType = fields[i].typ
		}
		if path != "" {
			name = path + "." + shortName(name)
		}
		if err := checkNames(dec, valueType, name); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}

// jsonField is a field encoding/json decodes into: its JSON name and type.
type jsonField struct {
	name string
	typ  reflect.Type
}

// jsonFields returns the fields of struct type t that encoding/json decodes
// into, in field order: the exported fields not tagged "-", named by their
// tag or else their Go name, and the fields promoted from embedded structs
// without a tag, rather than those structs.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for _, f := range reflect.VisibleFields(t) {
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if tag == "-" || !f.IsExported() || (f.Anonymous && name == "") {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{name, f.Type})
	}
	return out
}

// maxNameInError is the most bytes of a member name an error quotes: a
// map's keys (a reserve's class) have no length limit of their own.
const maxNameInError = 64

// shortName returns name, cut to maxNameInError bytes (at a rune
// boundary) and marked as cut, for an error message.
func shortName(name string) string {
	if len(name) <= maxNameInError {
		return name
	}
	cut := maxNameInError
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…"
}
