package client

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// algorithmLeaky is the protocol's name of the leaky bucket, a rule that
// shapes: its leases are schedules of slots, its direct takes may come with
// a delay.
const algorithmLeaky = "leaky_bucket"

// DefaultMaxWait is the Config.MaxWait of the zero value.
const DefaultMaxWait = time.Second

// slots is the schedule of a lease of a shaping rule (leaky_bucket): the
// lease holds a slice of the server's time, one slot every interval, and a
// request may go ahead only at or after its slot's start and only while
// its slot lies within the slice. Requests take slots in order: each one
// occupies [at, at + n·interval), at = max(next, now), and moves next to
// the end of it, so the process's requests are at least interval apart and
// inside the slice, and the slices of all holders never overlap: the
// fleet's outflow is the rule's rate.
//
// The slice is mapped onto the client's clock conservatively: it starts
// when the answer arrived plus the server's delay (rounded up), and ends
// when the request was sent plus the delay less 1 ms (the delay's rounding)
// plus granted slots. So no request goes ahead before the server's slice
// starts or after it ends, whatever the offset between the two clocks; the
// round trip and the rounding cost a slot or so per lease.
type slots struct {
	interval int64 // ns between two slots (rounded up)
	base     int64 // client clock: at or before the slice's start (for the used count)
	end      int64 // client clock: at or before the slice's end; immutable

	mu   sync.Mutex
	next int64 // client clock: the start of the next free slot
}

// newSlots returns the schedule of a lease of granted slots, asked for at
// sent and answered at recv (client clock), whose first slot starts delay
// after the server's decision, one slot every period/limit.
func newSlots(granted, limit int64, period time.Duration, delay time.Duration, sent, recv int64) *slots {
	exact := float64(period) / float64(limit)
	s := &slots{interval: max(1, int64(math.Ceil(exact)))}
	s.base = sent + int64(max(0, delay-time.Millisecond))
	s.end = s.base + int64(math.Floor(exact*float64(granted)))
	s.next = recv + int64(delay)
	return s
}

// reserve takes the next n slots of lease l for a request at now, unless
// the first of them starts more than maxWait after now or they do not fit
// the slice; then it takes nothing. It returns the request's start.
func (s *slots) reserve(l *lease, n, now, maxWait int64) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := max(s.next, now)
	if at-now > maxWait {
		return at, false
	}
	// n slots must fit before the slice ends; compared by division, as
	// n·interval can pass 2^63 (a large n on a long interval wrapped
	// around, passed this check and admitted more than the lease held).
	if at > s.end || n > (s.end-at)/s.interval {
		return at, false
	}
	next := at + n*s.interval
	// The lease reports as used every slot up to next, counted from base:
	// the server gives back only the slots after them.
	used := min(l.granted, (next-s.base+s.interval-1)/s.interval)
	cur := l.remaining.Load()
	if cur < 0 || !l.remaining.CompareAndSwap(cur, min(cur, l.granted-used)) {
		return at, false // frozen by the settle loop
	}
	s.next = next
	return at, true
}

// due returns the time from now until the next slot starts, 0 when it has.
func (s *slots) due(now int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.next-now, 0)
}

// exhausted reports whether no slot is left in the schedule at now.
func (s *slots) exhausted(now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.next, now)+s.interval > s.end
}

type maxWaitKey struct{}

// WithMaxWait returns a copy of ctx under which Wait and WaitN wait up to d
// for the slot of a key whose rule shapes (leaky_bucket), in place of
// Config.MaxWait: for a caller whose bound is its own, as httplimit's and
// grpclimit's MaxWait are. ctx's deadline bounds the wait too. A d ≤ 0
// waits for no slot: one not due at once fails the Wait with an error
// matching ErrRateLimited, taking nothing.
func WithMaxWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxWaitKey{}, d)
}

// maxWait returns how long a Wait may wait for a slot: Config.MaxWait, or
// what WithMaxWait put in ctx, and no later than ctx's deadline.
func (c *Client) maxWait(ctx context.Context) int64 {
	w := int64(c.cfg.MaxWait)
	if d, ok := ctx.Value(maxWaitKey{}).(time.Duration); ok {
		w = int64(d)
	}
	if dl, ok := ctx.Deadline(); ok {
		w = min(w, int64(time.Until(dl)))
	}
	return max(w, 0)
}

// waitShaped serves WaitN for one key leased under a shaping rule: it
// takes the next slots of the key's live lease, if they start within the
// maximum wait and fit the lease, and sleeps until the first of them.
// Waiters are served in slot order, which is the order they reserved in.
// It reports false when the lease cannot serve (no live schedule, or not
// enough slots left in it): the caller then waits as for any key. A slot
// beyond the maximum wait fails at once, taking nothing.
//
// release is called once the slots are reserved, before the sleep: the next
// waiter may reserve the following slots meanwhile.
func (c *Client) waitShaped(ctx context.Context, n int64, ks *keyState, release func()) (bool, error) {
	l := ks.active.Load()
	if l == nil || l.shape == nil {
		return false, nil
	}
	now := c.nanos()
	if now >= l.deadline || now < l.pausedUntil.Load() || l.shape.exhausted(now) {
		return false, nil
	}
	max := c.maxWait(ctx)
	at, ok := l.shape.reserve(l, n, now, max)
	if !ok {
		if at-now > max {
			return true, &RateLimitedError{Keys: []string{ks.key}, RetryAfter: time.Duration(at - now), Source: SourceLease}
		}
		return false, nil
	}
	release()
	return true, c.sleep(ctx, at-now)
}

// sleep waits d on the client's clock, or until ctx ends or the client
// closes.
func (c *Client) sleep(ctx context.Context, d int64) error {
	if d <= 0 {
		return nil
	}
	ch, stop := c.after(time.Duration(d))
	defer stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stopped:
		return ErrClosed
	}
}

// shaped reports whether a result names a shaping rule.
func shaped(algorithm string) bool { return algorithm == algorithmLeaky }

// directDelay returns the longest delay of a direct take's keys.
func directDelay(res *protocol.CheckResponse) time.Duration {
	var d int64
	for i := range res.Keys {
		d = max(d, res.Keys[i].DelayMillis)
	}
	return time.Duration(d) * time.Millisecond
}
