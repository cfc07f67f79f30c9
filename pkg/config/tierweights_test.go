package config

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// TestSettingsTierWeights: LLB_KV_TIER_WEIGHTS defaults to the inventory's
// weights, takes partial lists, and a bad entry is a start error that names
// the variable and the entry (docs/configuration.md).
func TestSettingsTierWeights(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    inventory.TierWeights
		wantErr []string // substrings of the error; nil = valid
	}{
		{"", inventory.DefaultTierWeights(), nil},
		{"GPU=1.0,CPU=0.8,STORAGE=0.25", inventory.DefaultTierWeights(), nil},
		{"CPU=0,STORAGE=0", inventory.TierWeights{1000, 0, 0}, nil},
		{"cpu=0.6", inventory.TierWeights{1000, 600, 250}, nil},
		{"CPU=2", inventory.TierWeights{}, []string{`LLB_KV_TIER_WEIGHTS="CPU=2" is invalid`, `entry "CPU=2"`, "0..1"}},
		{"GPU=1,FLASH=0.5", inventory.TierWeights{}, []string{"LLB_KV_TIER_WEIGHTS", `entry "FLASH=0.5"`, "allowed: GPU, CPU, STORAGE"}},
		{"GPU=0", inventory.TierWeights{}, []string{"LLB_KV_TIER_WEIGHTS", `entry "GPU=0"`, "above 0"}},
		{"CPU:0.5", inventory.TierWeights{}, []string{"LLB_KV_TIER_WEIGHTS", `entry "CPU:0.5"`, "TIER=weight"}},
	} {
		s, err := SettingsFromLookup(lookupOf(map[string]string{"LLB_KV_TIER_WEIGHTS": tc.value}))
		if tc.wantErr == nil {
			if err != nil || s.TierWeights != tc.want {
				t.Errorf("%q: weights %v, error %v; want %v", tc.value, s.TierWeights, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("%q: no error", tc.value)
			continue
		}
		for _, w := range tc.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not contain %q", tc.value, err, w)
			}
		}
	}
}
