package selector

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
)

// TestSessionHashAcrossReplicas: two selectors over the same rule (two
// replicas) route every new conversation to the same (prefill, decode) pair
// without sharing memory; keys spread over the endpoints; a full endpoint is
// skipped by the bounded-load cap; a down endpoint moves only its own keys.
// With the option off, a new conversation goes through the ladder as before.
func TestSessionHashAcrossReplicas(t *testing.T) {
	rule := pdRule([]int{0, 1, 2, 3}, []int{8, 9})
	opts := noSeed()
	opts.SessionHash = true
	a, b := newEnv(t, rule, opts), newEnv(t, rule, opts)
	home := map[string][2]int{}
	perEP := map[int]int{}
	for i := range 64 {
		key := fmt.Sprintf("conv-%d", i)
		da, _ := a.route(&Request{SessionKey: key})
		db := b.decide(&Request{SessionKey: key})
		if da.Tier != TierSession || da.Endpoint != db.Endpoint || da.Decode != db.Decode || da.Decode < 8 {
			t.Fatalf("%s: replica A %+v, replica B %+v", key, da, db)
		}
		home[key] = [2]int{da.Endpoint, da.Decode}
		perEP[da.Endpoint]++
	}
	for ep := range 4 {
		if perEP[ep] < 4 {
			t.Fatalf("keys spread %v: endpoint %d has too few", perEP, ep)
		}
	}
	// B: the home of conv-0 fills up, so B sends conv-0 elsewhere (A's pin holds).
	full := home["conv-0"][0]
	b.loads.l[full] = 40
	if d := b.decide(&Request{SessionKey: "conv-0"}); d.Endpoint == full || d.Tier != TierSession {
		t.Fatalf("bounded load: conv-0 still on its full home %d: %+v", full, d)
	}
	if d := a.decide(&Request{SessionKey: "conv-0"}); d.Endpoint != full {
		t.Fatalf("A's pin moved: %+v", d)
	}
	b.loads.l[full] = 0
	// An endpoint goes down on B: only its keys move.
	b.states.st.ProbeDown.Add(full)
	for key, h := range home {
		d := b.decide(&Request{SessionKey: key})
		if h[0] != full && d.Endpoint != h[0] {
			t.Fatalf("%s moved from healthy %d to %d", key, h[0], d.Endpoint)
		}
		if d.Endpoint == full {
			t.Fatalf("%s routed to the down endpoint", key)
		}
	}
	off := newEnv(t, rule, noSeed())
	if d := off.decide(&Request{SessionKey: "conv-1"}); d.Tier == TierSession {
		t.Fatalf("SessionHash off: a new conversation took tier 1: %+v", d)
	}
}

func TestBoundedHashPickCap(t *testing.T) {
	var sc scratch
	for _, c := range []struct {
		loads [2]int64
		mlf   int
		want  int // -2: either endpoint
	}{
		{[2]int64{0, 0}, 175, -2},
		{[2]int64{5, 0}, 175, -2}, // cap ceil(1.75·6/2) = 6: both under; the weight decides
		{[2]int64{9, 0}, 100, 1},  // cap ceil(10/2) = 5: ep 0 is over
		{[2]int64{0, 9}, 100, 0},
	} {
		sc.load[0], sc.load[1] = c.loads[0], c.loads[1]
		got := boundedHashPick(epset.Of(0, 1), sessionHash("k"), &sc, c.mlf)
		if got < 0 || c.want >= 0 && got != c.want {
			t.Errorf("loads %v mlf %d: got %d, want %d", c.loads, c.mlf, got, c.want)
		}
	}
	if boundedHashPick(epset.Of(), 1, &sc, 175) != -1 {
		t.Fatal("empty set")
	}
}
