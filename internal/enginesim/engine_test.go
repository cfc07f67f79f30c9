package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
)

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startEngine starts an engine on its own loopback address with instant
// timing unless cfg says otherwise.
func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.Host == "" {
		cfg.Host = testnet.Host(t)
	}
	if cfg.KVEventsEndpoint == "" {
		cfg.KVEventsEndpoint = "tcp://" + cfg.Host + ":0"
	}
	if cfg.ReplayEndpoint == "" {
		cfg.ReplayEndpoint = "tcp://" + cfg.Host + ":0"
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if !cfg.HashSeedSet {
		cfg.PythonHashSeed, cfg.HashSeedSet = "0", true
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func seqIDs(from, n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(from + i)
	}
	return ids
}

type httpResult struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url string, body any, hdr ...string) httpResult {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpResult{resp.StatusCode, resp.Header, data}
}

type completionBody struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

func decodeCompletion(t *testing.T, r httpResult) completionBody {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var c completionBody
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return c
}

func headerInt(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(h.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("header %s=%q: %v", name, h.Get(name), err)
	}
	return v
}

func TestCompletionsCachedTokens(t *testing.T) {
	e := startEngine(t, Config{})
	tests := []struct {
		name       string
		prompt     []uint32
		wantCached []int // per successive identical request
	}{
		// floor((n-1)/16) blocks: a fully cached prompt recomputes its last block.
		{"exact two blocks", seqIDs(1000, 32), []int{0, 16, 16}},
		{"partial third block", seqIDs(2000, 40), []int{0, 32, 32}},
		{"under one block", seqIDs(3000, 15), []int{0, 0}},
		{"one block plus one", seqIDs(4000, 17), []int{0, 16}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var firstText string
			for i, want := range tc.wantCached {
				r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": tc.prompt, "max_tokens": 5})
				if got := r.header.Get("x-engine-id"); got != e.ID() {
					t.Errorf("x-engine-id %q, want %q", got, e.ID())
				}
				c := decodeCompletion(t, r)
				if c.Usage.PromptTokensDetails.CachedTokens != want {
					t.Errorf("request %d: cached_tokens %d, want %d", i, c.Usage.PromptTokensDetails.CachedTokens, want)
				}
				if c.Usage.PromptTokens != len(tc.prompt) || c.Usage.CompletionTokens != 5 || c.Usage.TotalTokens != len(tc.prompt)+5 {
					t.Errorf("usage %+v", c.Usage)
				}
				if !strings.HasPrefix(c.ID, "cmpl-") || c.Object != "text_completion" || c.Choices[0].FinishReason != "length" {
					t.Errorf("response %+v", c)
				}
				if i == 0 {
					firstText = c.Choices[0].Text
				} else if c.Choices[0].Text != firstText {
					t.Errorf("output not deterministic: %q vs %q", c.Choices[0].Text, firstText)
				}
			}
		})
	}
}

func TestStreamingSSE(t *testing.T) {
	e := startEngine(t, Config{})
	tests := []struct {
		name string
		path string
		body map[string]any
	}{
		{"completions", "/v1/completions", map[string]any{"prompt": seqIDs(1, 20), "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}},
		{"chat", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hello there"}}, "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}},
		{"chat no usage", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "a"}, {"type": "text", "text": "b"}}}}, "max_completion_tokens": 3, "stream": true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, e.URL()+tc.path, tc.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if r.header.Get("x-engine-id") != e.ID() || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
				t.Errorf("headers %v", r.header)
			}
			var events []string
			sc := bufio.NewScanner(bytes.NewReader(r.body))
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					events = append(events, line)
				}
			}
			if len(events) < 3 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events %q", events)
			}
			var text strings.Builder
			finishes, usages := 0, 0
			for _, ev := range events[:len(events)-1] {
				var chunk struct {
					Choices []struct {
						Text         string  `json:"text"`
						FinishReason *string `json:"finish_reason"`
						Delta        struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
					Usage *struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				}
				if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
					t.Fatalf("chunk %q: %v", ev, err)
				}
				for _, c := range chunk.Choices {
					text.WriteString(c.Text + c.Delta.Content)
					if c.FinishReason != nil {
						finishes++
					}
				}
				if chunk.Usage != nil {
					usages++
				}
			}
			wantUsage := 0
			if so, ok := tc.body["stream_options"].(map[string]any); ok && so["include_usage"] == true {
				wantUsage = 1
			}
			if finishes != 1 || usages != wantUsage || text.Len() == 0 {
				t.Errorf("finishes %d usages %d (want %d) text %q", finishes, usages, wantUsage, text.String())
			}
		})
	}
}

func TestErrorsAreVLLMStyle(t *testing.T) {
	e := startEngine(t, Config{MaxModelLen: 100})
	tests := []struct {
		name   string
		path   string
		body   any
		status int
	}{
		{"bad json", "/v1/completions", "not an object", 400},
		{"missing prompt", "/v1/completions", map[string]any{"max_tokens": 1}, 400},
		{"empty prompt", "/v1/completions", map[string]any{"prompt": ""}, 400},
		{"empty id list", "/v1/completions", map[string]any{"prompt": []int{}}, 400},
		{"negative id", "/v1/completions", map[string]any{"prompt": []int{1, -2}}, 400},
		{"zero max_tokens", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 0}, 400},
		{"stream_options without stream", "/v1/completions", map[string]any{"prompt": "hi", "stream_options": map[string]any{"include_usage": true}}, 400},
		{"n=2", "/v1/completions", map[string]any{"prompt": "hi", "n": 2}, 400},
		{"min_tokens above max", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 2, "min_tokens": 3}, 400},
		{"too long", "/v1/completions", map[string]any{"prompt": seqIDs(0, 90), "max_tokens": 20}, 400},
		{"wrong model", "/v1/completions", map[string]any{"model": "other", "prompt": "hi"}, 404},
		{"no messages", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400},
		{"image part", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url"}}}}}, 400},
		{"unknown path", "/v1/nothing", map[string]any{}, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, e.URL()+tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if r.header.Get("x-engine-id") != e.ID() {
				t.Errorf("x-engine-id missing on error")
			}
			var body struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.body, &body); err != nil || body.Error.Message == "" || body.Error.Code != tc.status || body.Error.Type == "" {
				t.Errorf("error body %s (%v)", r.body, err)
			}
		})
	}
	// Wrong method: 405 in the same shape.
	resp, err := http.Get(e.URL() + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("x-engine-id") != e.ID() || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("GET /v1/completions: %d %v", resp.StatusCode, resp.Header)
	}
	// The body bound.
	big := strings.Repeat("x", int(DefaultMaxRequestBytes)+10)
	r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": big})
	if r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: status %d", r.status)
	}
}

// TestTTFTWarmFasterThanCold checks the timing model's own figures: the
// prefill part of TTFT is the floor plus the per-token cost of uncached
// tokens, so a warm request saves exactly cached_tokens × cost.
func TestTTFTWarmFasterThanCold(t *testing.T) {
	const perToken = 200.0 // µs
	floor := 2 * time.Millisecond
	e := startEngine(t, Config{PrefillUsPerToken: perToken, TTFTFloor: floor})
	prompt := seqIDs(500, 160) // 10 blocks; warm hit = 9 blocks = 144 tokens
	var prefill [2]time.Duration
	var cached [2]int
	for i := range 2 {
		r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
		c := decodeCompletion(t, r)
		cached[i] = c.Usage.PromptTokensDetails.CachedTokens
		ttft := time.Duration(headerInt(t, r.header, "x-enginesim-ttft-us")) * time.Microsecond
		queue := time.Duration(headerInt(t, r.header, "x-enginesim-queue-us")) * time.Microsecond
		prefill[i] = ttft - queue
	}
	if cached[0] != 0 || cached[1] != 144 {
		t.Fatalf("cached %v, want [0 144]", cached)
	}
	model := func(uncached int) time.Duration {
		return floor + time.Duration(perToken*float64(uncached))*time.Microsecond
	}
	for i, want := range []time.Duration{model(160), model(16)} {
		if d := prefill[i] - want; d < -2*time.Microsecond || d > 2*time.Microsecond {
			t.Errorf("request %d: prefill %v, model %v", i, prefill[i], want)
		}
	}
	if saved := prefill[0] - prefill[1]; saved < 28*time.Millisecond {
		t.Errorf("warm saved %v, want 144 tokens × 200µs = 28.8ms", saved)
	}
}

func TestMaxNumSeqsQueuesFIFO(t *testing.T) {
	e := startEngine(t, Config{MaxNumSeqs: 1, DecodeTokensPerS: 200})
	const n = 3
	var wg sync.WaitGroup
	queues := make([]int64, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": seqIDs(100*i, 8), "max_tokens": 10})
			decodeCompletion(t, r)
			queues[i] = headerInt(t, r.header, "x-enginesim-queue-us")
		}()
	}
	wg.Wait()
	// One runs at a time, each for 9 decode intervals (45 ms): the second
	// waits at least that long, the third twice as long.
	slowest := int64(0)
	for _, q := range queues {
		slowest = max(slowest, q)
	}
	if slowest < 2*45000-1000 {
		t.Errorf("queue times %v µs: the last request should wait for two others (≥ 90ms)", queues)
	}
}

func TestModelsHealthTokenize(t *testing.T) {
	e := startEngine(t, Config{Model: "sim/model", ID: "engine-a"})
	resp, err := http.Get(e.URL() + "/health")
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("x-engine-id") != "engine-a" {
		t.Fatalf("health %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != "sim/model" {
		t.Errorf("models %+v", models)
	}
	r := post(t, e.URL()+"/tokenize", map[string]any{"prompt": "ab"})
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	json.Unmarshal(r.body, &tok)
	// The byte tokenizer adds its BOS for completion strings by default.
	if tok.Count != 3 || tok.Tokens[0] != byteBOS || tok.Tokens[1] != 'a' {
		t.Errorf("tokenize %s", r.body)
	}
	r = post(t, e.URL()+"/tokenize", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}})
	json.Unmarshal(r.body, &tok)
	want, _, _ := byteTokenizer{}.EncodeChat(ChatRequest{Messages: []byte(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true})
	if tok.Count != len(want) {
		t.Errorf("chat tokenize %d tokens, want %d", tok.Count, len(want))
	}
}

func TestResetPrefixCache(t *testing.T) {
	e := startEngine(t, Config{})
	prompt := seqIDs(7, 33)
	decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}))
	r := post(t, e.URL()+"/reset_prefix_cache", map[string]any{})
	if r.status != 200 || r.header.Get("x-engine-id") != e.ID() {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	c := decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}))
	if c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("cached %d after reset", c.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestMetricsExposition(t *testing.T) {
	e := startEngine(t, Config{Model: "m1", NumGPUBlocks: 100, HashAlgo: "xxhash_cbor"})
	prompt := seqIDs(1, 40)
	for range 2 {
		decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3}))
	}
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		"# TYPE vllm:num_requests_running gauge",
		"# TYPE vllm:num_requests_waiting gauge",
		"# TYPE vllm:kv_cache_usage_perc gauge",
		"# TYPE vllm:cache_config_info gauge",
		"# TYPE vllm:prompt_tokens_total counter",
		"# TYPE vllm:generation_tokens_total counter",
		"# TYPE vllm:prefix_cache_queries_total counter",
		"# TYPE vllm:prefix_cache_hits_total counter",
		"# TYPE vllm:time_to_first_token_seconds histogram",
		`vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m1",le="0.001"}`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="m1"} 2`,
		`num_gpu_blocks="100"`, `block_size="16"`, `prefix_caching_hash_algo="xxhash_cbor"`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="m1"} 80`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="m1"} 32`,
		`vllm:prompt_tokens_total{engine="0",model_name="m1"} 80`,
		`vllm:generation_tokens_total{engine="0",model_name="m1"} 6`,
		`vllm:num_requests_running{engine="0",model_name="m1"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if resp.Header.Get("x-engine-id") != e.ID() {
		t.Error("x-engine-id missing on /metrics")
	}
}

// TestEnginesShareAPortOnDifferentAddresses runs engines the way real workers
// sit on separate hosts: same ports, different loopback addresses.
func TestEnginesShareAPortOnDifferentAddresses(t *testing.T) {
	engines, _, err := StartGroup(3, 10, func() (int, error) { return 20000 + rand.IntN(20000), nil },
		func(_, port int) Config {
			host := testnet.Host(t)
			return Config{Host: host, Port: port, Logger: quietLogger(), KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port+1)}
		})
	if err != nil {
		t.Fatalf("could not start three engines on one port: %v", err)
	}
	for _, e := range engines {
		t.Cleanup(func() { e.Close() })
		r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 1})
		if r.status != 200 || r.header.Get("x-engine-id") != e.ID() {
			t.Errorf("%s: %d %v", e.URL(), r.status, r.header)
		}
	}
}
