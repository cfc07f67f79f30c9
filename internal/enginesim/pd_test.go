package enginesim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func scrape(t *testing.T, e *Engine) string {
	t.Helper()
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestPrefillDecodeRoles follows docs/pd.md's protocol: the proxy sends the prefill
// leg with do_remote_decode and max_tokens=1, gets kv_transfer_params back,
// and forwards them verbatim to the decoder, which then skips the prefill
// cost of everything but the last prompt token.
func TestPrefillDecodeRoles(t *testing.T) {
	const perToken = 100.0
	floor := time.Millisecond
	p := startEngine(t, Config{Role: RolePrefill, PrefillUsPerToken: perToken, TTFTFloor: floor, Model: "m"})
	d := startEngine(t, Config{Role: RoleDecode, PrefillUsPerToken: perToken, TTFTFloor: floor, Model: "m"})
	prompt := seqIDs(900, 100)

	stub := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	pr := decodeCompletion(t, post(t, p.URL()+"/v1/completions",
		map[string]any{"prompt": prompt, "max_tokens": 1, "stream": false, "kv_transfer_params": stub}, "X-Request-Id", "req-1"))
	params := pr.KVTransferParams
	if params == nil {
		t.Fatal("prefill returned no kv_transfer_params")
	}
	for _, k := range []string{"remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size"} {
		if params[k] == nil {
			t.Errorf("kv_transfer_params lacks %s: %v", k, params)
		}
	}
	if params["do_remote_prefill"] != true || params["do_remote_decode"] != false {
		t.Errorf("flags %v", params)
	}
	if ids, _ := params["remote_block_ids"].([]any); len(ids) != 7 { // ceil(100/16)
		t.Errorf("remote_block_ids %v, want 7 blocks", params["remote_block_ids"])
	}
	if !strings.HasPrefix(pr.ID, "cmpl-req-1") {
		t.Errorf("id %q does not carry X-Request-Id", pr.ID)
	}
	// The blocks stay pinned on P until the decoder has read them.
	ctx := context.Background()
	if s, _ := p.Stats(ctx); s.UsedBlocks != 7 {
		t.Errorf("prefill holds %d blocks after hand-off, want 7", s.UsedBlocks)
	}

	r := post(t, d.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params}, "X-Request-Id", "req-1")
	dc := decodeCompletion(t, r)
	ttft := time.Duration(headerInt(t, r.header, "x-enginesim-ttft-us")-headerInt(t, r.header, "x-enginesim-queue-us")) * time.Microsecond
	if want := floor + time.Duration(perToken)*time.Microsecond; ttft < want-2*time.Microsecond || ttft > want+2*time.Microsecond {
		t.Errorf("decode prefill time %v, want %v (one recomputed token)", ttft, want)
	}
	if dc.Usage.CompletionTokens != 4 || dc.KVTransferParams != nil {
		t.Errorf("decode response %+v", dc)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, _ := p.Stats(ctx)
		if s.UsedBlocks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefill still holds %d blocks after the decoder read them", s.UsedBlocks)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Without kv_transfer_params the decoder prefills locally and counts it.
	r = post(t, d.URL()+"/v1/completions", map[string]any{"prompt": seqIDs(5000, 50), "max_tokens": 2})
	decodeCompletion(t, r)
	ttft = time.Duration(headerInt(t, r.header, "x-enginesim-ttft-us")-headerInt(t, r.header, "x-enginesim-queue-us")) * time.Microsecond
	if ttft < floor+50*time.Duration(perToken)*time.Microsecond-2*time.Microsecond {
		t.Errorf("local prefill on decoder took %v, want full cost", ttft)
	}
	m := scrape(t, d)
	for _, want := range []string{
		`enginesim_decode_local_prefills_total{engine="0",model_name="m"} 1`,
		`vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 99`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("decoder metrics lack %q", want)
		}
	}

	// Incomplete params: computed locally, like NixlConnector's
	// "Got invalid KVTransferParams".
	bad := map[string]any{"do_remote_prefill": true, "remote_block_ids": []int{1}}
	decodeCompletion(t, post(t, d.URL()+"/v1/completions", map[string]any{"prompt": seqIDs(7000, 20), "max_tokens": 1, "kv_transfer_params": bad}))
	if !strings.Contains(scrape(t, d), `enginesim_decode_local_prefills_total{engine="0",model_name="m"} 2`) {
		t.Error("invalid params not counted as a local prefill")
	}

	// Without do_remote_decode a prefill engine returns null params and frees.
	pr = decodeCompletion(t, post(t, p.URL()+"/v1/completions", map[string]any{"prompt": seqIDs(8000, 20), "max_tokens": 1}))
	if pr.KVTransferParams != nil {
		t.Errorf("params without do_remote_decode: %v", pr.KVTransferParams)
	}
}

func TestPrefillLeaseExpires(t *testing.T) {
	p := startEngine(t, Config{Role: RolePrefill, KVTransferTimeout: 50 * time.Millisecond})
	decodeCompletion(t, post(t, p.URL()+"/v1/completions",
		map[string]any{"prompt": seqIDs(1, 40), "max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}}))
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, _ := p.Stats(context.Background())
		if s.UsedBlocks == 0 {
			if s.CachedBlocks != 2 {
				t.Errorf("cached blocks %d after lease expiry, want 2", s.CachedBlocks)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease never expired: %d blocks in use", s.UsedBlocks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
