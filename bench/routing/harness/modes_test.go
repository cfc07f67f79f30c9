package harness

import (
	"slices"
	"testing"
	"time"
)

// TestFullPlanBudget keeps -mode full within the 90 minutes, by the
// per-point estimate the dry run prints (calibrated against measured runs in
// docs/routing-benchmark.md), and checks that it still covers every load
// blend and baseline.
func TestFullPlanBudget(t *testing.T) {
	pols := FullPolicies()
	for _, want := range []string{"kvgate", "kvgate-cost", "kvgate-off", "kvgate-soft", "kvgate-adaptive", "kvgate-adaptive-soft",
		"round-robin", "least-inflight", "least-load", "sglang", "sglang-scaled", "oracle"} {
		if !slices.Contains(pols, want) {
			t.Errorf("FullPolicies() lacks %q", want)
		}
	}
	plan := FullPlan(pols, Workloads(), []uint64{4, 5, 6})
	var total time.Duration
	for _, pt := range plan.Points {
		total += EstimateDuration(pt)
	}
	if total > 90*time.Minute {
		t.Errorf("full plan: %d points, about %s; want at most 90 minutes", len(plan.Points), total.Round(time.Minute))
	}
}
