package leases

import (
	"context"
	"errors"
	"math"
	"time"
)

// Errors of a Store. Per-operation errors (ErrUnknownLease,
// ErrUsedExceedsGranted) come back in Outcome.Err and fail that operation
// alone; ErrStoreUnavailable wraps a failure of the whole call.
var (
	// ErrUnknownLease: the lease ID names no open lease of this owner and
	// key. It expired, was settled already, belongs to another owner, or
	// never existed. Nothing changed.
	ErrUnknownLease = errors.New("unknown lease: it expired, was settled already, or is not this client's")
	// ErrUsedExceedsGranted: a settle reported more tokens used than the
	// lease granted. Nothing changed.
	ErrUsedExceedsGranted = errors.New("used exceeds the lease's grant")
	// ErrTooManyLeases: opening the lease would exceed a cap on the open
	// leases of the key (LeaseLimits). Nothing changed; settling or
	// returning open leases is never refused.
	ErrTooManyLeases = errors.New("too many open leases on this key")
	// ErrStoreUnavailable: the store could not be reached or failed; the
	// call may be retried. Nothing is known to have changed.
	ErrStoreUnavailable = errors.New("store unavailable")
)

// Owner identifies who holds a lease: the authenticated client (the
// principal a server knows by its credentials) and the process of that
// client (the client_id it sends, free text). A lease can be settled only by
// its owner. Fair share splits a shared key between clients first and then
// between the processes of each client, so a client gains nothing by
// inventing process ids.
//
// Client must not contain '/': the stores join the two as
// "client/process", which stays unambiguous because process is the rest.
type Owner struct {
	Client  string
	Process string
}

// String returns "client/process".
func (o Owner) String() string { return o.Client + "/" + o.Process }

// Default caps of LeaseLimits.
const (
	// DefaultMaxLeasesPerKey is the most open leases a key holds when
	// LeaseLimits.MaxLeasesPerKey is zero.
	DefaultMaxLeasesPerKey = 10_000
	// DefaultMaxProcessesPerClient is the most processes of one client
	// that hold leases on one key when LeaseLimits.MaxProcessesPerClient is
	// zero.
	DefaultMaxProcessesPerClient = 1_000
)

// LeaseLimits cap the open leases of one key, so that the work and memory of
// a key stay bounded whatever its holders do. A grant that would open a
// lease beyond a cap fails with ErrTooManyLeases; renewing a lease in the
// same slot, settling and returning are never refused. The zero value
// applies the defaults; a negative field removes that cap.
type LeaseLimits struct {
	// MaxLeasesPerKey caps the open leases of the key, all owners and
	// slots together.
	MaxLeasesPerKey int
	// MaxProcessesPerClient caps the processes of one client holding
	// leases on the key.
	MaxProcessesPerClient int
}

func (l LeaseLimits) maxLeases() int { return capOr(l.MaxLeasesPerKey, DefaultMaxLeasesPerKey) }
func (l LeaseLimits) maxProcesses() int {
	return capOr(l.MaxProcessesPerClient, DefaultMaxProcessesPerClient)
}

func capOr(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return math.MaxInt32
	}
	return v
}

// Bucket holds the parameters of one key's bucket, taken from its rule. A
// Store keeps no rules: each call says which parameters apply, so a rules
// reload takes effect at the next call on the key.
type Bucket struct {
	Algorithm Algorithm
	// Limit tokens are added per Period.
	Limit  int64
	Period time.Duration
	// Burst is the bucket size.
	Burst int64
	// LeaseTTL is the lifetime of a new lease.
	LeaseTTL time.Duration
}

// ratePerMicro returns the refill rate in tokens per microsecond.
func (b *Bucket) ratePerMicro() float64 {
	return float64(b.Limit) / float64(b.Period.Microseconds())
}

// LeaseOp settles and grants the lease of one owner and key in one atomic
// step.
type LeaseOp struct {
	Key    string
	Bucket Bucket
	// Want is the number of tokens asked for; 0 grants nothing.
	Want int64
	// LeaseID, when set, names the owner's open lease to settle first, of
	// which Used tokens were spent. When empty and the owner holds an open
	// lease on the key, that lease is closed as if fully spent: at most one
	// lease per owner and key is ever open.
	LeaseID string
	Used    int64
	// NewLeaseID names the lease opened by a grant. The caller generates
	// it (see NewLeaseID) so that every store names leases alike.
	NewLeaseID string
	// Slot is 0 or 1: an owner may hold one open lease per key in each
	// slot (see protocol.LeaseEntry.Slot). Fair share and safe rate count
	// owners, not slots.
	Slot int
	// Limits cap the open leases of the key.
	Limits LeaseLimits
	// Floor is the part of the limit's capacity (the burst of a token
	// bucket, the limit of a window, the queue of a leaky bucket) that
	// this grant must leave free: the share a rule reserves for the
	// priority classes above the owner's (see Rule.Floor). A grant may use
	// max(0, free − Floor) of what is free; its RetryAfter is the time
	// until Floor + 1 are free. 0 changes nothing.
	Floor int64
	// MaxDelay, when positive, lets a token bucket defer a grant it would
	// refuse now: it grants the owner's whole batch at once, with Delay
	// the wait until the refill (and, on a shared key, the owner's fair
	// share) covers it, when that wait is at most MaxDelay and half the
	// lease TTL. The level goes into debt meanwhile, and the owner must not
	// spend a deferred token before Delay has passed. Ignored when Floor is
	// set and by the other algorithms. 0 never defers.
	MaxDelay time.Duration
}

// LeaseOutcome is the result of one LeaseOp.
type LeaseOutcome struct {
	// Err is ErrUnknownLease, ErrUsedExceedsGranted or ErrTooManyLeases
	// when the operation failed; nothing changed then (but leases of any
	// owner found expired were closed, counted in Expired) and the other
	// fields are zero. It wraps ErrStoreUnavailable when the store failed
	// for this op alone (a Redis Cluster node down, while the others
	// answer): nothing is granted, and what the op may have changed without
	// its answer errs on the side of the limit (a lease it settled or
	// replaced expires by its TTL, counted as spent).
	Err error
	// Granted tokens are in the new lease LeaseID, valid for TTL.
	Granted int64
	LeaseID string
	TTL     time.Duration
	// RetryAfter is set when tokens were wanted and none granted: the time
	// until the bucket can serve one token above the op's Floor, assuming
	// no lease is settled early. It is negative when the Floor leaves the
	// bucket nothing it could ever grant.
	RetryAfter time.Duration
	// Remaining is the number of whole tokens in the bucket after the
	// operation.
	Remaining int64
	// Reset is the time until the bucket is whole again (Remaining back at
	// its size) if nothing else happens: for a token bucket, its refill to
	// the burst; for a window, the window's end. RateLimit headers carry it.
	Reset time.Duration
	// Delay is the time from now until the first of the granted tokens
	// may be spent. Algorithms that shape (leaky_bucket) set it with every
	// grant, and the other tokens follow one every Period/Limit; a token
	// bucket sets it on a deferred grant (LeaseOp.MaxDelay), and then
	// every token may be spent from then on. Zero otherwise.
	Delay time.Duration
	// Holders is the number of equal parts the key is shared in for this
	// owner after the operation: the clients holding open leases on it
	// times the processes of this owner's client holding open leases,
	// counting this owner (and its client) as holding even if it holds
	// none. A process with leases in both slots counts once. The fair share
	// and the safe rate are the bucket's divided by Holders.
	Holders int
	// Settled is true when LeaseID was settled.
	Settled bool
	// Owned is true when tokens were wanted and none granted because a
	// lease server owns the bucket (see Owning): RetryAfter is then at
	// most 100 ms, and the key's requests are best decided by direct takes
	// meanwhile, which reach the owner.
	Owned bool
	// Expired counts the leases of any owner on this key found expired and
	// closed without credit during the operation (including a lease replaced
	// because the owner asked again without its lease ID).
	Expired int
}

// TakeOp takes Cost tokens from one key's bucket outright, without a lease:
// all of them or none.
type TakeOp struct {
	Key    string
	Bucket Bucket
	Cost   int64
	// MaxDelay is, for a shaping algorithm (leaky_bucket), the longest
	// wait for the take's slot the caller accepts: a slot further away is
	// not taken (the take is denied, RetryAfter the time until one would
	// be near enough). Nil means no maximum; zero, the slot must be now.
	// The other algorithms ignore it.
	MaxDelay *time.Duration
	// At is, for Refund, the At of the take's outcome. The windows count
	// takes by their time and give back only from where this take counted
	// (nothing once its window or log bucket has passed); the leaky bucket
	// gives back the take's slots only while they are the last handed out;
	// zero gives back nothing there. The token bucket ignores it.
	At int64
	// Floor is, for Take, the part of the limit's capacity the take must
	// leave free, as in LeaseOp.Floor: the take needs Cost + Floor free,
	// and its RetryAfter is the time until they are (negative when Cost +
	// Floor exceeds the capacity). 0 changes nothing; Refund ignores it.
	Floor int64
	// Server names the lease server making the take, for a token bucket
	// (OwningStore sets it; empty otherwise): a bucket taken through more
	// than one server within a lease TTL is not given to an owner (see
	// Owning), since the owner would refuse the others' takes.
	Server string
}

// TakeOutcome is the result of one TakeOp.
type TakeOutcome struct {
	// Taken is true when Cost tokens were taken.
	Taken bool
	// RetryAfter is set when the tokens were not taken: the time until the
	// bucket holds Cost tokens, assuming no lease is settled early. It is
	// negative when Cost is larger than the bucket (it can never be served).
	RetryAfter time.Duration
	Remaining  int64
	// Reset is as in LeaseOutcome.
	Reset time.Duration
	// Delay is set by algorithms that shape (leaky_bucket) when the tokens
	// were taken: the time from now until the request's slot. Zero for the
	// others.
	Delay   time.Duration
	Expired int
	// At is the take's stamp, for Refund (TakeOp.At): the store's clock
	// (µs) at the take, or for leaky_bucket the end of the take's slots.
	At int64
	// Owned is set when the take was refused because a lease server owns
	// the bucket (see Owning); OwnedByServer too when that server is
	// TakeOp.Server.
	Owned, OwnedByServer bool
	// Err, when set, wraps ErrStoreUnavailable: the store failed for this
	// op alone (a Redis Cluster node down, while the others answer), and
	// nothing is taken as far as the caller knows.
	Err error
}

// BucketState is a snapshot of one key's bucket, for tests and operators.
// Taking it changes nothing. The durations are rounded up to whole
// milliseconds, as an outcome's RetryAfter and Reset are, and assume that
// nothing happens meanwhile: no take, no grant, no settle, and every open
// lease running to its expiry unsettled.
type BucketState struct {
	// Level is, for a token bucket, the number of tokens in the bucket,
	// refilled to Now (while a lease server owns it, the most the owner
	// can hold: the level at the acquisition and the refill since, under
	// the burst); for a window algorithm, what the window still admits
	// (the limit less the count or estimate); for a leaky bucket, the
	// length of its queue in slots (0 when empty).
	Level float64
	// Free is the number of whole tokens a take could take now: an
	// outcome's Remaining (zero while a lease server owns the bucket).
	Free int64
	// Outstanding is the number of tokens granted in open leases.
	Outstanding int64
	// Leases is the number of open leases (a token bucket's waiters, which
	// hold zero tokens, included).
	Leases int
	// Holders is the number of distinct owners (client and process) that
	// hold at least one open lease; an owner with a lease in each slot
	// counts once. The Redis store reads it from the key's expiry index,
	// so its cost grows with the open leases of the key (bounded by
	// LeaseLimits.MaxLeasesPerKey); the memory store from its per-client
	// counts.
	Holders int
	// Next is the time until Free is one more than now; zero when the
	// bucket is whole (Full is zero). Per algorithm:
	//   - token_bucket: the refill of the next whole token (the level
	//     refills up to Burst − Outstanding; the tokens held in leases
	//     come back by their settles);
	//   - fixed_window: the end of the current window;
	//   - sliding_window_counter: the moment the estimate has fallen by
	//     enough (the previous window's weight decays, then the current
	//     one's in the next window);
	//   - sliding_window_log: the moment the oldest entry the log counts
	//     leaves the window (an open lease is an entry ending at its
	//     expiry); should the log hold more than the limit after a rule
	//     lowered it, Free may still be zero then;
	//   - leaky_bucket: the moment the next slot of the queue is free.
	Next time.Duration
	// Full is the time until the bucket is whole again; zero when it is.
	// Per algorithm:
	//   - token_bucket: the refill to Burst − Outstanding, the most it
	//     holds while those leases are open;
	//   - fixed_window: the end of the current window;
	//   - sliding_window_counter: the moment the estimate is zero: the end
	//     of the next window when the current one counts anything, else
	//     the end of the current one;
	//   - sliding_window_log: the moment the newest entry leaves the
	//     window (an upper bound: the latest end the log recorded);
	//   - leaky_bucket: the moment the queue is empty.
	Full time.Duration
	// WindowEnd is, for fixed_window and sliding_window_counter, the time
	// until the current window ends (at least 1 ms): the count starts
	// afresh then (for the counter, it becomes the previous window's).
	// Zero for the other algorithms, which have no window boundary.
	WindowEnd time.Duration
	// Now is the store's clock at the snapshot.
	Now time.Time
	// Owner is the lease server owning the token bucket (OwnOp.Server),
	// empty when none does. Next and Full then assume that the ownership
	// expires at its deadline, which empties the bucket.
	Owner string
}

// Store keeps the global buckets and leases. Implementations must be safe
// for concurrent use, and every operation on one key must be atomic:
// package leases ships a memory store and a Redis store, and the suite in
// leases/storetest checks any implementation against the invariant.
//
// The owner of a lease is an Owner: the server passes the authenticated
// client name and the client_id together, so one caller can never settle
// another's lease.
type Store interface {
	// Lease applies ops, each key at most once, and returns one outcome per
	// op in order. A store error (ErrStoreUnavailable) fails the call when
	// no op ran; per-op errors are in the outcomes, a store error for some
	// ops only (some keys' shard down) included.
	Lease(ctx context.Context, owner Owner, ops []LeaseOp) ([]LeaseOutcome, error)
	// Take applies each op independently (the caller does all-or-nothing
	// across keys by giving back with Refund). Store errors are as for
	// Lease: the call fails when no op ran, an op alone in its outcome's
	// Err.
	Take(ctx context.Context, ops []TakeOp) ([]TakeOutcome, error)
	// Refund puts back tokens taken by Take, never filling a bucket above
	// its size minus its outstanding leases. Each op names the take's time
	// (TakeOp.At, from its outcome), so that no algorithm gives back tokens
	// that another request's admission counts.
	Refund(ctx context.Context, ops []TakeOp) error
	// State returns a snapshot of key's bucket without changing it.
	State(ctx context.Context, key string, b Bucket) (BucketState, error)
	// Ping reports whether the store is reachable.
	Ping(ctx context.Context) error
	// Close releases the store's resources. It does not close a Redis client
	// passed in by the caller.
	Close() error
}
