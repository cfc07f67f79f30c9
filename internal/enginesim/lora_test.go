package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// TestLoRAModules: a request naming a --lora-modules adapter is served,
// caches under hashes with the adapter name in every block's extra keys
// (so the base model's cached blocks do not serve it), and its BlockStored
// event carries lora_name, as vLLM does. Unknown models stay 404.
func TestLoRAModules(t *testing.T) {
	e := startEngine(t, Config{LoRAModules: []string{"sql-lora", "chat-lora"}, MaxNumSeqs: 1})
	sub := subscribe(t, e)
	h, _ := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})
	prompt := seqIDs(500, 33) // two full blocks
	complete := func(model string) completionBody {
		t.Helper()
		return decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}))
	}

	if c := complete("sql-lora"); c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cold adapter request cached %d", c.Usage.PromptTokensDetails.CachedTokens)
	}
	stored := recvBatches(t, sub, 1)[0].batch.Events
	want := h.AppendHashes(nil, prompt, kvhash.Extra{LoRAName: "sql-lora"})
	if len(stored) != 1 || stored[0].Type != kvevents.BlockStored || stored[0].LoRAName != "sql-lora" ||
		len(stored[0].BlockHashes) != 2 || stored[0].BlockHashes[0] != want[0] || stored[0].BlockHashes[1] != want[1] {
		t.Fatalf("adapter BlockStored %+v, want lora_name sql-lora and hashes %v", stored, want)
	}
	if base := h.AppendHashes(nil, prompt, kvhash.Extra{}); base[0] == want[0] {
		t.Fatal("adapter and base hashes alike")
	}
	if c := complete("sql-lora"); c.Usage.PromptTokensDetails.CachedTokens != 32 {
		t.Errorf("warm adapter request cached %d, want 32", c.Usage.PromptTokensDetails.CachedTokens)
	}
	if c := complete(DefaultModel); c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("base model reused the adapter's blocks: cached %d", c.Usage.PromptTokensDetails.CachedTokens)
	}
	if c := complete("chat-lora"); c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("another adapter reused sql-lora's blocks: cached %d", c.Usage.PromptTokensDetails.CachedTokens)
	}
	if r := post(t, e.URL()+"/v1/completions", map[string]any{"model": "nope-lora", "prompt": prompt}); r.status != http.StatusNotFound {
		t.Errorf("unknown model: %d %s", r.status, r.body)
	}

	resp, err := http.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var models struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 3 || models.Data[1].ID != "sql-lora" || models.Data[1].Parent == nil || *models.Data[1].Parent != DefaultModel {
		t.Errorf("/v1/models %+v", models.Data)
	}
}

func TestLoRAModulesValidated(t *testing.T) {
	for _, mods := range [][]string{{""}, {" a"}, {"a", "a"}, {DefaultModel}} {
		c := Config{LoRAModules: mods, KVEventsEndpoint: "none", ReplayEndpoint: "none", Logger: quietLogger()}
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "lora-modules") {
			t.Errorf("LoRAModules %q: err %v", mods, err)
		}
	}
}
