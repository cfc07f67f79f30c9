package ingest

import (
	"github.com/kvgate/kvgate/pkg/kvevents"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/inventory"
)

func encodeBatch(t *testing.T, events ...kvevents.Event) []byte {
	t.Helper()
	p, err := kvevents.AppendEncode(nil, &kvevents.Batch{TS: 1, Events: events, HasRank: true}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestIngesterApply(t *testing.T) {
	fa := func(typ kvevents.EventType, group int64, hs ...uint64) kvevents.Event {
		e := kvevents.Event{Type: typ, BlockHashes: hs, Medium: "GPU", BlockSize: 16, HasGroupIdx: true, GroupIdx: group}
		if typ == kvevents.BlockStored {
			e.KVCacheSpecKind = "full_attention"
		}
		return e
	}
	sw := func(typ kvevents.EventType, group int64, hs ...uint64) kvevents.Event {
		e := fa(typ, group, hs...)
		if typ == kvevents.BlockStored {
			e.KVCacheSpecKind = "sliding_window"
		}
		return e
	}
	for _, tc := range []struct {
		name    string
		batches [][]kvevents.Event
		gpu     []uint64
		other   map[string]int
	}{
		{"store remove clear", [][]kvevents.Event{
			{{Type: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3}}},
			{{Type: kvevents.BlockRemoved, BlockHashes: []uint64{2}}},
		}, []uint64{1, 3}, map[string]int{}},
		{"clear", [][]kvevents.Event{
			{{Type: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3}}, {Type: kvevents.AllBlocksCleared}, {Type: kvevents.BlockStored, BlockHashes: []uint64{9}}},
		}, []uint64{9}, map[string]int{}},
		{"other media apart", [][]kvevents.Event{
			{{Type: kvevents.BlockStored, BlockHashes: []uint64{1}, Medium: "CPU"}, {Type: kvevents.BlockStored, BlockHashes: []uint64{2}, Medium: "gpu"}},
		}, []uint64{2}, map[string]int{"CPU": 1}},
		{"hybrid: sliding-window removal keeps the full-attention block", [][]kvevents.Event{
			{fa(kvevents.BlockStored, 0, 1, 2), sw(kvevents.BlockStored, 1, 1, 2)},
			{sw(kvevents.BlockRemoved, 1, 1)},
		}, []uint64{1, 2}, map[string]int{"GPU#G1": 1}},
		{"hybrid: full attention in group 1", [][]kvevents.Event{
			{fa(kvevents.BlockStored, 1, 5, 6), sw(kvevents.BlockStored, 0, 5, 6)},
			{fa(kvevents.BlockRemoved, 1, 6), sw(kvevents.BlockRemoved, 0, 5)},
		}, []uint64{5}, map[string]int{"GPU#G0": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			in := &Ingester{Inventory: ix, EPIdx: 2, Rank: 1}
			for _, b := range tc.batches {
				if _, err := in.Apply(encodeBatch(t, b...)); err != nil {
					t.Fatal(err)
				}
			}
			if got := ix.Snapshot(2); !slices.Equal(got, tc.gpu) {
				t.Errorf("GPU inventory %v, want %v", got, tc.gpu)
			}
			got := ix.MediumBlocks(2)
			if len(got) != len(tc.other) {
				t.Errorf("other media %v, want %v", got, tc.other)
			}
			for k, v := range tc.other {
				if got[k] != v {
					t.Errorf("other media %v, want %v", got, tc.other)
				}
			}
		})
	}
	in := &Ingester{Inventory: nil}
	if _, err := in.Apply([]byte{0xc1}); err == nil {
		t.Error("a malformed payload must be an error")
	}
}

func TestIngestZeroAllocs(t *testing.T) {
	ix, _ := inventory.New(inventory.Options{})
	in := &Ingester{Inventory: ix, EPIdx: 0}
	store := encodeBatch(t, kvevents.Event{Type: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: make([]uint32, 64), Medium: "GPU", BlockSize: 16})
	remove := encodeBatch(t, kvevents.Event{Type: kvevents.BlockRemoved, BlockHashes: []uint64{1, 2, 3, 4}, Medium: "GPU"})
	for range 10 {
		_, _ = in.Apply(store)
		_, _ = in.Apply(remove)
	}
	if n := testing.AllocsPerRun(200, func() {
		_, _ = in.Apply(store)
		_, _ = in.Apply(remove)
	}); n > 0 {
		t.Errorf("%.1f allocations per store+remove, want 0", n)
	}
}
