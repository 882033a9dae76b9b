package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeStrict(t *testing.T) {
	for _, body := range []string{"", " ", "\r\n\t "} {
		_, err := DecodeCheckRequest([]byte(body))
		var p *Problem
		require.ErrorAs(t, err, &p, "%q", body)
		assert.Equal(t, CodeInvalidJSON, p.Code)
		assert.Equal(t, "body is empty: send a JSON object", p.Detail, "%q", body)
	}
	for _, body := range []string{`{"keys":["a"]} {}`, `{"keys":["a"]}x`, `{"keys":["a"]}]`, `{"keys":["a"]} null`} {
		_, err := DecodeCheckRequest([]byte(body))
		var p *Problem
		require.ErrorAs(t, err, &p, body)
		assert.Equal(t, CodeInvalidJSON, p.Code, body)
		assert.Contains(t, p.Detail, "after top-level value", body)
	}
	r, err := DecodeCheckRequest([]byte(" {\"keys\":[\"a\"]}\r\n\t "))
	require.NoError(t, err, "whitespace around the object is fine")
	assert.Equal(t, []string{"a"}, r.Keys)
}
