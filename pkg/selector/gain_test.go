package selector

import "testing"

func TestGainCapFor(t *testing.T) {
	tests := []struct {
		name                 string
		mlf, gain, full, out int64
	}{
		{"scaling off", 175, 0, 0, 175},
		{"gain reaches full", 175, 8, 8, 175},
		{"gain beyond full", 175, 20, 8, 175},
		{"no gain is the mean", 175, 0, 8, 100},
		{"negative gain is the mean", 175, -3, 8, 100},
		{"half the gain, half the excess", 175, 4, 8, 137}, // 100 + 75·4/8 = 137.5, floored
		{"one block of eight", 175, 1, 8, 109},             // 100 + 75/8
		{"mlf 100 stays 100", 100, 4, 8, 100},
		{"adaptive's larger mlf scales too", 300, 2, 8, 150},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := gainCapFor(tc.mlf, tc.gain, tc.full); got != tc.out {
				t.Fatalf("gainCapFor(%d, %d, %d) = %d, want %d", tc.mlf, tc.gain, tc.full, got, tc.out)
			}
		})
	}
}

// TestGainScaledCap: with LOXILB_KV_CAP_FULL_GAIN set, the bounded-load cap
// (hard, adaptive, cost) of an endpoint shrinks toward the fleet mean as its overlap advantage over
// the least-loaded endpoint shrinks; without it (want0) every mode decides
// as before. Four endpoints, one capacity each, an 8-block prompt.
func TestGainScaledCap(t *testing.T) {
	type want struct {
		ep      int
		spilled bool
		score   int
	}
	tests := []struct {
		name    string
		mode    LBMode
		gain    int // LOXILB_KV_CAP_FULL_GAIN
		relief  bool
		overlap map[int]int
		loads   map[int]int
		with    want // with the gain-scaled cap
		without want // CapFullGain = 0
	}{
		{
			// Every endpoint holds the prefix (band: ep0 leads by one block).
			// L=7, Σĉ=4. Off: cap0 = ceil(175·7/400) = 4 > 2, ep0 keeps it.
			// On: ref ep3 (least loaded, 7); gain0 = 1 → mlf 109, cap0 = 2: over;
			// ep1, ep2 gain 0 → mlf 100, cap 2: over; ep3 (1 < 2) wins.
			name: "small gain over the least loaded spills", mode: LBHard, gain: 100,
			overlap: map[int]int{0: 8, 1: 7, 2: 7, 3: 7}, loads: map[int]int{0: 2, 1: 2, 2: 2, 3: 1},
			with: want{3, true, 7}, without: want{0, false, 8},
		},
		{
			// Same scores: the tie already went to the least loaded.
			name: "tie goes to the least loaded either way", mode: LBHard, gain: 100,
			overlap: map[int]int{0: 8, 1: 8}, loads: map[int]int{0: 2, 1: 1, 2: 1, 3: 1},
			with: want{1, true, 8}, without: want{1, true, 8},
		},
		{
			// Relief over the fleet: L=5, Σĉ=4, ref ep1 (load 1, score 0), gain0 = 8
			// = full → cap ceil(175·5/400) = 3 > 2: ep0 stays, with or without.
			name: "full gain keeps the full cap", mode: LBHard, gain: 100, relief: true,
			overlap: map[int]int{0: 8}, loads: map[int]int{0: 2, 1: 1, 2: 1, 3: 1},
			with: want{0, false, 8}, without: want{0, false, 8},
		},
		{
			// gain0 = 4 of full 8 → mlf 137, fleet cap ceil(137·5/400) = 2: ep0
			// (2) is at it; relief moves to the least loaded under its cap, ep1.
			name: "half gain tightens relief", mode: LBHard, gain: 100, relief: true,
			overlap: map[int]int{0: 4}, loads: map[int]int{0: 2, 1: 1, 2: 1, 3: 1},
			with: want{1, true, 0}, without: want{0, false, 4},
		},
		{
			// LOXILB_KV_CAP_FULL_GAIN=50: full = 4 blocks, so a 4-block gain is full.
			name: "a lower full gain keeps the cap", mode: LBHard, gain: 50, relief: true,
			overlap: map[int]int{0: 4}, loads: map[int]int{0: 2, 1: 1, 2: 1, 3: 1},
			with: want{0, false, 4}, without: want{0, false, 4},
		},
		{
			// Adaptive is hard with its own mlf (175 at L ≤ 16), scaled the same.
			name: "adaptive scales its cap", mode: LBAdaptive, gain: 100,
			overlap: map[int]int{0: 8, 1: 7, 2: 7, 3: 7}, loads: map[int]int{0: 2, 1: 2, 2: 2, 3: 1},
			with: want{3, true, 7}, without: want{0, false, 8},
		},
		{
			// soft: costs {0 + 32·2, 1000 + 64, 1000 + 64, 1000 + 32}: ep0 either way.
			name: "soft unchanged", mode: LBSoft, gain: 100,
			overlap: map[int]int{0: 8, 1: 7, 2: 7, 3: 7}, loads: map[int]int{0: 2, 1: 2, 2: 2, 3: 1},
			with: want{0, false, 8}, without: want{0, false, 8},
		},
		{
			name: "off unchanged", mode: LBOff, gain: 100, relief: true,
			overlap: map[int]int{0: 8, 1: 7, 2: 7, 3: 7}, loads: map[int]int{0: 5, 1: 0, 2: 0, 3: 0},
			with: want{0, false, 8}, without: want{0, false, 8},
		},
		{
			// cost: equal learned speed (cold-start price), no pending work, so
			// the least uncached tokens (ep0) wins under the plain fleet cap
			// (4); scaled, ep0's cap is 2 and ep1, ep2 (no gain) are at the
			// mean, 2: only ep3 is under its cap.
			name: "cost scales its fleet cap", mode: LBCost, gain: 100,
			overlap: map[int]int{0: 8, 1: 7, 2: 7, 3: 7}, loads: map[int]int{0: 2, 1: 2, 2: 2, 3: 1},
			with: want{3, true, 7}, without: want{0, false, 8},
		},
	}
	for _, tc := range tests {
		for _, on := range []bool{true, false} {
			name := tc.name + "/without"
			exp := tc.without
			if on {
				name, exp = tc.name+"/with", tc.with
			}
			t.Run(name, func(t *testing.T) {
				opts := noSeed()
				opts.LBMode = tc.mode
				opts.SpillRelief = ReliefOff
				if tc.relief {
					opts.SpillRelief = ReliefOn
				}
				opts.CapFullGain = 0
				if on {
					opts.CapFullGain = tc.gain
				}
				e := newEnv(t, poolRule(4, 0), opts)
				prompt := seq(0, 8)
				for ep, n := range tc.overlap {
					e.inv.add(ep, prompt[:n]...)
				}
				for ep, l := range tc.loads {
					e.loads.l[ep] = l
				}
				d := e.decide(kvReq(prompt))
				if d.Tier != TierKV || d.Endpoint != exp.ep || d.Spilled != exp.spilled || d.Score != exp.score {
					t.Fatalf("got ep %d spilled %v score %d (%+v); want ep %d spilled %v score %d",
						d.Endpoint, d.Spilled, d.Score, d, exp.ep, exp.spilled, exp.score)
				}
			})
		}
	}
}

func TestCapFullGainValidated(t *testing.T) {
	for _, v := range []int{-1, 101} {
		o := DefaultOptions()
		o.CapFullGain = v
		if err := o.Validate(); err == nil {
			t.Fatalf("CapFullGain %d accepted", v)
		}
	}
	o := DefaultOptions()
	o.CapFullGain = 100
	if err := o.Validate(); err != nil {
		t.Fatalf("CapFullGain 100 rejected: %v", err)
	}
}
