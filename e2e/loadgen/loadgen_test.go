package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
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

func TestScheduleParseErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-procs", "0"},
		{"-procs", "2", "-proc", "2"},
		{"-proc", "-1"},
		{"-schedule-seed", "1"},
		{"-schedule-seed", "1", "-keys", "5", "-phases", "1s@10"},
		{"-schedule-seed", "1", "-keys", "5", "-rate", "1e7", "-duration", "1h"},
	} {
		_, err := parse(args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
}

// TestSchedule: one seed gives one schedule, a Poisson process at the rate
// over the keys, and the shares of the processes deal it out round-robin,
// each arrival to exactly one.
func TestSchedule(t *testing.T) {
	const rate, keys, procs = 2000.0, 50, 3
	d := 2 * time.Second
	a := Schedule(7, rate, d, keys, 1.1)
	assert.Equal(t, a, Schedule(7, rate, d, keys, 1.1))
	assert.Equal(t, Digest(a), Digest(Schedule(7, rate, d, keys, 1.1)))
	assert.NotEqual(t, Digest(a), Digest(Schedule(8, rate, d, keys, 1.1)))
	want := rate * d.Seconds()
	assert.InDelta(t, want, len(a), 5*math.Sqrt(want), "Poisson arrivals at the rate")
	for i, x := range a {
		assert.GreaterOrEqual(t, x.At, time.Duration(0))
		assert.Less(t, x.At, d)
		assert.True(t, x.Key >= 0 && x.Key < keys, "key %d", x.Key)
		if i > 0 {
			assert.GreaterOrEqual(t, x.At, a[i-1].At, "in time order")
		}
	}
	var n int
	for p := range procs {
		s := Share(a, procs, p)
		for j, x := range s {
			assert.Equal(t, a[j*procs+p], x)
		}
		n += len(s)
	}
	assert.Equal(t, len(a), n)
}

// TestRunSchedule: processes given one schedule issue their shares and
// decide every arrival, reporting the schedule they generated.
func TestRunSchedule(t *testing.T) {
	srv := leasetest.Start(t, `
rules:
  - {name: u, match: "user:*", limit: 50, period: 1s, burst: 10}
`, leasetest.Options{})
	const procs = 2
	d := 300 * time.Millisecond
	all := Schedule(3, 400, d, 5, 1.1)
	origin := time.Now().Add(50 * time.Millisecond).UnixMilli()
	for p := range procs {
		var out bytes.Buffer
		err := Run(context.Background(), []string{"-servers", srv.URL(), "-keys", "5", "-rate", "400", "-duration", d.String(),
			"-schedule-seed", "3", "-procs", fmt.Sprint(procs), "-proc", fmt.Sprint(p), "-start-unix-ms", fmt.Sprint(origin)}, &out, io.Discard)
		require.NoError(t, err)
		var res Result
		require.NoError(t, json.Unmarshal(out.Bytes(), &res))
		require.NotNil(t, res.Schedule)
		assert.Equal(t, Digest(all), res.Schedule.Digest)
		assert.Equal(t, len(all), res.Schedule.Arrivals)
		assert.Len(t, Share(all, procs, p), res.Schedule.Share)
		assert.Equal(t, int64(res.Schedule.Share), res.Requested, "every arrival decided")
		assert.Equal(t, res.Requested, res.Admitted+res.Denied)
		assert.GreaterOrEqual(t, res.Schedule.LagMax, res.Schedule.LagP99)
	}
}

// TestUsageHidesToken: the usage text, on -h and after a bad flag, never
// prints RATELEASE_TOKEN, as rateleased and ratelease do not: it was
// -token's default, and flag prints a flag's default. The variable still
// applies when -token is not given, and -token wins over it.
func TestUsageHidesToken(t *testing.T) {
	const secret = "s3cret-service-token"
	t.Setenv("RATELEASE_TOKEN", secret)
	for _, args := range [][]string{{"-h"}, {"-nope"}} {
		var out bytes.Buffer
		_, err := parse(args, &out)
		require.Error(t, err, "%v", args)
		assert.Contains(t, out.String(), "-token", "%v: the usage text", args)
		assert.NotContains(t, out.String(), secret, "%v", args)
	}
	o, err := parse(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, secret, o.token, "from the environment")
	o, err = parse([]string{"-token", "given"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "given", o.token, "the flag wins")
}
