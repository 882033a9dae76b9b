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
		{"-initial-batch", "-1"},
		{"-phases", "1s"},
		{"-phases", "0s@10"},
		{"-phases", "1s@-1"},
		{"-phases", "1s@10,x@5"},
		{"-nope"},
	} {
		_, err := parse(args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
	o, err := parse([]string{"-servers", "http://a:1, http://b:2", "-keys", "5"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{"http://a:1", "http://b:2"}, o.servers)
}

func TestPhases(t *testing.T) {
	o, err := parse([]string{"-phases", "1ms@1000, 2s@0", "-rate", "500", "-initial-batch", "100"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []phase{{time.Millisecond, 1000}, {2 * time.Second, 0}}, o.phases)
	assert.Equal(t, int64(100), o.initial)
	for _, c := range []struct {
		at        time.Duration
		due, rate float64
	}{
		{0, 0, 1000},
		{time.Millisecond / 2, 0.5, 1000},
		{time.Millisecond, 1, 0},
		{time.Second, 1, 0},
		{2001 * time.Millisecond, 1, 500},
		{2003 * time.Millisecond, 2, 500},
	} {
		due, rate := demand(o.phases, o.rate, c.at)
		assert.InDelta(t, c.due, due, 1e-9, "due at %v", c.at)
		assert.Equal(t, c.rate, rate, "rate at %v", c.at)
	}
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
