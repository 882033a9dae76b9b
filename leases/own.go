package leases

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Ownership of a bucket by one lease server (the design's "one tier up"):
// a rateleased that decides many direct takes of one key may own the key's
// token bucket for a while — the whole bucket, its level and its refill —
// and decide those takes from memory, exactly as the store would, without
// a Redis call per decision. The store keeps the bucket's record meanwhile
// and refuses everyone else:
//
//   - Own (acquire): granted only while the bucket has no open lease and no
//     other live owner, and no take has come through another server
//     within the last lease TTL (TakeOp.Server names the server a take
//     comes through; a bucket taken through several servers, as behind a
//     load balancer that spreads one key's requests, is never owned, for
//     the owner would refuse the others' takes). The store records the
//     owner, its deadline (now + Bucket.LeaseTTL), the ID of the op
//     (OwnOp.ID) and the bucket's level L0 at that moment t0, and answers
//     L0 and t0: the owner runs the bucket from there, refilling at the
//     rule's rate up to its burst, counting time from when its request was
//     sent (so its clock lags the store's, never leads it).
//   - Renew (OwnOp.Renew) by the same owner before the deadline, with
//     that ID: the deadline moves to now + TTL; nothing else changes. The
//     answer says whether a take or a lease was refused because of the
//     ownership since the last renewal (Contested): the owner should then
//     release, so that the key goes back to being decided by the store for
//     everyone. A renewal that finds no live ownership (it expired: the
//     bucket was emptied at its deadline, and others may have taken from
//     the refill since) changes nothing and is answered not owned: were it
//     to begin one, a renewal that arrived late would hand the owner back
//     the bucket it held before the expiry.
//   - Own by the same owner with another ID (an acquisition that finds an
//     ownership of its server live, or a renewal of another one): when the
//     op is an acquisition and the ownership's ID is among the op's Lost
//     (begun by an acquisition of the same server whose answer was lost,
//     from which nobody decided anything), it begins afresh: the level is
//     L0 + rate·(now − t0), under the burst, as if it had never begun, and
//     the answer is that of an acquisition, with the new ID kept. Otherwise
//     nothing changes, and the answer says the bucket is owned (Owned, ID)
//     but not acquired: the owner cannot know its level and decides
//     nothing from it (OwningStore releases it at level 0). An
//     acquisition with the ownership's own ID is a renewal.
//   - Release, with the ownership's ID: the bucket's level becomes the
//     owner's level, at most L0 + rate·(now − t0) and at most the burst, at
//     the store's now (no refill is credited for the time the release took
//     to arrive). A release with another ID changes nothing.
//   - Expiry (no renewal by the deadline, the owner is gone): the bucket is
//     empty at the deadline and refills from there, as if the owner had
//     spent everything it could: a dead owner never brings back tokens it
//     may have admitted.
//   - While the ownership is live, a take or a lease on the key by anyone
//     (the owner makes none on keys it knows it owns) is refused, with a
//     RetryAfter of at most 100 ms, and marks the ownership contested —
//     but a take through the owner itself (TakeOp.Server), which says so
//     (TakeOutcome.OwnedByServer) and marks nothing: an owner that lost
//     track of its ownership (see the IDs below), which nobody else
//     wants.
//
// The bound holds across owners and the store: an owner admits no more than
// the bucket would have over the same time (its level starts at the
// store's, its clock lags the store's, its refill and cap are the rule's),
// and whatever it hands back is capped by what it could have left.
//
// Why the IDs: an op sent to a Redis master that stalls (a long fork, a
// full machine) times out at the client and may still run when the master
// resumes. Without them, an acquisition that ran after its timeout left
// the store refusing this server's takes as owned, and the next
// acquisition was answered as a renewal, without a level, so the owner
// started from an empty bucket: false denials for as long as the master
// was slow. One ID per ownership is not enough either: the owner sends the
// acquisition again, and the first copy may run after the second began an
// ownership the owner decides from; Lost names exactly the copies whose
// answers the owner will never use, so only an ownership nobody decided
// from is begun afresh, and a late copy that finds another ownership
// changes nothing.
//
// Only the token bucket can be owned; the other algorithms answer ErrNotOwnable.

// ErrNotOwnable is the error of an OwnOp on a bucket whose algorithm cannot
// be owned (every one but token_bucket).
var ErrNotOwnable = errors.New("this algorithm's buckets cannot be owned by a server")

// OwnOp acquires, renews or releases one lease server's ownership of a
// token bucket.
type OwnOp struct {
	Key    string
	Bucket Bucket
	// Server names the owner: unique per lease server process.
	Server string
	// Release ends the ownership (a release by a server that does not own
	// the bucket, or with another ID, changes nothing); Level is then the
	// owner's level.
	Release bool
	Level   float64
	// Renew renews the ownership ID names, and never begins one (see
	// above); without it (and without Release), the op is an acquisition.
	Renew bool
	// ID names the ownership: for an acquisition, a new ID of this op (the
	// store keeps it if the op begins an ownership); for a renewal or a
	// release, the ID of the acquisition that began the ownership. At most
	// MaxOwnIDLen lowercase hex digits; empty names the ownerships of
	// servers that set none.
	ID string
	// Lost lists the IDs of this server's earlier acquisitions of the key
	// whose answers were lost (the call failed after they may have run),
	// at most MaxOwnLost: an ownership begun by one of them is begun
	// afresh by this op (see above). Only for an acquisition.
	Lost []string
}

// MaxOwnIDLen is the longest OwnOp.ID, and MaxOwnLost the most OwnOp.Lost
// entries, a store accepts.
const (
	MaxOwnIDLen = 32
	MaxOwnLost  = 16
)

// validOwnID reports whether id is at most MaxOwnIDLen lowercase hex digits.
func validOwnID(id string) bool {
	if len(id) > MaxOwnIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// check validates op's ID and Lost: a bad one fails the op alone.
func (op *OwnOp) check() error {
	if !validOwnID(op.ID) {
		return fmt.Errorf("leases: own op on %q: bad ID %q (at most %d lowercase hex digits)", op.Key, op.ID, MaxOwnIDLen)
	}
	if len(op.Lost) > MaxOwnLost {
		return fmt.Errorf("leases: own op on %q: %d lost IDs (at most %d)", op.Key, len(op.Lost), MaxOwnLost)
	}
	for _, id := range op.Lost {
		if id == "" || !validOwnID(id) {
			return fmt.Errorf("leases: own op on %q: bad lost ID %q", op.Key, id)
		}
	}
	return nil
}

// OwnOutcome is the result of one OwnOp.
type OwnOutcome struct {
	// Owned is true when Server owns the bucket after the op; ID is then
	// the ID of the op that began the ownership.
	Owned bool
	ID    string
	// Acquired is true when the op began a new ownership (none was live
	// for Server): Level and At are then the bucket's level and the
	// store's clock at that moment, from which the owner runs it. A renewal
	// of a live ownership leaves Acquired false.
	Acquired bool
	Level    float64
	// At is the store's clock at the op, in microseconds since the Unix
	// epoch.
	At int64
	// TTL is how long the ownership lasts from the op (Bucket.LeaseTTL),
	// unless renewed.
	TTL time.Duration
	// Contested is set on a renewal when a take or a lease on the key was
	// refused because of this ownership since the last acquisition or
	// renewal.
	Contested bool
	// RetryAfter is set when Owned is false after an acquire: the bucket
	// has open leases or another live owner; do not ask again sooner.
	RetryAfter time.Duration
	// Err is ErrNotOwnable, an error wrapping ErrStoreUnavailable when the
	// store failed for this op alone (a Redis Cluster node down, while the
	// others answer), an error naming a bad ID (see OwnOp.ID), or nil.
	Err error
}

// Owning is implemented by the stores whose token buckets a lease server
// may own (MemoryStore, RedisStore). OwningStore uses it.
type Owning interface {
	// Own runs ops, each atomic on its key. Only a store failure for every
	// op fails the whole call (see Store.Lease).
	Own(ctx context.Context, ops []OwnOp) ([]OwnOutcome, error)
}
