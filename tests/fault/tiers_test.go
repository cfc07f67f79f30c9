package fault

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOffloadTierRoutes runs real processes: enginesim engine A with a small
// GPU KV cache and a CPU offload tier (--num-cpu-blocks), engine B without,
// both publishing KV events over ZeroMQ to two kvgate daemons, one with the
// default LLB_KV_TIER_WEIGHTS and one scoring the GPU only (CPU=0,STORAGE=0).
// Two prompts are computed on A and then pushed out of A's GPU (they stay in
// its CPU tier); B computes a short prefix of each on its GPU. The
// tier-aware daemon sends the first prompt to A, where it is a cached hit
// reloaded from CPU; the GPU-only daemon sends the second to B, the longest
// GPU prefix.
func TestOffloadTierRoutes(t *testing.T) {
	requireRoot(t)
	tp := newTopo(t)
	a := tp.startEngine(t, nil, eng1Addr, "--num-gpu-blocks", "40", "--num-cpu-blocks", "1024", "--debug-state")
	b := tp.startEngine(t, nil, eng2Addr)
	eps := []string{fmt.Sprintf("%s:%d", eng1Addr, engPort), fmt.Sprintf("%s:%d", eng2Addr, engPort)}
	tiered := tp.startDaemon(t, "userspace", time.Second)
	gpuOnly := tp.startDaemonEnv(t, "userspace", time.Second, "LLB_KV_TIER_WEIGHTS=CPU=0,STORAGE=0")
	for i, d := range []*daemon{tiered, gpuOnly} {
		d.createRule(t, 8080+i, eps, kvArgs)
		waitFor(t, "subscribers", 20*time.Second, func() bool { return d.metric(t, "loxilb_kv_subscriber_connected", nil) == 2 })
	}

	ecl := tp.engineClient()
	aBase, bBase := fmt.Sprintf("http://%s:%d", eng1Addr, engPort), fmt.Sprintf("http://%s:%d", eng2Addr, engPort)
	first, second := prompt("tier-first"), prompt("tier-second")
	for _, p := range []string{first, second, prompt("evict-1"), prompt("evict-2")} {
		chatContent(t, ecl, aBase, p)
	}
	for _, p := range []string{first, second} {
		chatContent(t, ecl, bBase, p[:len(p)*2/5])
		gpu, cpu := debugMatch(t, ecl, aBase, p)
		if gpu != 0 || cpu < 16*10 {
			t.Fatalf("engine A holds %d tokens of a prompt on the GPU and %d in CPU; the test needs 0 and most of it", gpu, cpu)
		}
	}
	// Both daemons must have ingested A's CPU events: wait until their
	// non-GPU block counts for A agree and hold still.
	waitFor(t, "CPU-tier inventory ingested", 20*time.Second, func() bool {
		x := tiered.metric(t, "kvgate_kv_blocks_other_medium", map[string]string{"ep_idx": "0"})
		y := gpuOnly.metric(t, "kvgate_kv_blocks_other_medium", map[string]string{"ep_idx": "0"})
		time.Sleep(200 * time.Millisecond)
		return x > 0 && x == y && x == tiered.metric(t, "kvgate_kv_blocks_other_medium", map[string]string{"ep_idx": "0"})
	})
	reloadsBefore := engineCounter(t, ecl, aBase, "vllm:external_prefix_cache_hits_total")

	eng, cached := chatContent(t, tp.client(), fmt.Sprintf("http://%s:%d", gwAddr, 8080), first)
	if eng != a.id || cached < 16*10 {
		t.Errorf("tier-aware daemon: served by %q with %d cached tokens; want %q (its CPU tier holds the prefix) and a hit", eng, cached, a.id)
	}
	if d := engineCounter(t, ecl, aBase, "vllm:external_prefix_cache_hits_total") - reloadsBefore; d < 16*10 {
		t.Errorf("engine A reloaded %v tokens from its CPU tier, want the prompt's prefix", d)
	}
	if eng, _ := chatContent(t, tp.client(), fmt.Sprintf("http://%s:%d", gwAddr, 8081), second); eng != b.id {
		t.Errorf("GPU-only daemon: served by %q, want %q (the only GPU prefix)", eng, b.id)
	}
}

// chatContent sends one non-streamed chat completion and returns the engine
// that served it and the cached tokens it reports.
func chatContent(t *testing.T, cl *http.Client, base, content string) (engine string, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("request to %s: %v", base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("request to %s: %d %s", base, resp.StatusCode, b)
	}
	return resp.Header.Get("x-engine-id"), out.Usage.Details.Cached
}

// debugMatch asks an engine started with --debug-state how many tokens of a
// chat prompt its GPU cache and its CPU tier hold.
func debugMatch(t *testing.T, cl *http.Client, base, content string) (gpu, cpu int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": content}}})
	req, _ := http.NewRequest(http.MethodPost, base+"/debug/match", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Debug-Path", "/v1/chat/completions")
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Cached int `json:"cached_tokens"`
		CPU    int `json:"cpu_cached_tokens"`
	}
	if b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16)); resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("debug/match: %d %s", resp.StatusCode, b)
	}
	return out.Cached, out.CPU
}

// engineCounter reads one counter from an engine's /metrics.
func engineCounter(t *testing.T, cl *http.Client, base, name string) float64 {
	t.Helper()
	resp, err := cl.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			var v float64
			if _, err := fmt.Sscan(rest[strings.LastIndex(rest, " ")+1:], &v); err == nil {
				return v
			}
		}
	}
	t.Fatalf("engine metric %s not found", name)
	return 0
}
