package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/usageaudit"
)

func TestPredictedCached(t *testing.T) {
	rule := &config.Rule{}
	rule.Args.KVBlockSize = 16
	st := &ruleState{rule: rule, gran: ingest.NewGranularity(16)}
	tests := []struct {
		name string
		d    fullproxy.Decision
		want int
		ok   bool
	}{
		{"hit", fullproxy.Decision{Tier: "1.5", Reason: "hit", Score: 5, PromptTokens: 100}, 80, true},
		// vLLM recomputes a fully cached prompt's last token: 64 tokens, 4
		// blocks matched, at most 3 blocks are a hit.
		{"hit on a block boundary", fullproxy.Decision{Tier: "1.5", Reason: "hit", Score: 4, PromptTokens: 64}, 48, true},
		{"hit, one token past the boundary", fullproxy.Decision{Tier: "1.5", Reason: "hit", Score: 4, PromptTokens: 65}, 64, true},
		{"no endpoint holds a block", fullproxy.Decision{Tier: "3", Reason: "no_worker", PromptTokens: 100}, 0, true},
		{"shallow: the serving endpoint was not scored for it", fullproxy.Decision{Tier: "3", Reason: "shallow", PromptTokens: 100}, 0, false},
		{"tier 1 session", fullproxy.Decision{Tier: "1", Reason: "-", PromptTokens: 100}, 0, false},
		{"excluded", fullproxy.Decision{Tier: "3", Reason: "excluded", PromptTokens: 100}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := predictedCached(tc.d, st)
			if got != tc.want || ok != tc.ok {
				t.Errorf("predictedCached = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestAuditBody: only bodies the kernel leg would splice are sampled.
func TestAuditBody(t *testing.T) {
	tests := []struct {
		leg      string
		streamed bool
		sample   int
		want     int // of 8 bodies
	}{
		{"userspace", true, 0, 8},
		{"userspace", false, 64, 8},
		{"sockmap", false, 0, 8},
		{"sockmap", true, 0, 0},
		{"sockmap", true, 1, 8},
		{"sockmap", true, 4, 2},
	}
	for _, tc := range tests {
		s := usageaudit.NewSampler(tc.sample)
		got := 0
		for range 8 {
			if auditBody(tc.leg, tc.streamed, s) {
				got++
			}
		}
		if got != tc.want {
			t.Errorf("leg %s streamed %v sample %d: %d of 8 audited, want %d", tc.leg, tc.streamed, tc.sample, got, tc.want)
		}
	}
}

func TestGenerationPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/completions": true, "/v1/chat/completions": true, "/v1/chat/completions/": true, "/v1/responses": true,
		"/v1/messages": true, "/tokenize": false, "/v1/models": false, "/v1/embeddings": false, "": false,
	} {
		if got := generationPath(p); got != want {
			t.Errorf("generationPath(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestStagedModels: a model is labelled by name only when its tokenizer.json
// is staged; the check stats the file (no load) and keeps a bounded table.
func TestStagedModels(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "org__model"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "org__model", "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	pool := tokenizer.NewPool(dir)
	var s stagedModels
	for model, want := range map[string]bool{"org/model": true, "org/other": false, "": false, "..": false, "a\\b": false, "x\x00": false} {
		if got := s.has(pool, model); got != want {
			t.Errorf("has(%q) = %v, want %v", model, got, want)
		}
	}
	for i := range 3 * maxStagedNames {
		s.has(pool, fmt.Sprintf("made-up-%d", i))
	}
	if n := len(s.answers); n > maxStagedNames {
		t.Fatalf("%d answers kept, bound %d", n, maxStagedNames)
	}
	if !s.has(pool, "org/model") {
		t.Fatal("the staged model lost its label after a flood of names")
	}
}
