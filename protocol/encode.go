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
	dst = appendArray(append(dst, `,"leases":`...), r.Leases, appendLeaseEntry)
	if len(r.Takes) > 0 {
		dst = appendArray(append(dst, `,"takes":`...), r.Takes, AppendCheckRequest)
	}
	return append(dst, '}')
}

func appendLeaseEntry(dst []byte, e *LeaseEntry) []byte {
	dst = append(dst, `{"key":`...)
	dst = appendString(dst, e.Key)
	dst = appendIntField(dst, `,"want":`, e.Want)
	dst = appendOmitString(dst, `,"lease_id":`, e.LeaseID)
	dst = appendOmitInt(dst, `,"used":`, e.Used)
	dst = appendOmitInt(dst, `,"slot":`, int64(e.Slot))
	dst = appendOmitString(dst, `,"priority":`, e.Priority)
	dst = appendOmitInt(dst, `,"max_delay_ms":`, e.MaxDelayMillis)
	return append(dst, '}')
}

// AppendCheckRequest appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer.
func AppendCheckRequest(dst []byte, r *CheckRequest) []byte {
	dst = appendArray(append(dst, `{"keys":`...), r.Keys, func(dst []byte, k *string) []byte { return appendString(dst, *k) })
	if r.Cost != nil {
		dst = appendIntField(dst, `,"cost":`, *r.Cost)
	}
	if r.MaxDelayMillis != nil {
		dst = appendIntField(dst, `,"max_delay_ms":`, *r.MaxDelayMillis)
	}
	dst = appendOmitString(dst, `,"priority":`, r.Priority)
	return append(dst, '}')
}

// AppendLeaseResponse appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer. Like
// json.Marshal it fails, with a *json.UnsupportedValueError, when a
// safe_rate is not finite.
func AppendLeaseResponse(dst []byte, r *LeaseResponse) ([]byte, error) {
	dst, err := appendArrayErr(append(dst, `{"leases":`...), r.Leases, appendLeaseResult)
	if err != nil {
		return dst, err
	}
	if len(r.Takes) > 0 {
		if dst, err = appendArrayErr(append(dst, `,"takes":`...), r.Takes, AppendCheckResponse); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendLeaseResult(dst []byte, r *LeaseResult) ([]byte, error) {
	dst = append(dst, `{"key":`...)
	dst = appendString(dst, r.Key)
	dst = appendOmitInt(dst, `,"slot":`, int64(r.Slot))
	dst = appendOmitString(dst, `,"lease_id":`, r.LeaseID)
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
	dst = appendOmitString(dst, `,"rule":`, r.Rule)
	dst = appendOmitString(dst, `,"algorithm":`, r.Algorithm)
	dst = appendOmitInt(dst, `,"delay_ms":`, r.DelayMillis)
	if len(r.Limits) > 0 {
		dst = appendLimits(dst, r.Limits)
	}
	dst = appendOmitTrue(dst, `,"shadow_denied":`, r.ShadowDenied)
	dst = appendOmitInt(dst, `,"borrowed":`, r.Borrowed)
	dst = appendOmitTrue(dst, `,"unlimited":`, r.Unlimited)
	dst = appendOmitTrue(dst, `,"owned":`, r.Owned)
	if r.Error != nil {
		dst = append(dst, `,"error":`...)
		if dst, err = AppendProblem(dst, r.Error); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendLimits(dst []byte, ls []LimitStatus) []byte {
	return appendArray(append(dst, `,"limits":`...), ls, appendLimitStatus)
}

func appendLimitStatus(dst []byte, l *LimitStatus) []byte {
	dst = append(dst, `{"algorithm":`...)
	dst = appendString(dst, l.Algorithm)
	dst = appendIntField(dst, `,"limit":`, l.Limit)
	dst = appendIntField(dst, `,"period_ms":`, l.PeriodMillis)
	dst = appendIntField(dst, `,"burst":`, l.Burst)
	dst = appendIntField(dst, `,"remaining":`, l.Remaining)
	dst = appendIntField(dst, `,"reset_ms":`, l.ResetMillis)
	dst = appendOmitInt(dst, `,"overage":`, l.Overage)
	return append(dst, '}')
}

// AppendCheckResponse appends the JSON encoding of r to dst, the bytes
// json.Marshal(r) returns, and returns the extended buffer. It fails as
// AppendLeaseResponse does.
func AppendCheckResponse(dst []byte, r *CheckResponse) ([]byte, error) {
	dst = append(dst, `{"allowed":`...)
	dst = strconv.AppendBool(dst, r.Allowed)
	dst = appendIntField(dst, `,"retry_after_ms":`, r.RetryAfterMillis)
	dst = appendOmitInt(dst, `,"delay_ms":`, r.DelayMillis)
	dst = appendArray(append(dst, `,"keys":`...), r.Keys, appendCheckResult)
	dst = appendOmitTrue(dst, `,"shadow_denied":`, r.ShadowDenied)
	dst = appendOmitTrue(dst, `,"borrowed":`, r.Borrowed)
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
	dst = appendOmitString(dst, `,"rule":`, k.Rule)
	dst = appendOmitTrue(dst, `,"unlimited":`, k.Unlimited)
	dst = appendOmitInt(dst, `,"lease_ttl_ms":`, k.LeaseTTLMillis)
	dst = appendOmitString(dst, `,"algorithm":`, k.Algorithm)
	dst = appendOmitInt(dst, `,"delay_ms":`, k.DelayMillis)
	if len(k.Limits) > 0 {
		dst = appendLimits(dst, k.Limits)
	}
	dst = appendOmitTrue(dst, `,"shadow_denied":`, k.ShadowDenied)
	dst = appendOmitTrue(dst, `,"borrowed":`, k.Borrowed)
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
	dst = appendOmitString(dst, `,"detail":`, p.Detail)
	dst = append(dst, `,"code":`...)
	dst = appendString(dst, string(p.Code))
	if len(p.Leases) > 0 {
		var err error
		if dst, err = appendArrayErr(append(dst, `,"leases":`...), p.Leases, appendLeaseResult); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendIntField(dst []byte, name string, v int64) []byte {
	return strconv.AppendInt(append(dst, name...), v, 10)
}

// appendOmitInt, appendOmitString and appendOmitTrue append a field
// tagged omitempty: nothing for the zero value.
func appendOmitInt(dst []byte, name string, v int64) []byte {
	if v == 0 {
		return dst
	}
	return appendIntField(dst, name, v)
}

func appendOmitString(dst []byte, name, v string) []byte {
	if v == "" {
		return dst
	}
	return appendString(append(dst, name...), v)
}

func appendOmitTrue(dst []byte, name string, v bool) []byte {
	if !v {
		return dst
	}
	return append(append(dst, name...), "true"...)
}

// appendArray appends s as a JSON array, each element by elem; null when s
// is nil.
func appendArray[T any](dst []byte, s []T, elem func([]byte, *T) []byte) []byte {
	if s == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i := range s {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = elem(dst, &s[i])
	}
	return append(dst, ']')
}

// appendArrayErr is appendArray for elements whose encoding can fail.
func appendArrayErr[T any](dst []byte, s []T, elem func([]byte, *T) ([]byte, error)) ([]byte, error) {
	if s == nil {
		return append(dst, "null"...), nil
	}
	dst = append(dst, '[')
	for i := range s {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = elem(dst, &s[i]); err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
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
