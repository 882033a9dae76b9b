package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/ratelease/ratelease/e2e/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-rate", "0"},
		{"-rate", "-5"},
		{"-duration", "0s"},
		{"-slot", "10us"},
		{"-workers", "0"},
		{"-keys", "-1"},
		{"-keys", "10", "-zipf-s", "1"},
		{"-fallback", "maybe"},
		{"-nope"},
	} {
		_, err := parse(args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
	o, err := parse([]string{"-servers", "http://a:1, http://b:2", "-keys", "5"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{"http://a:1", "http://b:2"}, o.servers)
}

func TestRun(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: u, match: "user:*", limit: 50, period: 1s, burst: 10}
`, leasetest.Options{})
	var out bytes.Buffer
	start := time.Now()
	err := Run(context.Background(), []string{"-servers", srv.URL(), "-keys", "3", "-prefix", "user:", "-rate", "400", "-duration", "500ms"}, &out, io.Discard)
	require.NoError(t, err)
	var res Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	assert.Positive(t, res.Admitted)
	assert.Positive(t, res.Denied, "demand above the limit")
	assert.Equal(t, res.Requested, res.Admitted+res.Denied)
	var sum int64
	for key, spans := range res.Slots {
		assert.Contains(t, []string{"user:0", "user:1", "user:2"}, key)
		for _, s := range spans {
			assert.LessOrEqual(t, s[0], s[1])
			sum += s[2]
		}
	}
	assert.Equal(t, res.Admitted, sum)
	// Three keys of burst 10 and 50/s over half a second: at most 3·(10+25).
	assert.LessOrEqual(t, res.Admitted, int64(3*(10+50*time.Since(start).Seconds())))
	assert.Empty(t, res.CloseError)
}
