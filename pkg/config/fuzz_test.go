package config

import (
	"encoding/json"
	"os"
	"testing"
)

// FuzzRuleJSON: any body decodes or fails cleanly, validation never panics,
// and a valid rule survives a JSON round trip unchanged.
func FuzzRuleJSON(f *testing.F) {
	if b, err := os.ReadFile("testdata/spec_8_1.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"serviceArguments":{"externalIP":"fd00::1","port":1,"mode":4,"kvExactMode":3,"kvHashAlgo":"xxhash","kvHashSeed":""},"endpoints":[{"endpointIP":"::1","targetPort":2,"weight":0,"admin":"down"}]}`))
	f.Add([]byte(`{"serviceArguments":{"externalIP":"10.0.0.1","port":1,"mode":4,"kvExactMode":3,"kvLoraAdapters":["sql-lora","a=Qwen/Qwen3-0.6B","=x","b="]},"endpoints":[{"endpointIP":"10.0.0.2","targetPort":2}]}`))
	f.Add([]byte(`{"serviceArguments":null,"endpoints":null}`))
	f.Add([]byte(`{"serviceArguments":{"port":-1,"kvDpRankCount":8,"kvZmqPort":65535}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Rule
		if json.Unmarshal(b, &r) != nil {
			return
		}
		if len(r.Endpoints) > 4*MaxEndpoints {
			return
		}
		if Validate(&r, DefaultSettings()) != nil {
			return
		}
		r.AssignIndices(nil)
		_ = r.KVEndpoints()
		_ = r.ReplayPort(1000)
		_ = r.LoraAdapters()
		out, err := json.Marshal(&r)
		if err != nil {
			t.Fatalf("marshal a valid rule: %v", err)
		}
		var back Rule
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("re-read %s: %v", out, err)
		}
		if err := Validate(&back, DefaultSettings()); err != nil {
			t.Fatalf("a valid rule became invalid after a round trip: %v\n%s", err, out)
		}
	})
}

// FuzzSettings: any environment value parses or names its variable; never panics.
func FuzzSettings(f *testing.F) {
	f.Add("LOXILB_KV_LB_MODE", "adaptive")
	f.Add("LLB_PD_PREFILL_TIMEOUT_SEC", "99999")
	f.Add("LLB_KV_MIN_MATCH_TOKENS", "-0")
	f.Fuzz(func(t *testing.T, name, value string) {
		_, _ = SettingsFromLookup(func(k string) (string, bool) {
			if k == name {
				return value, true
			}
			return "", false
		})
	})
}
