package selector

import "testing"

// TestCursorStartSeparatesReplicas: two replicas whose round-robin cursors
// start apart do not send the same request number to the same endpoint;
// with the default start they do (the benchmark's in-step queueing,
// docs/routing-benchmark.md).
func TestCursorStartSeparatesReplicas(t *testing.T) {
	rule := poolRule(4, SelRR)
	picks := func(start uint64) []int {
		o := noSeed()
		o.CursorStart = start
		e := newEnv(t, rule, o)
		var out []int
		for range 8 {
			d, _ := e.route(&Request{})
			out = append(out, d.Endpoint)
		}
		return out
	}
	a, same, apart := picks(0), picks(0), picks(1)
	for i := range a {
		if a[i] != same[i] {
			t.Fatalf("same start, different picks: %v %v", a, same)
		}
		if a[i] == apart[i] {
			t.Fatalf("request %d: both replicas picked %d (%v vs %v)", i, a[i], a, apart)
		}
	}
}
