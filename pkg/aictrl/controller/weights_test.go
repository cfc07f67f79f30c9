package controller

import "testing"

func TestRaw(t *testing.T) {
	cases := []struct {
		name string
		srcs []source
		want []float64
	}{
		{"by role", []source{{"prefill", 1, false}, {"prefill", 0.5, false}, {"decode", 2, false}, {"decode", 1, false}},
			[]float64{100, 50, 100, 50}},
		{"stale drifts to 100 and leaves the max", []source{{"prefill", 1, true}, {"prefill", 0.5, false}},
			[]float64{100, 100}},
		{"all stale", []source{{"prefill", 1, true}, {"prefill", 0.5, true}}, []float64{100, 100}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := raw(c.srcs)
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v want %v", got, c.want)
				}
			}
		})
	}
}

func TestLawStep(t *testing.T) {
	cases := []struct {
		name string
		law  Law
		raws []float64
		want []uint32
	}{
		{"first epoch takes the raw value", DefaultLaw, []float64{50}, []uint32{50}},
		// 100 → 50: EWMA 85 (−15, past the dead-band, under the clamp), then 74.5, 66.15 ...
		{"ewma", Law{Alpha: 0.3, DeadBand: 0, MaxStep: 0}, []float64{100, 50, 50}, []uint32{100, 85, 75}},
		{"dead-band holds small moves", Law{Alpha: 1, DeadBand: 5, MaxStep: 0}, []float64{50, 54, 53, 56}, []uint32{50, 50, 50, 56}},
		{"step clamp", Law{Alpha: 1, DeadBand: 0, MaxStep: 20}, []float64{100, 10, 10, 10, 10}, []uint32{100, 80, 60, 40, 20}},
		{"stale drift back to 100", DefaultLaw, []float64{50, 100, 100, 100, 100, 100}, []uint32{50, 65, 76, 83, 88, 88}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var d damped
			for i, r := range c.raws {
				if got := c.law.step(&d, r); got != c.want[i] {
					t.Fatalf("epoch %d: got %d want %d (all %v)", i, got, c.want[i], c.want)
				}
			}
		})
	}
}
