package enginesim

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevents/trtllm"
)

// drainEvents calls POST /kv_cache_events and decodes the body with kvgate's
// TensorRT-LLM decoder.
func drainEvents(t *testing.T, e *Engine) []trtllm.Event {
	t.Helper()
	resp, err := http.Post(e.URL()+"/kv_cache_events", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("drain: %d %s", resp.StatusCode, body)
	}
	evs, err := trtllm.Decode(body)
	if err != nil {
		t.Fatalf("drain body is not TensorRT-LLM's: %v\n%s", err, body)
	}
	return evs
}

// TestTRTLLMModeHashVectors: a TensorRT-LLM-mode engine serving each golden
// vector's tokens (with its cache_salt, and its lora_task_id as a LoRA
// module's) plus one more (the KV cache manager keys every token but
// the last) drains exactly the block keys TensorRT-LLM's own hasher gave,
// after a created event, with event ids counting from 0, and a second drain
// is empty (the drain is destructive).
func TestTRTLLMModeHashVectors(t *testing.T) {
	raw, err := os.ReadFile("../../pkg/kvhash/testdata/engines/engine_hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs struct {
		TRTLLM []struct {
			Name       string   `json:"name"`
			Tokens     []uint64 `json:"tokens"`
			BlockSize  int      `json:"block_size"`
			CacheSalt  string   `json:"cache_salt"`
			LoRATaskID *uint64  `json:"lora_task_id"`
			Hashes     []uint64 `json:"hashes_u64"`
		} `json:"trtllm"`
	}
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, v := range vs.TRTLLM {
		if slices.Max(v.Tokens) >= 1<<31 {
			continue // vocabulary ids stay below 2^31
		}
		ran++
		t.Run(v.Name, func(t *testing.T) {
			cfg := Config{Engine: EngineTRTLLM, BlockSize: v.BlockSize, KVEventsEndpoint: "none", ReplayEndpoint: "none"}
			model := DefaultModel
			if v.LoRATaskID != nil {
				model = "adapter-t"
				cfg.LoRAModules, cfg.LoRATaskIDs = []string{model}, map[string]uint64{model: *v.LoRATaskID}
			}
			e := startEngine(t, cfg)
			prompt := make([]uint32, 0, len(v.Tokens)+1)
			for _, tok := range v.Tokens {
				prompt = append(prompt, uint32(tok))
			}
			prompt = append(prompt, 7) // not keyed: its KV is computed with the first output token
			body := map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}
			if v.CacheSalt != "" {
				body["cache_salt"] = v.CacheSalt
			}
			if r := post(t, e.URL()+"/v1/completions", body); r.status != 200 {
				t.Fatalf("completion: %d %s", r.status, r.body)
			}
			evs := drainEvents(t, e)
			if len(evs) < 2 || evs[0].Data.Type != trtllm.Created || evs[0].EventID != 0 {
				t.Fatalf("drain %+v: want created (event 0) then stored", evs)
			}
			var got []uint64
			for i, ev := range evs {
				if ev.EventID != int64(i) {
					t.Fatalf("event %d has event_id %d", i, ev.EventID)
				}
				if ev.Data.Type == trtllm.Stored {
					for _, b := range ev.Data.Blocks {
						if len(b.Tokens) != v.BlockSize || b.CacheLevel != 0 {
							t.Fatalf("block %+v: want %d tokens on cache level 0", b, v.BlockSize)
						}
						got = append(got, b.BlockHash)
					}
				}
			}
			if len(got) < len(v.Hashes) || !slices.Equal(got[:len(v.Hashes)], v.Hashes) {
				t.Fatalf("drained block keys %v, TensorRT-LLM's %v", got, v.Hashes)
			}
			if again := drainEvents(t, e); len(again) != 0 {
				t.Fatalf("second drain returned %d events; the drain is destructive", len(again))
			}
		})
	}
	if ran < 9 {
		t.Fatalf("only %d vectors ran", ran)
	}
}

// TestTRTLLMModeSurface: /server_info reports tokens_per_block and the
// v1 block key, the buffer keeps the newest event_buffer_max_size events,
// and configs TensorRT-LLM cannot have are refused.
func TestTRTLLMModeSurface(t *testing.T) {
	e := startEngine(t, Config{Engine: EngineTRTLLM, KVEventsEndpoint: "none", ReplayEndpoint: "none", EventBufferMaxSize: 2})
	resp, err := http.Get(e.URL() + "/server_info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		TokensPerBlock int    `json:"tokens_per_block"`
		Algo           string `json:"kv_cache_hash_algo"`
	}
	err = json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if err != nil || info.TokensPerBlock != DefaultTRTLLMTokensPerBlock || info.Algo != "v1_block_key" {
		t.Fatalf("/server_info %+v (err %v)", info, err)
	}
	for i := range 3 {
		if r := post(t, e.URL()+"/v1/completions", map[string]any{"model": DefaultModel, "prompt": seqIDs(1000*(i+1), 40), "max_tokens": 1}); r.status != 200 {
			t.Fatalf("completion: %d %s", r.status, r.body)
		}
	}
	evs := drainEvents(t, e)
	if len(evs) != 2 || evs[1].EventID != 3 {
		t.Fatalf("drain kept %d events (last id %v); want the newest 2 (ids 2, 3)", len(evs), evs)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"vllm hash", Config{Engine: EngineTRTLLM, HashAlgo: "sha256_cbor"}},
		{"zmq endpoint", Config{Engine: EngineTRTLLM, KVEventsEndpoint: "tcp://127.0.0.1:5557"}},
		{"lora without a task id", Config{Engine: EngineTRTLLM, LoRAModules: []string{"a"}, LoRATaskIDs: map[string]uint64{"b": 1}}},
		{"trtllm hash on vllm", Config{HashAlgo: "blockhash_trtllm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = quietLogger()
			if e, err := New(tc.cfg); err == nil {
				e.Close()
				t.Fatal("want a config error")
			}
		})
	}
}
