package selector

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/inventory"
)

// The real inventory index satisfies Scorer.
var _ Scorer = (*inventory.Index)(nil)

// TestWithInventoryIndex runs the worked example of docs/pd.md against the real
// index: EP0 and EP2 prefill, EP1 decode; the cold request takes Tier 2, the
// warm one (shared 2-block preamble) goes to EP0 by tier 1.5.
func TestWithInventoryIndex(t *testing.T) {
	ix, err := inventory.New(inventory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(pdRule([]int{0, 2}, []int{1}), noSeed(), Deps{Scorer: ix})
	if err != nil {
		t.Fatal(err)
	}
	promptA := []uint64{101, 102, 103} // h1, h2, h3 (partial block B3 hashed by the proxy only if full)
	promptB := []uint64{101, 102, 203}
	a := s.Begin(kvReq(promptA))
	d := a.Decide()
	if d.Tier != TierLoad || d.Reason != ReasonNoWorker || d.Decode != 1 || (d.Endpoint != 0 && d.Endpoint != 2) {
		t.Fatalf("cold: %+v", d)
	}
	a.Commit()
	if err := ix.Add(0, 0, "", promptA[:2]); err != nil { // EP0 stores B1, B2
		t.Fatal(err)
	}
	a = s.Begin(kvReq(promptB))
	d = a.Decide()
	if d.Tier != TierKV || d.Endpoint != 0 || d.Score != 2 || d.Decode != 1 {
		t.Fatalf("warm: %+v", d)
	}
	if o := a.Commit(); !o.Hit || o.Endpoint != 0 {
		t.Fatalf("outcome %+v", o)
	}
	// Overlap mode counts a match after a hole; prefix mode does not.
	if err := ix.Add(2, 0, "", []uint64{102, 203}); err != nil {
		t.Fatal(err)
	}
	var counts [epset.Max]uint32
	ix.Score(promptB, epset.Of(0, 2), true, &counts)
	if counts[0] != 2 || counts[2] != 0 {
		t.Fatalf("prefix counts %v %v", counts[0], counts[2])
	}
	opts := noSeed()
	opts.Score = ScoreOverlap
	s2, _ := New(pdRule([]int{0, 2}, []int{1}), opts, Deps{Scorer: ix})
	a = s2.Begin(kvReq(promptB))
	if d = a.Decide(); d.Endpoint != 0 || d.BestScore != 2 {
		t.Fatalf("overlap tie must go to the lowest ep_idx: %+v", d)
	}
}

// BenchmarkDecide64Index: the decision with the real inventory index.
func BenchmarkDecide64Index(b *testing.B) {
	ix, err := inventory.New(inventory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	hashes := seq(0, 64)
	for ep := 0; ep < 64; ep++ {
		if err := ix.Add(ep, 0, "", hashes[:(ep*13)%64]); err != nil {
			b.Fatal(err)
		}
	}
	req := kvReq(hashes)
	for _, pd := range []bool{false, true} {
		name := "pool/hard"
		if pd {
			name = "pd/hard"
		}
		b.Run(name, func(b *testing.B) {
			opts := DefaultOptions()
			opts.ColdStartSeedN = 0
			runDecide(b, benchSelector(b, bench64Rule(pd), opts, ix), req, TierKV)
		})
	}
}
