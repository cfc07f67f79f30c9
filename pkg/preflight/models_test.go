package preflight

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/models"
)

// modelsSource answers the model half of Source; the rest is not called here.
type modelsSource struct {
	Source
	states map[int]models.EndpointState // nil: discovery off
	staged map[string]bool
}

func (s modelsSource) DiscoveredModels(_, ep int) (models.EndpointState, bool) {
	if s.states == nil {
		return models.EndpointState{}, false
	}
	st, ok := s.states[ep]
	return st, ok
}

func (s modelsSource) StagedTokenizer(model string) (string, error) {
	path := "/etc/loxilb/tokenizers/" + strings.ReplaceAll(model, "/", "__") + "/tokenizer.json"
	if s.staged[model] {
		return path, nil
	}
	return path, errors.New("not staged")
}

// TestCheckModels: a row per endpoint with what discovery read; WARN when
// the last read failed, when none happened yet, or when no served model has
// a staged tokenizer; one SKIP row when the rule runs no discovery.
func TestCheckModels(t *testing.T) {
	now := time.Now()
	qwen := models.Served{Bases: []string{"Qwen/Qwen3-0.6B"}, Adapters: map[string]string{"sql-lora": "Qwen/Qwen3-0.6B"}}
	other := models.Served{Bases: []string{"acme/b"}}
	lora := models.Served{Bases: []string{"alias"}, Adapters: map[string]string{"x-lora": "Qwen/Qwen3-0.6B"}}
	staged := map[string]bool{"Qwen/Qwen3-0.6B": true}
	tests := []struct {
		name   string
		states map[int]models.EndpointState
		want   []Check // Detail and Fix: substrings
	}{
		{"discovery off", nil, []Check{{EPIdx: -1, Result: Skip, Detail: "LLB_KV_MODEL_DISCOVERY_SEC=0"}}},
		{"two endpoints, one without a staged tokenizer", map[int]models.EndpointState{
			0: {Served: qwen, CheckedAt: now},
			1: {Served: other, CheckedAt: now},
		}, []Check{
			{EPIdx: 0, Result: Pass, Detail: "serves Qwen/Qwen3-0.6B; LoRA adapters sql-lora (of Qwen/Qwen3-0.6B) (read 0s ago); tokenizer staged for Qwen/Qwen3-0.6B"},
			{EPIdx: 1, Result: Warn, Detail: "no tokenizer is staged for acme/b", Fix: "/etc/loxilb/tokenizers/acme__b/tokenizer.json"},
		}},
		{"an adapter's parent's tokenizer counts", map[int]models.EndpointState{0: {Served: lora, CheckedAt: now}, 1: {Served: qwen, CheckedAt: now}},
			[]Check{{EPIdx: 0, Result: Pass, Detail: "tokenizer staged for Qwen/Qwen3-0.6B"}, {EPIdx: 1, Result: Pass}}},
		{"failed after a listing, and never read", map[int]models.EndpointState{
			0: {Served: qwen, CheckedAt: now, Err: "status 500"},
			1: {CheckedAt: now, Err: "connection refused"},
		}, []Check{
			{EPIdx: 0, Result: Warn, Detail: "model discovery failed: status 500; routing keeps what it listed before: Qwen/Qwen3-0.6B", Fix: "kvgate_model_discovery_errors_total"},
			{EPIdx: 1, Result: Warn, Detail: "connection refused; until a read succeeds the endpoint is a candidate for every model"},
		}},
		{"first read in flight", map[int]models.EndpointState{0: {}, 1: {Served: qwen, CheckedAt: now}},
			[]Check{{EPIdx: 0, Result: Warn, Detail: "has not read this endpoint yet"}, {EPIdx: 1, Result: Pass}}},
	}
	rule := kvRule("sha256_cbor", 16)
	rule.Endpoints = []config.Endpoint{{Idx: 0, IP: "10.0.0.1", TargetPort: 8000}, {Idx: 1, IP: "10.0.0.2", TargetPort: 8000}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := New(modelsSource{states: tc.states, staged: staged}).checkModels(rule)
			if len(got) != len(tc.want) {
				t.Fatalf("%d rows, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.ID != CheckModels || g.EPIdx != w.EPIdx || g.Result != w.Result ||
					!strings.Contains(g.Detail, w.Detail) || !strings.Contains(g.Fix, w.Fix) {
					t.Errorf("row %d: %+v, want %+v", i, g, w)
				}
			}
		})
	}
}
