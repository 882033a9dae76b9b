package server

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelease/ratelease/leases"
)

const namespace = "ratelease"

// metrics are the server's Prometheus metrics, all under the "ratelease"
// namespace:
//
//	ratelease_grants_total                      entries granted tokens (and allowed checks)
//	ratelease_denials_total                     entries that wanted tokens and got none (and denied checks)
//	ratelease_settles_total                     leases settled
//	ratelease_expiries_total                    leases closed unsettled (expired or replaced)
//	ratelease_open_leases                       leases granted through this server, not settled through it,
//	                                                before their deadline (see openleases.go)
//	ratelease_shadow_denials_total              entries and checks of shadow rules admitted though their limits denied
//	ratelease_elastic_borrows_total             entries and checks of elastic rules their pool served
//	ratelease_rule_decisions_total{rule,result} decisions per rule (result: granted, denied, shadow_denied;
//	                                                see operator.go)
//	ratelease_request_duration_seconds{route,code}  HTTP request latency by route pattern and status;
//	                                                its _count is the one count of requests
//	ratelease_store_latency_seconds{op}         store call latency (op: lease, take, refund)
//	ratelease_store_errors_total{op}            store calls that failed, wholly or for some keys, by operation
//	ratelease_rules_loaded                      rules in force
//	ratelease_rules_info{version}               always 1: the version of the rules in force
//	ratelease_rules_reloads_total{result}       rules file reloads (result: ok, error)
//	ratelease_rules_last_reload_success         1 when the last load of the rules file succeeded, 0 when it failed
//	ratelease_build_info{version,revision,goversion}  always 1: the build serving
//
// and, registered by New when they apply: the rule database's override
// cache metrics, a leases.OwningStore's (owningmetrics.go) and
// ratelease_peer_commands_total (peers.go).
//
// Each request is counted once, in request_duration_seconds: an earlier
// requests_total{route,code} counted every request a second time.
type metrics struct {
	grants, denials, settles, expiries prometheus.Counter
	shadowDenials, borrows             prometheus.Counter

	duration      *prometheus.HistogramVec
	storeLatency  *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	rulesLoaded   prometheus.Gauge
	rulesInfo     *prometheus.GaugeVec
	reloads       *prometheus.CounterVec
	reloadSuccess prometheus.Gauge
	buildInfo     *prometheus.GaugeVec

	// The store children of the engine's operations, looked up once.
	storeLease, storeTake, storeRefund prometheus.Observer
	errLease, errTake, errRefund       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	m := &metrics{
		grants:        counter("grants_total", "Lease entries granted at least one token, and checks allowed."),
		denials:       counter("denials_total", "Lease entries that wanted tokens and got none, and checks denied."),
		settles:       counter("settles_total", "Leases settled."),
		expiries:      counter("expiries_total", "Leases closed without being settled: expired, or replaced by a new lease of the same client."),
		shadowDenials: counter("shadow_denials_total", "Lease entries and checks of rules in shadow mode that their limits would have denied (in part, for a lease), admitted all the same."),
		borrows:       counter("elastic_borrows_total", "Lease entries and checks of elastic rules served by their pool beyond their own limits."),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "request_duration_seconds",
			Help:    "HTTP request latency by route pattern and status code; its count is the number of requests.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"route", "code"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "store_latency_seconds",
			Help:    "Latency of store calls by operation (lease, take, refund).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "store_errors_total",
			Help: "Store calls that failed, wholly or for some keys (Redis errors, timeouts, a Redis Cluster node down), by operation (lease, take, refund).",
		}, []string{"op"}),
		reloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "rules_last_reload_success",
			Help: "1 when the last load of the rules file succeeded, 0 when it failed and older rules still serve.",
		}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "build_info",
			Help: "Always 1; its labels name the build of the server: module version, VCS revision, Go version.",
		}, []string{"version", "revision", "goversion"}),
		rulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "rules_loaded",
			Help: "Number of rules in force.",
		}),
		rulesInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "rules_info",
			Help: "Always 1; its label is the version of the rules in force (as GET /v1/rules says), so that servers that drifted apart show.",
		}, []string{"version"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rules_reloads_total",
			Help: "Reloads of a changed rules file, by result (ok, error).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{
		m.grants, m.denials, m.settles, m.expiries, m.shadowDenials, m.borrows,
		m.duration, m.storeLatency, m.storeErrors, m.rulesLoaded, m.rulesInfo, m.reloads, m.reloadSuccess, m.buildInfo,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: register metrics (give every Server its own Registry): %w", err)
		}
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.storeLease = m.storeLatency.WithLabelValues("lease")
	m.storeTake = m.storeLatency.WithLabelValues("take")
	m.storeRefund = m.storeLatency.WithLabelValues("refund")
	m.errLease = m.storeErrors.WithLabelValues("lease")
	m.errTake = m.storeErrors.WithLabelValues("take")
	m.errRefund = m.storeErrors.WithLabelValues("refund")
	m.reloadSuccess.Set(1)
	b := ReadBuild()
	m.buildInfo.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	return m, nil
}

// record adds what one engine call did.
func (m *metrics) record(r leases.Report) {
	m.grants.Add(float64(r.Grants))
	m.denials.Add(float64(r.Denials))
	m.settles.Add(float64(r.Settles))
	m.expiries.Add(float64(r.Expiries))
	m.shadowDenials.Add(float64(r.ShadowDenials))
	m.borrows.Add(float64(r.Borrows))
}

// observeStore is the engine's OnStoreCall hook: the call's latency, and
// its failure when err is not nil.
func (m *metrics) observeStore(op string, elapsed time.Duration, err error) {
	var (
		o prometheus.Observer
		c prometheus.Counter
	)
	switch op {
	case "lease":
		o, c = m.storeLease, m.errLease
	case "take":
		o, c = m.storeTake, m.errTake
	case "refund":
		o, c = m.storeRefund, m.errRefund
	default:
		o = m.storeLatency.WithLabelValues(op)
		if err != nil {
			c = m.storeErrors.WithLabelValues(op)
		}
	}
	o.Observe(elapsed.Seconds())
	if err != nil {
		c.Inc()
	}
}

// setRulesVersion makes version the one rules_info reports.
func (m *metrics) setRulesVersion(version string) {
	m.rulesInfo.Reset()
	m.rulesInfo.WithLabelValues(version).Set(1)
}
