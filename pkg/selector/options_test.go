package selector

import (
	"strings"
	"testing"
)

func TestOptionsFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		check   func(Options) bool
		wantErr string
	}{
		{name: "defaults", env: nil, check: func(o Options) bool {
			return o.MinMatchTokens == 16 && o.LBMode == LBHard && o.MeanLoadFactor == 175 && o.LoadPenalty == 32 &&
				o.SpillRelief == ReliefAuto && o.ColdStartSeedN == 16 && o.ColdStartMinBlocks == 16 && o.ZeroHitN == 50 &&
				o.Score == ScorePrefix && !o.LoadGuard
		}},
		{name: "all set", env: map[string]string{
			"LLB_KV_MIN_MATCH_TOKENS": "0", "LOXILB_KV_LB_MODE": "adaptive-soft", "LOXILB_KV_MEAN_LOAD_FACTOR": "300",
			"LOXILB_KV_LOAD_PENALTY": "100000", "LOXILB_KV_SPILL_RELIEF": "on", "LOXILB_KV_COLDSTART_SEED_N": "0",
			"LOXILB_KV_COLDSTART_MIN_BLOCKS": "0", "LOXILB_KV_ZERO_HIT_N": "1", "LOXILB_KV_SCORE": "overlap", "LLB_KV_LOADGUARD": "1",
		}, check: func(o Options) bool {
			return o.MinMatchTokens == 0 && o.LBMode == LBAdaptiveSoft && o.MeanLoadFactor == 300 && o.LoadPenalty == 100000 &&
				o.SpillRelief == ReliefOn && o.ColdStartSeedN == 0 && o.ColdStartMinBlocks == 0 && o.ZeroHitN == 1 &&
				o.Score == ScoreOverlap && o.LoadGuard
		}},
		{name: "mode off, relief off", env: map[string]string{"LOXILB_KV_LB_MODE": "off", "LOXILB_KV_SPILL_RELIEF": "false"},
			check: func(o Options) bool { return o.LBMode == LBOff && o.SpillRelief == ReliefOff }},
		{name: "empty values keep defaults", env: map[string]string{"LOXILB_KV_LB_MODE": "", "LLB_KV_MIN_MATCH_TOKENS": " "},
			check: func(o Options) bool { return o.LBMode == LBHard && o.MinMatchTokens == 16 }},
		{name: "bad mode", env: map[string]string{"LOXILB_KV_LB_MODE": "bounded"}, wantErr: "LOXILB_KV_LB_MODE"},
		{name: "min match too big", env: map[string]string{"LLB_KV_MIN_MATCH_TOKENS": "4097"}, wantErr: "LLB_KV_MIN_MATCH_TOKENS"},
		{name: "min match negative", env: map[string]string{"LLB_KV_MIN_MATCH_TOKENS": "-1"}, wantErr: "LLB_KV_MIN_MATCH_TOKENS"},
		{name: "min match garbage", env: map[string]string{"LLB_KV_MIN_MATCH_TOKENS": "16t"}, wantErr: "LLB_KV_MIN_MATCH_TOKENS"},
		{name: "mlf low", env: map[string]string{"LOXILB_KV_MEAN_LOAD_FACTOR": "99"}, wantErr: "LOXILB_KV_MEAN_LOAD_FACTOR"},
		{name: "mlf high", env: map[string]string{"LOXILB_KV_MEAN_LOAD_FACTOR": "1001"}, wantErr: "LOXILB_KV_MEAN_LOAD_FACTOR"},
		{name: "penalty zero", env: map[string]string{"LOXILB_KV_LOAD_PENALTY": "0"}, wantErr: "LOXILB_KV_LOAD_PENALTY"},
		{name: "relief garbage", env: map[string]string{"LOXILB_KV_SPILL_RELIEF": "sometimes"}, wantErr: "LOXILB_KV_SPILL_RELIEF"},
		{name: "seed negative", env: map[string]string{"LOXILB_KV_COLDSTART_SEED_N": "-3"}, wantErr: "LOXILB_KV_COLDSTART_SEED_N"},
		{name: "min blocks garbage", env: map[string]string{"LOXILB_KV_COLDSTART_MIN_BLOCKS": "x"}, wantErr: "LOXILB_KV_COLDSTART_MIN_BLOCKS"},
		{name: "zero hit zero", env: map[string]string{"LOXILB_KV_ZERO_HIT_N": "0"}, wantErr: "LOXILB_KV_ZERO_HIT_N"},
		{name: "score garbage", env: map[string]string{"LOXILB_KV_SCORE": "longest"}, wantErr: "LOXILB_KV_SCORE"},
		{name: "score leading-run is not a spelling", env: map[string]string{"LOXILB_KV_SCORE": "leading-run"}, wantErr: "allowed values: leading (the default; alias prefix), overlap"},
		{name: "score leading", env: map[string]string{"LOXILB_KV_SCORE": "leading"}, check: func(o Options) bool { return o.Score == ScorePrefix }},
		{name: "score prefix alias", env: map[string]string{"LOXILB_KV_SCORE": " Prefix "}, check: func(o Options) bool { return o.Score == ScorePrefix }},
		{name: "loadguard garbage", env: map[string]string{"LLB_KV_LOADGUARD": "maybe"}, wantErr: "LLB_KV_LOADGUARD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := OptionsFromEnv(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(o) {
				t.Fatalf("err %v, options %+v", err, o)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	bad := DefaultOptions()
	bad.MeanLoadFactor = 50
	if _, err := New(poolRule(2, 0), bad, Deps{}); err == nil {
		t.Fatal("bad options accepted")
	}
	for _, r := range []Rule{
		{KVExactMode: 4},
		{KVExactMode: 1},
		{KVExactMode: 3, PD: true},
		{Sel: 11},
		{Endpoints: []Endpoint{{Idx: 256}}},
		{Endpoints: []Endpoint{{Idx: 1}, {Idx: 1}}},
		{Endpoints: []Endpoint{{Idx: 1, Role: 3}}},
		{CacheThreshold: 101},
	} {
		if _, err := New(r, DefaultOptions(), Deps{}); err == nil {
			t.Errorf("rule %+v accepted", r)
		}
	}
	// Nil deps are usable.
	s, err := New(poolRule(2, 0), DefaultOptions(), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	a := s.Begin(kvReq(seq(0, 2)))
	if d := a.Decide(); d.Endpoint != 0 || d.Reason != ReasonNoWorker {
		t.Fatalf("%+v", d)
	}
}

func FuzzOptionsFromEnv(f *testing.F) {
	f.Add("hard", "16", "175", "auto", "1")
	f.Add("adaptive-soft", "0", "1000", "off", "0")
	f.Add("x", "-1", "abc", "", "yes")
	f.Fuzz(func(t *testing.T, mode, minTok, mlf, relief, guard string) {
		env := map[string]string{"LOXILB_KV_LB_MODE": mode, "LLB_KV_MIN_MATCH_TOKENS": minTok,
			"LOXILB_KV_MEAN_LOAD_FACTOR": mlf, "LOXILB_KV_SPILL_RELIEF": relief, "LLB_KV_LOADGUARD": guard}
		o, err := OptionsFromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err == nil {
			if verr := o.Validate(); verr != nil {
				t.Fatalf("accepted options fail Validate: %v", verr)
			}
		}
	})
}
