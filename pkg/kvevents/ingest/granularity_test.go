package ingest

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents"
)

func TestGranularity(t *testing.T) {
	type obs struct{ ep, bs int }
	cases := []struct {
		name     string
		seen     []obs
		forget   []int
		step     int
		unusable bool
	}{
		{"nothing seen", nil, nil, 1, false},
		{"same size", []obs{{0, 16}, {1, 16}}, nil, 1, false},
		{"group block of two", []obs{{0, 32}}, nil, 2, false},
		{"mixed 1 and 2: the finer endpoint holds every hash", []obs{{0, 16}, {1, 32}}, nil, 2, false},
		{"2 and 3 give 6", []obs{{0, 32}, {1, 48}}, nil, 6, false},
		{"not a multiple", []obs{{0, 24}}, nil, 1, true},
		{"one usable endpoint keeps the tier", []obs{{0, 24}, {1, 16}}, nil, 1, false},
		{"the usable endpoint leaves", []obs{{0, 24}, {1, 16}}, []int{1}, 1, true},
		{"an endpoint moves to a good size", []obs{{0, 24}, {0, 32}}, nil, 2, false},
		{"stride beyond the bound is not taken", []obs{{0, 16 * 48}, {1, 16 * 35}}, nil, 35, false},
	}
	for _, tc := range cases {
		g := NewGranularity(16)
		for _, o := range tc.seen {
			g.observe(o.ep, o.bs)
		}
		for _, ep := range tc.forget {
			g.forget(ep)
		}
		_, bad := g.Unusable()
		if g.Step() != tc.step || bad != tc.unusable {
			t.Errorf("%s: step %d unusable %v, want %d %v", tc.name, g.Step(), bad, tc.step, tc.unusable)
		}
	}
}

func TestEveryKth(t *testing.T) {
	h := []uint64{1, 2, 3, 4, 5}
	for _, tc := range []struct {
		k    int
		want []uint64
	}{{1, []uint64{1, 2, 3, 4, 5}}, {2, []uint64{2, 4}}, {3, []uint64{3}}, {6, []uint64{}}} {
		if got := EveryKth(slices.Clone(h), tc.k); !slices.Equal(got, tc.want) {
			t.Errorf("k=%d: %v, want %v", tc.k, got, tc.want)
		}
	}
}

// TestIngesterBlockSize: blocks of a size that is not a multiple of
// kvBlockSize are not stored (no request can match them) and the change is
// reported once; multiples are stored as published.
func TestIngesterBlockSize(t *testing.T) {
	ix, _ := inventory.New(inventory.Options{})
	g := NewGranularity(16)
	in := Ingester{Inventory: ix, EPIdx: 2, Granularity: g}
	apply := func(bs int, hs ...uint64) IngestResult {
		t.Helper()
		res, err := in.Apply(encodeBatch(t, kvevents.Event{Type: kvevents.BlockStored, BlockHashes: hs, BlockSize: bs, Medium: "GPU"}))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := apply(32, 1, 2); res.BlockSize != 32 || res.BadBlockSize || res.Stored != 2 || g.Step() != 2 {
		t.Errorf("size 32: %+v step %d", res, g.Step())
	}
	if res := apply(32, 3); res.BlockSize != 0 || res.Stored != 1 {
		t.Errorf("size 32 again: %+v (a repeated size is not reported)", res)
	}
	if res := apply(24, 4, 5); res.BlockSize != 24 || !res.BadBlockSize || res.Unmatchable != 2 || res.Stored != 0 {
		t.Errorf("size 24: %+v", res)
	}
	if bs, bad := g.Unusable(); !bad || bs != 24 {
		t.Errorf("Unusable = %d %v, want 24 true", bs, bad)
	}
	if got := ix.Snapshot(2); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("inventory %v, want [1 2 3]", got)
	}
}
