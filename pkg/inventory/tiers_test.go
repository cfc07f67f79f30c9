package inventory

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

func TestTierOfMapsEveryEnginesMedia(t *testing.T) {
	for _, tc := range []struct {
		medium string
		tier   Tier
		scored bool
	}{
		{"", TierGPU, true}, // vLLM before v0.11 and any engine that leaves medium out
		{"GPU", TierGPU, true},
		{"gpu", TierGPU, true},
		{"CPU", TierCPU, true},         // vLLM OffloadingConnector, TensorRT-LLM secondary memory
		{"STORAGE", TierStorage, true}, // LMCache, vLLM storage media
		{"CPU_PINNED", TierCPU, true},  // SGLang HiCache host memory
		{"cpu_pinned", TierCPU, true},
		{"DISK", TierStorage, true},     // SGLang
		{"EXTERNAL", TierStorage, true}, // SGLang
		{"NVME_OVER_FABRIC", 0, false},
		{MediumOther, 0, false},
	} {
		tier, ok := TierOf(tc.medium)
		if ok != tc.scored || (ok && tier != tc.tier) {
			t.Errorf("TierOf(%q) = %v, %v; want %v, %v", tc.medium, tier, ok, tc.tier, tc.scored)
		}
	}
}

func TestParseTierWeights(t *testing.T) {
	def := DefaultTierWeights()
	for _, tc := range []struct {
		in      string
		want    TierWeights
		badPart string // the entry the error must name; "" = valid
	}{
		{"", def, ""},
		{"GPU=1.0,CPU=0.8,STORAGE=0.25", def, ""},
		{"cpu=0.5", TierWeights{1000, 500, 250}, ""},
		{" CPU = 0 , STORAGE=0 ", TierWeights{1000, 0, 0}, ""},
		{"GPU=1,CPU=1,STORAGE=1", TierWeights{1000, 1000, 1000}, ""},
		{"STORAGE=.125", TierWeights{1000, 800, 125}, ""},
		{"GPU=0.9", TierWeights{900, 800, 250}, ""},
		{"CPU=1.5", def, "CPU=1.5"},
		{"CPU=-0.1", def, "CPU=-0.1"},
		{"CPU=0.1234", def, "CPU=0.1234"},
		{"CPU=abc", def, "CPU=abc"},
		{"CPU=", def, "CPU="},
		{"CPU", def, "CPU"},
		{"HBM=0.5", def, "HBM=0.5"},
		{"CPU=0.5,CPU=0.6", def, "CPU=0.6"},
		{"GPU=0", def, "GPU=0"},
		{"CPU=1e-1", def, "CPU=1e-1"},
		{strings.Repeat("CPU=0.5,", 40), def, "longer than"},
	} {
		got, err := ParseTierWeights(tc.in)
		if tc.badPart == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseTierWeights(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			continue
		}
		var te *TierWeightError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), tc.badPart) {
			t.Errorf("ParseTierWeights(%q) error = %v; want a TierWeightError naming %q", tc.in, err, tc.badPart)
		}
	}
	if s := def.String(); s != "GPU=1,CPU=0.8,STORAGE=0.25" {
		t.Errorf("default weights print as %q", s)
	}
}

// tierOp is one Add or Remove of prompt blocks [from, to) on a medium.
type tierOp struct {
	ep       int
	medium   string
	from, to int
	remove   bool
}

func TestScoreLeadingRunAcrossTiers(t *testing.T) {
	const n = 10
	prompt := make([]uint64, n)
	for i := range prompt {
		prompt[i] = 0xabc000 + uint64(i)
	}
	zeroSlow := TierWeights{1000, 0, 0}
	for _, tc := range []struct {
		name    string
		weights TierWeights
		ops     []tierOp
		want    []uint32 // counts of endpoints 0..len-1
	}{
		{"gpu only", TierWeights{}, []tierOp{{0, "GPU", 0, n, false}}, []uint32{10}},
		{"no medium is GPU", TierWeights{}, []tierOp{{0, "", 0, n, false}}, []uint32{10}},
		{"gpu head, cpu tail is one prefix", TierWeights{}, []tierOp{{0, "GPU", 0, 5, false}, {0, "CPU", 5, n, false}}, []uint32{9}},
		{"cpu only", TierWeights{}, []tierOp{{0, "CPU", 0, n, false}}, []uint32{8}},
		{"cpu head, gpu tail", TierWeights{}, []tierOp{{0, "CPU", 0, 5, false}, {0, "GPU", 5, n, false}}, []uint32{9}},
		{"run stops at a block on no tier", TierWeights{}, []tierOp{{0, "GPU", 0, 3, false}, {0, "CPU", 4, n, false}}, []uint32{3}},
		{"gpu copy wins over cpu copy", TierWeights{}, []tierOp{{0, "GPU", 0, n, false}, {0, "CPU", 0, n, false}}, []uint32{10}},
		{"best slower tier wins", TierWeights{}, []tierOp{{0, "CPU", 0, 4, false}, {0, "STORAGE", 0, n, false}}, []uint32{5}}, // 3.2 + 1.5
		{"sglang host memory", TierWeights{}, []tierOp{{0, "CPU_PINNED", 0, n, false}}, []uint32{8}},
		{"sglang disk rounds half up", TierWeights{}, []tierOp{{0, "DISK", 0, n, false}}, []uint32{3}}, // 2.5
		{"unknown medium is not scored", TierWeights{}, []tierOp{{0, "GPU", 0, 2, false}, {0, "NVME_X", 0, n, false}}, []uint32{2}},
		{"remove gpu leaves the cpu copy", TierWeights{},
			[]tierOp{{0, "GPU", 0, n, false}, {0, "CPU", 0, n, false}, {0, "GPU", 5, n, true}}, []uint32{9}},
		{"remove cpu leaves the gpu copy", TierWeights{},
			[]tierOp{{0, "GPU", 0, n, false}, {0, "CPU", 0, n, false}, {0, "CPU", 0, n, true}}, []uint32{10}},
		{"remove from a medium never stored on", TierWeights{},
			[]tierOp{{0, "GPU", 0, n, false}, {0, "STORAGE", 0, n, true}}, []uint32{10}},
		{"cpu weight 0 is gpu only", zeroSlow, []tierOp{{0, "GPU", 0, 5, false}, {0, "CPU", 5, n, false}}, []uint32{5}},
		{"cpu weight 1", TierWeights{1000, 1000, 250}, []tierOp{{0, "GPU", 0, 5, false}, {0, "CPU", 5, n, false}}, []uint32{10}},
		{"gpu weight below 1", TierWeights{500, 800, 250}, []tierOp{{0, "GPU", 0, n, false}}, []uint32{5}},
		{"longer mixed run beats shorter gpu run", TierWeights{},
			[]tierOp{{0, "GPU", 0, 6, false}, {1, "GPU", 0, 3, false}, {1, "CPU", 3, n, false}}, []uint32{6, 9}}, // 3 + 5.6
		{"endpoints do not share tiers", TierWeights{},
			[]tierOp{{0, "GPU", 0, 5, false}, {1, "CPU", 5, n, false}}, []uint32{5, 0}},
		{"ranks are unioned across tiers", TierWeights{},
			[]tierOp{{0, "GPU", 0, 5, false}, {0, "CPU", 5, n, false}, {2, "CPU", 0, 2, false}}, []uint32{9, 0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := New(Options{MaxBlocks: MinMaxBlocks, TierWeights: tc.weights})
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range tc.ops {
				apply := ix.Add
				if op.remove {
					apply = ix.Remove
				}
				rank := 0
				if op.ep == 2 { // endpoint 2 in the ranks case is endpoint 0's rank 1
					op.ep, rank = 0, 1
				}
				if err := apply(op.ep, rank, op.medium, prompt[op.from:op.to]); err != nil {
					t.Fatal(err)
				}
			}
			eps := len(tc.want)
			if tc.name == "ranks are unioned across tiers" {
				eps = 1
			}
			var counts [epset.Max]uint32
			ix.Score(prompt, epset.FirstN(eps), true, &counts)
			for e := range eps {
				if counts[e] != tc.want[e] {
					t.Errorf("endpoint %d: count %d, want %d", e, counts[e], tc.want[e])
				}
			}
		})
	}
}

// TestScoreTieredMatchesGPUOnlyOnGPUBlocks checks that turning the tiered path
// on (a CPU table exists) changes nothing for blocks that are on the GPU
// only, over random fleets, and that the overlap score stays GPU only.
func TestScoreTieredMatchesGPUOnlyOnGPUBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	for round := range 20 {
		plain := newIndex(t, MinMaxBlocks)
		tiered := newIndex(t, MinMaxBlocks)
		prompt := make([]uint64, 1+r.IntN(200))
		for i := range prompt {
			prompt[i] = r.Uint64()
		}
		nEps := 1 + r.IntN(130)
		for e := range nEps {
			k := r.IntN(len(prompt) + 1)
			for _, ix := range []*Index{plain, tiered} {
				if err := ix.Add(e, 0, "GPU", prompt[:k]); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A CPU table holding blocks of another prompt switches on the tiered path.
		if err := tiered.Add(0, 0, "CPU", []uint64{^prompt[0]}); err != nil {
			t.Fatal(err)
		}
		for _, run := range []bool{true, false} {
			var a, b [epset.Max]uint32
			plain.Score(prompt, epset.FirstN(nEps), run, &a)
			tiered.Score(prompt, epset.FirstN(nEps), run, &b)
			if a != b {
				t.Fatalf("round %d leadingRun=%v: tiered counts differ from GPU-only counts", round, run)
			}
		}
	}
}

// FuzzParseTierWeights: any text either parses to weights in range with a
// positive GPU weight, which print and parse back to the same weights, or is
// a TierWeightError; never a panic.
func FuzzParseTierWeights(f *testing.F) {
	for _, s := range []string{"", "GPU=1.0,CPU=0.8,STORAGE=0.25", "cpu=0", "CPU=1.5", "GPU=0", "=,=,", "STORAGE=.5,CPU=1."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseTierWeights(s)
		if err != nil {
			var te *TierWeightError
			if !errors.As(err, &te) {
				t.Fatalf("%q: error %v is not a TierWeightError", s, err)
			}
			return
		}
		for tier, v := range w {
			if v > weightScale || (Tier(tier) == TierGPU && v == 0) {
				t.Fatalf("%q: weights %v out of range", s, w)
			}
		}
		back, err := ParseTierWeights(w.String())
		if err != nil || back != w {
			t.Fatalf("%q: %v prints as %q, which parses to %v, %v", s, w, w.String(), back, err)
		}
	})
}

// TestScoreTieredConcurrentWithWrites: scoring across tiers while a writer
// stores and removes blocks on the GPU and on new media (which rebuilds the
// scored list) is race-free and every count stays within the prompt.
func TestScoreTieredConcurrentWithWrites(t *testing.T) {
	ix := newIndex(t, MinMaxBlocks)
	prompt := make([]uint64, 128)
	for i := range prompt {
		prompt[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		media := []string{"GPU", "CPU", "STORAGE", "CPU_PINNED", "DISK", "X1", "X2"}
		for i := range 2000 {
			m := media[i%len(media)]
			part := prompt[i%64 : i%64+32]
			if err := ix.Add(i%8, 0, m, part); err != nil {
				t.Error(err)
				return
			}
			if i%3 == 0 {
				if err := ix.Remove(i%8, 0, m, part[:8]); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	var counts [epset.Max]uint32
	for {
		select {
		case <-done:
			return
		default:
		}
		ix.Score(prompt, epset.FirstN(8), true, &counts)
		for e := range 8 {
			if counts[e] > uint32(len(prompt)) {
				t.Fatalf("endpoint %d: count %d over the prompt's %d blocks", e, counts[e], len(prompt))
			}
		}
	}
}

// TestOverlayExtendsTieredRun: predicted (provisional) blocks extend an
// endpoint's leading run from where the run really ends, not from its
// weighted score, when the run reaches into a slower tier (or the GPU weight
// is below 1).
func TestOverlayExtendsTieredRun(t *testing.T) {
	prompt := chain(0, 15)
	for _, tc := range []struct {
		name    string
		weights TierWeights
		cpuTail bool
		want    uint32
	}{
		// 5 GPU + 5 CPU × 0.8 = 9, then 5 predicted × 90% = 4 (rounded down).
		{"gpu head, cpu tail, predicted rest", TierWeights{}, true, 13},
		// 10 GPU × 0.5 = 5, then 4.
		{"gpu weight 0.5", TierWeights{500, 800, 250}, false, 9},
		{"gpu only", TierWeights{}, false, 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := New(Options{MaxBlocks: MinMaxBlocks, TierWeights: tc.weights})
			if err != nil {
				t.Fatal(err)
			}
			split := 10
			if tc.cpuTail {
				split = 5
				if err := ix.Add(0, 0, "CPU", prompt[5:10]); err != nil {
					t.Fatal(err)
				}
			}
			if err := ix.Add(0, 0, "GPU", prompt[:split]); err != nil {
				t.Fatal(err)
			}
			ov, err := NewOverlay(ix, ProvisionalOptions{Weight: 90, TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			ov.Reserve(0, prompt)
			var counts [epset.Max]uint32
			ov.Score(prompt, epset.FirstN(1), true, &counts)
			if counts[0] != tc.want {
				t.Errorf("score %d, want %d", counts[0], tc.want)
			}
		})
	}
}

// TestOtherMediaBlocksThroughOverlay: the subscriber reports
// kvgate_kv_blocks_other_medium through whatever Sink the rule uses, the
// provisional overlay included.
func TestOtherMediaBlocksThroughOverlay(t *testing.T) {
	ix := newIndex(t, MinMaxBlocks)
	ov, err := NewOverlay(ix, ProvisionalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sink interface{ OtherMediaBlocks(int) int } = ov
	if err := ov.Add(1, 0, "CPU", chain(0, 5)); err != nil {
		t.Fatal(err)
	}
	if err := ov.Add(1, 0, "DISK", chain(10, 2)); err != nil {
		t.Fatal(err)
	}
	if err := ov.Add(1, 0, "GPU", chain(20, 3)); err != nil {
		t.Fatal(err)
	}
	if got := sink.OtherMediaBlocks(1); got != 7 {
		t.Errorf("other media blocks %d, want 7", got)
	}
}
