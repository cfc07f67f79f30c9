package inventory

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
)

// TestModelSinkKeysModelsApart: two endpoints of two models that hash the
// same prompt alike (same tokenizer, same seed) store the same engine
// hashes; a request keyed for one model scores only on that model's
// endpoint, and a snapshot maps back to the engine's hashes.
func TestModelSinkKeysModelsApart(t *testing.T) {
	ix, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	engine := []uint64{11, 22, 33, 44}
	a, b := SaltFor("model-a"), SaltFor("model-b")
	sinks := []ModelSink{{Inner: ix, Salt: a}, {Inner: ix, Salt: b}, {Inner: ix}}
	for ep, s := range sinks {
		if err := s.Add(ep, 0, MediumGPU, engine); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(engine, []uint64{11, 22, 33, 44}) {
		t.Fatalf("Add rewrote the caller's hashes: %v", engine)
	}
	all := epset.Of(0, 1, 2)
	cases := []struct {
		name string
		salt ModelSalt
		want [3]uint32
	}{
		{"model a", a, [3]uint32{4, 0, 0}},
		{"model b", b, [3]uint32{0, 4, 0}},
		{"no model known", 0, [3]uint32{0, 0, 4}},
		{"another model", SaltFor("model-c"), [3]uint32{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := slices.Clone(engine)
			c.salt.KeyAll(req)
			var counts [epset.Max]uint32
			ix.Score(req, all, true, &counts)
			if got := [3]uint32{counts[0], counts[1], counts[2]}; got != c.want {
				t.Fatalf("scores %v, want %v", got, c.want)
			}
		})
	}
	for ep, s := range sinks {
		snap := ix.Snapshot(ep)
		s.Salt.Unkey(snap)
		slices.Sort(snap)
		if !slices.Equal(snap, engine) {
			t.Fatalf("ep %d snapshot unkeyed %v, want %v", ep, snap, engine)
		}
	}
	if err := sinks[1].Remove(1, 0, MediumGPU, engine[:2]); err != nil {
		t.Fatal(err)
	}
	if err := sinks[0].Add(0, 0, "CPU", engine[:3]); err != nil {
		t.Fatal(err)
	}
	if sinks[0].OtherMediaBlocks(0) != 3 || sinks[0].OtherMediaBlocks(0) != ix.OtherMediaBlocks(0) {
		t.Fatalf("OtherMediaBlocks %d through the sink, %d in the index; want 3 (failed before: the sink hid the index's count)", sinks[0].OtherMediaBlocks(0), ix.OtherMediaBlocks(0))
	}
	if ix.Blocks(0) != 4 || ix.Blocks(1) != 2 || sinks[1].Blocks(1) != 2 {
		t.Fatalf("after removing 2 of model b's blocks: %d, %d blocks", ix.Blocks(0), ix.Blocks(1))
	}
	x1, x2 := SaltFor("x"), SaltFor("x")
	if SaltFor("") != 0 || x1 == 0 || x1 != x2 || x1 == SaltFor("y") {
		t.Fatal("SaltFor: the empty name must be 0, others stable, distinct and non-zero")
	}
	if sinks[0] != (ModelSink{Inner: ix, Salt: a}) || sinks[0] == sinks[1] {
		t.Fatal("ModelSink must compare by index and salt (a changed salt is a changed ingest target)")
	}
}

// BenchmarkModelSinkAdd is BenchmarkAdd through a model-keyed sink: the
// cost of keying each event batch (a pooled copy and an XOR per hash) on
// top of the index's own add and remove. salt=0 is the unkeyed pass-through.
func BenchmarkModelSinkAdd(b *testing.B) {
	for _, salt := range []ModelSalt{0, SaltFor("Qwen/Qwen3-0.6B")} {
		name := "salt=0"
		if salt != 0 {
			name = "salt=model"
		}
		b.Run(name, func(b *testing.B) {
			ix, _ := fleet(b, 8, 125_000)
			sink := ModelSink{Inner: ix, Salt: salt}
			batch := make([]uint64, 512)
			n := 0
			for b.Loop() {
				seed := uint64(n) * 0x2545f4914f6cdd1d
				for j := range batch {
					batch[j] = seed + uint64(j)*0x9e3779b97f4a7c15
				}
				e := n % 8
				n++
				if err := sink.Add(e, 0, "", batch); err != nil {
					b.Fatal(err)
				}
				if err := sink.Remove(e, 0, "", batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*len(batch)*b.N)/b.Elapsed().Seconds()/1e6, "Mhash/s")
		})
	}
}
