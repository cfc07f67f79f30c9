package harness

import "slices"

// DefaultShape sizes every workload (a word of the prose is about one Qwen3
// token). capacity keeps llm-d's shared_prefix proportions (6,000-token
// system prompts, 1,200-token questions) with 16 groups: a working set of
// about 6,000 blocks, 1.5× one engine's 4,000 and a quarter of a 6-engine
// fleet's; each group recurs about five times in 80 requests (llm-d's
// prompts per group). Outputs are 64 tokens instead of llm-d's 1,000 so the
// client and proxies of a 2-core machine keep up; TTFT does not depend on
// them.
func DefaultShape(requests int) Shape {
	return Shape{
		Requests: requests,
		Groups:   16, SystemWords: 6000, QuestionWords: 1200,
		Turns: 6, UserWords: 150, AssistantWords: 150, ActiveConvs: 16,
		HotShare: 0.6, HotWords: 3000,
		UniqueWords: 3000,
		MaxTokens:   64,
	}
}

// Plan is the list of points a mode runs.
type Plan struct {
	Points []Point
}

// Sweep is the open-loop QPS sweep per workload (model time) for the
// headline profile: moderate load, round-robin's knee on capacity, and past
// it. Three levels keep the full mode within 90 minutes on two cores.
func Sweep() map[string][]float64 {
	return map[string][]float64{
		"capacity":  {30, 60, 90},
		"chat":      {60, 120, 180},
		"herding":   {30, 60, 90},
		"nosharing": {30, 60, 90},
		"mixed":     {30, 60, 90},
	}
}

// quickLoad is the one load per workload of the quick mode: near
// round-robin's knee, where the policies differ.
func quickLoad() map[string]float64 {
	return map[string]float64{"capacity": 30, "chat": 60, "herding": 30, "nosharing": 30, "mixed": 30}
}

// QuickPolicies are the policies of the quick mode.
func QuickPolicies() []string {
	return []string{"kvgate", "kvgate-cost", "kvgate-off", "round-robin", "least-load", "sglang", "sglang-scaled", "oracle"}
}

// FullPolicies is -mode full's default list: every policy but the
// kvgate-noprov ablation, which has its own section in
// docs/routing-benchmark.md and would push the sweep past 90 minutes.
func FullPolicies() []string {
	return slices.DeleteFunc(Policies(), func(p string) bool { return p == "kvgate-noprov" })
}

// QuickPlan is `make bench-routing`: the main policies on every workload at
// one open-loop load near the knee, one seed of the headline profile.
func QuickPlan(policies, workloads []string) Plan {
	prof := Profiles()["headline"]
	s := DefaultShape(80)
	var pl Plan
	for _, w := range workloads {
		for _, pol := range policies {
			pl.Points = append(pl.Points, Point{Profile: prof, Seed: 4, Workload: w, Load: Load{QPS: quickLoad()[w]}, Policy: pol, Shape: s})
		}
	}
	return pl
}

// FullPlan sweeps open-loop QPS from light load to past the knee plus one
// closed-loop concurrency, for every policy and workload, on the headline
// profile with the given seeds (4–6 for the doc).
func FullPlan(policies, workloads []string, seeds []uint64) Plan {
	prof := Profiles()["headline"]
	s := DefaultShape(60)
	var pl Plan
	for _, seed := range seeds {
		for _, w := range workloads {
			var loads []Load
			for _, q := range Sweep()[w] {
				loads = append(loads, Load{QPS: q})
			}
			loads = append(loads, Load{Concurrency: 8 * prof.Engines})
			for _, l := range loads {
				for _, pol := range policies {
					pl.Points = append(pl.Points, Point{Profile: prof, Seed: seed, Workload: w, Load: l, Policy: pol, Shape: s})
				}
			}
		}
	}
	return pl
}

// SGLangGrid is the tuning grid for the SGLang router's thresholds
// (TunePlan): balance_abs_threshold, balance_rel_threshold, cache_threshold.
func SGLangGrid() []string {
	return []string{
		"sglang@abs4-rel1.25-thr0.3", "sglang@abs8-rel1.25-thr0.3", "sglang@abs16-rel1.5-thr0.3",
		"sglang@abs4-rel1.25-thr0.5", "sglang@abs8-rel1.25-thr0.5", "sglang@abs16-rel1.5-thr0.5",
	}
}

// TunePlan runs the SGLang grid (and the router's defaults) on the tune
// profile with seeds 1–3, capacity and herding near the knee; the winner
// becomes sglang-scaled. kvgate is not tuned here.
func TunePlan() Plan {
	prof := Profiles()["tune"]
	s := DefaultShape(80)
	var pl Plan
	for _, seed := range []uint64{1, 2, 3} {
		for _, w := range []string{"capacity", "herding"} {
			for _, pol := range append([]string{"sglang"}, SGLangGrid()...) {
				pl.Points = append(pl.Points, Point{Profile: prof, Seed: seed, Workload: w, Load: Load{QPS: quickLoad()[w] * 2 / 3}, Policy: pol, Shape: s})
			}
		}
	}
	return pl
}
