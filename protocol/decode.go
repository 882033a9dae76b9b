package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// DecodeLeaseRequest decodes and validates the body of POST /v1/leases. On
// failure it returns a *Problem: CodeInvalidJSON for a body that is not one
// JSON object of the right shape, or the code of the failed validation.
// Unknown fields are ignored, so that newer clients can talk to older
// servers.
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
func decodeStrict(body []byte, v any) error {
	if len(body) > MaxBodyBytes {
		return NewProblem(CodeBodyTooLarge, fmt.Sprintf("body is %d bytes; the most is %d", len(body), MaxBodyBytes))
	}
	if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
		return NewProblem(CodeInvalidJSON, "body is empty: send a JSON object")
	}
	// json.Unmarshal checks that the whole body is one JSON value, so data
	// after it is a syntax error.
	if err := json.Unmarshal(body, v); err != nil {
		return NewProblem(CodeInvalidJSON, "body is not valid JSON for this endpoint: "+err.Error())
	}
	return nil
}
