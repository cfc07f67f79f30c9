package enginesim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

func postRaw(t *testing.T, url, body string, hdr ...string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func TestDebugEndpointsOff(t *testing.T) {
	e := startEngine(t, Config{PerfModel: DefaultPerfModel, TimeScale: 0.01})
	var st debugState
	if code := getJSON(t, e.URL()+"/debug/state", &st); code != http.StatusNotFound {
		t.Errorf("GET /debug/state without --debug-state: %d, want 404", code)
	}
	if code, _ := postRaw(t, e.URL()+"/debug/match", `{"prompt":"x"}`, "X-Debug-Path", "/v1/completions"); code != http.StatusNotFound {
		t.Errorf("POST /debug/match without --debug-state: %d, want 404", code)
	}
}

func TestDebugStateAndMatch(t *testing.T) {
	e := startEngine(t, Config{PerfModel: DefaultPerfModel, TimeScale: 0.01, DebugState: true, ID: "eng-a"})
	chat := `{"messages":[{"role":"system","content":"` + string(bytes.Repeat([]byte("shared system prompt "), 20)) + `"},{"role":"user","content":"hello"}],"max_tokens":2}`
	prompt := `{"prompt":[` + string(bytes.TrimSuffix(bytes.Repeat([]byte("7,"), 50), []byte(","))) + `],"max_tokens":2}`

	type match struct {
		PromptTokens int `json:"prompt_tokens"`
		CachedTokens int `json:"cached_tokens"`
	}
	doMatch := func(path, body string) match {
		t.Helper()
		code, b := postRaw(t, e.URL()+"/debug/match", body, "X-Debug-Path", path)
		if code != 200 {
			t.Fatalf("match %s: %d %s", path, code, b)
		}
		var m match
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	tests := []struct{ path, body string }{
		{"/v1/chat/completions", chat},
		{"/v1/completions", prompt},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			cold := doMatch(tc.path, tc.body)
			if cold.CachedTokens != 0 || cold.PromptTokens == 0 {
				t.Fatalf("cold match %+v", cold)
			}
			code, b := postRaw(t, e.URL()+tc.path, tc.body)
			if code != 200 {
				t.Fatalf("%d %s", code, b)
			}
			warm := doMatch(tc.path, tc.body)
			again := doMatch(tc.path, tc.body)
			code, b = postRaw(t, e.URL()+tc.path, tc.body)
			var c completionBody
			if code != 200 || json.Unmarshal(b, &c) != nil {
				t.Fatalf("%d %s", code, b)
			}
			if warm != again || warm.CachedTokens != c.Usage.PromptTokensDetails.CachedTokens || warm.PromptTokens != c.Usage.PromptTokens {
				t.Fatalf("match %+v then %+v, the request then reported %+v", warm, again, c.Usage)
			}
			if warm.CachedTokens == 0 {
				t.Fatal("nothing cached after the first request")
			}
		})
	}

	var st debugState
	if code := getJSON(t, e.URL()+"/debug/state", &st); code != 200 {
		t.Fatalf("state %d", code)
	}
	prof, _ := LookupProfile(DefaultPerfModel)
	want := prof.Perf
	if st.EngineID != "eng-a" || st.NowUnixNano == 0 || st.BlockSize != 16 || st.KVBlocksTotal != e.cfg.NumGPUBlocks-1 ||
		st.Running != 0 || st.Waiting != 0 || st.PendingPrefillTokens != 0 || st.KVBlocksUsed != 0 ||
		st.Perf.Model != DefaultPerfModel || st.Perf.StepPerf != want || st.Perf.MaxNumBatchedTokens != 8192 || st.Perf.MaxNumSeqs != e.cfg.MaxNumSeqs ||
		st.PredictedTTFTPer1k <= 0 {
		t.Fatalf("state %+v", st)
	}

	// Bad input: unknown path header, bad body.
	if code, _ := postRaw(t, e.URL()+"/debug/match", prompt, "X-Debug-Path", "/v1/embeddings"); code != 400 {
		t.Errorf("unknown X-Debug-Path: %d, want 400", code)
	}
	if code, _ := postRaw(t, e.URL()+"/debug/match", `{"prompt":`, "X-Debug-Path", "/v1/completions"); code != 400 {
		t.Errorf("bad JSON: %d, want 400", code)
	}
}

// TestDebugStateKeys pins the JSON names of the oracle contract.
func TestDebugStateKeys(t *testing.T) {
	b, err := json.Marshal(debugState{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	for _, k := range []string{"engine_id", "now_unix_nano", "running", "waiting", "pending_prefill_tokens", "kv_blocks_used", "kv_blocks_total", "block_size", "perf", "predicted_ttft_s_for_new_tokens_per_1k"} {
		if _, ok := m[k]; !ok {
			t.Errorf("missing %q in %s", k, b)
		}
	}
	perf, _ := m["perf"].(map[string]any)
	for _, k := range []string{"model", "step_floor_s", "prefill_s_per_token", "decode_s_per_seq", "attn_s_per_context_token", "max_num_batched_tokens", "max_num_seqs"} {
		if _, ok := perf[k]; !ok {
			t.Errorf("missing perf.%q in %s", k, b)
		}
	}
	if len(m) != 10 || len(perf) != 7 {
		t.Errorf("extra keys in %s", b)
	}
}

func TestPromptTokensDetailsFlag(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		e := startEngine(t, Config{DisablePromptTokensDetails: disabled})
		code, b := postRaw(t, e.URL()+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":1}`)
		var raw struct {
			Usage map[string]json.RawMessage `json:"usage"`
		}
		if code != 200 || json.Unmarshal(b, &raw) != nil {
			t.Fatalf("%d %s", code, b)
		}
		got := string(raw.Usage["prompt_tokens_details"])
		if disabled && got != "null" || !disabled && got != `{"cached_tokens":0}` {
			t.Errorf("disabled=%v: prompt_tokens_details %s", disabled, got)
		}
	}
}
