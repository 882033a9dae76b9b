package compare

import (
	"context"
	"sync"
	"time"
)

// decideFunc makes one decision for key on instance inst.
type decideFunc func(ctx context.Context, inst int, key string) decision

// maxInFlight bounds the decisions in flight during a replay: past it the
// pacer waits (and its lag, which the report shows, grows) rather than
// start more workers.
const maxInFlight = 4096

// replayed is what a replay measured.
type replayed struct {
	decisions []decision      // one per arrival, same order
	lag       []time.Duration // when each decision began, less its scheduled time
	elapsed   time.Duration   // from the start of the run to the end of the last decision
	workers   int             // the most decisions that were in flight at once
}

// replay fires each arrival at its scheduled time, open loop: a pacer
// goroutine sleeps until the next arrival is due and hands it to an idle
// worker goroutine, starting a new worker when none is idle (up to
// maxInFlight), so that a slow decision never delays the next arrivals;
// every arrival already due when the pacer wakes is handed out at once.
// The idle worker that finished last is reused first, so that decisions
// run, as in a long-running server, on goroutines whose stacks have
// already grown to what a decision needs (a fresh goroutine per arrival
// would charge each decision its stack growth). A worker reads the clock,
// decides, and reads the clock again: the decision's start and end, since
// the start of the run. keys maps an arrival's key id to its key. ctx
// bounds the replay and every decision: when it ends, the arrivals not yet
// handed out are marked failed, and replay returns once the decisions
// under way have returned.
func replay(ctx context.Context, arr []arrival, keys []string, decide decideFunc) replayed {
	out := replayed{
		decisions: make([]decision, len(arr)),
		lag:       make([]time.Duration, len(arr)),
	}
	base := time.Now().Add(time.Millisecond) // the run's zero
	p := newPool(func(i int) {
		start := time.Since(base)
		d := decide(ctx, int(arr[i].inst), keys[arr[i].key])
		d.start, d.end = start, time.Since(base)
		out.decisions[i] = d
		out.lag[i] = start - arr[i].at
	})
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := range arr {
		if d := time.Until(base.Add(arr[i].at)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil || !p.run(ctx, i) {
			// Out of time: the arrivals left are not decided (failed).
			for j := i; j < len(arr); j++ {
				out.decisions[j] = decision{failed: true, start: arr[j].at, end: arr[j].at}
			}
			break
		}
	}
	out.workers = p.stop()
	for _, d := range out.decisions {
		out.elapsed = max(out.elapsed, d.end)
	}
	return out
}

// pool is replay's set of worker goroutines: the idle ones on a stack
// (last in, first out), at most maxInFlight in all.
type pool struct {
	do   func(i int)
	mu   sync.Mutex
	cond *sync.Cond // signalled when a worker becomes idle
	idle []chan int
	all  []chan int
	wg   sync.WaitGroup
}

func newPool(do func(i int)) *pool {
	p := &pool{do: do}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// run hands arrival i to an idle worker, or to a new one, or waits for one
// to become idle when maxInFlight are busy. It returns false, without
// running i, if ctx ended while it waited.
func (p *pool) run(ctx context.Context, i int) bool {
	p.mu.Lock()
	for len(p.idle) == 0 && len(p.all) >= maxInFlight {
		if ctx.Err() != nil {
			p.mu.Unlock()
			return false
		}
		p.cond.Wait() // a worker finishing signals; each decision is bounded by ctx
	}
	var w chan int
	if n := len(p.idle); n > 0 {
		w = p.idle[n-1]
		p.idle = p.idle[:n-1]
	} else {
		w = make(chan int, 1)
		p.all = append(p.all, w)
		p.wg.Add(1)
		go p.work(w)
	}
	p.mu.Unlock()
	w <- i
	return true
}

func (p *pool) work(w chan int) {
	defer p.wg.Done()
	for i := range w {
		p.do(i)
		p.mu.Lock()
		p.idle = append(p.idle, w)
		p.cond.Signal()
		p.mu.Unlock()
	}
}

// stop waits for the decisions under way, ends the workers and returns
// how many there were.
func (p *pool) stop() int {
	p.mu.Lock()
	for len(p.idle) < len(p.all) {
		p.cond.Wait()
	}
	all := p.all
	p.mu.Unlock()
	for _, w := range all {
		close(w)
	}
	p.wg.Wait()
	return len(all)
}
