package protocol

import (
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// The messages of the hot path (a lease call and its answer) are encoded by
// hand here: encoding/json reflects over every field of every value, which
// cost a direct take more CPU than its HTTP exchange in the lease server and
// in the client. Each Append function writes exactly the bytes json.Marshal
// writes for the same value (field order, omitempty, HTML-safe escaping,
// float format), so that the wire does not change; fuzz tests hold them to
// that. A struct field added to one of these types must be added here too:
// a test compares the fields each function knows with the types'.

// AppendLeaseRequest appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer.
func AppendLeaseRequest(dst []byte, r *LeaseRequest) []byte {
	dst = append(dst, `{"client_id":`...)
	dst = appendString(dst, r.ClientID)
	dst = append(dst, `,"leases":`...)
	if r.Leases == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i := range r.Leases {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendLeaseEntry(dst, &r.Leases[i])
		}
		dst = append(dst, ']')
	}
	if len(r.Takes) > 0 {
		dst = append(dst, `,"takes":[`...)
		for i := range r.Takes {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendCheckRequest(dst, &r.Takes[i])
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

func appendLeaseEntry(dst []byte, e *LeaseEntry) []byte {
	dst = append(dst, `{"key":`...)
	dst = appendString(dst, e.Key)
	dst = appendIntField(dst, `,"want":`, e.Want)
	if e.LeaseID != "" {
		dst = append(dst, `,"lease_id":`...)
		dst = appendString(dst, e.LeaseID)
	}
	if e.Used != 0 {
		dst = appendIntField(dst, `,"used":`, e.Used)
	}
	if e.Slot != 0 {
		dst = appendIntField(dst, `,"slot":`, int64(e.Slot))
	}
	if e.Priority != "" {
		dst = append(dst, `,"priority":`...)
		dst = appendString(dst, e.Priority)
	}
	if e.MaxDelayMillis != 0 {
		dst = appendIntField(dst, `,"max_delay_ms":`, e.MaxDelayMillis)
	}
	return append(dst, '}')
}

// AppendCheckRequest appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer.
func AppendCheckRequest(dst []byte, r *CheckRequest) []byte {
	dst = append(dst, `{"keys":`...)
	dst = appendStrings(dst, r.Keys)
	if r.Cost != nil {
		dst = appendIntField(dst, `,"cost":`, *r.Cost)
	}
	if r.MaxDelayMillis != nil {
		dst = appendIntField(dst, `,"max_delay_ms":`, *r.MaxDelayMillis)
	}
	if r.Priority != "" {
		dst = append(dst, `,"priority":`...)
		dst = appendString(dst, r.Priority)
	}
	return append(dst, '}')
}

// AppendLeaseResponse appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer. Like
// json.Marshal it fails, with a *json.UnsupportedValueError, when a
// safe_rate is not finite.
func AppendLeaseResponse(dst []byte, r *LeaseResponse) ([]byte, error) {
	dst = append(dst, `{"leases":`...)
	dst, err := appendLeaseResults(dst, r.Leases)
	if err != nil {
		return dst, err
	}
	if len(r.Takes) > 0 {
		dst = append(dst, `,"takes":[`...)
		for i := range r.Takes {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, err = AppendCheckResponse(dst, &r.Takes[i]); err != nil {
				return dst, err
			}
		}
		dst = append(dst, ']')
	}
	return append(dst, '}'), nil
}

// appendLeaseResults appends a []LeaseResult, null when nil.
func appendLeaseResults(dst []byte, rs []LeaseResult) ([]byte, error) {
	if rs == nil {
		return append(dst, "null"...), nil
	}
	dst = append(dst, '[')
	for i := range rs {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = appendLeaseResult(dst, &rs[i]); err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

func appendLeaseResult(dst []byte, r *LeaseResult) ([]byte, error) {
	dst = append(dst, `{"key":`...)
	dst = appendString(dst, r.Key)
	if r.Slot != 0 {
		dst = appendIntField(dst, `,"slot":`, int64(r.Slot))
	}
	if r.LeaseID != "" {
		dst = append(dst, `,"lease_id":`...)
		dst = appendString(dst, r.LeaseID)
	}
	dst = appendIntField(dst, `,"granted":`, r.Granted)
	dst = appendIntField(dst, `,"ttl_ms":`, r.TTLMillis)
	dst = appendIntField(dst, `,"retry_after_ms":`, r.RetryAfterMillis)
	dst = appendIntField(dst, `,"limit":`, r.Limit)
	dst = appendIntField(dst, `,"period_ms":`, r.PeriodMillis)
	dst = appendIntField(dst, `,"burst":`, r.Burst)
	dst = appendIntField(dst, `,"remaining":`, r.Remaining)
	dst = append(dst, `,"safe_rate":`...)
	dst, err := appendFloat(dst, r.SafeRate)
	if err != nil {
		return dst, err
	}
	if r.Rule != "" {
		dst = append(dst, `,"rule":`...)
		dst = appendString(dst, r.Rule)
	}
	if r.Algorithm != "" {
		dst = append(dst, `,"algorithm":`...)
		dst = appendString(dst, r.Algorithm)
	}
	if r.DelayMillis != 0 {
		dst = appendIntField(dst, `,"delay_ms":`, r.DelayMillis)
	}
	if len(r.Limits) > 0 {
		dst = appendLimits(dst, r.Limits)
	}
	if r.ShadowDenied {
		dst = append(dst, `,"shadow_denied":true`...)
	}
	if r.Borrowed != 0 {
		dst = appendIntField(dst, `,"borrowed":`, r.Borrowed)
	}
	if r.Unlimited {
		dst = append(dst, `,"unlimited":true`...)
	}
	if r.Owned {
		dst = append(dst, `,"owned":true`...)
	}
	if r.Error != nil {
		dst = append(dst, `,"error":`...)
		if dst, err = AppendProblem(dst, r.Error); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendLimits(dst []byte, ls []LimitStatus) []byte {
	dst = append(dst, `,"limits":[`...)
	for i := range ls {
		l := &ls[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"algorithm":`...)
		dst = appendString(dst, l.Algorithm)
		dst = appendIntField(dst, `,"limit":`, l.Limit)
		dst = appendIntField(dst, `,"period_ms":`, l.PeriodMillis)
		dst = appendIntField(dst, `,"burst":`, l.Burst)
		dst = appendIntField(dst, `,"remaining":`, l.Remaining)
		dst = appendIntField(dst, `,"reset_ms":`, l.ResetMillis)
		if l.Overage != 0 {
			dst = appendIntField(dst, `,"overage":`, l.Overage)
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// AppendCheckResponse appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer. It fails as
// AppendLeaseResponse does.
func AppendCheckResponse(dst []byte, r *CheckResponse) ([]byte, error) {
	dst = append(dst, `{"allowed":`...)
	dst = strconv.AppendBool(dst, r.Allowed)
	dst = appendIntField(dst, `,"retry_after_ms":`, r.RetryAfterMillis)
	if r.DelayMillis != 0 {
		dst = appendIntField(dst, `,"delay_ms":`, r.DelayMillis)
	}
	dst = append(dst, `,"keys":`...)
	if r.Keys == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i := range r.Keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendCheckResult(dst, &r.Keys[i])
		}
		dst = append(dst, ']')
	}
	if r.ShadowDenied {
		dst = append(dst, `,"shadow_denied":true`...)
	}
	if r.Borrowed {
		dst = append(dst, `,"borrowed":true`...)
	}
	if r.Error != nil {
		dst = append(dst, `,"error":`...)
		var err error
		if dst, err = AppendProblem(dst, r.Error); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendCheckResult(dst []byte, k *CheckResult) []byte {
	dst = append(dst, `{"key":`...)
	dst = appendString(dst, k.Key)
	dst = append(dst, `,"allowed":`...)
	dst = strconv.AppendBool(dst, k.Allowed)
	dst = appendIntField(dst, `,"retry_after_ms":`, k.RetryAfterMillis)
	dst = appendIntField(dst, `,"remaining":`, k.Remaining)
	dst = appendIntField(dst, `,"limit":`, k.Limit)
	dst = appendIntField(dst, `,"period_ms":`, k.PeriodMillis)
	dst = appendIntField(dst, `,"burst":`, k.Burst)
	if k.Rule != "" {
		dst = append(dst, `,"rule":`...)
		dst = appendString(dst, k.Rule)
	}
	if k.Unlimited {
		dst = append(dst, `,"unlimited":true`...)
	}
	if k.LeaseTTLMillis != 0 {
		dst = appendIntField(dst, `,"lease_ttl_ms":`, k.LeaseTTLMillis)
	}
	if k.Algorithm != "" {
		dst = append(dst, `,"algorithm":`...)
		dst = appendString(dst, k.Algorithm)
	}
	if k.DelayMillis != 0 {
		dst = appendIntField(dst, `,"delay_ms":`, k.DelayMillis)
	}
	if len(k.Limits) > 0 {
		dst = appendLimits(dst, k.Limits)
	}
	if k.ShadowDenied {
		dst = append(dst, `,"shadow_denied":true`...)
	}
	if k.Borrowed {
		dst = append(dst, `,"borrowed":true`...)
	}
	return append(dst, '}')
}

// AppendProblem appends the JSON encoding of p to dst, the bytes
// json.Marshal(p) returns, and returns the extended buffer. It fails as
// AppendLeaseResponse does, for the results p carries.
func AppendProblem(dst []byte, p *Problem) ([]byte, error) {
	dst = append(dst, '{')
	if p.Type != "" {
		dst = append(dst, `"type":`...)
		dst = appendString(dst, p.Type)
		dst = append(dst, ',')
	}
	dst = append(dst, `"title":`...)
	dst = appendString(dst, p.Title)
	dst = appendIntField(dst, `,"status":`, int64(p.Status))
	if p.Detail != "" {
		dst = append(dst, `,"detail":`...)
		dst = appendString(dst, p.Detail)
	}
	dst = append(dst, `,"code":`...)
	dst = appendString(dst, string(p.Code))
	if len(p.Leases) > 0 {
		dst = append(dst, `,"leases":`...)
		var err error
		if dst, err = appendLeaseResults(dst, p.Leases); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendIntField(dst []byte, name string, v int64) []byte {
	return strconv.AppendInt(append(dst, name...), v, 10)
}

func appendStrings(dst []byte, ss []string) []byte {
	if ss == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, s := range ss {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, s)
	}
	return append(dst, ']')
}

// appendFloat formats f as encoding/json does a float64: the shortest
// representation, in exponent form below 1e-6 and from 1e21 on, with a
// one-digit negative exponent not padded. A NaN or an infinity fails.
func appendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return dst, &json.UnsupportedValueError{Str: strconv.FormatFloat(f, 'g', -1, 64)}
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// e-09 becomes e-9
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, nil
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, escaped as encoding/json escapes
// it by default: quotes, backslashes and control characters; '<', '>' and
// '&' (HTML-safe); U+2028 and U+2029; invalid UTF-8 becomes \ufffd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
