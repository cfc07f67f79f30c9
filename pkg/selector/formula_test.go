package selector

import (
	"math/rand/v2"
	"testing"
)

func TestCapFor(t *testing.T) {
	tests := []struct {
		name                string
		mlf, total, ci, sum int64
		want                int64
	}{
		{"three equal candidates", 175, 5, 1, 3, 3},            // ceil(875/300)=ceil(2.92)
		{"no load", 175, 0, 1, 3, 1},                           // max(1, 0)
		{"weighted", 175, 10, 1000, 4000, 5},                   // ceil(1,750,000/400,000)=ceil(4.375)
		{"exact division", 300, 26, 8_000_000, 16_000_000, 39}, // 62.4e9/1.6e9 = 39
		{"below one", 100, 1, 1, 2, 1},                         // ceil(0.5)
		{"single candidate", 175, 4, 7, 7, 7},                  // ceil(1.75·4)
		{"huge, exact in 128 bits", 1000, 256 * maxLoad, maxCapacity, maxCapacity, 10 * 256 * maxLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := capFor(tc.mlf, tc.total, tc.ci, tc.sum); got != tc.want {
				t.Fatalf("capFor(%d,%d,%d,%d) = %d, want %d", tc.mlf, tc.total, tc.ci, tc.sum, got, tc.want)
			}
		})
	}
}

func TestAdaptiveLaw(t *testing.T) {
	tests := []struct{ l, mlf, lambda int64 }{
		{0, 175, 50000}, {16, 175, 50000}, {17, 187, 55000}, {20, 225, 70000},
		{25, 287, 95000}, {26, 300, 100000}, {1000, 300, 100000},
	}
	for _, tc := range tests {
		if got := adaptiveMLF(tc.l); got != tc.mlf {
			t.Errorf("adaptiveMLF(%d) = %d, want %d", tc.l, got, tc.mlf)
		}
		if got := adaptiveLambda(tc.l); got != tc.lambda {
			t.Errorf("adaptiveLambda(%d) = %d, want %d", tc.l, got, tc.lambda)
		}
	}
}

func TestMinBlocks(t *testing.T) {
	tests := []struct{ tokens, bs, nh, want int }{
		{16, 16, 5, 1}, {32, 16, 5, 2}, {33, 16, 5, 3}, {100, 16, 3, 3}, {16, 16, 0, 1},
		{0, 16, 5, 0}, {4096, 16, 1000, 256}, {1, 16, 4, 1}, {16, 128, 4, 1}, {300, 128, 9, 3},
	}
	for _, tc := range tests {
		if got := minBlocks(tc.tokens, tc.bs, tc.nh); got != tc.want {
			t.Errorf("minBlocks(%d,%d,%d) = %d, want %d", tc.tokens, tc.bs, tc.nh, got, tc.want)
		}
	}
}

func TestCapacity(t *testing.T) {
	e := newEnv(t, Rule{KVExactMode: 3, Endpoints: []Endpoint{
		{Idx: 0}, {Idx: 1, CapacityWeight: 50}, {Idx: 2, CapacityWeight: 250}, {Idx: 3}, {Idx: 4}, {Idx: 5},
	}}, DefaultOptions())
	e.engine.blocks = map[int]int64{0: 1000, 1: 1000, 2: 1000, 4: 9_000_000, 5: 0}
	c := e.sel.rule.Load()
	for ep, want := range map[int]int64{
		0: 1000,      // weight 100
		1: 500,       // 1000 × 50 / 100
		2: 1000,      // weights above 100 are 100
		3: 1,         // unknown
		4: 8_000_000, // clamped
		5: 1,         // zero blocks
	} {
		if got := e.sel.capacity(c, ep); got != want {
			t.Errorf("capacity(ep %d) = %d, want %d", ep, got, want)
		}
	}
}

// TestUnderCapMatchesCapFor: the division-free test agrees with the formula.
func TestUnderCapMatchesCapFor(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200000; i++ {
		mlf := int64(100 + rng.IntN(901))
		sum := int64(1 + rng.IntN(1<<rng.IntN(31)))
		ci := min(sum, int64(1+rng.IntN(maxCapacity)))
		total := int64(rng.IntN(1 << rng.IntN(25)))
		load := int64(rng.IntN(int(total) + 2))
		if got, want := underCap(load, mlf, total, ci, sum), load < capFor(mlf, total, ci, sum); got != want {
			t.Fatalf("underCap(%d,%d,%d,%d,%d) = %v, capFor says %v", load, mlf, total, ci, sum, got, want)
		}
	}
}
