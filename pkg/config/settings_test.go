package config

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/selector"
)

func lookupOf(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func TestSettingsDefaults(t *testing.T) {
	s, err := SettingsFromLookup(lookupOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if s != DefaultSettings() {
		t.Fatalf("empty env %+v != defaults %+v", s, DefaultSettings())
	}
	if s.LBMode != selector.LBHard || s.MeanLoadFactor != 175 || s.LoadPenalty != 32 || s.MinMatchTokens != 16 ||
		s.ColdStartSeedN != 16 || s.ColdStartMinBlocks != 16 || s.MaxBlocks != 1_000_000 || s.ZeroHitN != 50 ||
		s.Score != selector.ScorePrefix || s.ReplayPortOffset != 1000 || s.PrefillTimeout != 30*time.Second ||
		s.DecodeSilence != 120*time.Second || s.OriginErrThreshold != 3 || !s.DecodeOnlyFallback || s.NoneHashSeedSet {
		t.Fatalf("defaults wrong: %+v", s)
	}
	if s.EffectiveMaxPark() != 30*time.Second {
		t.Error("MaxPark 0 means the prefill timeout")
	}
}

func TestSettingsValues(t *testing.T) {
	cases := []struct {
		env   map[string]string
		check func(Settings) bool
	}{
		{map[string]string{"LLB_KV_NONE_HASH_SEED": ""}, func(s Settings) bool { return s.NoneHashSeedSet && s.NoneHashSeed == "" }},
		{map[string]string{"LLB_KV_NONE_HASH_SEED": "0"}, func(s Settings) bool { return s.NoneHashSeedSet && s.NoneHashSeed == "0" }},
		{map[string]string{"LLB_KV_HASH_DEBUG": "1"}, func(s Settings) bool { return s.HashDebug }},
		{map[string]string{"LLB_KV_MIN_MATCH_TOKENS": "0"}, func(s Settings) bool { return s.MinMatchTokens == 0 }},
		{map[string]string{"LLB_KV_MIN_MATCH_TOKENS": "4096"}, func(s Settings) bool { return s.MinMatchTokens == 4096 }},
		{map[string]string{"LLB_KV_LOADGUARD": "1"}, func(s Settings) bool { return s.LoadGuard }},
		{map[string]string{"LOXILB_KV_LB_MODE": "adaptive-soft"}, func(s Settings) bool { return s.LBMode == selector.LBAdaptiveSoft }},
		{map[string]string{"LOXILB_KV_LB_MODE": "off", "LOXILB_KV_UNIFIED_MODE": "1"}, func(s Settings) bool { return s.LBMode == selector.LBOff }},
		{map[string]string{"LOXILB_KV_UNIFIED_MODE": "No"}, func(s Settings) bool { return s.LBMode == selector.LBOff }},
		{map[string]string{"LOXILB_KV_UNIFIED_MODE": "whatever"}, func(s Settings) bool { return s.LBMode == selector.LBHard }},
		{map[string]string{"LOXILB_KV_MEAN_LOAD_FACTOR": "1000"}, func(s Settings) bool { return s.MeanLoadFactor == 1000 }},
		{map[string]string{"LOXILB_KV_LOAD_PENALTY": "100000"}, func(s Settings) bool { return s.LoadPenalty == 100000 }},
		{map[string]string{"LOXILB_KV_SPILL_RELIEF": "Yes"}, func(s Settings) bool { return s.SpillRelief == selector.ReliefOn }},
		{map[string]string{"LOXILB_KV_SPILL_RELIEF": "FALSE"}, func(s Settings) bool { return s.SpillRelief == selector.ReliefOff }},
		{map[string]string{"LOXILB_KV_SPILL_RELIEF": "auto"}, func(s Settings) bool { return s.SpillRelief == selector.ReliefAuto }},
		{map[string]string{"LOXILB_KV_SPILL_RELIEF": "on", "LOXILB_KV_SCORE": " Overlap ", "LOXILB_KV_LB_MODE": "SOFT"}, func(s Settings) bool {
			return s.SpillRelief == selector.ReliefOn && s.Score == selector.ScoreOverlap && s.LBMode == selector.LBSoft
		}},
		{map[string]string{"LOXILB_KV_UNIFIED_MODE": "0"}, func(s Settings) bool { return s.LBMode == selector.LBOff }},
		{map[string]string{"LOXILB_KV_UNIFIED_MODE": "off", "LOXILB_KV_LB_MODE": " "}, func(s Settings) bool { return s.LBMode == selector.LBOff }},
		{map[string]string{"LOXILB_KV_COLDSTART_SEED_N": "0"}, func(s Settings) bool { return s.ColdStartSeedN == 0 }},
		{map[string]string{"LOXILB_KV_COLDSTART_MIN_BLOCKS": "0"}, func(s Settings) bool { return s.EffectiveColdStartMinBlocks() == 1 }},
		{map[string]string{"LOXILB_KV_MAX_BLOCKS": "1000"}, func(s Settings) bool { return s.MaxBlocks == 1000 }},
		{map[string]string{"LOXILB_KV_ZERO_HIT_N": "1"}, func(s Settings) bool { return s.ZeroHitN == 1 }},
		{map[string]string{"LOXILB_KV_SCORE": "overlap"}, func(s Settings) bool { return s.Score == selector.ScoreOverlap }},
		{map[string]string{"LOXILB_KV_SCORE": "prefix"}, func(s Settings) bool { return s.Score == selector.ScorePrefix }},
		{map[string]string{"LOXILB_KV_SCORE": "leading"}, func(s Settings) bool { return s.Score == selector.ScorePrefix }},
		{map[string]string{"LOXILB_KV_SCORE": "LEADING"}, func(s Settings) bool { return s.Score == selector.ScorePrefix }},
		{map[string]string{"LOXILB_KV_LB_MODE": "cost"}, func(s Settings) bool { return s.LBMode == selector.LBCost }},
		{map[string]string{"LOXILB_KV_PROVISIONAL_WEIGHT": "0"}, func(s Settings) bool { return s.ProvisionalWeight == 0 }},
		{map[string]string{"LLB_KV_COLD_PLACEMENT": " Hash "}, func(s Settings) bool { return s.ColdPlacement == selector.ColdPlacementHash }},
		{map[string]string{"LLB_KV_COLD_PLACEMENT": "sel"}, func(s Settings) bool { return s.ColdPlacement == selector.ColdPlacementSel }},
		{map[string]string{"LLB_KV_RELIEF_TARGET": " Holders "}, func(s Settings) bool { return s.ReliefTarget == selector.ReliefToHolders }},
		{map[string]string{"LLB_KV_RELIEF_TARGET": "fleet"}, func(s Settings) bool { return s.ReliefTarget == selector.ReliefToFleet }},
		{map[string]string{"LLB_KV_LOAD_MIRROR": "on"}, func(s Settings) bool { return s.LoadMirror }},
		{map[string]string{}, func(s Settings) bool { return !s.LoadMirror }},
		{map[string]string{"LLB_KV_COLD_PLACEMENT": "cost"}, func(s Settings) bool { return s.ColdPlacement == selector.ColdPlacementCost }},
		{map[string]string{"LLB_KV_LOAD_SCRAPE_MS": "250"}, func(s Settings) bool { return s.LoadScrapeInterval == 250*time.Millisecond }},
		{map[string]string{"LLB_KV_LOAD_SCRAPE_MS": "0"}, func(s Settings) bool { return s.LoadScrapeInterval == 0 }},
		{map[string]string{}, func(s Settings) bool { return s.LoadScrapeInterval == 0 }},
		{map[string]string{"LOXILB_KV_COST_WORK_WEIGHT": "100"}, func(s Settings) bool { return s.CostWorkWeight == 100 }},
		{map[string]string{"LOXILB_KV_PROVISIONAL_TTL_MS": "2500"}, func(s Settings) bool { return s.ProvisionalTTL == 2500*time.Millisecond }},
		{map[string]string{"LLB_KV_REPLAY_PORT_OFFSET": "0"}, func(s Settings) bool { return s.ReplayPortOffset == 0 }},
		{map[string]string{"LLB_KV_MAX_PROMPT_TOKENS": "1024"}, func(s Settings) bool { return s.MaxPromptTokens == 1024 }},
		{map[string]string{}, func(s Settings) bool { return s.MaxPromptTokens == 262144 }},
		{map[string]string{"LLB_KV_MAX_FRAME_BYTES": "4096"}, func(s Settings) bool { return s.MaxFrameBytes == 4096 }},
		{map[string]string{}, func(s Settings) bool { return s.AuditSample == 64 }},
		{map[string]string{"LLB_KV_AUDIT_SAMPLE": "0"}, func(s Settings) bool { return s.AuditSample == 0 }},
		{map[string]string{"LLB_KV_AUDIT_SAMPLE": "1"}, func(s Settings) bool { return s.AuditSample == 1 }},
		{map[string]string{"LOXILB_KV_TRTLLM_POLL_MIN_MS": "1", "LOXILB_KV_TRTLLM_POLL_MAX_MS": "10000"}, func(s Settings) bool {
			return s.TRTLLMPollMin == time.Millisecond && s.TRTLLMPollMax == 10*time.Second
		}},
		{map[string]string{"LOXILB_KV_TRTLLM_POLL_MIN_MS": "50"}, func(s Settings) bool { // min > max: both revert
			return s.TRTLLMPollMin == 5*time.Millisecond && s.TRTLLMPollMax == 20*time.Millisecond
		}},
		{map[string]string{}, func(s Settings) bool { return s.MaxFrameBytes == 64<<20 }},
		{map[string]string{"LLB_PD_PREFILL_TIMEOUT_SEC": "600"}, func(s Settings) bool { return s.PrefillTimeout == 600*time.Second }},
		{map[string]string{"LLB_PD_DECODE_SILENCE_SEC": "5"}, func(s Settings) bool { return s.DecodeSilence == 5*time.Second }},
		{map[string]string{"LLB_PD_MAX_INFLIGHT_PER_EP": "8", "LLB_PD_QUEUE_DEPTH_PER_EP": "4", "LLB_PD_MAX_PARK_SEC": "2", "LLB_PD_MAX_TOTAL_INFLIGHT": "100"},
			func(s Settings) bool {
				return s.MaxInflightPerEP == 8 && s.QueueDepthPerEP == 4 && s.EffectiveMaxPark() == 2*time.Second && s.MaxTotalInflight == 100
			}},
		{map[string]string{"LLB_PD_ORIGIN_ERR_THRESHOLD": "0"}, func(s Settings) bool { return s.OriginErrThreshold == 0 }},
		{map[string]string{"LLB_PD_DECODE_ONLY_FALLBACK": "0"}, func(s Settings) bool { return !s.DecodeOnlyFallback }},
	}
	for _, c := range cases {
		s, err := SettingsFromLookup(lookupOf(c.env))
		if err != nil {
			t.Errorf("%v: %v", c.env, err)
			continue
		}
		if !c.check(s) {
			t.Errorf("%v: got %+v", c.env, s)
		}
	}
}

func TestSettingsErrorsNameVariable(t *testing.T) {
	bad := map[string]string{
		"LLB_KV_HASH_DEBUG":              "maybe",
		"LLB_KV_MIN_MATCH_TOKENS":        "4097",
		"LLB_KV_LOADGUARD":               "x",
		"LLB_KV_LOAD_MIRROR":             "sometimes",
		"LOXILB_KV_LB_MODE":              "medium",
		"LOXILB_KV_MEAN_LOAD_FACTOR":     "99",
		"LOXILB_KV_LOAD_PENALTY":         "0",
		"LOXILB_KV_SPILL_RELIEF":         "sometimes",
		"LOXILB_KV_COLDSTART_SEED_N":     "-1",
		"LOXILB_KV_COLDSTART_MIN_BLOCKS": "abc",
		"LOXILB_KV_MAX_BLOCKS":           "999",
		"LOXILB_KV_ZERO_HIT_N":           "0",
		"LOXILB_KV_SCORE":                "best",
		"LOXILB_KV_PROVISIONAL_WEIGHT":   "101",
		"LOXILB_KV_COST_WORK_WEIGHT":     "1001",
		"LOXILB_KV_PROVISIONAL_TTL_MS":   "99",
		"LLB_KV_REPLAY_PORT_OFFSET":      "1e3",
		"LLB_KV_MAX_PROMPT_TOKENS":       "0",
		"LLB_KV_MAX_FRAME_BYTES":         "4095",
		"LLB_KV_AUDIT_SAMPLE":            "-1",
		"LOXILB_KV_TRTLLM_POLL_MIN_MS":   "0",
		"LOXILB_KV_TRTLLM_POLL_MAX_MS":   "10001",
		"LLB_PD_PREFILL_TIMEOUT_SEC":     "0",
		"LLB_PD_DECODE_SILENCE_SEC":      "100000",
		"LLB_PD_MAX_INFLIGHT_PER_EP":     "-3",
		"LLB_PD_QUEUE_DEPTH_PER_EP":      "4097",
		"LLB_PD_MAX_PARK_SEC":            "-1",
		"LLB_PD_MAX_TOTAL_INFLIGHT":      "3000000000",
		"LLB_PD_ORIGIN_ERR_THRESHOLD":    "-1",
		"LLB_PD_DECODE_ONLY_FALLBACK":    "2",
		"LLB_KV_COLD_PLACEMENT":          "round-robin",
		"LLB_KV_LOAD_SCRAPE_MS":          "99",
	}
	for name, val := range bad {
		_, err := SettingsFromLookup(lookupOf(map[string]string{name: val}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: error %v does not name the variable", name, val, err)
		}
	}
	// All at once: every variable is reported.
	_, err := SettingsFromLookup(lookupOf(bad))
	for name := range bad {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("joined error lacks %s", name)
		}
	}
}

func TestSettingsFromEnvGetenv(t *testing.T) {
	s, err := SettingsFromEnv(func(k string) string {
		if k == "LOXILB_KV_LB_MODE" {
			return "soft"
		}
		return ""
	})
	if err != nil || s.LBMode != selector.LBSoft {
		t.Fatalf("%v %+v", err, s)
	}
}

// TestSettingsSelectorKnobErrors: the selector's knobs are parsed with
// pkg/selector's parsers, and the start-up error keeps the documented text
// (docs/configuration.md).
func TestSettingsSelectorKnobErrors(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"LOXILB_KV_LB_MODE", "medium", `environment variable LOXILB_KV_LB_MODE="medium" is invalid: allowed values: off, hard, soft, adaptive, adaptive-soft, cost`},
		{"LOXILB_KV_SPILL_RELIEF", " sometimes ", `environment variable LOXILB_KV_SPILL_RELIEF="sometimes" is invalid: allowed values: auto, on (1, true, yes), off (0, false, no)`},
		{"LOXILB_KV_SCORE", "leading-run", `environment variable LOXILB_KV_SCORE="leading-run" is invalid: allowed values: leading (the default; alias prefix), overlap`},
		{"LLB_KV_COLD_PLACEMENT", "rendezvous", `environment variable LLB_KV_COLD_PLACEMENT="rendezvous" is invalid: allowed values: cost (the default), sel, hash`},
		{"LLB_KV_RELIEF_TARGET", "overlap", `environment variable LLB_KV_RELIEF_TARGET="overlap" is invalid: allowed values: fleet (the default), holders`},
	} {
		_, err := SettingsFromLookup(lookupOf(map[string]string{tc.name: tc.value}))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s=%q: error %v\nwant %s", tc.name, tc.value, err, tc.want)
		}
	}
}

// TestSettingsDefaultsAreThePackages': an empty environment gives exactly the
// selector's and the inventory's defaults, and the documented ranges are
// theirs (one source of truth, docs/configuration.md).
func TestSettingsDefaultsAreThePackages(t *testing.T) {
	s, o := DefaultSettings(), selector.DefaultOptions()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"LLB_KV_MIN_MATCH_TOKENS", s.MinMatchTokens, o.MinMatchTokens},
		{"LOXILB_KV_LB_MODE", s.LBMode, o.LBMode},
		{"LOXILB_KV_MEAN_LOAD_FACTOR", s.MeanLoadFactor, o.MeanLoadFactor},
		{"LOXILB_KV_LOAD_PENALTY", s.LoadPenalty, o.LoadPenalty},
		{"LOXILB_KV_SPILL_RELIEF", s.SpillRelief, o.SpillRelief},
		{"LOXILB_KV_COLDSTART_SEED_N", s.ColdStartSeedN, o.ColdStartSeedN},
		{"LOXILB_KV_COLDSTART_MIN_BLOCKS", s.ColdStartMinBlocks, o.ColdStartMinBlocks},
		{"LOXILB_KV_ZERO_HIT_N", s.ZeroHitN, o.ZeroHitN},
		{"LOXILB_KV_SCORE", s.Score, o.Score},
		{"LLB_KV_COLD_PLACEMENT", s.ColdPlacement, o.ColdPlacement},
		{"LLB_KV_RELIEF_TARGET", s.ReliefTarget, o.ReliefTarget},
		{"LLB_KV_LOADGUARD", s.LoadGuard, o.LoadGuard},
		{"LOXILB_KV_MAX_BLOCKS", s.MaxBlocks, inventory.DefaultMaxBlocks},
	} {
		if c.got != c.want {
			t.Errorf("%s: config default %v, package default %v", c.name, c.got, c.want)
		}
	}
	// The bounds config accepts are the ones the packages validate.
	for _, c := range []struct {
		name   string
		lo, hi int
		set    func(*selector.Options, int)
	}{
		{"LLB_KV_MIN_MATCH_TOKENS", 0, selector.MaxMinMatchTokens, func(o *selector.Options, v int) { o.MinMatchTokens = v }},
		{"LOXILB_KV_MEAN_LOAD_FACTOR", selector.MinMeanLoadFactor, selector.MaxMeanLoadFactor, func(o *selector.Options, v int) { o.MeanLoadFactor = v }},
		{"LOXILB_KV_LOAD_PENALTY", 1, selector.MaxLoadPenalty, func(o *selector.Options, v int) { o.LoadPenalty = v }},
	} {
		for _, v := range []int{c.lo, c.hi} {
			env := map[string]string{c.name: strconv.Itoa(v)}
			if _, err := SettingsFromLookup(lookupOf(env)); err != nil {
				t.Errorf("%s=%d rejected by config: %v", c.name, v, err)
			}
			o := selector.DefaultOptions()
			c.set(&o, v)
			if err := o.Validate(); err != nil {
				t.Errorf("%s=%d rejected by the selector: %v", c.name, v, err)
			}
		}
		for _, v := range []int{c.lo - 1, c.hi + 1} {
			if _, err := SettingsFromLookup(lookupOf(map[string]string{c.name: strconv.Itoa(v)})); err == nil {
				t.Errorf("%s=%d accepted by config", c.name, v)
			}
		}
	}
}
