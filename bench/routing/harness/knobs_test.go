package harness

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/selector"
)

func TestKVGatePolicySettings(t *testing.T) {
	tests := []struct {
		spec          string
		sel           int
		rest          string
		mlf, gain, cw int
		cold          selector.ColdPlacement
		wantErr       bool
	}{
		{spec: "", sel: 0, rest: "", mlf: 175, gain: 0, cw: 300, cold: selector.DefaultColdPlacement},
		{spec: "sel4", sel: 4, rest: "", mlf: 175, gain: 0, cw: 300, cold: selector.DefaultColdPlacement},
		{spec: "mlf150-sel8-gain100", sel: 8, rest: "mlf150-gain100", mlf: 150, gain: 100, cw: 300, cold: selector.DefaultColdPlacement},
		{spec: "costw100-gain50", sel: 0, rest: "costw100-gain50", mlf: 175, gain: 50, cw: 100, cold: selector.DefaultColdPlacement},
		{spec: "coldsel", sel: 0, rest: "coldsel", mlf: 175, cw: 300, cold: selector.ColdPlacementSel},
		{spec: "coldcost-mlf150", sel: 0, rest: "coldcost-mlf150", mlf: 150, cw: 300, cold: selector.ColdPlacementCost},
		{spec: "sel4-coldhash", sel: 4, rest: "coldhash", mlf: 175, cw: 300, cold: selector.ColdPlacementHash},
		{spec: "coldrr", sel: 0, rest: "coldrr", wantErr: true},
		{spec: "sel99", sel: 0, rest: "sel99", wantErr: true}, // out of range: left to kvgateKnobs, which refuses it
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			sel, rest := ruleSel(tc.spec)
			if sel != tc.sel || rest != tc.rest {
				t.Fatalf("ruleSel(%q) = %d, %q; want %d, %q", tc.spec, sel, rest, tc.sel, tc.rest)
			}
			s := config.DefaultSettings()
			err := kvgateKnobs(rest, &s)
			if (err != nil) != tc.wantErr {
				t.Fatalf("kvgateKnobs(%q): %v, want error %v", rest, err, tc.wantErr)
			}
			if err == nil && (s.MeanLoadFactor != tc.mlf || s.CapFullGain != tc.gain || s.CostWorkWeight != tc.cw || s.ColdPlacement != tc.cold) {
				t.Fatalf("settings mlf %d gain %d costw %d cold %v", s.MeanLoadFactor, s.CapFullGain, s.CostWorkWeight, s.ColdPlacement)
			}
		})
	}
}
