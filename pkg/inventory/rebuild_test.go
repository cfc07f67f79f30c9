package inventory

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
)

// checkRobinHood fails unless every entry of s is found by lookup with its
// holder set, and every entry's probe path from its home is occupied by
// entries displaced at least as far (the order that lets lookups of absent
// keys stop early and backward-shift deletion stay correct).
func checkRobinHood(t *testing.T, s *shard, want map[uint64]uint32) {
	t.Helper()
	n := len(s.slots)
	used := 0
	for i := range s.slots {
		if s.slots[i].id == emptySet {
			continue
		}
		used++
		d := displacement(s.slots[i].key(), i, n)
		for back := 1; back <= d; back++ {
			q := (i - back + n) % n
			if s.slots[q].id == emptySet || displacement(s.slots[q].key(), q, n) < d-back {
				t.Fatalf("slot %d (displacement %d): slot %d on its probe path breaks the order", i, d, q)
			}
		}
	}
	if used != len(want) || s.used != len(want) {
		t.Fatalf("%d slots used (counted %d), want %d", used, s.used, len(want))
	}
	for k, id := range want {
		if got := s.lookup(k); got != id {
			t.Fatalf("key %#x: lookup %d, want %d", k, got, id)
		}
	}
}

// keysFor returns n distinct 56-bit keys drawn as the case asks.
func keysFor(r *rand.Rand, n int, pick func(*rand.Rand) uint64) []uint64 {
	seen := map[uint64]bool{}
	out := make([]uint64, 0, n)
	for len(out) < n {
		k := pick(r) & keyMask
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// TestRebuildKeepsEveryEntry rebuilds shards of every shape the table
// produces (growth by 2 and by 1/8, a copy at the same size, shrinking, a
// full shard, clusters that wrap past the end, keys sharing one home slot)
// and checks that the result holds exactly the same entries in Robin Hood
// order, also after deleting half of them.
func TestRebuildKeepsEveryEntry(t *testing.T) {
	uniform := func(r *rand.Rand) uint64 { return r.Uint64() }
	// Keys packed into a few home slots: most entries share their old home
	// with others and come in arbitrary key order.
	clustered := func(r *rand.Rand) uint64 { return r.Uint64N(8)<<50 | r.Uint64N(1<<20) }
	// Keys at the top of the key space wrap past the shard's end.
	top := func(r *rand.Rand) uint64 {
		if r.IntN(2) == 0 {
			return keyMask - r.Uint64N(1<<44)
		}
		return r.Uint64()
	}
	for _, tc := range []struct {
		name     string
		from, to int
		entries  int
		pick     func(*rand.Rand) uint64
	}{
		{"double small", 16, 32, 13, uniform},
		{"grow by an eighth", 1024, 1152, 870, uniform},
		{"grow by an eighth, at most load", 4096, 4608, 4096 * maxLoadNum / maxLoadDen, uniform},
		{"same size", 512, 512, 400, uniform},
		{"shrink", 1152, 700, 280, uniform},
		{"shrink to nearly full", 1000, 300, 290, uniform},
		{"shared homes", 2048, 2304, 1700, clustered},
		{"shared homes, shrink", 2048, 1024, 900, clustered},
		{"wrapping clusters", 1024, 1152, 860, top},
		{"wrapping clusters, shrink", 1024, 600, 500, top},
		{"single slot shard", 16, 16, 1, uniform},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.from), uint64(tc.entries)))
			s := shard{slots: make([]slot, tc.from)}
			want := map[uint64]uint32{}
			for i, k := range keysFor(r, tc.entries, tc.pick) {
				id := uint32(i%7 + 1)
				j, d, _ := s.find(k)
				s.insertAt(j, d, uint64(i%200)<<keyBits|k, id)
				want[k] = id
			}
			checkRobinHood(t, &s, want)
			ns := s.rebuiltInto(make([]slot, tc.to))
			checkRobinHood(t, &ns, want)
			for k := range want {
				if r.IntN(2) == 0 {
					i, _, found := ns.find(k)
					if !found {
						t.Fatalf("key %#x not found for deletion", k)
					}
					ns.deleteAt(i)
					delete(want, k)
				}
			}
			checkRobinHood(t, &ns, want)
		})
	}
}

// TestGrowthKeepsCapAndRemoves drives an index through many rounds of shard
// growth, segment rebuilds and shrinking (on the Go heap and in slabs) while
// endpoints run at their cap and blocks are removed between growth steps,
// and checks the index against the model and the cap after every step.
func TestGrowthKeepsCapAndRemoves(t *testing.T) {
	const capBlocks = 6000
	for _, tc := range []struct {
		name   string
		slabs  bool
		remove int // per mille of each batch removed again right away
	}{
		{"heap, adds only", false, 0},
		{"heap, removes during growth", false, 300},
		{"slabs, adds only", true, 0},
		{"slabs, removes during growth", true, 300},
		{"slabs, most removed", true, 900},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, capBlocks)
			if tc.slabs {
				useTinySlabs(ix)
			}
			r := rand.New(rand.NewPCG(11, uint64(tc.remove)))
			live := [2][]uint64{} // per endpoint, oldest first
			for step := range 40 {
				for ep := range live {
					batch := make([]uint64, 400)
					for i := range batch {
						batch[i] = r.Uint64()
					}
					must(t, ix.Add(ep, 0, "", batch))
					var gone []uint64
					for _, h := range batch {
						if r.IntN(1000) < tc.remove {
							gone = append(gone, h)
						} else {
							live[ep] = append(live[ep], h)
						}
					}
					must(t, ix.Remove(ep, 0, "", gone))
					// Hashes are stored in batches, so generations follow the
					// order of live: the cap evicts from the front.
					if over := len(live[ep]) - capBlocks; over > 0 {
						live[ep] = live[ep][over:]
					}
				}
				for ep := range live {
					got := ix.Blocks(ep)
					if got > capBlocks {
						t.Fatalf("step %d: endpoint %d holds %d blocks, over the cap %d", step, ep, got, capBlocks)
					}
					snap := ix.Snapshot(ep)
					if len(snap) != got {
						t.Fatalf("step %d: endpoint %d: Blocks %d, snapshot %d", step, ep, got, len(snap))
					}
					// Eviction is by generation, not exact order: every
					// snapshot entry must be live in the model, and the
					// newest batch must be fully present.
					want := slices.Clone(live[ep])
					slices.Sort(want)
					for _, h := range snap {
						if _, ok := slices.BinarySearch(want, h); !ok {
							t.Fatalf("step %d: endpoint %d holds %#x, which was removed or never stored", step, ep, h)
						}
					}
					newest := live[ep][max(0, len(live[ep])-100):]
					var counts [epset.Max]uint32
					ix.Score(newest, epset.Of(ep), false, &counts)
					if int(counts[ep]) != len(newest) {
						t.Fatalf("step %d: endpoint %d scores %d of its %d newest blocks", step, ep, counts[ep], len(newest))
					}
				}
			}
			st := ix.Stats()
			if st.Used > 2*capBlocks {
				t.Fatalf("table holds %d hashes for 2 endpoints capped at %d", st.Used, capBlocks)
			}
		})
	}
}

// TestExpectStored: a reservation sizes nothing by itself; the shards that
// fill up while it stands grow straight to their share of it (the burst is
// then added in one or two rebuilds instead of dozens), never past the cap
// of the endpoints that hold or reserve blocks; it changes no count or
// score, and withdrawing it or removing blocks while it stands keeps the
// index exact.
func TestExpectStored(t *testing.T) {
	const capBlocks = 200_000
	// Slack for shard sizes rounding up (minShardSlots and the last slot).
	const slack = 2 * numShards * minShardSlots
	for _, tc := range []struct {
		name      string
		slabs     bool
		reserve   int // announced by endpoint 0
		add       int // then stored by endpoint 0
		removeAll bool
		failMaps  bool // every slab mapping fails: shards grow on the Go heap
		// Bounds on the table's slots after the burst. Growing by an
		// eighth would leave it near add/0.8; growing to the reservation
		// near (reserve + 1000)/0.8.
		minSlots, maxSlots int
	}{
		{"heap, burst fits", false, 150_000, 120_000, false, false, 151_000 * 5 / 4, 151_000*5/4 + slack},
		{"slabs, burst fits", true, 150_000, 120_000, false, false, 151_000 * 5 / 4, 151_000*5/4 + slack},
		{"slabs, mapping fails", true, 150_000, 120_000, false, true, 151_000 * 5 / 4, 151_000*5/4 + slack},
		// Two endpoints hold or reserve blocks: the table stops at twice the cap.
		{"slabs, over the cap", true, 10 * capBlocks, 50_000, false, false, 0, 2*capBlocks*5/4 + slack},
		{"slabs, removed while reserved", true, 150_000, 100_000, true, false, 0, 151_000*5/4 + slack},
		{"too small to reserve", true, minReserve - 1, 1000, false, false, 0, 4 * numShards * minShardSlots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, capBlocks)
			if tc.slabs {
				useTinySlabs(ix)
			}
			if tc.failMaps {
				ix.writeMu.Lock()
				ix.gpu.arena.mapSlab = func(int) ([]byte, []byte, error) { return nil, nil, errors.New("injected mapping failure") }
				ix.writeMu.Unlock()
			}
			r := rand.New(rand.NewPCG(5, uint64(tc.reserve)))
			other := make([]uint64, 1000)
			for i := range other {
				other[i] = r.Uint64()
			}
			must(t, ix.Add(1, 0, "", other))
			before := ix.Stats()
			ix.ExpectStored(0, tc.reserve)
			ix.ExpectStored(-1, tc.reserve)        // ignored
			ix.ExpectStored(epset.Max, tc.reserve) // ignored
			if st := ix.Stats(); st.Slots != before.Slots || st.Used != len(other) || st.Reserved != tc.reserve {
				t.Fatalf("a reservation alone changed the table: %+v, before %+v", st, before)
			}
			if ix.Blocks(0) != 0 || ix.Blocks(1) != len(other) {
				t.Fatalf("a reservation changed the counts: %d, %d", ix.Blocks(0), ix.Blocks(1))
			}
			batch := make([]uint64, tc.add)
			for i := range batch {
				batch[i] = r.Uint64()
			}
			for i := 0; i < len(batch); i += 256 {
				must(t, ix.Add(0, 0, "", batch[i:min(i+256, len(batch))]))
			}
			if st := ix.Stats(); st.Slots < tc.minSlots || st.Slots > tc.maxSlots {
				t.Fatalf("after the burst: %d slots, want %d to %d", st.Slots, tc.minSlots, tc.maxSlots)
			}
			want := batch
			if tc.removeAll {
				must(t, ix.Remove(0, 0, "", batch[:len(batch)/2]))
				want = batch[len(batch)/2:]
			}
			ix.ExpectStored(0, 0)
			if st := ix.Stats(); st.Reserved != 0 {
				t.Fatalf("reservation %d after withdrawing it", st.Reserved)
			}
			snap := ix.Snapshot(0)
			sorted := slices.Clone(want)
			slices.Sort(sorted)
			if !slices.Equal(snap, sorted) {
				t.Fatalf("endpoint 0 holds %d hashes, want %d", len(snap), len(sorted))
			}
			var counts [epset.Max]uint32
			ix.Score(want[:100], epset.Of(0, 1), false, &counts)
			if counts[0] != 100 || counts[1] != 0 {
				t.Fatalf("scores %d, %d; want 100, 0", counts[0], counts[1])
			}
			if got := ix.Snapshot(1); len(got) != len(other) {
				t.Fatalf("endpoint 1 holds %d, want %d", len(got), len(other))
			}
		})
	}
}
