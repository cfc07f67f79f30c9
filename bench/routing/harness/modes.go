package harness

import "time"

// DefaultShape sizes every workload for the profiles above: the capacity
// working set (Groups × SystemWords ≈ 12k tokens ≈ 760 blocks) is about
// two engines' KV caches (400–450 blocks, room for the running requests
// and a few prefixes) and well within the fleet's (1,800–2,400); each group
// recurs about five times in 60 requests (llm-d's prompts per group); a
// point takes seconds.
func DefaultShape(requests int) Shape {
	return Shape{
		Requests: requests,
		Groups:   12, SystemWords: 1000, QuestionWords: 200,
		Turns: 6, UserWords: 80, AssistantWords: 60, ActiveConvs: 12,
		HotShare: 0.6, HotWords: 800,
		UniqueWords: 900,
		MaxTokens:   48,
	}
}

// Plan is the list of points a mode runs.
type Plan struct {
	Points []Point
}

// Capacity estimates the fleet's request rate at saturation: every slot
// busy for a cold prefill of the longest prompt plus the decode.
func Capacity(p Profile, s Shape) float64 {
	prompt := float64(s.SystemWords + s.QuestionWords)
	slot := float64(p.TTFTFloor)/float64(time.Second) + prompt*p.PrefillUsPerToken/1e6 + float64(s.MaxTokens)/p.DecodeTokensPerS
	return float64(p.Engines*p.MaxNumSeqs) / slot
}

// QuickPlan is `make bench-routing`: every policy on every workload at one
// open-loop load near the knee, one seed of the headline profile.
func QuickPlan(policies, workloads []string) Plan {
	prof := Profiles["headline"]
	s := DefaultShape(60)
	q := round1(0.8 * Capacity(prof, s))
	var pl Plan
	for _, w := range workloads {
		for _, pol := range policies {
			pl.Points = append(pl.Points, Point{Profile: prof, Seed: 4, Workload: w, Load: Load{QPS: q}, Policy: pol, Shape: s})
		}
	}
	return pl
}

// FullPlan sweeps open-loop QPS from light load to past the knee plus one
// closed-loop concurrency, for every policy and workload, on the headline
// profile with seeds 4–6.
func FullPlan(policies, workloads []string, seeds []uint64) Plan {
	prof := Profiles["headline"]
	s := DefaultShape(90)
	c := Capacity(prof, s)
	var pl Plan
	for _, seed := range seeds {
		for _, w := range workloads {
			var loads []Load
			for _, f := range []float64{0.4, 0.8, 1.1, 1.5} {
				loads = append(loads, Load{QPS: round1(f * c)})
			}
			loads = append(loads, Load{Concurrency: prof.Engines * prof.MaxNumSeqs})
			for _, l := range loads {
				for _, pol := range policies {
					pl.Points = append(pl.Points, Point{Profile: prof, Seed: seed, Workload: w, Load: l, Policy: pol, Shape: s})
				}
			}
		}
	}
	return pl
}

func round1(v float64) float64 { return float64(int(v*10+0.5)) / 10 }

// SGLangGrid is the tuning grid for the SGLang router's thresholds
// (TunePlan): balance_abs_threshold, balance_rel_threshold, cache_threshold.
var SGLangGrid = []string{
	"sglang@abs2-rel1.25-thr0.3", "sglang@abs5-rel1.25-thr0.3", "sglang@abs10-rel1.5-thr0.3",
	"sglang@abs2-rel1.25-thr0.5", "sglang@abs5-rel1.25-thr0.5", "sglang@abs10-rel1.5-thr0.5",
}

// TunePlan runs the SGLang grid (and the router's defaults) on the tune
// profile with seeds 1–3, capacity and herding at one load near the knee;
// the winner becomes sglang-scaled. kvgate is not tuned here.
func TunePlan() Plan {
	prof := Profiles["tune"]
	s := DefaultShape(40)
	q := round1(0.8 * Capacity(prof, s))
	var pl Plan
	for _, seed := range []uint64{1, 2, 3} {
		for _, w := range []string{"capacity", "herding"} {
			for _, pol := range append([]string{"sglang"}, SGLangGrid...) {
				pl.Points = append(pl.Points, Point{Profile: prof, Seed: seed, Workload: w, Load: Load{QPS: q}, Policy: pol, Shape: s})
			}
		}
	}
	return pl
}
