package enginesim

import (
	"fmt"
	"testing"
)

// BenchmarkStep measures the simulator's own CPU time for one engine step
// with n requests decoding (schedule, block growth and caching, completion).
// A step models 6 ms or more of GPU time, so the loop keeps real time while
// this stays well under that. Results: docs/enginesim.md, "Simulator cost".
func BenchmarkStep(b *testing.B) {
	for _, n := range []int{64, 256, 1024} {
		b.Run(fmt.Sprintf("decoders=%d", n), func(b *testing.B) {
			h := newSchedHarness(b, Config{NumGPUBlocks: 200000})
			for i := range n {
				h.submit(seqIDs(1000*(i+1), 500), 2100)
			}
			h.step()
			if b.N > 2000 {
				b.Fatal("run with -benchtime 2000x or fewer: the pool holds 2,000 steps of growth")
			}
			b.ResetTimer()
			for range b.N {
				if h.step() == nil {
					b.Fatal("idle")
				}
				for _, r := range h.st.running {
					drain(r)
				}
			}
		})
	}
}
