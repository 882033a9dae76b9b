package leases

import (
	"slices"
	"strconv"
	"time"
)

// This file is the ownership of a token bucket by a lease server (own.go)
// in Go, as the memory store runs it; scripts/token_bucket.lua (modes own
// and release, and the owned branch of the others) is its Redis twin, with
// the same floating-point operations in the same order.
//
// The record of an ownership is the owner, its deadline and whether it was
// contested; its L0 and t0 are the bucket's own level and refill clock,
// which no call changes while the ownership lasts. So a bucket that is not
// owned carries nothing more, and costs what it always did.

// ownedRetryMax is the longest RetryAfter of a take or a grant refused
// because the bucket is owned: the owner may release it sooner.
const ownedRetryMax = 100 * time.Millisecond

// releaseLevel returns the level op's release claims, made safe: NaN, a
// negative level and zero claim nothing, a level above the burst claims the
// burst. The release caps it further (see tbState.own); both stores apply
// it before anything else, so bad input never reaches a bucket.
func (op *OwnOp) releaseLevel() float64 {
	switch l := op.Level; {
	case !(l > 0): // NaN too
		return 0
	case l > float64(op.Bucket.Burst):
		return float64(op.Bucket.Burst)
	default:
		return l
	}
}

// formatLevel writes a level as the shortest decimal that reads back as
// the same float64, for the Lua script.
func formatLevel(l float64) string { return strconv.FormatFloat(l, 'g', -1, 64) }

// noteTaker records that server's direct take took from the bucket at now,
// while no lease is open and nobody owns it (the Redis store writes the
// bucket's string then, with its takers).
func (s *tbState) noteTaker(server string, now int64) {
	if server == "" || len(s.leases) > 0 || s.owner != nil {
		return
	}
	if s.taker != "" && s.taker != server {
		s.mixedAt = now
	}
	s.taker, s.takenAt = server, now
}

// sharedTakes reports whether takes reached the bucket through a server
// other than server within ttl before now: then it is not owned, since
// the owner would refuse that server's takes. A key whose direct takes the
// SDK routes to one server is taken through that one alone.
func (s *tbState) sharedTakes(server string, now, ttl int64) bool {
	if s.taker == "" {
		return false
	}
	return s.mixedAt > now-ttl || (s.taker != server && s.takenAt > now-ttl)
}

// endOwnership ends an ownership whose deadline is at or before now,
// unrenewed and unreleased: the bucket is empty at the deadline and refills
// from there, as if the owner had spent all it could. It reports whether it
// ended one.
func (s *tbState) endOwnership(now int64) bool {
	w := s.owner
	if w == nil || w.deadline > now {
		return false
	}
	s.level, s.last, s.owner = 0, w.deadline, nil
	return true
}

// own acquires, renews or releases op.Server's ownership at now; level is
// op.releaseLevel().
func (s *tbState) own(b *Bucket, op *OwnOp, level float64, now int64) OwnOutcome {
	s.bucket = *b
	o := OwnOutcome{At: now}
	ttl := b.LeaseTTL.Microseconds()
	ended := s.endOwnership(now)
	if w := s.owner; w != nil {
		switch {
		case w.server != op.Server:
			// Another server's: refused, or a release that changes nothing.
			if !op.Release {
				o.RetryAfter = microsToRetry(w.deadline - now)
			}
		case op.ID != w.id && op.Release:
			// A release of another ownership of this server's (a late
			// copy): nothing changes.
		case op.ID != w.id && !op.Renew && slices.Contains(op.Lost, w.id):
			// Begun by an acquisition of this server's whose answer was
			// lost: nobody decided from it, and takes through other
			// servers were refused meanwhile. Begin afresh, from the
			// level the bucket would have had (the contested mark stays,
			// for the first renewal).
			s.refillTo(b, now)
			w.deadline, w.id = now+ttl, op.ID
			o.Owned, o.Acquired, o.ID, o.Level, o.TTL = true, true, w.id, s.level, b.LeaseTTL
		case op.ID != w.id:
			// An ownership of this server's that op does not know: its
			// level cannot be known, nothing changes.
			o.Owned, o.ID, o.TTL = true, w.id, b.LeaseTTL
		case op.Release:
			// At most what the owner could have left: L0 and the refill
			// since t0, under the burst; the clock is the store's now.
			s.owner = nil
			s.refillTo(b, now)
			if level < s.level {
				s.level = level
			}
		default:
			w.deadline = now + ttl
			o.Owned, o.ID, o.TTL, o.Contested = true, w.id, b.LeaseTTL, w.contested
			w.contested = false
		}
		return o
	}
	lvl, last, open := s.level, s.last, len(s.leases)
	s.advance(b, now)
	if !op.Release && !op.Renew { // a renewal of none begins nothing
		switch {
		case len(s.leases) > 0:
			// Open leases: until the last of them ends, at most one
			// lease TTL.
			o.RetryAfter = microsToRetry(min(s.maxExp-now, ttl))
		case s.level < 0:
			// In debt (a deferred grant, see tbState.deferral): an owner
			// starting from it could not be ended safely at its
			// deadline, which empties the bucket. Ask again once the
			// refill has paid it.
			o.RetryAfter = microsToRetry(microsCeil(-s.level, b.ratePerMicro()))
		case s.sharedTakes(op.Server, now, ttl):
			// Taken through other servers lately: owning it would refuse
			// their takes. Ask again a TTL later.
			o.RetryAfter = microsToRetry(ttl)
		default:
			s.owner = &tbOwner{server: op.Server, deadline: now + ttl, id: op.ID}
			s.taker, s.takenAt, s.mixedAt = "", 0, 0
			o.Owned, o.Acquired, o.ID, o.Level, o.TTL = true, true, op.ID, s.level, b.LeaseTTL
			return o
		}
	}
	if len(s.leases) == open && !ended {
		// Nothing closed, nothing to write (the Redis store writes
		// nothing): keep the state the next refill starts from, as take.
		s.level, s.last = lvl, last
	}
	return o
}

// refuse refuses a take or a grant on the owned bucket at now: it marks the
// ownership contested and returns the RetryAfter, until the deadline and at
// most ownedRetryMax.
func (s *tbState) refuse(now int64) time.Duration {
	s.owner.contested = true
	return microsToRetry(min(s.owner.deadline-now, ownedRetryMax.Microseconds()))
}

// ownedWait returns the time until the owned bucket holds tokens if
// nothing happens meanwhile: the ownership then expires at its deadline,
// empty, and refills from there.
func (s *tbState) ownedWait(b *Bucket, tokens float64, now int64) time.Duration {
	return microsToRetry(s.owner.deadline - now + microsCeil(tokens, b.ratePerMicro()))
}

// ownedTake answers a take on the owned bucket: refused. The store cannot
// tell what the owner has left: Remaining is 0, Reset the wait until whole
// should the ownership expire.
func (s *tbState) ownedTake(b *Bucket, now int64) TakeOutcome {
	return TakeOutcome{RetryAfter: s.refuse(now), Reset: s.ownedWait(b, float64(b.Burst), now), At: now, Owned: true}
}

// ownedLease answers a lease op on the owned bucket: no lease is open to
// settle, and a grant is refused (no waiter is recorded: the bucket stays a
// plain record); asking for nothing is answered and marks nothing.
func (s *tbState) ownedLease(b *Bucket, op *LeaseOp, now int64) LeaseOutcome {
	if op.LeaseID != "" {
		return LeaseOutcome{Err: ErrUnknownLease}
	}
	o := LeaseOutcome{Holders: 1, Reset: s.ownedWait(b, float64(b.Burst), now)}
	if op.Want > 0 {
		o.RetryAfter = s.refuse(now)
		o.Owned = true
	}
	return o
}

// ownedSnapshot is the snapshot of the owned bucket at now: the owner, the
// most it can hold (L0 and the refill since t0, under the burst: what a
// release could bring back now), nothing free (takes are refused), and
// Next and Full as if the ownership expired at its deadline.
func (s *tbState) ownedSnapshot(b *Bucket, now int64) BucketState {
	cp := tbState{level: s.level, last: s.last}
	cp.refillTo(b, now)
	return BucketState{
		Level: cp.level, Owner: s.owner.server,
		Next: s.ownedWait(b, 1, now), Full: s.ownedWait(b, float64(b.Burst), now),
	}
}
