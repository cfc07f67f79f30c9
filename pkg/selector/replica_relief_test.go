package selector

import "testing"

// TestReliefTarget: with LLB_KV_RELIEF_TARGET=holders, spill relief moves a
// hit to an endpoint holding part of its prefix, and onto one without only
// at 1.5 times the fleet cap; fleet (the default) keeps the spec's move onto
// any under-cap endpoint, overlap ignored.
func TestReliefTarget(t *testing.T) {
	prompt := seq(0, 4)
	tests := []struct {
		name    string
		eps     int // 3 unless given
		target  ReliefTarget
		overlap map[int]int // blocks of prompt each endpoint holds
		loads   map[int]int
		want    int
		spill   bool
		score   int
	}{
		// One holder, loads {3,1,1}: L=5, fleet cap ceil(175·5/300)=3, ep0
		// at it. Fleet moves to ep1; holders has no other holder, and ep0 is
		// under 1.5 × the fleet cap, ceil(262·5/300)=5: it stays.
		{name: "fleet moves onto no overlap", target: ReliefToFleet, overlap: map[int]int{0: 4}, loads: map[int]int{0: 3, 1: 1, 2: 1}, want: 1, spill: true, score: 0},
		{name: "holders keeps a lone holder", target: ReliefToHolders, overlap: map[int]int{0: 4}, loads: map[int]int{0: 3, 1: 1, 2: 1}, want: 0, score: 4},
		// Loads {3,0,0}: L=3, 1.5 × the fleet cap is ceil(262·3/300)=3 and
		// ep0 is at it: a hot prefix on one endpoint still spreads.
		{name: "holders spreads a hot lone holder", target: ReliefToHolders, overlap: map[int]int{0: 4}, loads: map[int]int{0: 3}, want: 1, spill: true, score: 0},
		// ep0 (4 blocks) and ep2 (1 block) hold it; loads {4,0,1}: L=5,
		// candidates' cap ceil(175·5/200)=5 keeps ep0 in the primary arm;
		// fleet cap ceil(175·5/300)=3, ep0 over. Fleet: least loaded ep1;
		// holders: ep2 (load 1 < 3).
		{name: "fleet takes the least loaded", target: ReliefToFleet, overlap: map[int]int{0: 4, 2: 1}, loads: map[int]int{0: 4, 2: 1}, want: 1, spill: true, score: 0},
		{name: "holders takes a holder under cap", target: ReliefToHolders, overlap: map[int]int{0: 4, 2: 1}, loads: map[int]int{0: 4, 2: 1}, want: 2, spill: true, score: 1},
		// Four endpoints, loads {4,0,4,0}: L=8, fleet cap ceil(175·8/400)=4,
		// so both holders are at it (the candidates' cap ceil(175·8/200)=7
		// keeps ep0 in the primary arm). Fleet moves to ep1; holders stays.
		{name: "fleet leaves holders at cap", eps: 4, target: ReliefToFleet, overlap: map[int]int{0: 4, 2: 1}, loads: map[int]int{0: 4, 2: 4}, want: 1, spill: true, score: 0},
		// ep0 is under 1.5 × the fleet cap, ceil(262·8/400)=6: holders stays.
		{name: "holders stays when holders are at cap", eps: 4, target: ReliefToHolders, overlap: map[int]int{0: 4, 2: 1}, loads: map[int]int{0: 4, 2: 4}, want: 0, score: 4},
		// Under its fleet cap nothing moves, whatever the target.
		{name: "under cap stays", target: ReliefToHolders, overlap: map[int]int{0: 4}, loads: map[int]int{0: 1, 1: 1, 2: 1}, want: 0, score: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := noSeed()
			opts.ReliefTarget = tc.target
			opts.CapFullGain = 0
			n := tc.eps
			if n == 0 {
				n = 3
			}
			e := newEnv(t, poolRule(n, 0), opts)
			for ep, n := range tc.overlap {
				e.inv.add(ep, prompt[:n]...)
			}
			for ep, l := range tc.loads {
				e.loads.l[ep] = l
			}
			d := e.decide(kvReq(prompt))
			if d.Tier != TierKV || d.Endpoint != tc.want || d.Spilled != tc.spill || d.Score != tc.score {
				t.Fatalf("decision %+v, want ep %d spilled %v score %d", d, tc.want, tc.spill, tc.score)
			}
		})
	}
}

// TestParseReliefTarget: fleet (or empty) and holders, any case; anything
// else is an error naming the allowed values.
func TestParseReliefTarget(t *testing.T) {
	for _, c := range []struct {
		in   string
		want ReliefTarget
		ok   bool
	}{
		{"", ReliefToFleet, true},
		{" Fleet ", ReliefToFleet, true},
		{"HOLDERS", ReliefToHolders, true},
		{"holder", 0, false},
	} {
		got, err := ParseReliefTarget(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("%q: %v, %v; want %v ok %v", c.in, got, err, c.want, c.ok)
		}
		if c.ok && got.String() != map[ReliefTarget]string{ReliefToFleet: "fleet", ReliefToHolders: "holders"}[c.want] {
			t.Errorf("%q: String %q", c.in, got.String())
		}
	}
}
