package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelease/ratelease/e2e/redistest"
	"github.com/ratelease/ratelease/leases"
	"github.com/ratelease/ratelease/protocol"
)

// TestRedis runs the full handler over a real Redis: a lease and a settle
// change the shared bucket; a stopped Redis gives 503 with Retry-After and a
// failing /readyz; a restarted Redis is used again without restarting the
// server.
func TestRedis(t *testing.T) {
	rs := redistest.Start(t)
	store := leases.NewRedisStore(rs.Client(t), leases.RedisOptions{})
	f := newFixture(t, rulesYAML, store, Options{StoreTimeout: time.Second})

	start := time.Now()
	first := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:42", Want: 30})[0]
	require.Nil(t, first.Error)
	require.EqualValues(t, 30, first.Granted)
	st := f.state("user:42")
	assert.EqualValues(t, 30, st.Outstanding)
	assert.Equal(t, 1, st.Leases)

	settled := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:42", LeaseID: first.LeaseID, Used: 12})[0]
	require.Nil(t, settled.Error)
	st = f.state("user:42")
	assert.Zero(t, st.Outstanding)
	assert.Zero(t, st.Leases)
	// 30 − 12 unused tokens came back, and the bucket (100/s, Redis TIME)
	// refilled since: at most for as long as the test ran.
	refilled := 100 * time.Since(start).Seconds()
	assert.GreaterOrEqual(t, st.Level, 88.0-1e-9, "30 − 12 unused tokens came back")
	assert.LessOrEqual(t, st.Level, 88+refilled+1e-9, "and the refill since, no more")

	// Another client's view of the same bucket is shared, through Redis.
	r := f.postJSON(protocol.PathLeases, "", `{"client_id":"svc-2","leases":[{"key":"user:42","want":1,"lease_id":"`+first.LeaseID+`"}]}`)
	require.Equal(t, http.StatusConflict, r.status)

	r = f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
	require.Equal(t, http.StatusOK, r.status)

	rs.Stop(t)
	r = f.postJSON(protocol.PathLeases, "", `{"client_id":"svc-1","leases":[{"key":"user:1","want":1}]}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	assert.Equal(t, protocol.CodeStoreUnavailable, r.problem(t).Code)
	assert.Equal(t, "1", r.header.Get("Retry-After"))

	r = f.postJSON(protocol.PathCheck, "", `{"keys":["user:1"]}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, "1", r.header.Get("Retry-After"))

	r = f.do(http.MethodGet, protocol.PathReadyz, "", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, protocol.CodeStoreUnavailable, r.problem(t).Code)
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, protocol.PathHealthz, "", "", nil).status, "alive all the same")

	rs.Restart(t)
	require.Eventually(t, func() bool {
		return f.do(http.MethodGet, protocol.PathReadyz, "", "", nil).status == http.StatusOK
	}, 5*time.Second, 50*time.Millisecond)
	res := f.lease("", "svc-1", protocol.LeaseEntry{Key: "user:1", Want: 3})[0]
	assert.EqualValues(t, 3, res.Granted)
}
