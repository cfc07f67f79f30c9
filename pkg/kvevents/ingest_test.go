package kvevents

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/inventory"
)

func encodeBatch(t *testing.T, events ...Event) []byte {
	t.Helper()
	p, err := AppendEncode(nil, &Batch{TS: 1, Events: events, HasRank: true}, LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestIngesterApply(t *testing.T) {
	fa := func(typ EventType, group int64, hs ...uint64) Event {
		e := Event{Type: typ, BlockHashes: hs, Medium: "GPU", BlockSize: 16, HasGroupIdx: true, GroupIdx: group}
		if typ == BlockStored {
			e.KVCacheSpecKind = "full_attention"
		}
		return e
	}
	sw := func(typ EventType, group int64, hs ...uint64) Event {
		e := fa(typ, group, hs...)
		if typ == BlockStored {
			e.KVCacheSpecKind = "sliding_window"
		}
		return e
	}
	for _, tc := range []struct {
		name    string
		batches [][]Event
		gpu     []uint64
		other   map[string]int
	}{
		{"store remove clear", [][]Event{
			{{Type: BlockStored, BlockHashes: []uint64{1, 2, 3}}},
			{{Type: BlockRemoved, BlockHashes: []uint64{2}}},
		}, []uint64{1, 3}, map[string]int{}},
		{"clear", [][]Event{
			{{Type: BlockStored, BlockHashes: []uint64{1, 2, 3}}, {Type: AllBlocksCleared}, {Type: BlockStored, BlockHashes: []uint64{9}}},
		}, []uint64{9}, map[string]int{}},
		{"other media apart", [][]Event{
			{{Type: BlockStored, BlockHashes: []uint64{1}, Medium: "CPU"}, {Type: BlockStored, BlockHashes: []uint64{2}, Medium: "gpu"}},
		}, []uint64{2}, map[string]int{"CPU": 1}},
		{"hybrid: sliding-window removal keeps the full-attention block", [][]Event{
			{fa(BlockStored, 0, 1, 2), sw(BlockStored, 1, 1, 2)},
			{sw(BlockRemoved, 1, 1)},
		}, []uint64{1, 2}, map[string]int{"GPU#G1": 1}},
		{"hybrid: full attention in group 1", [][]Event{
			{fa(BlockStored, 1, 5, 6), sw(BlockStored, 0, 5, 6)},
			{fa(BlockRemoved, 1, 6), sw(BlockRemoved, 0, 5)},
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
	store := encodeBatch(t, Event{Type: BlockStored, BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: make([]uint32, 64), Medium: "GPU", BlockSize: 16})
	remove := encodeBatch(t, Event{Type: BlockRemoved, BlockHashes: []uint64{1, 2, 3, 4}, Medium: "GPU"})
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
