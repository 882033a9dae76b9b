package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/leases"
)

// owningStats is what a store that owns buckets (leases.OwningStore)
// reports.
type owningStats interface {
	Stats() leases.OwningStats
}

// owningCollectors returns the metrics of a store that owns buckets:
//
//	ratelease_owned_buckets          token buckets this server owns now
//	ratelease_owned_takes_total      takes decided from an owned bucket, without a store call
//	ratelease_ownerships_total{event} ownerships acquired, released, lost (not renewed
//	                                 in time) and contested (another server was refused)
func owningCollectors(st owningStats) []prometheus.Collector {
	ev := func(event string, f func(leases.OwningStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "ownerships_total", ConstLabels: prometheus.Labels{"event": event},
			Help: "Ownerships of token buckets by this server, by event: acquired, released (handed back), lost (not renewed by its deadline: the store empties the bucket then), contested (another server was refused a take or lease on an owned key; the bucket is handed back).",
		}, func() float64 { return float64(f(st.Stats())) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "owned_buckets",
			Help: "Token buckets this server owns now, deciding their takes from memory (see leases.OwningStore).",
		}, func() float64 { return float64(st.Stats().Owned) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "owned_takes_total",
			Help: "Take operations decided from a bucket this server owns, without a store call.",
		}, func() float64 { return float64(st.Stats().LocalTakes) }),
		ev("acquired", func(s leases.OwningStats) int64 { return s.Acquired }),
		ev("released", func(s leases.OwningStats) int64 { return s.Released }),
		ev("lost", func(s leases.OwningStats) int64 { return s.Lost }),
		ev("contested", func(s leases.OwningStats) int64 { return s.Contested }),
	}
}
