package selector

import (
	"strings"
	"testing"
	"time"
)

// fixedCost is a CostSource with set pending work and per-token times
// (0 = no sample).
type fixedCost struct {
	pending map[int]int64
	per     map[int]time.Duration
}

func (f fixedCost) PendingTokens(ep int) int64 { return f.pending[ep] }
func (f fixedCost) PrefillPerToken(ep int) (time.Duration, bool) {
	v, ok := f.per[ep]
	return v, ok && v > 0
}

// costSelector is a 3-endpoint round-robin pool rule's selector whose
// endpoints hold the given leading blocks of prompt and carry the given
// in-flight loads and cost source.
func costSelector(t *testing.T, o Options, prompt []uint64, stored map[int]int, loads [3]int, cost CostSource) *Selector {
	t.Helper()
	inv := newInv()
	for ep, n := range stored {
		inv.add(ep, prompt[:n]...)
	}
	l := &testLoads{}
	copy(l.l[:], loads[:])
	sel, err := New(poolRule(3, SelRR), o, Deps{Scorer: inv, Loads: l, Cost: cost})
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func TestCostModeChoosesLeastPredictedTTFT(t *testing.T) {
	prompt := seq(0, 10) // 160 tokens at block size 16
	for _, tc := range []struct {
		name    string
		stored  map[int]int // ep → leading blocks of prompt it holds
		loads   [3]int
		pending map[int]int64
		per     map[int]time.Duration
		tokens  int
		work    int // CostWorkWeight
		want    int
		spilled bool
	}{
		{
			name: "a prefix still being computed: the earliest first token copies it to an idle endpoint",
			// ep0 holds the prefix provisionally (scored 9 of 10 blocks) behind 160 pending
			// tokens: (160+16) against ep1's (0+160).
			stored: map[int]int{0: 9}, pending: map[int]int64{0: 160},
			want: 1, spilled: true,
		},
		{
			name:   "charging the added fleet work keeps it where it is being computed",
			stored: map[int]int{0: 9}, pending: map[int]int64{0: 160}, work: 100,
			want: 0, // (160+16+16) against (0+160+160)
		},
		{
			name:   "idle fleet: the deepest overlap has the least uncached work",
			stored: map[int]int{0: 2, 1: 8},
			want:   1,
		},
		{
			name:    "queued prefill work outweighs an overlap",
			stored:  map[int]int{0: 2, 1: 8},
			pending: map[int]int64{1: 4000},
			want:    0, spilled: true, // ep0: (0+128)·c against ep1: (4000+32)·c
		},
		{
			name:   "a faster endpoint wins at equal work",
			stored: map[int]int{0: 8, 1: 8, 2: 8},
			per:    map[int]time.Duration{0: 80 * time.Microsecond, 1: 20 * time.Microsecond, 2: 40 * time.Microsecond},
			want:   1, spilled: true,
		},
		{
			name:   "an endpoint without a sample takes the fleet mean, not the default",
			stored: map[int]int{0: 8, 1: 8, 2: 8},
			per:    map[int]time.Duration{0: 80 * time.Microsecond, 1: 40 * time.Microsecond},
			// ep2 is priced at the mean of 80 and 40 µs: 60 µs, worse than ep1.
			want: 1, spilled: true,
		},
		{
			name:    "an endpoint with no overlap can win when the others are busy",
			stored:  map[int]int{0: 10, 1: 10},
			pending: map[int]int64{0: 5000, 1: 5000},
			want:    2, spilled: true,
		},
		{
			name:   "ties go to the higher overlap, then the lower load",
			stored: map[int]int{0: 10, 1: 10, 2: 10},
			loads:  [3]int{2, 1, 1},
			want:   1,
			// all cost 16 tokens (the last block is a full block here: prompt
			// tokens default to blocks × 16, so uncached is 0 for all three)
			spilled: true,
		},
		{
			name:   "the fleet load cap still applies",
			stored: map[int]int{0: 10},
			loads:  [3]int{6, 0, 0},
			// L = 6, cap = ceil(1.75·6/3) = 4: ep0 is over it despite its overlap.
			want: 1, spilled: true,
		},
		{
			name:   "the tokenized length counts beyond the last full block",
			stored: map[int]int{0: 10, 1: 4},
			tokens: 170,
			want:   0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := noSeed()
			o.LBMode = LBCost
			o.CostWorkWeight = tc.work
			sel := costSelector(t, o, prompt, tc.stored, tc.loads, fixedCost{pending: tc.pending, per: tc.per})
			req := kvReq(prompt)
			req.PromptTokens = tc.tokens
			a := sel.Begin(req)
			d := a.Decide()
			if d.Reason != ReasonHit || d.Endpoint != tc.want || d.Spilled != tc.spilled {
				t.Fatalf("decision %+v: want ep %d, spilled %v", d, tc.want, tc.spilled)
			}
		})
	}
}

func TestCostModeKeepsTheGuards(t *testing.T) {
	o := noSeed()
	o.LBMode = LBCost
	sel, err := New(poolRule(3, SelRR), o, Deps{Scorer: newInv()})
	if err != nil {
		t.Fatal(err)
	}
	a := sel.Begin(kvReq(seq(0, 4)))
	if d := a.Decide(); d.Reason != ReasonNoWorker || d.Tier != TierSelector {
		t.Fatalf("no overlap anywhere: %+v, want a no_worker miss to the rule's selector", d)
	}
}

func TestParseLBModeCost(t *testing.T) {
	for _, in := range []string{"cost", "COST", " Cost "} {
		m, err := ParseLBMode(in)
		if err != nil || m != LBCost || m.String() != "cost" {
			t.Errorf("ParseLBMode(%q) = %v, %v", in, m, err)
		}
	}
	o := DefaultOptions()
	o.LBMode = LBCost + 1
	if o.Validate() == nil {
		t.Error("an LB mode past cost validates")
	}
	for _, w := range []int{-1, MaxCostWorkWeight + 1} {
		o := DefaultOptions()
		o.CostWorkWeight = w
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "LOXILB_KV_COST_WORK_WEIGHT") {
			t.Errorf("CostWorkWeight %d: error %v, want one naming LOXILB_KV_COST_WORK_WEIGHT", w, err)
		}
	}
}

func TestCostsTrackPendingAndLearn(t *testing.T) {
	type step struct {
		do     string // dispatch, first, abandon
		ep     int
		tokens int64
		ticket int
		ttft   time.Duration
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		wantPending map[int]int64
		wantPer     map[int]time.Duration // 0: no sample
	}{
		{
			name:        "dispatch adds pending work",
			steps:       []step{{do: "dispatch", ep: 1, tokens: 1000}, {do: "dispatch", ep: 1, tokens: 500, ticket: 1}},
			wantPending: map[int]int64{1: 1500, 0: 0},
			wantPer:     map[int]time.Duration{1: 0},
		},
		{
			name: "the first byte settles the work and gives a sample",
			steps: []step{
				{do: "dispatch", ep: 1, tokens: 1000},
				{do: "first", ticket: 0, ttft: 50 * time.Millisecond},
			},
			wantPending: map[int]int64{1: 0},
			wantPer:     map[int]time.Duration{1: 50 * time.Microsecond},
		},
		{
			name: "a sample divides by the work ahead plus its own",
			steps: []step{
				{do: "dispatch", ep: 2, tokens: 3000, ticket: 0},
				{do: "dispatch", ep: 2, tokens: 1000, ticket: 1},
				{do: "first", ticket: 1, ttft: 200 * time.Millisecond},
			},
			wantPending: map[int]int64{2: 3000},
			wantPer:     map[int]time.Duration{2: 50 * time.Microsecond}, // 200 ms / 4000
		},
		{
			name: "the EWMA moves a fifth of the way to a new sample",
			steps: []step{
				{do: "dispatch", ep: 0, tokens: 1000, ticket: 0},
				{do: "first", ticket: 0, ttft: 100 * time.Millisecond},
				{do: "dispatch", ep: 0, tokens: 1000, ticket: 1},
				{do: "first", ticket: 1, ttft: 200 * time.Millisecond},
			},
			wantPer: map[int]time.Duration{0: 120 * time.Microsecond},
		},
		{
			name: "small work teaches nothing",
			steps: []step{
				{do: "dispatch", ep: 0, tokens: MinLearnTokens - 1},
				{do: "first", ticket: 0, ttft: time.Second},
			},
			wantPending: map[int]int64{0: 0},
			wantPer:     map[int]time.Duration{0: 0},
		},
		{
			name: "abandon settles without a sample, and a ticket settles once",
			steps: []step{
				{do: "dispatch", ep: 3, tokens: 2000},
				{do: "abandon", ticket: 0},
				{do: "first", ticket: 0, ttft: time.Second},
				{do: "abandon", ticket: 0},
			},
			wantPending: map[int]int64{3: 0},
			wantPer:     map[int]time.Duration{3: 0},
		},
		{
			name: "an absurd sample is clamped",
			steps: []step{
				{do: "dispatch", ep: 0, tokens: 1000},
				{do: "first", ticket: 0, ttft: time.Hour},
			},
			wantPer: map[int]time.Duration{0: time.Duration(maxPerTokenNs)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Costs
			tickets := map[int]*CostTicket{}
			for _, s := range tc.steps {
				switch s.do {
				case "dispatch":
					tickets[s.ticket] = c.Dispatch(s.ep, s.tokens)
				case "first":
					tickets[s.ticket].FirstByte(s.ttft)
				case "abandon":
					tickets[s.ticket].Abandon()
				}
			}
			for ep, want := range tc.wantPending {
				if got := c.PendingTokens(ep); got != want {
					t.Errorf("pending on ep %d = %d, want %d", ep, got, want)
				}
			}
			for ep, want := range tc.wantPer {
				got, known := c.PrefillPerToken(ep)
				if known != (want > 0) || (known && absDur(got-want) > time.Microsecond/10) {
					t.Errorf("per-token on ep %d = %v (known %v), want %v", ep, got, known, want)
				}
			}
		})
	}
}

func TestCostsBounds(t *testing.T) {
	var c Costs
	if c.Dispatch(-1, 10) != nil || c.Dispatch(1<<20, 10) != nil {
		t.Error("out-of-range endpoints get tickets")
	}
	var nilTicket *CostTicket
	nilTicket.FirstByte(time.Second) // must not panic
	nilTicket.Abandon()
	tk := c.Dispatch(0, -50)
	if tk.Tokens() != 0 || c.PendingTokens(0) != 0 {
		t.Errorf("negative work counted: %d", c.PendingTokens(0))
	}
	c.Dispatch(1, 1000).FirstByte(50 * time.Millisecond)
	c.Forget(1)
	if _, known := c.PrefillPerToken(1); known {
		t.Error("Forget kept the sample")
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// TestColdPlacementByCost: with LLB_KV_COLD_PLACEMENT=cost a prompt nobody
// holds goes to the least predicted time to first token, endpoints within
// the tolerance tied and taken round-robin (not by in-flight count); a
// prompt with a holder is tier 1.5's, unchanged.
func TestColdPlacementByCost(t *testing.T) {
	prompt := seq(1<<30, 10) // 160 tokens at block size 16
	for _, tc := range []struct {
		name    string
		stored  map[int]int // ep → leading blocks of prompt it holds
		loads   [3]int
		pending map[int]int64
		per     map[int]time.Duration
		want    []int // endpoints of successive decisions
		reason  Reason
	}{
		{
			name: "idle fleet: round-robin among the tied",
			want: []int{0, 1, 2, 0}, reason: ReasonNoWorker,
		},
		{
			name:    "pending prefill work steers it away",
			pending: map[int]int64{0: 3000, 2: 3000},
			want:    []int{1, 1}, reason: ReasonNoWorker,
		},
		{
			name:    "work within the tolerance is a tie, taken in turn whatever the in-flight counts",
			pending: map[int]int64{0: 10, 2: 5000},
			loads:   [3]int{3, 0, 0},
			want:    []int{0, 1, 0}, reason: ReasonNoWorker, // 170 vs 160 tokens: within 10 %; ep2 far beyond
		},
		{
			name: "a faster engine wins beyond the tolerance",
			per:  map[int]time.Duration{0: 80 * time.Microsecond, 1: 80 * time.Microsecond, 2: 40 * time.Microsecond},
			want: []int{2, 2}, reason: ReasonNoWorker,
		},
		{
			name:    "a held prefix is tier 1.5's, whatever the pending work",
			stored:  map[int]int{0: 10},
			pending: map[int]int64{0: 1000},
			want:    []int{0}, reason: ReasonHit,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel := costSelector(t, coldOpts(ColdPlacementCost), prompt, tc.stored, tc.loads, fixedCost{pending: tc.pending, per: tc.per})
			for i, want := range tc.want {
				req := kvReq(prompt)
				req.PromptTokens = 160
				a := sel.Begin(req)
				d := a.Decide()
				if d.Endpoint != want || d.Reason != tc.reason || (tc.reason == ReasonNoWorker) != d.ColdPlaced {
					t.Fatalf("decision %d: %+v, want ep %d (%v)", i, d, want, tc.reason)
				}
			}
		})
	}
}
