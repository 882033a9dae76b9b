package server

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// The fleet on the status page. Every PeerInterval each server records
// itself in Options.Peers (Beat), and every other one (snapshotRefresh) it
// publishes there a status snapshot (Publish): its per-rule decision
// counts and rates, its two top-K summaries (every counter, with the
// summary's total and floor) and its ratelease_open_leases, as JSON
// (statusSnapshot), which lives for SnapshotTTL. So the fleet view costs
// the store the same whatever the traffic — one ZADD every PeerInterval
// and one SET every snapshotRefresh per server (see RedisPeers, and
// ratelease_peer_commands_total, which counts them) — a cost per second,
// never per decision. (Publishing at every interval when the figures
// changed, as servers did before, made a busy fleet cost twice the SETs
// of an idle one, for figures two seconds fresher.) In
// Redis (NewRedisPeers) a snapshot is one string key,
// RedisSnapshotPrefix + the server's name, so all of them share one hash tag
// and one MGET reads them, on Redis Cluster too. A snapshot is a few
// hundred bytes plus its keys: at most about 60 KB, with both summaries
// full of 256-byte keys.
//
// The page of any server lists the servers seen in the last PeerWindow,
// reads their snapshots, and merges them with its own figures, taken live:
// counts and rates are summed (each server's rates are over its own last
// minute), top-K summaries are merged (mergeKeys), open leases are summed.
// The servers table says which servers were counted and how old their
// snapshot is; a server listed without a snapshot (it stopped, or runs a
// build that does not publish) is listed and not counted. When the page
// cannot read the other servers (no Options.Peers: the memory store; or
// the store fails), it shows this server's figures alone and says so.

// snapshotVersion is the version of statusSnapshot's encoding. A server
// skips a snapshot of another version, so that servers of different
// builds may share a store.
const snapshotVersion = 1

// statusSnapshot is what a server publishes for the fleet's status page.
type statusSnapshot struct {
	Version    int                  `json:"v"`
	Server     string               `json:"server"`
	At         int64                `json:"at_ms"`     // when it was taken, Unix milliseconds
	Window     int64                `json:"window_ms"` // the window of the rates
	Rules      map[string]ruleRates `json:"rules"`
	Busiest    keySummary           `json:"busiest"`
	Denied     keySummary           `json:"denied"`
	OpenLeases int                  `json:"open_leases"`
}

// keySummary is a top-K summary as published: every counter, the weight
// of the whole stream, and Floor, the most a key without a counter may
// weigh (the smallest count when the summary is full, else 0).
type keySummary struct {
	K       int         `json:"k"`
	Total   int64       `json:"total"`
	Floor   int64       `json:"floor"`
	Entries []topKEntry `json:"entries"`
}

// snapshot returns this server's status snapshot now, under name.
func (s *Server) snapshot(name string, now time.Time) statusSnapshot {
	rates, window := s.ops.rates(now)
	return statusSnapshot{
		Version:    snapshotVersion,
		Server:     name,
		At:         now.UnixMilli(),
		Window:     window.Milliseconds(),
		Rules:      rates,
		Busiest:    s.ops.busiest.summary(),
		Denied:     s.ops.denied.summary(),
		OpenLeases: s.ops.openLeases(),
	}
}

// published is the status snapshot a server last published: under which
// name, and when. Its mutex is held for a whole heartbeat, so heartbeats
// run one at a time (see heartbeatLocked).
type published struct {
	mu   sync.Mutex
	name string
	at   time.Time
}

// heartbeat records this server in Options.Peers and publishes its status
// snapshot there, under its name now, which it returns. The operator's
// loop calls it every PeerInterval; it does nothing without Options.Peers.
//
// The snapshot is published every other heartbeat (snapshotRefresh): when
// the one published under this name is more than one and a half intervals
// old, so that a heartbeat a little early or late does not skip a round
// and let it expire; or when none is (the server's first heartbeat, or a
// new name). The store's cost does not depend on the traffic.
func (s *Server) heartbeat() (string, error) {
	last := &s.ops.published
	last.mu.Lock()
	defer last.mu.Unlock()
	return s.heartbeatLocked(last)
}

// heartbeatLocked is heartbeat with last, s.ops.published, locked: one
// heartbeat at a time, the operator loop's (at start, when Run has bound
// the listener, and every PeerInterval) or a test's that counts the
// commands of its own.
func (s *Server) heartbeatLocked(last *published) (string, error) {
	name := selfName(*s.listenAddr.Load())
	if s.ops.peers == nil {
		return name, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StoreTimeout)
	defer cancel()
	now := s.opts.Now()
	if err := s.ops.peers.Beat(ctx, name, now); err != nil {
		return name, err
	}
	if last.name == name && now.Sub(last.at) < snapshotRefresh-PeerInterval/2 && !now.Before(last.at) {
		return name, nil
	}
	doc, err := json.Marshal(s.snapshot(name, now))
	if err != nil {
		return name, fmt.Errorf("server: encode the status snapshot: %w", err)
	}
	if err := s.ops.peers.Publish(ctx, name, doc, SnapshotTTL); err != nil {
		last.name = "" // published again at the next heartbeat
		return name, err
	}
	last.name, last.at = name, now
	return name, nil
}

// fleetView is what the status page shows of the fleet.
type fleetView struct {
	Fleet      bool   // the other servers were read; false: this server only
	Note       string // how the figures were gathered, or why alone
	Counted    int    // servers whose figures are summed
	Rates      map[string]ruleRates
	Busiest    statusKeys
	Denied     statusKeys
	OpenLeases int
	Peers      []statusPeer
}

// fleet gathers the figures of the servers sharing the store, this one's
// live (see the top of this file). self is this server's name.
func (s *Server) fleet(ctx context.Context, self string, now time.Time) fleetView {
	local := s.snapshot(self, now)
	selfRow := statusPeer{Name: self, Self: true, Counted: true, OpenLeases: local.OpenLeases}
	if s.ops.peers == nil {
		return merged([]statusSnapshot{local}, []statusPeer{selfRow}, false,
			"This server only: it shares no store with other servers (the memory store, or Options.Peers unset).")
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.StoreTimeout)
	defer cancel()
	peers, err := s.ops.peers.List(ctx, now.Add(-PeerWindow))
	var raw [][]byte
	var names []string
	if err == nil {
		for _, p := range peers {
			if p.Name != self {
				names = append(names, p.Name)
			}
		}
		raw, err = s.ops.peers.Snapshots(ctx, names)
	}
	if err != nil {
		s.log.WarnContext(ctx, "status page: could not read the other servers; showing this server's figures alone", "err", err)
		return merged([]statusSnapshot{local}, []statusPeer{selfRow}, false,
			"This server only: the store did not answer, so the other servers' figures are unknown. "+err.Error())
	}
	snaps := []statusSnapshot{local}
	rows := make([]statusPeer, 0, len(peers)+1)
	found, i := false, 0
	for _, p := range peers {
		if p.Name == self {
			rows = append(rows, statusPeer{Name: p.Name, Ago: max(0, now.Sub(p.Seen)), Self: true, Counted: true, OpenLeases: local.OpenLeases})
			found = true
			continue
		}
		row := statusPeer{Name: p.Name, Ago: max(0, now.Sub(p.Seen))}
		var snap statusSnapshot
		switch doc := raw[i]; {
		case doc == nil:
			row.Missing = "no snapshot in the last " + SnapshotTTL.String() + ": stopped, or a build that does not publish one"
		case json.Unmarshal(doc, &snap) != nil || snap.Version != snapshotVersion:
			row.Missing = "a snapshot this build cannot read"
		default:
			row.Counted, row.Published, row.OpenLeases = true, max(0, now.Sub(time.UnixMilli(snap.At))), snap.OpenLeases
			snaps = append(snaps, snap)
		}
		i++
		rows = append(rows, row)
	}
	if !found {
		rows = append(rows, selfRow)
	}
	return merged(snaps, rows, true, fmt.Sprintf(
		"Figures of %d servers, summed: this server's as they are now, the others' as they published them (every %s; kept %s).",
		len(snaps), snapshotRefresh, SnapshotTTL))
}

// merged sums snaps into a fleetView with the servers rows.
func merged(snaps []statusSnapshot, rows []statusPeer, fleet bool, note string) fleetView {
	v := fleetView{Fleet: fleet, Note: note, Counted: len(snaps), Rates: map[string]ruleRates{}, Peers: rows}
	busiest := make([]keySummary, len(snaps))
	denied := make([]keySummary, len(snaps))
	for i, sn := range snaps {
		for rule, r := range sn.Rules {
			sum := v.Rates[rule]
			sum.add(r)
			v.Rates[rule] = sum
		}
		busiest[i], denied[i] = sn.Busiest, sn.Denied
		v.OpenLeases += sn.OpenLeases
	}
	v.Busiest = mergeKeys("busiest-keys", busiest, topKeysShown)
	v.Denied = mergeKeys("denied-keys", denied, topKeysShown)
	return v
}

// mergeKeys merges top-K summaries of disjoint streams (one per server)
// into the table of the n heaviest keys, with the HTML id id.
//
// A key's weight in stream i lies in [Count−Err, Count] when summary i
// counts it, and in [0, Floor] when it does not. So the merged Count, an
// upper bound, sums the counts and the floors of the summaries that do not
// count the key, and the merged Err is Count minus the sum of the lower
// bounds. Every error of summary i is at most its Total/K, so the merged
// MaxErr is the sum of those; a key heavier than the sum of the floors is
// counted by some summary, so it is among the merged keys.
func mergeKeys(id string, sums []keySummary, n int) statusKeys {
	type acc struct{ count, lower, floors int64 }
	byKey := map[string]*acc{}
	out := statusKeys{ID: id}
	var floors int64
	for _, ks := range sums {
		floors += ks.Floor
		out.Total += ks.Total
		if ks.K > 0 {
			out.MaxErr += ks.Total / int64(ks.K)
		}
		for _, e := range ks.Entries {
			a := byKey[e.Key]
			if a == nil {
				a = &acc{}
				byKey[e.Key] = a
			}
			a.count += e.Count
			a.lower += e.Count - e.Err
			a.floors += ks.Floor
		}
	}
	out.Entries = make([]topKEntry, 0, len(byKey))
	for k, a := range byKey {
		c := a.count + floors - a.floors
		out.Entries = append(out.Entries, topKEntry{Key: k, Count: c, Err: c - a.lower})
	}
	sortEntries(out.Entries)
	if len(out.Entries) > n {
		out.Entries = out.Entries[:n]
	}
	return out
}
