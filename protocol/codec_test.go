package protocol

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fill sets every field of the value v points to, recursively, to a value
// that is not zero and differs from field to field, so that a field the
// hand-written codecs do not know shows. Problems (the error fields) are
// filled only when withProblems is true, and their results one level deep.
func fill(t *testing.T, v reflect.Value, n *int, withProblems bool, depth int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + strconv.Itoa(*n) + "é")
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.Pointer:
		if v.Type().Elem() == reflect.TypeFor[Problem]() && (!withProblems || depth > 1) {
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n, withProblems, depth+1)
	case reflect.Slice:
		if depth > 2 {
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(t, v.Index(i), n, withProblems, depth+1)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), n, withProblems, depth)
		}
	default:
		t.Fatalf("fill: a field of kind %s: teach fill (and the hand-written codecs) about it", v.Kind())
	}
}

// TestCodecsCoverEveryField: with every field of every message set, the
// hand-written encoders write what json.Marshal writes, and the
// hand-written decoders take the result (they give up on a field they do
// not know) and decode what json.Unmarshal decodes. A field added to a
// message and not to the codecs fails here.
func TestCodecsCoverEveryField(t *testing.T) {
	encoders := []struct {
		name   string
		v      any
		append func(v any) ([]byte, error)
		decode func(b []byte) (any, bool) // nil: no fast decoder
	}{
		{"LeaseRequest", &LeaseRequest{}, func(v any) ([]byte, error) { return AppendLeaseRequest(nil, v.(*LeaseRequest)), nil },
			func(b []byte) (any, bool) {
				var out LeaseRequest
				r := reader{b: b}
				return &out, r.leaseRequest(&out) && r.end()
			}},
		{"CheckRequest", &CheckRequest{}, func(v any) ([]byte, error) { return AppendCheckRequest(nil, v.(*CheckRequest)), nil },
			func(b []byte) (any, bool) {
				var out CheckRequest
				r := reader{b: b}
				return &out, r.checkRequest(&out) && r.end()
			}},
		{"LeaseResponse", &LeaseResponse{}, func(v any) ([]byte, error) { return AppendLeaseResponse(nil, v.(*LeaseResponse)) },
			func(b []byte) (any, bool) {
				var out LeaseResponse
				r := reader{b: b}
				return &out, r.leaseResponse(&out) && r.end()
			}},
		{"CheckResponse", &CheckResponse{}, func(v any) ([]byte, error) { return AppendCheckResponse(nil, v.(*CheckResponse)) }, nil},
		{"Problem", &Problem{}, func(v any) ([]byte, error) { return AppendProblem(nil, v.(*Problem)) }, nil},
	}
	for _, tt := range encoders {
		for _, withProblems := range []bool{false, true} {
			t.Run(tt.name+"/problems="+strconv.FormatBool(withProblems), func(t *testing.T) {
				v := reflect.New(reflect.TypeOf(tt.v).Elem())
				n := 0
				fill(t, v.Elem(), &n, withProblems, 0)
				want, err := json.Marshal(v.Interface())
				require.NoError(t, err)
				got, err := tt.append(v.Interface())
				require.NoError(t, err)
				require.Equal(t, string(want), string(got))
				if tt.decode == nil || withProblems {
					return
				}
				fast, ok := tt.decode(got)
				require.True(t, ok, "the fast decoder gives up on %s", got)
				assert.Equal(t, v.Interface(), fast)
			})
		}
	}
}

func TestAppendFloat(t *testing.T) {
	for _, f := range []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 2.5, 1e-6, 9.99e-7, 1e-7, 1.5e-10, 1e20, 1e21, 1.25e21, -3e-8, math.MaxFloat64, math.SmallestNonzeroFloat64, 123456789.125} {
		want, err := json.Marshal(f)
		require.NoError(t, err)
		got, err := appendFloat(nil, f)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "%g", f)
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		_, wantErr := json.Marshal(LeaseResponse{Leases: []LeaseResult{{SafeRate: f}}})
		_, err := AppendLeaseResponse(nil, &LeaseResponse{Leases: []LeaseResult{{SafeRate: f}}})
		require.Error(t, wantErr)
		assert.ErrorAs(t, err, new(*json.UnsupportedValueError), "%g", f)
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "user:42", `a"b\c`, "<script>&</script>", "\x00\x01\b\f\n\r\t\x1f\x7f", "é日本\u2028\u2029", "a\xffb\xc0\xaf", "\xed\xa0\x80", "\U0001F600"} {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(appendString(nil, s)), "%q", s)
	}
}

// TestUnmarshalFastGivesUp: bodies outside the plain form go to
// encoding/json, which decides as it always did.
func TestUnmarshalFastGivesUp(t *testing.T) {
	for _, body := range []string{
		`{"keys":["a"],"Cost":2}`,                    // another case
		`{"keys":["a"],"cost":1,"cost":2}`,           // twice
		`{"keys":["a"],"cost":1.0}`,                  // a fraction
		`{"keys":["a"],"cost":1e2}`,                  // an exponent
		`{"keys":["a\u0041"]}`,                       // an escape
		"{\"keys\":[\"a\xffb\"]}",                    // not UTF-8
		`{"keys":[null]}`,                            // a null element
		`{"keys":["a"],"extra":1}`,                   // an unknown field
		`{"keys":["a"],"cost":99999999999999999999}`, // too large
		`{"keys":["a"]} x`,                           // trailing data
		`{"keys":["a"],}`,                            // not JSON
		`null`,
	} {
		var fast CheckRequest
		r := reader{b: []byte(body)}
		assert.False(t, r.checkRequest(&fast) && r.end(), "%s", body)
	}
	// The plain form, with white space and nulls, is taken.
	for body, want := range map[string]CheckRequest{
		` { "keys" : [ "a" , "b" ] , "cost" : -0 , "max_delay_ms" : null , "priority" : null } `: {Keys: []string{"a", "b"}, Cost: new(int64)},
		`{"keys":[],"cost":null}`: {Keys: []string{}},
		`{"keys":null}`:           {},
		`{}`:                      {},
	} {
		var fast CheckRequest
		r := reader{b: []byte(body)}
		require.True(t, r.checkRequest(&fast) && r.end(), "%s", body)
		assert.Equal(t, want, fast, "%s", body)
	}
}
