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
//	ratelease_shadow_denials_total              entries and checks of shadow rules admitted though their limits denied
//	ratelease_requests_total{route,code}        HTTP requests by route pattern and status
//	ratelease_request_duration_seconds{route}   HTTP request latency
//	ratelease_store_latency_seconds{op}         store call latency (op: lease, take, refund)
//	ratelease_rules_loaded                      rules in force
//	ratelease_rules_reloads_total{result}       rules file reloads (result: ok, error)
type metrics struct {
	grants, denials, settles, expiries prometheus.Counter
	shadowDenials                      prometheus.Counter

	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	storeLatency *prometheus.HistogramVec
	rulesLoaded  prometheus.Gauge
	reloads      *prometheus.CounterVec

	// The store latency children of the engine's operations, looked up
	// once.
	storeLease, storeTake, storeRefund prometheus.Observer
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
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "requests_total",
			Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "request_duration_seconds",
			Help:    "HTTP request latency by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"route"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "store_latency_seconds",
			Help:    "Latency of store calls by operation (lease, take, refund).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}, []string{"op"}),
		rulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "rules_loaded",
			Help: "Number of rules in force.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rules_reloads_total",
			Help: "Reloads of a changed rules file, by result (ok, error).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{
		m.grants, m.denials, m.settles, m.expiries, m.shadowDenials,
		m.requests, m.duration, m.storeLatency, m.rulesLoaded, m.reloads,
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
	return m, nil
}

// record adds what one engine call did.
func (m *metrics) record(r leases.Report) {
	m.grants.Add(float64(r.Grants))
	m.denials.Add(float64(r.Denials))
	m.settles.Add(float64(r.Settles))
	m.expiries.Add(float64(r.Expiries))
	m.shadowDenials.Add(float64(r.ShadowDenials))
}

// observeStore is the engine's OnStoreCall hook.
func (m *metrics) observeStore(op string, elapsed time.Duration, _ error) {
	var o prometheus.Observer
	switch op {
	case "lease":
		o = m.storeLease
	case "take":
		o = m.storeTake
	case "refund":
		o = m.storeRefund
	default:
		o = m.storeLatency.WithLabelValues(op)
	}
	o.Observe(elapsed.Seconds())
}
