package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/models"
)

// TestRuntimeLoRA: with RuntimeLoRA the engine serves vLLM's
// load/unload_lora_adapter: a loaded adapter is listed on /v1/models with
// the model as parent and served; vLLM's errors for a missing field, a
// second load and an unknown unload; without RuntimeLoRA the paths 404.
func TestRuntimeLoRA(t *testing.T) {
	e := startEngine(t, Config{RuntimeLoRA: true, LoRAModules: []string{"static-lora"}})
	listed := func() models.Served {
		t.Helper()
		resp, err := http.Get(e.URL() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b json.RawMessage
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			t.Fatal(err)
		}
		s, err := models.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	steps := []struct {
		path   string
		body   map[string]any
		status int
		has    []string // served after the step
		hasnt  []string
	}{
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "late-lora", "lora_path": "/a"}, 200, []string{"late-lora", "static-lora"}, nil},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "late-lora", "lora_path": "/a"}, 400, []string{"late-lora"}, nil},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "static-lora", "lora_path": "/a"}, 400, nil, nil},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "x"}, 400, nil, []string{"x"}},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": DefaultModel, "lora_path": "/a"}, 400, nil, nil},
		{"/v1/unload_lora_adapter", map[string]any{"lora_name": "nope"}, 404, nil, nil},
		{"/v1/unload_lora_adapter", map[string]any{"lora_name": "late-lora"}, 200, []string{"static-lora"}, []string{"late-lora"}},
	}
	for i, s := range steps {
		r := post(t, e.URL()+s.path, s.body)
		if r.status != s.status {
			t.Fatalf("step %d %s %v: %d %s, want %d", i, s.path, s.body, r.status, r.body, s.status)
		}
		got := listed()
		for _, m := range s.has {
			if got.Adapters[m] != DefaultModel {
				t.Fatalf("step %d: %q not listed with parent %q: %+v", i, m, DefaultModel, got)
			}
		}
		for _, m := range s.hasnt {
			if got.Serves(m) {
				t.Fatalf("step %d: %q still listed", i, m)
			}
		}
	}
	if r := post(t, e.URL()+"/v1/load_lora_adapter", map[string]any{"lora_name": "late-lora", "lora_path": "/a"}); r.status != 200 {
		t.Fatal(r.status)
	}
	if r := post(t, e.URL()+"/v1/completions", map[string]any{"model": "late-lora", "prompt": "hello", "max_tokens": 1}); r.status != 200 {
		t.Fatalf("a loaded adapter is not served: %d %s", r.status, r.body)
	}

	off := startEngine(t, Config{})
	if r := post(t, off.URL()+"/v1/load_lora_adapter", map[string]any{"lora_name": "a", "lora_path": "/a"}); r.status != 404 || !strings.Contains(string(r.body), "NotFoundError") {
		t.Fatalf("without RuntimeLoRA: %d %s, want vLLM's 404", r.status, r.body)
	}
}
