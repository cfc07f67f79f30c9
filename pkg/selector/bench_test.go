package selector

import (
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// fixedScorer returns precomputed counts: it measures the selector alone.
type fixedScorer struct {
	counts [epset.Max]uint32
	blocks [epset.Max]int
}

func (f *fixedScorer) Score(_ []uint64, eligible epset.Set, _ bool, counts *[epset.Max]uint32) {
	for ep := eligible.Next(0); ep >= 0; ep = eligible.Next(ep + 1) {
		counts[ep] = f.counts[ep]
	}
}
func (f *fixedScorer) Blocks(ep int) int { return f.blocks[ep] }

// invertedScorer is an inverted index (hash → endpoint set), the shape a
// real inventory has; the leading run walks hashes with a shrinking alive set.
type invertedScorer struct {
	idx    map[uint64]epset.Set
	blocks [epset.Max]int
}

func (v *invertedScorer) Score(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32) {
	alive := eligible
	for _, h := range hashes {
		has := v.idx[h].And(alive)
		for ep := has.Next(0); ep >= 0; ep = has.Next(ep + 1) {
			counts[ep]++
		}
		if leadingRun {
			alive = has
			if alive.Empty() {
				return
			}
		}
	}
}
func (v *invertedScorer) Blocks(ep int) int { return v.blocks[ep] }

type benchLoads struct{ l [epset.Max]int }

func (b *benchLoads) InFlight(ep int) int { return b.l[ep] }

type benchEngine struct{ now time.Time }

func (b *benchEngine) GPUBlocks(ep int) (int64, bool) { return int64(20000 + 1000*(ep%4)), true }
func (b *benchEngine) Waiting(ep int) (int, time.Time, bool) {
	return ep % 3, b.now, true
}

type benchStates struct{ st States }

func (b *benchStates) States() States { return b.st }

func benchSelector(b *testing.B, rule Rule, opts Options, scorer Scorer) *Selector {
	b.Helper()
	now := time.Unix(1_800_000_000, 0)
	loads := &benchLoads{}
	for i := range loads.l {
		loads.l[i] = (i * 7) % 11
	}
	s, err := New(rule, opts, Deps{
		Scorer: scorer, Loads: loads, Engine: &benchEngine{now: now},
		States: &benchStates{st: States{ProbeDown: epset.Of(5), BreakerOpen: epset.Of(9)}},
		Now:    func() time.Time { return now },
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func bench64Rule(pd bool) Rule {
	if !pd {
		return poolRule(64, 0)
	}
	r := Rule{ServiceID: 1, KVExactMode: 1, PD: true, BlockSize: 16}
	for i := 0; i < 64; i++ {
		r.Endpoints = append(r.Endpoints, Endpoint{Idx: i, Role: RolePrefill})
	}
	for i := 64; i < 72; i++ {
		r.Endpoints = append(r.Endpoints, Endpoint{Idx: i, Role: RoleDecode})
	}
	return r
}

// threadCPU is the CPU time of the calling OS thread. The machine is
// shared and oversubscribed, so the benchmarks also report CPU time per
// operation (cpu-ns/op), which wall-clock ns/op inflates under contention.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func runDecide(b *testing.B, s *Selector, req *Request, want Tier) {
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, n := threadCPU(), 0
	for b.Loop() {
		a := s.Begin(req)
		if d := a.Decide(); d.Tier != want {
			b.Fatalf("tier %v, want %v (%+v)", d.Tier, want, d)
		}
		n++
	}
	b.ReportMetric(float64(threadCPU()-start)/float64(n), "cpu-ns/op")
}

// BenchmarkDecide64: one decision over 64 endpoints, hashing excluded.
func BenchmarkDecide64(b *testing.B) {
	hashes := seq(0, 64) // a 1,024-token prompt at block size 16
	fixed := &fixedScorer{}
	inv := &invertedScorer{idx: map[uint64]epset.Set{}}
	for ep := 0; ep < 64; ep++ {
		depth := (ep * 13) % 64 // a spread of overlaps
		fixed.counts[ep] = uint32(depth)
		fixed.blocks[ep] = 1000
		inv.blocks[ep] = 1000
		for _, h := range hashes[:depth] {
			s := inv.idx[h]
			s.Add(ep)
			inv.idx[h] = s
		}
	}
	req := kvReq(hashes)
	for _, tc := range []struct {
		name   string
		pd     bool
		mode   LBMode
		scorer Scorer
		want   Tier
	}{
		{"pool/hard/fixed-scores", false, LBHard, fixed, TierKV},
		{"pool/soft/fixed-scores", false, LBSoft, fixed, TierKV},
		{"pool/off/fixed-scores", false, LBOff, fixed, TierKV},
		{"pd/hard/fixed-scores", true, LBHard, fixed, TierKV},
		{"pd/hard/inverted-index", true, LBHard, inv, TierKV},
		{"pool/hard/inverted-index", false, LBHard, inv, TierKV},
	} {
		b.Run(tc.name, func(b *testing.B) {
			opts := DefaultOptions()
			opts.LBMode = tc.mode
			opts.ColdStartSeedN = 0
			runDecide(b, benchSelector(b, bench64Rule(tc.pd), opts, tc.scorer), req, tc.want)
		})
	}
	b.Run("pd/tier2-miss", func(b *testing.B) {
		runDecide(b, benchSelector(b, bench64Rule(true), DefaultOptions(), &fixedScorer{}), req, TierLoad)
	})
}
