package harness

import (
	"math/rand/v2"
	"testing"
)

// TestColdCostAvoidsPendingPrefill: with LLB_KV_COLD_PLACEMENT=cost, a
// prompt no engine holds goes to the engine with the least prefill work
// kvgate has sent and not yet seen a first byte for. Three unique prompts
// of 6,000, 300 and 3,000 words start on three engines (each is tied, or
// the least, when it arrives); while the long two still prefill (the
// engines run 20× slower than the model), a fourth unique prompt must take
// the engine of the short one, where a round-robin fallback would take the
// engine of the longest.
func TestColdCostAvoidsPendingPrefill(t *testing.T) {
	env := fleetEnv(t)
	ctx, _, front := slowFleet(t, env, "kvgate@coldcost")
	send := func(seed uint64, words int) routed {
		t.Helper()
		resp, err := openCompletion(ctx, front.URL, prose(rand.New(rand.NewPCG(seed, seed+1)), words))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drain(resp) })
		r := parseDecision(t, resp.Header.Get("x-kvgate-decision"))
		if r.reason != "no_worker" {
			t.Fatalf("prompt %d: reason %s, want a no_worker miss", seed, r.reason)
		}
		return r
	}
	long, short, mid := send(11, 6000), send(21, 300), send(31, 3000)
	if long.ep == short.ep || long.ep == mid.ep || short.ep == mid.ep {
		t.Fatalf("the first three unique prompts share an engine: %d, %d, %d", long.ep, short.ep, mid.ep)
	}
	if next := send(41, 3000); next.ep != short.ep {
		t.Fatalf("the fourth went to ep %d; want ep %d, the one without a long prefill pending (long on %d, mid on %d)",
			next.ep, short.ep, long.ep, mid.ep)
	}
}
