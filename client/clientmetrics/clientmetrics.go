// Package clientmetrics exports the counters of a ratelease SDK client
// (client.Client.Stats) as Prometheus metrics. It lives apart from package
// client so that programs that do not use Prometheus do not link it.
//
// Register a collector per client:
//
//	c, err := client.New(cfg)
//	...
//	prometheus.MustRegister(clientmetrics.New(c, clientmetrics.Options{}))
//
// The metrics, read from Stats at each scrape, are:
//
//	ratelease_client_allowed_total              tokens spent: from leases, direct takes, unlimited keys and the fallback
//	ratelease_client_denied_total               requests denied (a Wait counts once, when it fails)
//	ratelease_client_decisions_total{source}    requests decided by the fallback (source="fallback") and sent
//	                                            to a lease server as direct takes (source="direct"); the others
//	                                            were decided locally (from leases, unlimited keys, local denials)
//	ratelease_client_server_calls_total         HTTP calls to lease servers, retries included
//	ratelease_client_server_errors_total        calls that failed on every server
//	ratelease_client_refusals_total             calls a lease server refused as a whole (401, 403, another 4xx)
//	ratelease_client_keys_held                  keys holding a lease now
//	ratelease_client_max_keys_held              the most keys that held a lease at once
//	ratelease_client_online                     1 while the client takes the servers for up, 0 while it takes them
//	                                            for down (client.Stats.Online)
//	ratelease_client_tokens_held                tokens left in the active leases, granted and not spent yet
package clientmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelease/ratelease/client"
)

// Source is what the collector reads: *client.Client is one.
type Source interface {
	// Stats returns the client's counters.
	Stats() client.Stats
}

// Options configure a Collector.
type Options struct {
	// ConstLabels are added to every metric, to tell several clients of
	// one process apart (for example {"limiter": "billing"}). Two
	// collectors registered in one registry need different ones.
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector over the Stats of a client. It is
// safe for concurrent use; each scrape calls Stats once.
type Collector struct {
	src Source

	allowed, denied, decisions    *prometheus.Desc
	calls, errors, refusals       *prometheus.Desc
	keysHeld, maxKeysHeld, online *prometheus.Desc
	tokensHeld                    *prometheus.Desc
}

// New returns a Collector of src's Stats.
func New(src Source, opts Options) *Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("ratelease", "client", name), help, labels, opts.ConstLabels)
	}
	return &Collector{
		src:         src,
		allowed:     desc("allowed_total", "Tokens spent: from leases, by direct takes, by unlimited keys and by the fallback."),
		denied:      desc("denied_total", "Requests denied (a Wait counts once, when it fails)."),
		decisions:   desc("decisions_total", "Requests decided by the fallback (source=fallback) or sent to a lease server as direct takes (source=direct); the others were decided locally (from leases, unlimited keys, local denials).", "source"),
		calls:       desc("server_calls_total", "HTTP calls to lease servers, retries included."),
		errors:      desc("server_errors_total", "Calls to lease servers that failed on every server."),
		refusals:    desc("refusals_total", "Calls a lease server refused as a whole (401, 403, another 4xx): a misconfiguration."),
		keysHeld:    desc("keys_held", "Keys holding a lease now."),
		maxKeysHeld: desc("max_keys_held", "The most keys that held a lease at once since the client started."),
		online:      desc("online", "1 while the client takes the lease servers for up, 0 while direct takes or lease calls go unanswered."),
		tokensHeld:  desc("tokens_held", "Tokens left in the keys' active leases, deferred ones included: granted and not spent yet."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.allowed, c.denied, c.decisions, c.calls, c.errors, c.refusals, c.keysHeld, c.maxKeysHeld, c.online, c.tokensHeld} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(c.allowed, s.Allowed)
	counter(c.denied, s.Denied)
	counter(c.decisions, s.FallbackDecisions, "fallback")
	counter(c.decisions, s.DirectDecisions, "direct")
	counter(c.calls, s.ServerCalls)
	counter(c.errors, s.ServerErrors)
	counter(c.refusals, s.Refusals)
	gauge(c.keysHeld, float64(s.KeysHeld))
	gauge(c.maxKeysHeld, float64(s.MaxKeysHeld))
	gauge(c.tokensHeld, float64(s.TokensHeld))
	online := 0.0
	if s.Online {
		online = 1
	}
	gauge(c.online, online)
}
