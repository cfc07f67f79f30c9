package harness

import (
	"strings"
	"testing"
)

func TestGoals(t *testing.T) {
	a := func(wl string, qps float64, pol string, p90 float64, cached int, spread float64) agg {
		return agg{workload: wl, policy: pol, load: Load{QPS: qps}, seeds: 1,
			m: Result{TTFTp90: p90, CachedTok: cached, LoadMaxMean: spread}}
	}
	// round-robin's TTFT p90 is under 5 s up to 60 QPS: that is the knee.
	capacity := []agg{
		a("capacity", 30, "round-robin", 1, 0, 1), a("capacity", 60, "round-robin", 4, 0, 1), a("capacity", 90, "round-robin", 9, 0, 1),
		a("capacity", 60, "kvgate", 0.5, 990, 1), a("capacity", 60, "sglang", 2, 0, 1), a("capacity", 60, "oracle", 0.4, 1000, 1),
	}
	for _, c := range []struct {
		name string
		as   []agg
		want []string
		not  []string
	}{
		{"capacity at the knee", capacity, []string{
			"| capacity @ knee 60 QPS: kvgate TTFT p90 ≤ 0.20× round-robin | 500 ms vs 4.00 s = 0.12× | met |",
			"| capacity @ knee 60 QPS: kvgate TTFT p90 ≤ 0.50× sglang | 500 ms vs 2.00 s = 0.25× | met |",
			"| capacity @ knee 60 QPS: kvgate TTFT p90 ≤ 1.15× oracle | 500 ms vs 400 ms = 1.25× | **missed** |",
			"| capacity @ knee: kvgate cached tokens ≥ 98% of the oracle's | 990 vs 1000 = 99.0% | met |",
			"| no other policy (oracle excepted) beats kvgate's TTFT p90 by > 10% | none | met |",
		}, []string{"sglang-scaled"}},
		{"no knee", []agg{a("capacity", 30, "round-robin", 6, 0, 1)}, []string{
			"| capacity knee | no capacity QPS point where round-robin's TTFT p90 < 5 s | – |",
		}, nil},
		{"herding and nosharing", []agg{
			a("herding", 30, "kvgate", 1, 0, 1.2), a("herding", 30, "least-load", 0.8, 0, 1),
			a("nosharing", 30, "kvgate", 1, 0, 1), a("nosharing", 30, "least-load", 1, 0, 1),
		}, []string{
			"| herding @ 30 QPS: TTFT p90 ≤ 1.1× the best (least-load) | 1.00 s vs 800 ms = 1.25× | **missed** |",
			"| herding @ 30 QPS: max/mean engine load ≤ 1.5 | 1.20 | met |",
			"| nosharing @ 30 QPS: TTFT p90 ≤ 1.05× least-load | 1.00 s vs 1.00 s = 1.00× | met |",
			"| no other policy (oracle excepted) beats kvgate's TTFT p90 by > 10% | herding qps 30: least-load 800 ms vs kvgate 1.00 s | **missed** |",
		}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			Goals(&b, c.as)
			out := b.String()
			for _, w := range c.want {
				if !strings.Contains(out, w+"\n") {
					t.Errorf("missing row %q in:\n%s", w, out)
				}
			}
			for _, n := range c.not {
				if strings.Contains(out, n) {
					t.Errorf("unexpected %q in:\n%s", n, out)
				}
			}
		})
	}
}
