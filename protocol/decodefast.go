package protocol

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"unicode/utf8"
)

// The messages of the hot path are decoded by hand first (see encode.go for
// why). The hand-written decoders take only the plain form the SDK and the
// server write: known field names, each at most once, strings without
// escapes, integers without fraction or exponent. On anything else (an
// unknown or differently cased field name, an escape, an error of any
// kind) they give up, having changed nothing, and the message is decoded
// by encoding/json, whose result and errors stay the reference. So a
// message either decodes exactly as encoding/json decodes it, or goes the
// slow way; fuzz tests hold the decoders to that.

// UnmarshalLeaseResponse decodes data, the body of a successful POST
// /v1/leases, into out, as json.Unmarshal(data, out) does for a fresh out:
// out must not be nil, and what it held is replaced, not merged into.
func UnmarshalLeaseResponse(data []byte, out *LeaseResponse) error {
	var fast LeaseResponse
	r := reader{b: data}
	if r.leaseResponse(&fast) && r.end() {
		*out = fast
		return nil
	}
	return json.Unmarshal(data, out)
}

// unmarshalRequest decodes body into v, a *LeaseRequest or a
// *CheckRequest, as json.Unmarshal(body, v) does, v being zero, except that
// a member given twice in one object, or a field's name in another case
// than its own, is an error (see checkNames): encoding/json keeps the last
// of two "want"s and takes "WANT" for "want", so that a body could mean
// one thing to a proxy or a log and another to the server. The plain form
// the hand-written decoder reads has neither (it gives up on both), so
// only the bodies it leaves to encoding/json pay for the check.
func unmarshalRequest(body []byte, v any) error {
	r := reader{b: body}
	switch v := v.(type) {
	case *LeaseRequest:
		var fast LeaseRequest
		if r.leaseRequest(&fast) && r.end() {
			*v = fast
			return nil
		}
	case *CheckRequest:
		var fast CheckRequest
		if r.checkRequest(&fast) && r.end() {
			*v = fast
			return nil
		}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return err
	}
	return checkNames(json.NewDecoder(bytes.NewReader(body)), reflect.TypeOf(v), "")
}

// reader is a cursor over a JSON text. Its methods report false when the
// text is not in the plain form they take, and the caller then gives up.
type reader struct {
	b []byte
	i int
}

func (r *reader) ws() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips white space and consumes c, if c is next.
func (r *reader) next(c byte) bool {
	r.ws()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (r *reader) end() bool {
	r.ws()
	return r.i == len(r.b)
}

// literal consumes lit ("null", "true", "false") if it is next.
func (r *reader) literal(lit string) bool {
	r.ws()
	if len(r.b)-r.i >= len(lit) && string(r.b[r.i:r.i+len(lit)]) == lit {
		r.i += len(lit)
		return true
	}
	return false
}

// null consumes a null if one is next: the value leaves its field as it
// is (zero), as encoding/json does.
func (r *reader) null() bool { return r.literal("null") }

// raw reads a string without escapes and returns its bytes, which alias
// the input. It refuses invalid UTF-8, which encoding/json would replace.
func (r *reader) raw() ([]byte, bool) {
	r.ws()
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return nil, false
	}
	start := r.i + 1
	ascii := true
	for j := start; j < len(r.b); j++ {
		switch c := r.b[j]; {
		case c == '"':
			s := r.b[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			r.i = j + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// str decodes a string field; null leaves it as it is.
func (r *reader) str(dst *string) bool {
	if r.null() {
		return true
	}
	s, ok := r.raw()
	if ok {
		*dst = string(s)
	}
	return ok
}

// integer reads an integer in [lo, hi] without fraction or exponent.
func (r *reader) integer(lo, hi int64) (int64, bool) {
	r.ws()
	j := r.i
	neg := j < len(r.b) && r.b[j] == '-'
	if neg {
		j++
	}
	start := j
	var u uint64
	for ; j < len(r.b) && r.b[j] >= '0' && r.b[j] <= '9'; j++ {
		if u > (math.MaxUint64-9)/10 {
			return 0, false
		}
		u = u*10 + uint64(r.b[j]-'0')
	}
	if j == start || (r.b[start] == '0' && j-start > 1) {
		return 0, false
	}
	if j < len(r.b) && (r.b[j] == '.' || r.b[j] == 'e' || r.b[j] == 'E') {
		return 0, false
	}
	var v int64
	if neg {
		if u > uint64(-(lo+1))+1 {
			return 0, false
		}
		v = -int64(u)
	} else {
		if u > uint64(hi) {
			return 0, false
		}
		v = int64(u)
	}
	r.i = j
	return v, true
}

// int64 decodes an int64 field; null leaves it as it is.
func (r *reader) int64(dst *int64) bool {
	if r.null() {
		return true
	}
	v, ok := r.integer(math.MinInt64, math.MaxInt64)
	if ok {
		*dst = v
	}
	return ok
}

// int decodes an int field; null leaves it as it is.
func (r *reader) int(dst *int) bool {
	if r.null() {
		return true
	}
	v, ok := r.integer(math.MinInt, math.MaxInt)
	if ok {
		*dst = int(v)
	}
	return ok
}

// ptrInt64 decodes an *int64 field: null leaves it nil.
func (r *reader) ptrInt64(dst **int64) bool {
	if r.null() {
		return true
	}
	v, ok := r.integer(math.MinInt64, math.MaxInt64)
	if ok {
		*dst = &v
	}
	return ok
}

// bool decodes a bool field; null leaves it as it is.
func (r *reader) bool(dst *bool) bool {
	switch {
	case r.literal("true"):
		*dst = true
	case r.literal("false"):
		*dst = false
	default:
		return r.null()
	}
	return true
}

// float64 decodes a float64 field; null leaves it as it is. The number
// must be a JSON number that strconv.ParseFloat takes without error, as
// for encoding/json.
func (r *reader) float64(dst *float64) bool {
	if r.null() {
		return true
	}
	r.ws()
	j := r.i
	digits := func() int {
		k := j
		for j < len(r.b) && r.b[j] >= '0' && r.b[j] <= '9' {
			j++
		}
		return j - k
	}
	if j < len(r.b) && r.b[j] == '-' {
		j++
	}
	start := j
	if n := digits(); n == 0 || (r.b[start] == '0' && n > 1) {
		return false
	}
	if j < len(r.b) && r.b[j] == '.' {
		j++
		if digits() == 0 {
			return false
		}
	}
	if j < len(r.b) && (r.b[j] == 'e' || r.b[j] == 'E') {
		j++
		if j < len(r.b) && (r.b[j] == '+' || r.b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return false
		}
	}
	v, err := strconv.ParseFloat(string(r.b[r.i:j]), 64)
	if err != nil {
		return false
	}
	*dst = v
	r.i = j
	return true
}

// object reads an object, calling field for each member with its name
// (which aliases the input) after the colon. field reads the value, or
// reports false to give up. A name seen twice gives up: encoding/json
// would merge the two.
func (r *reader) object(field func(name []byte) bool) bool {
	if !r.next('{') {
		return false
	}
	if r.next('}') {
		return true
	}
	for {
		name, ok := r.raw()
		if !ok || !r.next(':') || !field(name) {
			return false
		}
		if r.next(',') {
			continue
		}
		return r.next('}')
	}
}

// readArray reads an array into *dst, each element by elem, which gives
// up on a null element (encoding/json would decode it as a zero value);
// null leaves *dst nil, [] makes it empty, not nil, as encoding/json does.
func readArray[T any](r *reader, dst *[]T, elem func(*reader, *T) bool) bool {
	if r.null() {
		return true
	}
	if !r.next('[') {
		return false
	}
	*dst = []T{}
	if r.next(']') {
		return true
	}
	var zero T
	for {
		// Decoded in place: a pointer to a local would escape through
		// elem, an allocation per element.
		*dst = append(*dst, zero)
		if !elem(r, &(*dst)[len(*dst)-1]) {
			return false
		}
		if r.next(',') {
			continue
		}
		return r.next(']')
	}
}

// element decodes a string element of an array; null gives up.
func (r *reader) element(dst *string) bool {
	s, ok := r.raw()
	if ok {
		*dst = string(s)
	}
	return ok
}

// seen records field bit in *mask, and reports false when it was there
// already. The hand-written decoders give each field a bit; DecodeAdmin's
// check of field names (exactFieldNames) gives a struct's fields their
// index.
func seen(mask *uint32, bit uint32) bool {
	if *mask&bit != 0 {
		return false
	}
	*mask |= bit
	return true
}

func (r *reader) leaseRequest(req *LeaseRequest) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "client_id":
			return seen(&mask, 1) && r.str(&req.ClientID)
		case "leases":
			return seen(&mask, 2) && readArray(r, &req.Leases, (*reader).leaseEntry)
		case "takes":
			return seen(&mask, 4) && readArray(r, &req.Takes, (*reader).checkRequest)
		}
		return false
	})
}

func (r *reader) leaseEntry(e *LeaseEntry) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "key":
			return seen(&mask, 1) && r.str(&e.Key)
		case "want":
			return seen(&mask, 2) && r.int64(&e.Want)
		case "lease_id":
			return seen(&mask, 4) && r.str(&e.LeaseID)
		case "used":
			return seen(&mask, 8) && r.int64(&e.Used)
		case "slot":
			return seen(&mask, 16) && r.int(&e.Slot)
		case "priority":
			return seen(&mask, 32) && r.str(&e.Priority)
		case "max_delay_ms":
			return seen(&mask, 64) && r.int64(&e.MaxDelayMillis)
		}
		return false
	})
}

func (r *reader) checkRequest(c *CheckRequest) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "keys":
			return seen(&mask, 1) && readArray(r, &c.Keys, (*reader).element)
		case "cost":
			return seen(&mask, 2) && r.ptrInt64(&c.Cost)
		case "max_delay_ms":
			return seen(&mask, 4) && r.ptrInt64(&c.MaxDelayMillis)
		case "priority":
			return seen(&mask, 8) && r.str(&c.Priority)
		}
		return false
	})
}

func (r *reader) leaseResponse(resp *LeaseResponse) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "leases":
			return seen(&mask, 1) && readArray(r, &resp.Leases, (*reader).leaseResult)
		case "takes":
			return seen(&mask, 2) && readArray(r, &resp.Takes, (*reader).checkResponse)
		}
		return false
	})
}

func (r *reader) leaseResult(l *LeaseResult) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "key":
			return seen(&mask, 1<<0) && r.str(&l.Key)
		case "slot":
			return seen(&mask, 1<<1) && r.int(&l.Slot)
		case "lease_id":
			return seen(&mask, 1<<2) && r.str(&l.LeaseID)
		case "granted":
			return seen(&mask, 1<<3) && r.int64(&l.Granted)
		case "ttl_ms":
			return seen(&mask, 1<<4) && r.int64(&l.TTLMillis)
		case "retry_after_ms":
			return seen(&mask, 1<<5) && r.int64(&l.RetryAfterMillis)
		case "limit":
			return seen(&mask, 1<<6) && r.int64(&l.Limit)
		case "period_ms":
			return seen(&mask, 1<<7) && r.int64(&l.PeriodMillis)
		case "burst":
			return seen(&mask, 1<<8) && r.int64(&l.Burst)
		case "remaining":
			return seen(&mask, 1<<9) && r.int64(&l.Remaining)
		case "safe_rate":
			return seen(&mask, 1<<10) && r.float64(&l.SafeRate)
		case "rule":
			return seen(&mask, 1<<11) && r.str(&l.Rule)
		case "algorithm":
			return seen(&mask, 1<<12) && r.str(&l.Algorithm)
		case "delay_ms":
			return seen(&mask, 1<<13) && r.int64(&l.DelayMillis)
		case "limits":
			return seen(&mask, 1<<14) && readArray(r, &l.Limits, (*reader).limitStatus)
		case "shadow_denied":
			return seen(&mask, 1<<15) && r.bool(&l.ShadowDenied)
		case "borrowed":
			return seen(&mask, 1<<16) && r.int64(&l.Borrowed)
		case "unlimited":
			return seen(&mask, 1<<17) && r.bool(&l.Unlimited)
		case "owned":
			return seen(&mask, 1<<18) && r.bool(&l.Owned)
		}
		return false // "error" too: a problem goes the slow way
	})
}

func (r *reader) limitStatus(l *LimitStatus) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "algorithm":
			return seen(&mask, 1<<0) && r.str(&l.Algorithm)
		case "limit":
			return seen(&mask, 1<<1) && r.int64(&l.Limit)
		case "period_ms":
			return seen(&mask, 1<<2) && r.int64(&l.PeriodMillis)
		case "burst":
			return seen(&mask, 1<<3) && r.int64(&l.Burst)
		case "remaining":
			return seen(&mask, 1<<4) && r.int64(&l.Remaining)
		case "reset_ms":
			return seen(&mask, 1<<5) && r.int64(&l.ResetMillis)
		case "overage":
			return seen(&mask, 1<<6) && r.int64(&l.Overage)
		}
		return false
	})
}

func (r *reader) checkResponse(c *CheckResponse) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "allowed":
			return seen(&mask, 1<<0) && r.bool(&c.Allowed)
		case "retry_after_ms":
			return seen(&mask, 1<<1) && r.int64(&c.RetryAfterMillis)
		case "delay_ms":
			return seen(&mask, 1<<2) && r.int64(&c.DelayMillis)
		case "keys":
			return seen(&mask, 1<<3) && readArray(r, &c.Keys, (*reader).checkResult)
		case "shadow_denied":
			return seen(&mask, 1<<4) && r.bool(&c.ShadowDenied)
		case "borrowed":
			return seen(&mask, 1<<5) && r.bool(&c.Borrowed)
		}
		return false // "error" too: a problem goes the slow way
	})
}

func (r *reader) checkResult(k *CheckResult) bool {
	var mask uint32
	return r.object(func(name []byte) bool {
		switch string(name) {
		case "key":
			return seen(&mask, 1<<0) && r.str(&k.Key)
		case "allowed":
			return seen(&mask, 1<<1) && r.bool(&k.Allowed)
		case "retry_after_ms":
			return seen(&mask, 1<<2) && r.int64(&k.RetryAfterMillis)
		case "remaining":
			return seen(&mask, 1<<3) && r.int64(&k.Remaining)
		case "limit":
			return seen(&mask, 1<<4) && r.int64(&k.Limit)
		case "period_ms":
			return seen(&mask, 1<<5) && r.int64(&k.PeriodMillis)
		case "burst":
			return seen(&mask, 1<<6) && r.int64(&k.Burst)
		case "rule":
			return seen(&mask, 1<<7) && r.str(&k.Rule)
		case "unlimited":
			return seen(&mask, 1<<8) && r.bool(&k.Unlimited)
		case "lease_ttl_ms":
			return seen(&mask, 1<<9) && r.int64(&k.LeaseTTLMillis)
		case "algorithm":
			return seen(&mask, 1<<10) && r.str(&k.Algorithm)
		case "delay_ms":
			return seen(&mask, 1<<11) && r.int64(&k.DelayMillis)
		case "limits":
			return seen(&mask, 1<<12) && readArray(r, &k.Limits, (*reader).limitStatus)
		case "shadow_denied":
			return seen(&mask, 1<<13) && r.bool(&k.ShadowDenied)
		case "borrowed":
			return seen(&mask, 1<<14) && r.bool(&k.Borrowed)
		}
		return false
	})
}
