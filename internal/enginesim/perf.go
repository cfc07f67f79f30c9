package enginesim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// PerfModelSimple is the per-request timing model enginesim had before the
// step loop: every prefill runs at full speed beside any number of others.
// docs/enginesim.md ("Timing models") compares the two.
const PerfModelSimple = "simple"

// DefaultPerfModel is the profile `enginesim` runs when --perf-model is not
// given.
const DefaultPerfModel = "llama3-8b-h100"

// DefaultMaxNumBatchedTokens is vLLM V1's default token budget per step for
// the OpenAI server on an 80 GB-class GPU.
const DefaultMaxNumBatchedTokens = 8192

// StepPerf is the cost model of one engine step, in seconds:
//
//	step = StepFloorS
//	     + PrefillSPerToken     × prefill tokens scheduled in the step
//	     + DecodeSPerSeq        × decode sequences in the step
//	     + AttnSPerContextToken × KV tokens the step's sequences attend to
//
// The floor is the weight read and launch cost every forward pass pays; the
// prefill term is the GEMM work of new prompt tokens; the decode term is the
// marginal cost of one more sequence in the batch; the attention term is the
// KV-cache read, which grows with every running sequence's context. The JSON
// names are the /debug/state contract (docs/enginesim.md, "Debug state").
type StepPerf struct {
	StepFloorS           float64 `json:"step_floor_s"`
	PrefillSPerToken     float64 `json:"prefill_s_per_token"`
	DecodeSPerSeq        float64 `json:"decode_s_per_seq"`
	AttnSPerContextToken float64 `json:"attn_s_per_context_token"`
}

// Profile is a named model/GPU pair: its step costs and the engine limits
// vLLM would pick on that GPU.
type Profile struct {
	Name        string
	Description string
	Perf        StepPerf
	// NumGPUBlocks is what vLLM's memory profiling leaves for the KV cache
	// at gpu_memory_utilization 0.9 with 16-token blocks.
	NumGPUBlocks int
	MaxNumSeqs   int
}

// profiles are calibrated against published measurements; docs/enginesim.md
// ("Calibration") cites each source, and TestCalibration checks the model
// against those points.
var profiles = []Profile{
	{
		Name:        "llama3-8b-h100",
		Description: "Llama-3.1-8B-Instruct, BF16, one H100-80GB SXM",
		Perf: StepPerf{
			StepFloorS:           0.0060,
			PrefillSPerToken:     0.000020,
			DecodeSPerSeq:        0.000015,
			AttnSPerContextToken: 0.000000045, // 128 KiB of KV per token read at ~2.9 TB/s
		},
		NumGPUBlocks: 27000, // ~430k tokens: 72 GB less 16 GB of weights and activations, 128 KiB per token
		MaxNumSeqs:   1024,  // vLLM's default on a >= 70 GiB GPU
	},
	{
		Name:        "codellama-34b-h100-tp2",
		Description: "CodeLlama-34B-Instruct, BF16, two H100-80GB SXM (tensor parallel 2)",
		Perf: StepPerf{
			StepFloorS:           0.0135,
			PrefillSPerToken:     0.000050,
			DecodeSPerSeq:        0.000020,
			AttnSPerContextToken: 0.000000035, // 192 KiB of KV per token, half on each GPU
		},
		NumGPUBlocks: 22000, // ~350k tokens: 34 GB per GPU left after 34 GB of weights, 96 KiB per token per GPU
		MaxNumSeqs:   1024,
	},
}

// profileAliases are earlier names of profiles, kept so configurations
// written against them keep working: the first ~32B profile was named after
// Qwen2.5-32B before its calibration settled on CodeLlama-34B, the ~32B
// model Vidur measured on H100.
var profileAliases = map[string]string{
	"qwen2.5-32b-h100-tp2": "codellama-34b-h100-tp2",
}

// Profiles lists the named performance profiles (not "simple").
func Profiles() []Profile { return slices.Clone(profiles) }

// LookupProfile returns the profile called name (or an alias of it).
func LookupProfile(name string) (Profile, bool) {
	if canonical, ok := profileAliases[name]; ok {
		name = canonical
	}
	for _, p := range profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// PerfModelNames lists what --perf-model accepts.
func PerfModelNames() []string {
	names := []string{PerfModelSimple}
	for _, p := range profiles {
		names = append(names, p.Name)
	}
	return names
}

func checkPerfModel(name string) error {
	if name == PerfModelSimple {
		return nil
	}
	if _, ok := LookupProfile(name); ok {
		return nil
	}
	return fmt.Errorf("perf-model %q: want one of %s", name, strings.Join(PerfModelNames(), ", "))
}

func (p StepPerf) validate() error {
	for _, v := range []float64{p.StepFloorS, p.PrefillSPerToken, p.DecodeSPerSeq, p.AttnSPerContextToken} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 60 {
			return fmt.Errorf("step costs must be finite, non-negative and under 60 s, got %+v", p)
		}
	}
	return nil
}

// stepLoad is the work in one engine step, as the cost model sees it.
type stepLoad struct {
	prefillTokens int // prompt (or recomputed) tokens scheduled
	decodeSeqs    int // sequences decoding one token
	contextTokens int // KV tokens attended: each scheduled sequence's context after the step
	reloadTokens  int // tokens reloaded from the CPU offload tier for this step (offload.go)
}

// duration is the model time of a step with this load.
func (p StepPerf) duration(l stepLoad) time.Duration {
	s := p.StepFloorS +
		p.PrefillSPerToken*float64(l.prefillTokens) +
		p.DecodeSPerSeq*float64(l.decodeSeqs) +
		p.AttnSPerContextToken*float64(l.contextTokens)
	return time.Duration(s * float64(time.Second))
}

// ColdTTFT is the model's time to first token of one prompt of n uncached
// tokens on an idle engine: ceil(n / budget) prefill steps, each attending to
// the context computed so far.
func (p StepPerf) ColdTTFT(n, maxNumBatchedTokens int) time.Duration {
	var total time.Duration
	for done := 0; done < n; {
		chunk := min(n-done, maxNumBatchedTokens)
		done += chunk
		total += p.duration(stepLoad{prefillTokens: chunk, contextTokens: done})
	}
	return total
}

// DecodeThroughput is the model's output tokens per second of batch
// sequences decoding together, each with context tokens of KV.
func (p StepPerf) DecodeThroughput(batch, context int) float64 {
	d := p.duration(stepLoad{decodeSeqs: batch, contextTokens: batch * context})
	return float64(batch) / d.Seconds()
}

// secondsPer1kNewTokens predicts how long 1,000 uncached prompt tokens of a
// new request take to prefill beside the current decode load: each step
// gives the budget left after the decodes to prefill and also pays the floor
// and the decoders' costs. It is the /debug/state figure
// predicted_ttft_s_for_new_tokens_per_1k.
func (p StepPerf) secondsPer1kNewTokens(budget, decodeSeqs, decodeContext int) float64 {
	free := max(budget-decodeSeqs, 1)
	perStepOverhead := p.StepFloorS + p.DecodeSPerSeq*float64(decodeSeqs) + p.AttnSPerContextToken*float64(decodeContext)
	return 1000*p.PrefillSPerToken + 1000/float64(free)*perStepOverhead
}
