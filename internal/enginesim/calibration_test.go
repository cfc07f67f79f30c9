package enginesim

import (
	"math"
	"testing"
)

// calibrationPoint is one published measurement a profile must reproduce
// within calibrationTolerance. docs/enginesim.md ("Calibration") gives each
// source and how the figure was read from it.
type calibrationPoint struct {
	profile string
	source  string
	// TTFT of one prompt of promptTokens uncached tokens on an idle engine,
	// or decode throughput of batch sequences with context tokens each.
	promptTokens   int
	batch, context int
	published      float64 // TTFT in seconds, or output tokens per second
}

const calibrationTolerance = 0.25

var calibrationPoints = []calibrationPoint{
	// NVIDIA Dynamo's mocker, built-in polynomial (lib/mocker perf_model.rs):
	// prefill_ms = 4.209989e-7·T² + 1.518344e-2·T + 16.50142;
	// decode_ms = -25.74·u² + 54.01·u + 5.74 with u the KV usage fraction.
	{profile: "llama3-8b-h100", source: "Dynamo mocker prefill, 1,000 tokens", promptTokens: 1000, published: 0.032105},
	{profile: "llama3-8b-h100", source: "Dynamo mocker prefill, 4,000 tokens", promptTokens: 4000, published: 0.083970},
	{profile: "llama3-8b-h100", source: "Dynamo mocker decode at zero KV usage, one sequence", batch: 1, context: 128, published: 1 / 0.00574},
	// vLLM's V1 announcement: "Llama-8B running on NVIDIA H100 GPUs, where
	// execution time on the GPU is as low as ~5ms" per step.
	{profile: "llama3-8b-h100", source: "vLLM V1 blog, ~5 ms GPU step, one sequence", batch: 1, context: 128, published: 1 / 0.005},
	// Vidur's H100 operator profile of Llama-2-7B (TP1): the sum of the
	// measured per-layer operator medians for a forward pass of N tokens.
	{profile: "llama3-8b-h100", source: "Vidur H100 Llama-2-7B, 4,096-token pass", promptTokens: 4096, published: 0.08306},
	// Vidur's H100 operator profile of CodeLlama-34B at tensor parallel 2.
	{profile: "codellama-34b-h100-tp2", source: "Vidur H100 CodeLlama-34B TP2, 1,024-token pass", promptTokens: 1024, published: 0.05725},
	{profile: "codellama-34b-h100-tp2", source: "Vidur H100 CodeLlama-34B TP2, 4,096-token pass", promptTokens: 4096, published: 0.21246},
	{profile: "codellama-34b-h100-tp2", source: "Vidur H100 CodeLlama-34B TP2, 1-token pass", batch: 1, context: 128, published: 1 / 0.01287},
	{profile: "codellama-34b-h100-tp2", source: "Vidur H100 CodeLlama-34B TP2, 64-token pass", batch: 64, context: 128, published: 64 / 0.01388},
}

// TestCalibration computes each profile's figure for the published points
// (a model computation, no clock involved) and checks it is within 25%.
func TestCalibration(t *testing.T) {
	seen := map[string][2]bool{}
	for _, pt := range calibrationPoints {
		t.Run(pt.profile+"/"+pt.source, func(t *testing.T) {
			prof, ok := LookupProfile(pt.profile)
			if !ok {
				t.Fatalf("no profile %q", pt.profile)
			}
			var model float64
			unit := "tok/s"
			if pt.promptTokens > 0 {
				model = prof.Perf.ColdTTFT(pt.promptTokens, DefaultMaxNumBatchedTokens).Seconds()
				unit = "s TTFT"
				s := seen[pt.profile]
				s[0] = true
				seen[pt.profile] = s
			} else {
				model = prof.Perf.DecodeThroughput(pt.batch, pt.context)
				s := seen[pt.profile]
				s[1] = true
				seen[pt.profile] = s
			}
			dev := model/pt.published - 1
			t.Logf("model %.4g %s, published %.4g (%+.1f%%)", model, unit, pt.published, 100*dev)
			if math.Abs(dev) > calibrationTolerance {
				t.Errorf("model %.4g %s is %+.1f%% off the published %.4g", model, unit, 100*dev, pt.published)
			}
		})
	}
	for _, prof := range Profiles() {
		if s := seen[prof.Name]; !s[0] || !s[1] {
			t.Errorf("profile %s lacks a TTFT or a decode calibration point", prof.Name)
		}
	}
}
