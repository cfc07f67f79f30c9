package selector

import (
	"github.com/kvgate/kvgate/pkg/epset"
	"slices"
	"testing"
)

// TestGuardLadder checks that every miss reason fires alone, in ladder order,
// and that a P/D miss falls through to tier 2.
func TestGuardLadder(t *testing.T) {
	prompt := seq(100, 4)
	flipDown := States{ProbeDown: epsOf(0)}
	tests := []struct {
		name      string
		mode      int
		minTokens int
		req       *Request
		inv       map[int][]uint64
		flip      *States
		want      Reason
	}{
		{name: "mode_off", mode: 0, req: kvReq(prompt), inv: map[int][]uint64{0: prompt}, want: ReasonModeOff},
		{name: "mode 2 is reserved, off", mode: 2, req: kvReq(prompt), want: ReasonModeOff},
		{name: "text_empty", mode: 1, req: &Request{Model: "m", Hashes: prompt}, want: ReasonTextEmpty},
		{name: "text_empty before model_empty", mode: 1, req: &Request{}, want: ReasonTextEmpty},
		{name: "text_empty upstream", mode: 1, req: &Request{HasText: true, Model: "m", Upstream: ReasonTextEmpty}, want: ReasonTextEmpty},
		{name: "model_empty", mode: 1, req: &Request{HasText: true, Hashes: prompt}, want: ReasonModelEmpty},
		{name: "model_empty before tokenize", mode: 1, req: &Request{HasText: true, Upstream: ReasonTokenize}, want: ReasonModelEmpty},
		{name: "tokenize", mode: 1, req: &Request{HasText: true, Model: "m", Upstream: ReasonTokenize}, want: ReasonTokenize},
		{name: "hashes", mode: 1, req: &Request{HasText: true, Model: "m", Upstream: ReasonHashes}, want: ReasonHashes},
		{name: "no_worker: empty inventory", mode: 1, minTokens: 16, req: kvReq(prompt), want: ReasonNoWorker},
		{name: "no_worker: no overlap", mode: 1, minTokens: 16, req: kvReq(prompt), inv: map[int][]uint64{0: seq(900, 4)}, want: ReasonNoWorker},
		{name: "short prompt, guard on: shallow", mode: 1, minTokens: 16, req: kvReq(nil), inv: map[int][]uint64{0: prompt}, want: ReasonShallow},
		{name: "short prompt, guard off: no_worker", mode: 1, minTokens: 0, req: kvReq(nil), inv: map[int][]uint64{0: prompt}, want: ReasonNoWorker},
		{name: "shallow: 2 of 3 required", mode: 1, minTokens: 48, req: kvReq(prompt), inv: map[int][]uint64{0: prompt[:2]}, want: ReasonShallow},
		{name: "shallow cap at request blocks", mode: 1, minTokens: 4096, req: kvReq(prompt[:2]), inv: map[int][]uint64{0: prompt[:2]}, want: ReasonHit},
		{name: "shallow off", mode: 1, minTokens: 0, req: kvReq(prompt), inv: map[int][]uint64{0: prompt[:1]}, want: ReasonHit},
		{name: "excluded: winner went down after the mask was seeded", mode: 1, minTokens: 16, req: kvReq(prompt), inv: map[int][]uint64{0: prompt}, flip: &flipDown, want: ReasonExcluded},
		{name: "hit", mode: 1, minTokens: 16, req: kvReq(prompt), inv: map[int][]uint64{0: prompt}, want: ReasonHit},
		{name: "mode 3 hit", mode: 3, minTokens: 16, req: kvReq(prompt), inv: map[int][]uint64{0: prompt}, want: ReasonHit},
		{name: "mode 3 shallow", mode: 3, minTokens: 64, req: kvReq(prompt), inv: map[int][]uint64{0: prompt[:3]}, want: ReasonShallow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := noSeed()
			opts.MinMatchTokens = tc.minTokens
			rule := pdRule([]int{0, 1}, []int{2})
			if tc.mode == 3 {
				rule = poolRule(3, 0)
			}
			rule.KVExactMode = tc.mode
			e := newEnv(t, rule, opts)
			for ep, hs := range tc.inv {
				e.inv.add(ep, hs...)
			}
			if tc.flip != nil {
				e.states.flipped, e.states.flipAfter = tc.flip, 1
			}
			d := e.decide(tc.req)
			if d.Reason != tc.want {
				t.Fatalf("reason = %v, want %v (decision %+v)", d.Reason, tc.want, d)
			}
			pd := tc.mode != 3
			switch {
			case tc.want == ReasonHit:
				if d.Tier != TierKV || d.Endpoint != 0 || d.Fallthrough {
					t.Fatalf("hit decision = %+v", d)
				}
			case pd:
				if d.Tier != TierLoad || !d.Fallthrough || d.Endpoint < 0 || d.Endpoint > 1 || d.Decode != 2 {
					t.Fatalf("P/D miss should fall through to tier 2 with a prefill target: %+v", d)
				}
			default:
				if d.Tier != TierSelector || d.Fallthrough {
					t.Fatalf("mode-3 miss should take sel without fallthrough: %+v", d)
				}
			}
		})
	}
}

func epsOf(idx ...int) (s epset.Set) {
	for _, i := range idx {
		s.Add(i)
	}
	return s
}

// TestMissReasonsList pins the nine label values and their order.
func TestMissReasonsList(t *testing.T) {
	want := []string{"mode_off", "warmup", "text_empty", "model_empty", "tokenize", "hashes", "no_worker", "shallow", "excluded"}
	got := MissReasons()
	if len(got) != len(want) {
		t.Fatalf("got %d reasons", len(got))
	}
	for i, r := range got {
		if r.String() != want[i] || !r.Miss() {
			t.Errorf("reason %d = %q, want %q", i, r, want[i])
		}
	}
	if ReasonHit.Miss() || ReasonNone.Miss() {
		t.Error("hit/none must not be misses")
	}
}

// TestWarmupInert: kvWarmupSec is stored but never suppresses the tier.
func TestWarmupInert(t *testing.T) {
	r := pdRule([]int{0, 1}, []int{2})
	r.KVWarmupSec = 3600
	e := newEnv(t, r, noSeed())
	e.inv.add(1, seq(0, 2)...)
	if d := e.decide(kvReq(seq(0, 2))); d.Reason != ReasonHit || d.Endpoint != 1 {
		t.Fatalf("decision %+v", d)
	}
	if e.sel.Rule().KVWarmupSec != 3600 {
		t.Fatal("kvWarmupSec not stored")
	}
}

type blendCase struct {
	name     string
	mode     LBMode
	penalty  int
	overlap  map[int]int   // ep → number of leading blocks it holds
	loads    map[int]int   // ep → in-flight
	blocks   map[int]int64 // ep → num_gpu_blocks
	want     int
	spilled  bool
	wantScor int
}

// TestBlendModes checks each LOXILB_KV_LB_MODE against hand-computed values
// (single pool, spill relief off, cold seeding off).
func TestBlendModes(t *testing.T) {
	tests := []blendCase{
		// L=5, Σĉ=3, cap=ceil(175·5/300)=3: ep0 (4) over, ep1 (1) under → ep1.
		{name: "hard spills to best under cap", mode: LBHard, overlap: map[int]int{0: 5, 1: 3, 2: 1}, loads: map[int]int{0: 4, 1: 1}, want: 1, spilled: true, wantScor: 3},
		// L=5, cap 3: ep0 load 2 under → argmax keeps it.
		{name: "hard keeps argmax under cap", mode: LBHard, overlap: map[int]int{0: 5, 1: 3, 2: 1}, loads: map[int]int{0: 2, 1: 3}, want: 0, wantScor: 5},
		// ĉ={1000,3000}, L=4: cap0=ceil(175·4·1000/400000)=2 (load 2: over); cap1=ceil(5.25)=6 → ep1.
		{name: "hard capacity weighted", mode: LBHard, overlap: map[int]int{0: 4, 1: 2}, loads: map[int]int{0: 2, 1: 2}, blocks: map[int]int64{0: 1000, 1: 3000}, want: 1, spilled: true, wantScor: 2},
		// Equal overlap, both under cap 3 (L=3): least loaded wins (ep1), not the argmax ep0.
		{name: "hard tie to least loaded", mode: LBHard, overlap: map[int]int{0: 3, 1: 3}, loads: map[int]int{0: 2, 1: 1}, want: 1, spilled: true, wantScor: 3},
		{name: "hard tie equal load to lowest ep_idx", mode: LBHard, overlap: map[int]int{1: 3, 2: 3}, loads: map[int]int{1: 1, 2: 1}, want: 1, wantScor: 3},
		// Static mlf 175, L=20, ĉ={1000,3000}: cap0=ceil(8.75)=9 < 11 → ep1.
		{name: "hard static mlf", mode: LBHard, overlap: map[int]int{0: 5, 1: 3}, loads: map[int]int{0: 11, 1: 9}, blocks: map[int]int64{0: 1000, 1: 3000}, want: 1, spilled: true, wantScor: 3},
		// Adaptive at L=20: mlf=225, cap0=ceil(225·20·1000/400000)=ceil(11.25)=12 > 11 → ep0.
		{name: "adaptive raises mlf with load", mode: LBAdaptive, overlap: map[int]int{0: 5, 1: 3}, loads: map[int]int{0: 11, 1: 9}, blocks: map[int]int64{0: 1000, 1: 3000}, want: 0, wantScor: 5},
		// soft λ=32: cost0=0+32·4=128, cost1=2000+32=2032, cost2=4000 → ep0.
		{name: "soft default penalty", mode: LBSoft, overlap: map[int]int{0: 5, 1: 3, 2: 1}, loads: map[int]int{0: 4, 1: 1}, want: 0, wantScor: 5},
		// soft λ=1000: cost0=4000, cost1=3000, cost2=4000 → ep1.
		{name: "soft high penalty", mode: LBSoft, penalty: 1000, overlap: map[int]int{0: 5, 1: 3, 2: 1}, loads: map[int]int{0: 4, 1: 1}, want: 1, spilled: true, wantScor: 3},
		// soft λ=1000 with ĉ0=100: cost0=floor(4000/100)=40 → ep0.
		{name: "soft capacity divides", mode: LBSoft, penalty: 1000, overlap: map[int]int{0: 5, 1: 3, 2: 1}, loads: map[int]int{0: 4, 1: 1}, blocks: map[int]int64{0: 100}, want: 0, wantScor: 5},
		// soft tie on cost: cost0=0+32·0... overlap equal, loads equal → higher overlap, lower load, lowest idx.
		{name: "soft tie to lowest ep_idx", mode: LBSoft, overlap: map[int]int{1: 2, 2: 2}, want: 1, wantScor: 2},
		// adaptive-soft at L=5: λ=50000: cost0=200000, cost1=52000, cost2=4000 → ep2.
		{name: "adaptive-soft", mode: LBAdaptiveSoft, overlap: map[int]int{0: 5, 1: 3, 2: 1}, loads: map[int]int{0: 4, 1: 1}, want: 2, spilled: true, wantScor: 1},
		// off: argmax, ties to the lowest ep_idx, load ignored.
		{name: "off ties to lowest ep_idx", mode: LBOff, overlap: map[int]int{0: 3, 1: 3}, loads: map[int]int{0: 100}, want: 0, wantScor: 3},
		{name: "off ignores load", mode: LBOff, overlap: map[int]int{0: 1, 2: 4}, loads: map[int]int{2: 1000}, want: 2, wantScor: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := noSeed()
			opts.LBMode = tc.mode
			opts.SpillRelief = ReliefOff
			opts.CapFullGain = 0 // the spec's formulas; gain_test.go checks the scaled cap
			if tc.penalty > 0 {
				opts.LoadPenalty = tc.penalty
			}
			e := newEnv(t, poolRule(4, 0), opts)
			prompt := seq(0, 8)
			for ep, n := range tc.overlap {
				e.inv.add(ep, prompt[:n]...)
			}
			for ep, l := range tc.loads {
				e.loads.l[ep] = l
			}
			for ep, b := range tc.blocks {
				e.engine.blocks[ep] = b
			}
			d := e.decide(kvReq(prompt))
			if d.Tier != TierKV || d.Endpoint != tc.want || d.Spilled != tc.spilled || d.Score != tc.wantScor {
				t.Fatalf("got ep %d spilled %v score %d (%+v); want ep %d spilled %v score %d", d.Endpoint, d.Spilled, d.Score, d, tc.want, tc.spilled, tc.wantScor)
			}
		})
	}
}

// TestSpillRelief: a lone candidate never spills in the primary arm; relief
// moves it when it is over its fleet cap (auto: on for single pool, off for P/D).
func TestSpillRelief(t *testing.T) {
	prompt := seq(0, 4)
	tests := []struct {
		name   string
		pd     bool
		relief Relief
		mode   LBMode
		want   int
		spill  bool
	}{
		// cands={0}, L=3 → cap0=ceil(5.25)=6, no primary spill. Fleet: L=3, Σĉ=3 → cap=ceil(1.75)=2;
		// ep0 load 3 ≥ 2 → least loaded under its fleet cap: ep1 (0, lowest idx).
		{name: "auto single pool", relief: ReliefAuto, mode: LBHard, want: 1, spill: true},
		{name: "off single pool", relief: ReliefOff, mode: LBHard, want: 0},
		{name: "auto P/D is off", pd: true, relief: ReliefAuto, mode: LBHard, want: 0},
		{name: "on P/D", pd: true, relief: ReliefOn, mode: LBHard, want: 1, spill: true},
		{name: "never in off mode", relief: ReliefOn, mode: LBOff, want: 0},
		{name: "soft mode", relief: ReliefAuto, mode: LBSoft, want: 1, spill: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := noSeed()
			opts.SpillRelief, opts.LBMode = tc.relief, tc.mode
			rule := poolRule(3, 0)
			if tc.pd {
				rule = pdRule([]int{0, 1, 2}, []int{3})
			}
			e := newEnv(t, rule, opts)
			e.inv.add(0, prompt...)
			e.loads.l[0] = 3
			d := e.decide(kvReq(prompt))
			if d.Tier != TierKV || d.Endpoint != tc.want || d.Spilled != tc.spill {
				t.Fatalf("decision %+v, want ep %d spilled %v", d, tc.want, tc.spill)
			}
			if tc.spill && d.Score != 0 {
				t.Fatalf("relief target has no overlap, score %d", d.Score)
			}
		})
	}
}

// TestColdStartSeed: every Nth hit goes to the lowest-index cold endpoint,
// keeping the displaced score, until its inventory warms.
func TestColdStartSeed(t *testing.T) {
	opts := DefaultOptions()
	opts.ColdStartSeedN, opts.ColdStartMinBlocks = 2, 0 // 0 → 1: strictly empty only
	opts.SpillRelief = ReliefOff
	e := newEnv(t, poolRule(3, 0), opts)
	prompt := seq(0, 4)
	e.inv.add(0, prompt...)
	var got []int
	for i := 0; i < 4; i++ {
		d, o := e.route(kvReq(prompt))
		got = append(got, d.Endpoint)
		if wantSeed := i%2 == 1; d.ColdSeed != wantSeed || o.ColdSeed != wantSeed || !o.Hit {
			t.Fatalf("request %d: decision %+v outcome %+v", i, d, o)
		}
		if d.Score != 4 {
			t.Fatalf("request %d: score %d, want the displaced 4", i, d.Score)
		}
	}
	if want := []int{0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("endpoints %v, want %v", got, want)
	}
	e.inv.add(1, 77) // ep1 warms (1 block ≥ min 1); ep2 is next
	e.route(kvReq(prompt))
	if d, _ := e.route(kvReq(prompt)); d.Endpoint != 2 || !d.ColdSeed {
		t.Fatalf("expected seed of ep2, got %+v", d)
	}
	// Disabled with N=0.
	opts.ColdStartSeedN = 0
	e = newEnv(t, poolRule(3, 0), opts)
	e.inv.add(0, prompt...)
	for i := 0; i < 5; i++ {
		if d := e.decide(kvReq(prompt)); d.ColdSeed {
			t.Fatal("seeding with N=0")
		}
	}
}

// TestZeroHitWatchdog: counts every zero-overlap lookup from the Nth on, warns
// once per transition, resets on a hit, ignores empty inventories.
func TestZeroHitWatchdog(t *testing.T) {
	opts := noSeed()
	opts.ZeroHitN = 3
	e := newEnv(t, poolRule(2, 0), opts)
	miss := kvReq(seq(500, 2))
	for i := 0; i < 5; i++ { // empty inventory: not counted
		e.decide(miss)
	}
	if e.obs.watchdog != 0 {
		t.Fatalf("counted against an empty inventory")
	}
	e.inv.add(0, seq(0, 2)...)
	for i := 0; i < 4; i++ {
		e.decide(miss)
	}
	if e.obs.watchdog != 2 {
		t.Fatalf("watchdog = %d, want 2 (lookups 3 and 4)", e.obs.watchdog)
	}
	e.decide(kvReq(seq(0, 2))) // a hit re-arms
	for i := 0; i < 3; i++ {
		e.decide(miss)
	}
	if e.obs.watchdog != 3 {
		t.Fatalf("watchdog = %d, want 3", e.obs.watchdog)
	}
	if n := countSub(e.logs.String(), "zero-hit watchdog"); n != 2 {
		t.Fatalf("%d warnings, want one per transition (2):\n%s", n, e.logs.String())
	}
	for _, cause := range []string{"PYTHONHASHSEED", "--block-size", "kvHashAlgo", "tokenizer"} {
		if countSub(e.logs.String(), cause) == 0 {
			t.Errorf("warning does not name %s", cause)
		}
	}
}

func countSub(s, sub string) int {
	n := 0
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			n++
		}
	}
	return n
}
