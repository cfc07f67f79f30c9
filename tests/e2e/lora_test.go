package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// TestLoRAAdapterRouting: engines serve a LoRA adapter (enginesim
// --lora-modules) and the rule lists it in kvLoraAdapters. A request for the
// adapter is tokenized with the base model's tokenizer and hashed with the
// adapter's lora_name in every block's extra keys, exactly as the engine
// caches and publishes it: the warm request sharing its prefix goes to the
// engine holding its blocks (tier 1.5), and the same prompt for the base
// model matches nothing (its hashes differ from the adapter's).
func TestLoRAAdapterRouting(t *testing.T) {
	const adapter = "sql-lora"
	lora := []string{adapter}
	_, tg, id, base := startMode3(t, []engineSpec{{lora: lora}, {lora: lora}, {lora: lora}},
		map[string]any{"kvLoraAdapters": []string{adapter + "=" + model}})
	url := base + "/v1/completions"

	shared := strings.Repeat("SELECT name, total FROM orders JOIN customers USING (customer_id) WHERE total > 100; ", 6)
	promptA := shared + "Explain the first query."
	promptB := shared + "Rewrite it with a CTE, please."

	a := post(t, url, map[string]any{"model": adapter, "prompt": promptA, "max_tokens": 2})
	if a.status != 200 || decisionField(a.decision, "tier") != "3" {
		t.Fatalf("cold adapter request: %d decision %q (want the rule selector, tier 3): %s", a.status, a.decision, a.body)
	}
	epA := decisionField(a.decision, "ep")

	// The engine's inventory holds the adapter's hashes (base-model ids, lora_name
	// in the extra keys), none of the base model's.
	ids, err := engineTokenizer(t).EncodePrompt(promptA, true)
	if err != nil {
		t.Fatal(err)
	}
	h, err := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})
	if err != nil {
		t.Fatal(err)
	}
	loraHashes := h.AppendHashes(nil, ids, kvhash.Extra{LoRAName: adapter})
	baseHashes := h.AppendHashes(nil, ids, kvhash.Extra{})
	if len(loraHashes) < 4 {
		t.Fatalf("prompt has %d blocks; the test wants at least 4", len(loraHashes))
	}
	var inv []uint64
	waitFor(t, "the cold engine's adapter blocks", 5*time.Second, func() bool {
		inv = inventory(t, tg, id, epA)
		return len(inv) >= len(loraHashes)
	})
	for i := range loraHashes {
		if !slices.Contains(inv, loraHashes[i]) {
			t.Fatalf("block %d: the adapter hash %d is not in ep %s's inventory %v", i, loraHashes[i], epA, inv)
		}
		if slices.Contains(inv, baseHashes[i]) {
			t.Fatalf("block %d: the base model's hash is in the inventory; adapter and base hash alike", i)
		}
	}

	b := post(t, url, map[string]any{"model": adapter, "prompt": promptB, "max_tokens": 2})
	if b.status != 200 {
		t.Fatalf("warm adapter request: %d %s", b.status, b.body)
	}
	if decisionField(b.decision, "tier") != "1.5" || decisionField(b.decision, "ep") != epA || b.engine != a.engine {
		t.Fatalf("warm adapter request: decision %q engine %q; want tier 1.5 on ep %s (%s)", b.decision, b.engine, epA, a.engine)
	}
	score, _ := strconv.Atoi(decisionField(b.decision, "score"))
	if score < 1 || b.cached() != score*16 {
		t.Fatalf("warm adapter request: score %d blocks, engine cached %d tokens; want score*16", score, b.cached())
	}

	// The base model's identical prompt shares no block with the adapter.
	c := post(t, url, map[string]any{"model": model, "prompt": promptA, "max_tokens": 2})
	if c.status != 200 || decisionField(c.decision, "tier") == "1.5" || c.cached() != 0 {
		t.Fatalf("base-model request: %d decision %q cached %d; want no KV hit and nothing cached", c.status, c.decision, c.cached())
	}
	if got := tg.metric(t, "loxilb_pd_kv_tier15_hits_total", map[string]string{"service": strconv.Itoa(id)}); got != 1 {
		t.Fatalf("tier15 hits %v, want exactly 1 (the warm adapter request)", got)
	}
	assertLoadsZero(t, tg, id)
}

// inventory reads an endpoint's mirrored block hashes through the API.
func inventory(t *testing.T, tg *testGateway, service int, epIdx string) []uint64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("%s/netlox/v1/config/ai/kv/inventory?service_id=%d&ep_idx=%s", tg.api, service, epIdx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Blocks []struct {
			Hash uint64 `json:"hash_uint64"`
		} `json:"blocks"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("inventory: %d %s", resp.StatusCode, b)
	}
	hashes := make([]uint64, 0, len(out.Blocks))
	for _, bl := range out.Blocks {
		hashes = append(hashes, bl.Hash)
	}
	return hashes
}
