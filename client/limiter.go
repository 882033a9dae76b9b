package client

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/ratelease/ratelease/protocol"
)

// Limiter is a handle for a fixed set of keys, for the hot path: Allow on a
// key with a live lease takes no lock, allocates nothing and makes no
// system call. Create it once with Client.Limiter and keep it.
type Limiter struct {
	c      *Client
	keys   []string
	states []atomic.Pointer[keyState]
	err    error
}

// Limiter returns a handle for keys (all of them, all or nothing; a key
// named twice counts once). If a key is invalid (see protocol.ValidateKey),
// or keys holds none or more than protocol.MaxEntries, the Limiter denies
// every request and Err says why (an error matching ErrInvalidRequest):
// Allow and AllowN return false, Decide a Decision with Source
// SourceDenied and that Err, and Wait returns it, without a call.
func (c *Client) Limiter(keys ...string) *Limiter {
	keys = distinctKeys(keys)
	l := &Limiter{c: c, keys: append([]string(nil), keys...)}
	if len(keys) == 0 || len(keys) > protocol.MaxEntries {
		l.err = fmt.Errorf("%w: Limiter needs 1 to %d keys, not %d", ErrInvalidRequest, protocol.MaxEntries, len(keys))
		return l
	}
	for _, k := range keys {
		if err := protocol.ValidateKey(k); err != nil {
			// No states: Allow's one-key path is never taken, and every
			// method denies with l.err. The state of a key before the
			// invalid one was set, an invalid key's was nil, and Allow on
			// a Limiter of one invalid key panicked on it (found by the
			// API review).
			l.err = invalidKey(k, err)
			return l
		}
	}
	l.states = make([]atomic.Pointer[keyState], len(keys))
	for i, k := range keys {
		l.states[i].Store(c.state(k))
	}
	return l
}

// Err returns why the Limiter denies everything, or nil.
func (l *Limiter) Err() error { return l.err }

// Keys returns the Limiter's keys.
func (l *Limiter) Keys() []string { return append([]string(nil), l.keys...) }

// Allow reports whether one request may happen now, spending one token of
// each key. With a live lease it is decided by one atomic operation per key;
// otherwise as Client.Allow decides with a context that never ends: a
// direct take waits about one round trip, but the first decision to find
// the servers down waits for its call to fail, Config.RequestTimeout per
// attempt (2 s by default with one server, which is tried twice). Use
// Decide with a context to bound that wait.
func (l *Limiter) Allow() bool {
	if len(l.states) == 1 {
		if ls := l.states[0].Load().active.Load(); ls != nil && ls.spend(1, l.c) {
			return true
		}
	}
	return l.Decide(context.Background(), 1).Allowed
}

// AllowN is Allow for n tokens of each key (false for n below 1 or above
// protocol.MaxCount).
func (l *Limiter) AllowN(n int64) bool {
	return l.Decide(context.Background(), n).Allowed
}

// Decide is AllowN with the full Decision; a direct take waits at most
// until ctx ends.
func (l *Limiter) Decide(ctx context.Context, n int64) Decision {
	if l.err != nil {
		l.c.denied.Add(1)
		return Decision{Source: SourceDenied, Err: l.err}
	}
	if err := checkCount(n, len(l.keys)); err != nil {
		l.c.denied.Add(1)
		return Decision{Source: SourceDenied, Err: err}
	}
	var buf [4]*keyState
	states := l.resolve(buf[:0])
	d := l.c.decide(ctx, n, states, 0)
	l.c.count(d.Allowed, d.Source)
	return d
}

// Wait blocks until one request may happen for every key, as Client.Wait.
func (l *Limiter) Wait(ctx context.Context) error {
	if l.err != nil {
		l.c.denied.Add(1) // as WaitN counts invalid arguments
		return l.err
	}
	return l.c.WaitN(ctx, 1, l.keys...)
}

// resolve returns the keys' states, replacing forgotten ones.
func (l *Limiter) resolve(buf []*keyState) []*keyState {
	for i := range l.states {
		ks := l.states[i].Load()
		if ks.dead.Load() {
			ks = l.c.state(l.keys[i])
			l.states[i].Store(ks)
		}
		buf = append(buf, ks)
	}
	return buf
}
