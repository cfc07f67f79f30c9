package config

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func loadSpecRule(t *testing.T) *Rule {
	t.Helper()
	b, err := os.ReadFile("testdata/spec_8_1.json")
	if err != nil {
		t.Fatal(err)
	}
	var r Rule
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("unmarshal spec §8.1 body: %v", err)
	}
	return &r
}

func TestSpecBodyParsesAndValidates(t *testing.T) {
	r := loadSpecRule(t)
	if err := Validate(r, DefaultSettings()); err != nil {
		t.Fatalf("spec §8.1 body rejected: %v", err)
	}
	r.AssignIndices(nil)
	if got := r.Key(); got != (RuleKey{"10.10.10.254", 8080, "tcp"}) {
		t.Errorf("key = %v", got)
	}
	if !r.PDDisagg() {
		t.Error("kvExactMode 1 must imply pd_disagg_mode")
	}
	kv := r.KVEndpoints()
	if len(kv) != 1 || kv[0].IP != "192.0.2.1" || kv[0].Idx != 0 {
		t.Errorf("KVEndpoints = %+v, want the prefill endpoint 192.0.2.1 idx 0", kv)
	}
	checks := []struct {
		name string
		got  any
		want any
	}{
		{"algo", r.EffectiveHashAlgo(), HashSHA256CBOR},
		{"zmq", r.ZmqPort(), 5557},
		{"block", r.BlockSize(), 16},
		{"ranks", r.DpRankCount(), 1},
		{"ttl", r.SessionTTL(), 300 * time.Second},
		{"threshold", r.CacheThreshold(), 20},
		{"balance", r.BalanceAbsThreshold(), 3},
		{"probe", r.ProbeType(), ProbeHTTP},
		{"probe path", r.ProbePath(), "/health"},
		{"warmup stored", r.Args.KVWarmupSec, 30},
		{"replay", r.ReplayPort(1000), 6557},
		{"replay off", r.ReplayPort(0), 0},
		{"cb", r.CircuitBreakerThreshold(), 3},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestDefaults(t *testing.T) {
	r := &Rule{Args: ServiceArguments{ExternalIP: "10.0.0.1", Port: 80}}
	if r.ProbeType() != ProbeTCP {
		t.Errorf("plain rule probe = %s, want tcp", r.ProbeType())
	}
	r.Args.KVEngineType = "sglang"
	if r.EffectiveHashAlgo() != HashSHA256SGLang {
		t.Error("sglang default algo")
	}
	if r.BlockSize() != 16 {
		t.Errorf("sglang default block size %d, want 16", r.BlockSize())
	}
	r.Args.KVEngineType = "trtllm"
	if r.EffectiveHashAlgo() != HashBlockHashTRTLLM || r.BlockSize() != 32 {
		t.Errorf("trtllm defaults %s / %d, want blockhash_trtllm / 32 (tokens_per_block)", r.EffectiveHashAlgo(), r.BlockSize())
	}
	r.Args.KVEngineType = "sglang"
	r.Args.KVExactMode = 3
	r.Endpoints = []Endpoint{{IP: "10.0.0.2", TargetPort: 1}, {IP: "10.0.0.3", TargetPort: 1}}
	if len(r.KVEndpoints()) != 2 {
		t.Error("mode 3 scores all endpoints")
	}
	seed := ""
	r.Args.KVHashSeed = &seed
	if s, ok := r.HashSeed(DefaultSettings()); !ok || s != "" {
		t.Error("an explicit empty kvHashSeed is set")
	}
	r.Args.KVHashSeed = nil
	if _, ok := r.HashSeed(DefaultSettings()); ok {
		t.Error("no seed anywhere must be unset")
	}
}

func TestRuleJSONRoundTrip(t *testing.T) {
	r := loadSpecRule(t)
	r.AssignIndices(nil)
	r.ServiceID = 7
	r.Endpoints[1].AdminDown = true
	r.Args.KVLoraAdapters = []string{"sql-lora", "chat-lora=Qwen/Qwen3-0.6B"}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"service_id":7`, `"ep_idx":1`, `"admin":"down"`, `"admin":"up"`, `"ep_role":2`, `"kvWarmupSec":30`, `"kvLoraAdapters":["sql-lora","chat-lora=Qwen/Qwen3-0.6B"]`, `"pd_disagg_mode"`} {
		if want == `"pd_disagg_mode"` {
			if strings.Contains(s, want) {
				t.Errorf("GET must echo what was configured, not implied fields: %s", s)
			}
			continue
		}
		if !strings.Contains(s, want) {
			t.Errorf("marshal lacks %s: %s", want, s)
		}
	}
	var back Rule
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if c := r.Clone(); !reflect.DeepEqual(c, r) || &c.Args.KVLoraAdapters[0] == &r.Args.KVLoraAdapters[0] {
		t.Errorf("Clone must deep-copy kvLoraAdapters")
	}
	if !reflect.DeepEqual(&back, r) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, *r)
	}
}

func TestEndpointAdminJSON(t *testing.T) {
	var e Endpoint
	if err := json.Unmarshal([]byte(`{"endpointIP":"1.2.3.4","targetPort":1,"weight":1,"admin":"sideways"}`), &e); err == nil {
		t.Fatal("bad admin accepted")
	}
}

func TestAssignIndicesStable(t *testing.T) {
	ep := func(ip string) Endpoint { return Endpoint{IP: ip, TargetPort: 8000} }
	old := &Rule{Endpoints: []Endpoint{ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3")}}
	old.AssignIndices(nil)
	// 10.0.0.2 leaves, 10.0.0.4 joins at the front, order changes.
	upd := &Rule{Endpoints: []Endpoint{ep("10.0.0.4"), ep("10.0.0.3"), ep("10.0.0.1")}}
	upd.AssignIndices(old)
	got := map[string]int{}
	for _, e := range upd.Endpoints {
		got[e.IP] = e.Idx
	}
	want := map[string]int{"10.0.0.1": 0, "10.0.0.3": 2, "10.0.0.4": 3}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("indices %v, want %v", got, want)
	}
	// 10.0.0.2 comes back: a new index, 1 is never reused.
	again := &Rule{Endpoints: []Endpoint{ep("10.0.0.2"), ep("10.0.0.1")}}
	again.AssignIndices(upd)
	if again.Endpoints[0].Idx != 4 || again.Endpoints[1].Idx != 0 || again.NextIdx != 5 {
		t.Fatalf("rejoin got %+v next %d", again.Endpoints, again.NextIdx)
	}
}

func TestAssignIndicesExhausted(t *testing.T) {
	old := &Rule{NextIdx: MaxEndpoints, Endpoints: []Endpoint{{IP: "10.0.0.1", TargetPort: 1, Idx: 0}, {IP: "10.0.0.2", TargetPort: 1, Idx: 2}}}
	upd := &Rule{Endpoints: []Endpoint{{IP: "10.0.0.1", TargetPort: 1}, {IP: "10.0.0.9", TargetPort: 1}, {IP: "10.0.0.8", TargetPort: 1}}}
	upd.AssignIndices(old)
	if upd.Endpoints[1].Idx != 1 || upd.Endpoints[2].Idx != 2 {
		t.Fatalf("exhausted allocation %+v", upd.Endpoints)
	}
}
