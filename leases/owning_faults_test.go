package leases

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOwningFaultsBound (written by review): two OwningStores ("a", "b") over one memory store,
// each through a faultyOwning that loses or holds random Own calls (held
// ones run at random later moments, in random order), plus takes and
// leases straight at the store; the clock moves randomly and each owning
// store's loop is stepped at random. Every admission (a take's token at
// its At, a grant's tokens at the grant) must fit one exact token bucket.
func TestOwningFaultsBound(t *testing.T) {
	for _, solo := range []bool{false, true} {
		for seed := range uint64(20) {
			t.Run(fmt.Sprint(solo, seed), func(t *testing.T) {
				ctx := context.Background()
				rng := rand.New(rand.NewPCG(seed, 7))
				clk := newTestClock(time.Unix(1_700_000_000, 0))
				mem := NewMemoryStore(MemoryOptions{Now: clk.Now, SweepInterval: -1})
				t.Cleanup(func() { _ = mem.Close() })
				b := Bucket{Algorithm: TokenBucket, Limit: 50, Period: time.Second, Burst: 10, LeaseTTL: 200 * time.Millisecond}
				fa, fb := newFaultyOwning(mem), newFaultyOwning(mem)
				sa, sb := newOwning(t, fa, clk, "a"), newOwning(t, fb, clk, "b")
				type adm struct {
					at   int64
					cost int64
					who  string
				}
				var adms []adm
				ranA, ranB := 0, 0
				var log []string
				for step := range 3000 {
					clk.Advance(time.Duration(rng.IntN(8000)) * time.Microsecond)
					now := clk.Now().UnixMicro()
					switch r := rng.IntN(100); {
					case r < 50:
						s, who := sa, "a"
						if !solo && rng.IntN(4) == 0 {
							s, who = sb, "b"
						}
						// An op in flight or due: the take waits for a step;
						// give up at once (nothing taken).
						tctx, cancel := context.WithTimeout(ctx, time.Millisecond)
						out, err := s.Take(tctx, []TakeOp{{Key: "k", Bucket: b, Cost: 1}})
						cancel()
						if err == nil && out[0].Taken {
							adms = append(adms, adm{out[0].At, 1, who})
						}
					case r < 53 && !solo:
						out, err := mem.Take(ctx, []TakeOp{{Key: "k", Bucket: b, Cost: 1}})
						require.NoError(t, err)
						if out[0].Taken {
							adms = append(adms, adm{now, 1, "store"})
						}
					case r < 54 && !solo:
						id := NewLeaseID()
						o := Owner{Client: "c", Process: "p"}
						lo, err := mem.Lease(ctx, o, []LeaseOp{{Key: "k", Bucket: b, Want: 2, NewLeaseID: id}})
						require.NoError(t, err)
						if lo[0].Granted > 0 {
							adms = append(adms, adm{now, lo[0].Granted, "lease"})
							_, err = mem.Lease(ctx, o, []LeaseOp{{Key: "k", Bucket: b, LeaseID: id, Used: lo[0].Granted}})
							require.NoError(t, err)
						}
					case r < 70:
						if rng.IntN(6) == 0 {
							fa.fault([]string{"lose", "hold"}[rng.IntN(2)])
						}
						sa.step(ctx)
					case r < 76:
						if rng.IntN(6) == 0 {
							fb.fault([]string{"lose", "hold"}[rng.IntN(2)])
						}
						sb.step(ctx)
					case r < 80:
						// a held call runs now (not in order).
						f, ran := fa, &ranA
						if rng.IntN(2) == 0 {
							f, ran = fb, &ranB
						}
						f.mu.Lock()
						n := len(f.held)
						f.mu.Unlock()
						if *ran < n {
							i := *ran + rng.IntN(min(2, n-*ran))
							f.mu.Lock()
							f.held[i], f.held[*ran] = f.held[*ran], f.held[i]
							ops := f.held[*ran]
							f.mu.Unlock()
							*ran++
							_, err := f.own.Own(ctx, ops)
							require.NoError(t, err)
							log = append(log, fmt.Sprintf("step %d: ran held %+v", step, ops))
						}
					}
				}
				slices.SortStableFunc(adms, func(x, y adm) int { return int(x.at - y.at) })
				ref := newTBState(&b, adms[0].at-int64(time.Hour/time.Microsecond))
				over := 0
				for i, a := range adms {
					if !ref.take(&b, a.cost, 0, 0, a.at).Taken {
						over++
						if over < 4 {
							t.Errorf("admission %d (%s, %d at %d): over the bound", i, a.who, a.cost, a.at)
						}
						ref.level -= float64(a.cost)
					}
				}
				t.Logf("%d admissions, %d over; a %+v, b %+v", len(adms), over, sa.Stats(), sb.Stats())
			})
		}
	}
}
