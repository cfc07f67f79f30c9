package inventory

import (
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
)

// BenchmarkScoreTiers is BenchmarkScoreSmall's case (a 64-block prompt over
// 64 endpoints holding a spread of its prefixes) with offload tiers:
// "gpu" has no other medium (the GPU-only path), "cpuPresent" adds a CPU
// table holding unrelated blocks (the tiered path, every prefix on the GPU),
// "gpuHeadCpuTail" puts the second half of each endpoint's prefix in CPU
// memory only. docs/selection.md ("Offload tiers in the score") records the
// results:
//
//	go test -run '^$' -bench 'ScoreTiers|ScoreSmall/leadingRun/new' -count 6 ./pkg/inventory
func BenchmarkScoreTiers(b *testing.B) {
	const nEps = 64
	prompt := make([]uint64, 64)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	eligible := epset.FirstN(nEps)
	eligible.Remove(5)
	eligible.Remove(9)
	for _, layout := range []string{"gpu", "cpuPresent", "gpuHeadCpuTail"} {
		ix, err := New(Options{})
		if err != nil {
			b.Fatal(err)
		}
		for e := range nEps {
			n := (e * 13) % 64
			split := n
			if layout == "gpuHeadCpuTail" {
				split = n / 2
			}
			if err := ix.Add(e, 0, "GPU", prompt[:split]); err != nil {
				b.Fatal(err)
			}
			if err := ix.Add(e, 0, "CPU", prompt[split:n]); err != nil {
				b.Fatal(err)
			}
		}
		if layout == "cpuPresent" {
			if err := ix.Add(0, 0, "CPU", []uint64{1 << 60}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(layout, func(b *testing.B) {
			var counts [epset.Max]uint32
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c0 := threadCPU()
			for b.Loop() {
				ix.Score(prompt, eligible, true, &counts)
			}
			b.ReportMetric(float64(threadCPU()-c0)/float64(b.N), "cpu-ns/op")
			if ep, _ := Best(&counts, eligible); ep < 0 {
				b.Fatal("no match")
			}
		})
	}
}
