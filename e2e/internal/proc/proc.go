// Package proc holds what the e2e helpers that run child processes share:
// a bounded buffer for a child's output, and the process attributes that
// tie a child's life to the test binary's.
package proc

import "sync"

// Tail is an io.Writer, safe for concurrent use, that keeps the end of what
// was written to it: when more than max bytes are held, it drops all but
// the last max/2, so it holds at most max bytes, and at least max/2 once
// that much was written.
type Tail struct {
	mu   sync.Mutex
	max  int
	data []byte
}

// NewTail returns an empty Tail that holds at most max bytes (max ≥ 2).
func NewTail(max int) *Tail {
	if max < 2 {
		panic("proc: NewTail: max must be at least 2")
	}
	return &Tail{max: max}
}

// Write appends p, then drops the oldest bytes if more than max are held.
// It never fails.
func (b *Tail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.data = append(b.data, p...)
	if len(b.data) > b.max {
		n := copy(b.data, b.data[len(b.data)-b.max/2:])
		b.data = b.data[:n]
	}
	return len(p), nil
}

// String returns everything held.
func (b *Tail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.data)
}

// Last returns the last n bytes held (all of them if fewer are held).
func (b *Tail) Last(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.data
	if len(d) > n {
		d = d[len(d)-n:]
	}
	return string(d)
}
