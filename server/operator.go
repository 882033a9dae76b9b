package server

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelease/ratelease/leases"
)

// The operator's view: what the status page shows beyond the rules. The
// handlers count each decision of a rule (granted, denied, shadow_denied)
// from the engine's results, in ratelease_rule_decisions_total and in
// counters of their own from which the page computes rates; two top-K
// summaries find the busiest and the most denied keys; openLeases counts
// the leases open through this server; a loop samples the counters, records
// the server in Options.Peers and publishes its status snapshot there for
// the other servers' pages (see fleet.go).

// Sizes of the operator's view.
const (
	// topKeys is the number of counters of each top-K summary; the page
	// lists the first topKeysShown.
	topKeys      = 100
	topKeysShown = 10
	// rateSamples counters are kept, one per PeerInterval, so that rates
	// are over the last minute.
	rateSamples = 31
)

// Results of ratelease_rule_decisions_total.
const (
	resultGranted      = "granted"
	resultDenied       = "denied"
	resultShadowDenied = "shadow_denied"
)

// operator holds the counters and summaries of the operator's view. It is
// safe for concurrent use.
type operator struct {
	decisions *prometheus.CounterVec
	rules     sync.Map  // rule name -> *ruleCounters
	busiest   *topK     // decisions per key
	denied    *topK     // denials per key
	peers     Peers     // nil: the server is alone as far as it knows
	published published // the status snapshot last published to peers
	open      *openLeases
	now       func() time.Time // Options.Now
	started   time.Time

	mu      sync.Mutex
	samples []ruleSample // oldest first, at most rateSamples
}

// ruleCounters count one rule's decisions since the server started.
type ruleCounters struct {
	granted, denied, shadow    atomic.Int64
	pGranted, pDenied, pShadow prometheus.Counter
}

// ruleSample is the rules' counts at a time.
type ruleSample struct {
	at     time.Time
	counts map[string][3]int64 // granted, denied, shadow_denied
}

func newOperator(reg prometheus.Registerer, peers Peers, clock func() time.Time) (*operator, error) {
	now := clock()
	o := &operator{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rule_decisions_total",
			Help: "Decisions of each rule, by result: granted (a lease entry granted tokens, a key of a check allowed), denied (none granted), shadow_denied (a shadow rule's limits would have denied; admitted all the same). A lease entry that asks for nothing is not a decision.",
		}, []string{"rule", "result"}),
		busiest: newTopK(topKeys),
		denied:  newTopK(topKeys),
		peers:   peers,
		open:    newOpenLeases(),
		now:     clock,
		started: now,
		samples: []ruleSample{{at: now}},
	}
	openGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "open_leases",
		Help: "Leases granted through this server, not settled through it, whose deadline (grant time plus TTL) has not passed. A lease settled through another server, or closed by the store without a settle, counts until its deadline (see openleases.go).",
	}, func() float64 { return float64(o.openLeases()) })
	for _, c := range []prometheus.Collector{o.decisions, openGauge} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: register metrics (give every Server its own Registry): %w", err)
		}
	}
	return o, nil
}

// counters returns the counters of rule, created on first use.
func (o *operator) counters(rule string) *ruleCounters {
	if c, ok := o.rules.Load(rule); ok {
		return c.(*ruleCounters)
	}
	c := &ruleCounters{
		pGranted: o.decisions.WithLabelValues(rule, resultGranted),
		pDenied:  o.decisions.WithLabelValues(rule, resultDenied),
		pShadow:  o.decisions.WithLabelValues(rule, resultShadowDenied),
	}
	actual, _ := o.rules.LoadOrStore(rule, c)
	return actual.(*ruleCounters)
}

// decide counts one decision on key: of rule (nil for an unlimited key,
// which counts only towards the busiest keys).
func (o *operator) decide(key string, rule *leases.Rule, granted, shadowDenied bool) {
	o.busiest.add(key, 1)
	if rule == nil {
		return
	}
	c := o.counters(rule.Name)
	switch {
	case shadowDenied:
		c.shadow.Add(1)
		c.pShadow.Inc()
	case granted:
		c.granted.Add(1)
		c.pGranted.Inc()
	default:
		c.denied.Add(1)
		c.pDenied.Inc()
		o.denied.add(key, 1)
	}
}

// openLeases returns the value of ratelease_open_leases now.
func (o *operator) openLeases() int { return o.open.count(o.now().UnixNano()) }

// leases counts the decisions of a lease call: asks[i] was decided as
// results[i] at now. Entries that ask for nothing and failed entries are
// not decisions; the leases the call granted and settled are counted in
// ratelease_open_leases.
func (o *operator) leases(asks []leases.LeaseAsk, results []leases.LeaseResult, now time.Time) {
	o.open.record(asks, results, now.UnixNano())
	for i := range results {
		r := &results[i]
		if r.Err != nil || asks[i].Want <= 0 {
			continue
		}
		o.decide(r.Key, r.Rule, r.Granted > 0, r.ShadowDenied)
	}
}

// takes counts the decisions of takes, one per key.
func (o *operator) takes(results []leases.TakeResult) {
	for i := range results {
		o.take(&results[i])
	}
}

// take counts the decisions of one take, one per key. Each key counts its
// own answer: a key that had the tokens counts granted even when another
// key of the take denied (and its tokens were given back).
func (o *operator) take(r *leases.TakeResult) {
	if r.Err != nil {
		return
	}
	for j := range r.Keys {
		k := &r.Keys[j]
		o.decide(k.Key, k.Rule, k.Allowed, k.ShadowDenied)
	}
}

// snapshot returns every rule's counts now.
func (o *operator) snapshot(now time.Time) ruleSample {
	s := ruleSample{at: now, counts: map[string][3]int64{}}
	o.rules.Range(func(k, v any) bool {
		c := v.(*ruleCounters)
		s.counts[k.(string)] = [3]int64{c.granted.Load(), c.denied.Load(), c.shadow.Load()}
		return true
	})
	return s
}

// sample records the counts now, keeping the last rateSamples.
func (o *operator) sample(now time.Time) {
	s := o.snapshot(now)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.samples = append(o.samples, s)
	if n := len(o.samples) - rateSamples; n > 0 {
		o.samples = append(o.samples[:0], o.samples[n:]...)
	}
}

// ruleRates are one rule's counts since the server started and its rates
// per second over the window of the samples.
type ruleRates struct {
	Granted          int64   `json:"granted"`
	Denied           int64   `json:"denied"`
	ShadowDenied     int64   `json:"shadow_denied"`
	GrantedRate      float64 `json:"granted_rate"`
	DeniedRate       float64 `json:"denied_rate"`
	ShadowDeniedRate float64 `json:"shadow_denied_rate"`
}

// add adds o's counts and rates to r.
func (r *ruleRates) add(o ruleRates) {
	r.Granted += o.Granted
	r.Denied += o.Denied
	r.ShadowDenied += o.ShadowDenied
	r.GrantedRate += o.GrantedRate
	r.DeniedRate += o.DeniedRate
	r.ShadowDeniedRate += o.ShadowDeniedRate
}

// rates returns the counts and rates of every rule counted, and the window
// the rates are over.
func (o *operator) rates(now time.Time) (map[string]ruleRates, time.Duration) {
	cur := o.snapshot(now)
	o.mu.Lock()
	old := o.samples[0]
	o.mu.Unlock()
	window := cur.at.Sub(old.at)
	secs := window.Seconds()
	out := make(map[string]ruleRates, len(cur.counts))
	for name, c := range cur.counts {
		p := old.counts[name]
		r := ruleRates{Granted: c[0], Denied: c[1], ShadowDenied: c[2]}
		if secs > 0 {
			r.GrantedRate = float64(c[0]-p[0]) / secs
			r.DeniedRate = float64(c[1]-p[1]) / secs
			r.ShadowDeniedRate = float64(c[2]-p[2]) / secs
		}
		out[name] = r
	}
	return out, window
}

// rebeat asks the operator's loop for a heartbeat now, without waiting.
func (s *Server) rebeat() {
	select {
	case s.beatNow <- struct{}{}:
	default:
	}
}

// selfName names this server among its peers: host, listen address and
// process ID.
func selfName(addr string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	if addr == "" {
		addr = "(no listener)"
	}
	return fmt.Sprintf("%s %s pid %d", host, addr, os.Getpid())
}

// operatorLoop samples the rule counters, records the server in
// Options.Peers and publishes its status snapshot there every PeerInterval
// until Close, then leaves the peers. A failure to reach the peers is
// logged once at WARN until it changes, and its end at INFO.
func (s *Server) operatorLoop() {
	defer close(s.opsDone)
	t := time.NewTicker(PeerInterval)
	defer t.Stop()
	lastErr := ""
	beat := func() string {
		name, err := s.heartbeat()
		switch {
		case err != nil && err.Error() != lastErr:
			lastErr = err.Error()
			s.log.Warn("status page: could not record this server among the peers; retrying every "+PeerInterval.String(), "err", err)
		case err == nil && lastErr != "":
			lastErr = ""
			s.log.Info("status page: this server is recorded among the peers again")
		}
		return name
	}
	leave := func(name string) {
		if s.ops.peers == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.StoreTimeout)
		defer cancel()
		if err := s.ops.peers.Leave(ctx, name); err != nil {
			s.log.Debug("status page: could not remove this server from the peers", "err", err)
		}
	}
	name := beat()
	for {
		select {
		case <-s.stop:
			leave(name)
			return
		case <-s.beatNow:
		case <-t.C:
			s.ops.sample(s.opts.Now())
		}
		// Run binds the listener after the first beat: the name with the
		// old address goes.
		prev := name
		if name = beat(); name != prev {
			leave(prev)
		}
	}
}
