package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

func decodeStrict(body []byte, v any) error {
	if len(body) > MaxBodyBytes {
		return NewProblem(CodeBodyTooLarge, fmt.Sprintf("body is %d bytes; the most is %d", len(body), MaxBodyBytes))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return NewProblem(CodeInvalidJSON, "body is empty: send a JSON object")
		}
		return NewProblem(CodeInvalidJSON, "body is not valid JSON for this endpoint: "+err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return NewProblem(CodeInvalidJSON, "body has data after the JSON object")
	}
	return nil
}
