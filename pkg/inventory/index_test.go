package inventory

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

func newIndex(t testing.TB, max int) *Index {
	t.Helper()
	ix, err := New(Options{MaxBlocks: max})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func TestMixIsABijection(t *testing.T) {
	c1, c1i, c2, c2i := uint64(mixC1), uint64(mixC1Inv), uint64(mixC2), uint64(mixC2Inv)
	if c1*c1i != 1 || c2*c2i != 1 {
		t.Fatal("inverse constants are wrong")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, x := range []uint64{0, 1, 2, 1<<63 - 1, 1 << 63, ^uint64(0)} {
		if got := unmix(mix(x)); got != x {
			t.Fatalf("unmix(mix(%#x)) = %#x", x, got)
		}
	}
	for range 100000 {
		x := r.Uint64()
		if got := unmix(mix(x)); got != x {
			t.Fatalf("unmix(mix(%#x)) = %#x", x, got)
		}
	}
}

func TestNewValidatesMaxBlocks(t *testing.T) {
	for _, tc := range []struct {
		max  int
		want int
		bad  bool
	}{
		{0, DefaultMaxBlocks, false},
		{MinMaxBlocks, MinMaxBlocks, false},
		{MaxMaxBlocks, MaxMaxBlocks, false},
		{MinMaxBlocks - 1, 0, true},
		{MaxMaxBlocks + 1, 0, true},
		{-5, 0, true},
	} {
		ix, err := New(Options{MaxBlocks: tc.max})
		if tc.bad {
			if err == nil {
				t.Errorf("New(%d): want an error", tc.max)
			}
			continue
		}
		if err != nil || ix.MaxBlocks() != tc.want {
			t.Errorf("New(%d) = %v, %v; want cap %d", tc.max, ix, err, tc.want)
		}
	}
}

func TestRejectsOutOfRangeMembers(t *testing.T) {
	ix := newIndex(t, 0)
	for _, tc := range []struct{ ep, rank int }{{-1, 0}, {epset.Max, 0}, {0, -1}, {0, MaxRanks}} {
		if err := ix.Add(tc.ep, tc.rank, "", []uint64{1}); err == nil {
			t.Errorf("Add(%d,%d): want an error", tc.ep, tc.rank)
		}
		if err := ix.Remove(tc.ep, tc.rank, "", []uint64{1}); err == nil {
			t.Errorf("Remove(%d,%d): want an error", tc.ep, tc.rank)
		}
		if err := ix.ClearRank(tc.ep, tc.rank); err == nil {
			t.Errorf("ClearRank(%d,%d): want an error", tc.ep, tc.rank)
		}
	}
	if ix.Blocks(-1) != 0 || ix.Blocks(epset.Max) != 0 || ix.Snapshot(-1) != nil {
		t.Error("out-of-range reads must be empty")
	}
}

// TestRankUnion walks the rank semantics step by step.
func TestRankUnion(t *testing.T) {
	ix := newIndex(t, 0)
	type step struct {
		name  string
		do    func() error
		ep0   []uint64 // expected Snapshot(0)
		ranks [2]int   // expected RankBlocks(0, 0..1)
	}
	steps := []step{
		{"rank0 stores", func() error { return ix.Add(0, 0, "GPU", []uint64{1, 2, 3}) }, []uint64{1, 2, 3}, [2]int{3, 0}},
		{"rank1 stores overlapping", func() error { return ix.Add(0, 1, "", []uint64{3, 4}) }, []uint64{1, 2, 3, 4}, [2]int{3, 2}},
		{"duplicate store is idempotent", func() error { return ix.Add(0, 0, "gpu", []uint64{1, 1, 2}) }, []uint64{1, 2, 3, 4}, [2]int{3, 2}},
		{"rank0 removes shared hash: rank1 keeps it", func() error { return ix.Remove(0, 0, "GPU", []uint64{3}) }, []uint64{1, 2, 3, 4}, [2]int{2, 2}},
		{"remove of unknown hash ignored", func() error { return ix.Remove(0, 0, "GPU", []uint64{99}) }, []uint64{1, 2, 3, 4}, [2]int{2, 2}},
		{"rank1 clears", func() error { return ix.ClearRank(0, 1) }, []uint64{1, 2}, [2]int{2, 0}},
		{"rank0 removes rest", func() error { return ix.Remove(0, 0, "", []uint64{1, 2}) }, []uint64{}, [2]int{0, 0}},
	}
	if err := ix.Add(1, 0, "", []uint64{1, 2, 3}); err != nil { // another endpoint is never touched
		t.Fatal(err)
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := ix.Snapshot(0); !slices.Equal(got, s.ep0) {
			t.Errorf("%s: Snapshot(0) = %v, want %v", s.name, got, s.ep0)
		}
		if ix.Blocks(0) != len(s.ep0) {
			t.Errorf("%s: Blocks(0) = %d, want %d", s.name, ix.Blocks(0), len(s.ep0))
		}
		for r, want := range s.ranks {
			if got := ix.RankBlocks(0, r); got != want {
				t.Errorf("%s: RankBlocks(0,%d) = %d, want %d", s.name, r, got, want)
			}
		}
		if got := ix.Snapshot(1); !slices.Equal(got, []uint64{1, 2, 3}) {
			t.Errorf("%s: endpoint 1 changed: %v", s.name, got)
		}
	}
	if err := ix.ClearEndpoint(1); err != nil {
		t.Fatal(err)
	}
	if ix.Blocks(1) != 0 || ix.Stats().Used != 0 {
		t.Errorf("after ClearEndpoint: blocks %d, stats %+v", ix.Blocks(1), ix.Stats())
	}
}

func TestMediaCountedApart(t *testing.T) {
	ix := newIndex(t, 0)
	must(t, ix.Add(0, 0, "GPU", []uint64{1, 2}))
	must(t, ix.Add(0, 0, "CPU", []uint64{2, 3, 4}))
	must(t, ix.Add(0, 1, "cpu", []uint64{4, 5}))
	must(t, ix.Add(0, 0, "STORAGE", []uint64{9}))
	if ix.Blocks(0) != 2 {
		t.Errorf("Blocks = %d, want 2 (GPU only)", ix.Blocks(0))
	}
	if got := ix.MediumBlocks(0); got["CPU"] != 4 || got["STORAGE"] != 1 || len(got) != 2 {
		t.Errorf("MediumBlocks = %v", got)
	}
	var counts [epset.Max]uint32
	ix.Score([]uint64{1, 2, 3}, epset.Of(0), false, &counts)
	if counts[0] != 2 {
		t.Errorf("overlap = %d, want 2: other media must not score", counts[0])
	}
	must(t, ix.Remove(0, 0, "CPU", []uint64{2, 4}))
	if got := ix.MediumBlocks(0); got["CPU"] != 3 {
		t.Errorf("after remove: MediumBlocks = %v, want CPU 3 (3 from rank 0, 4 and 5 from rank 1)", got)
	}
	must(t, ix.ClearRank(0, 0))
	if got := ix.MediumBlocks(0); got["CPU"] != 2 || got["STORAGE"] != 0 || ix.Blocks(0) != 0 {
		t.Errorf("after ClearRank(0,0): %v, blocks %d", got, ix.Blocks(0))
	}
	// Media beyond maxMedia share one bucket instead of growing without bound.
	for i := range 20 {
		must(t, ix.Add(2, 0, string(rune('a'+i)), []uint64{uint64(i)}))
	}
	if got := ix.MediumBlocks(2); len(got) > maxMedia {
		t.Errorf("%d media tracked, want at most %d", len(got), maxMedia)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestScoreModes(t *testing.T) {
	ix := newIndex(t, 0)
	must(t, ix.Add(0, 0, "", []uint64{10, 11, 12, 13}))
	must(t, ix.Add(1, 0, "", []uint64{10, 11, 13, 14, 15}))
	must(t, ix.Add(2, 0, "", []uint64{11, 12, 13}))
	must(t, ix.Add(3, 0, "", []uint64{10, 11, 12, 13}))
	prompt := []uint64{10, 11, 12, 13, 14}
	for _, tc := range []struct {
		name     string
		eligible epset.Set
		run      bool
		want     map[int]uint32
		best     int
	}{
		{"run all", epset.FirstN(5), true, map[int]uint32{0: 4, 1: 2, 2: 0, 3: 4}, 0},
		{"overlap all", epset.FirstN(5), false, map[int]uint32{0: 4, 1: 4, 2: 3, 3: 4}, 0},
		{"run excludes 0", epset.Of(1, 2, 3), true, map[int]uint32{1: 2, 3: 4}, 3},
		{"overlap excludes 0,3", epset.Of(1, 2), false, map[int]uint32{1: 4, 2: 3}, 1},
		{"run only 2", epset.Of(2), true, map[int]uint32{}, -1},
		{"nothing eligible", epset.Set{}, false, map[int]uint32{}, -1},
	} {
		var counts [epset.Max]uint32
		counts[7] = 99 // Score must reset stale counts
		ix.Score(prompt, tc.eligible, tc.run, &counts)
		for e := range epset.Max {
			if counts[e] != tc.want[e] {
				t.Errorf("%s: counts[%d] = %d, want %d", tc.name, e, counts[e], tc.want[e])
			}
		}
		if ep, _ := Best(&counts, tc.eligible); ep != tc.best {
			t.Errorf("%s: Best = %d, want %d", tc.name, ep, tc.best)
		}
	}
}

func TestBest(t *testing.T) {
	for _, tc := range []struct {
		name     string
		counts   map[int]uint32
		eligible epset.Set
		ep       int
		score    uint32
	}{
		{"all zero", nil, epset.FirstN(8), -1, 0},
		{"single", map[int]uint32{5: 3}, epset.FirstN(8), 5, 3},
		{"tie goes to lowest", map[int]uint32{200: 7, 64: 7, 130: 7}, epset.FirstN(epset.Max), 64, 7},
		{"ineligible max ignored", map[int]uint32{1: 9, 2: 4}, epset.Of(2, 3), 2, 4},
		{"empty eligible", map[int]uint32{1: 9}, epset.Set{}, -1, 0},
	} {
		var c [epset.Max]uint32
		for e, v := range tc.counts {
			c[e] = v
		}
		ep, score := Best(&c, tc.eligible)
		if ep != tc.ep || score != tc.score {
			t.Errorf("%s: Best = (%d, %d), want (%d, %d)", tc.name, ep, score, tc.ep, tc.score)
		}
	}
}

// model is the obviously-correct reference the index is checked against.
type model map[uint64]map[member]bool

func (m model) endpoint(ep int) []uint64 {
	out := []uint64{}
	for h, ms := range m {
		for mb := range ms {
			if mb.ep() == ep {
				out = append(out, h)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

func (m model) score(hashes []uint64, eligible epset.Set, run bool) [epset.Max]uint32 {
	var c [epset.Max]uint32
	for e := eligible.Next(0); e >= 0; e = eligible.Next(e + 1) {
		for _, h := range hashes {
			held := false
			for mb := range m[h] {
				held = held || mb.ep() == e
			}
			if held {
				c[e]++
			} else if run {
				break
			}
		}
	}
	return c
}

// TestAgainstModel drives random operations over small and large key spaces
// (collisions, shared holder sets, shard growth and shrink) and compares every
// observable with the model.
func TestAgainstModel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keySpace  uint64
		eps, rank int
		ops       int
	}{
		{"dense small keys", 64, 4, 2, 4000},
		{"wide keys", 1 << 40, 8, 2, 6000},
		{"many endpoints", 5000, 70, 3, 3000},
	} {
		for _, slabs := range []bool{false, true} {
			name := tc.name
			if slabs {
				name += "/huge-page slabs"
			}
			// -short (the race step, make race) runs a quarter of the
			// operations: the model check is single-threaded, and under
			// -race it was the package's longest test; make test runs all.
			ops := tc.ops
			if testing.Short() {
				ops /= 4
			}
			t.Run(name, func(t *testing.T) {
				r := rand.New(rand.NewPCG(7, uint64(tc.ops)))
				ix := newIndex(t, MaxMaxBlocks)
				if slabs {
					useTinySlabs(ix)
				}
				m := model{}
				for op := range ops {
					ep, rank := r.IntN(tc.eps), r.IntN(tc.rank)
					mb := makeMember(ep, rank)
					hashes := make([]uint64, 1+r.IntN(300))
					for i := range hashes {
						hashes[i] = r.Uint64N(tc.keySpace)
					}
					switch k := r.IntN(100); {
					case k < 60:
						must(t, ix.Add(ep, rank, "", hashes))
						for _, h := range hashes {
							if m[h] == nil {
								m[h] = map[member]bool{}
							}
							m[h][mb] = true
						}
					case k < 95:
						must(t, ix.Remove(ep, rank, "GPU", hashes))
						for _, h := range hashes {
							delete(m[h], mb)
							if len(m[h]) == 0 {
								delete(m, h)
							}
						}
					case k < 98:
						must(t, ix.ClearRank(ep, rank))
						for h, ms := range m {
							delete(ms, mb)
							if len(ms) == 0 {
								delete(m, h)
							}
						}
					default:
						must(t, ix.ClearEndpoint(ep))
						for h, ms := range m {
							for x := range ms {
								if x.ep() == ep {
									delete(ms, x)
								}
							}
							if len(ms) == 0 {
								delete(m, h)
							}
						}
					}
					if op%97 != 0 && op != ops-1 {
						continue
					}
					byEp := map[int][]uint64{}
					for h, ms := range m {
						seen := epset.Set{}
						for mb := range ms {
							if !seen.Has(mb.ep()) {
								seen.Add(mb.ep())
								byEp[mb.ep()] = append(byEp[mb.ep()], h)
							}
						}
					}
					for e := range tc.eps {
						want := byEp[e]
						if want == nil {
							want = []uint64{}
						}
						slices.Sort(want)
						if got := ix.Blocks(e); got != len(want) {
							t.Fatalf("op %d: Blocks(%d) = %d, want %d", op, e, got, len(want))
						}
						if got := ix.Snapshot(e); !slices.Equal(got, want) {
							t.Fatalf("op %d: Snapshot(%d) differs: %d vs %d entries", op, e, len(got), len(want))
						}
					}
					if st := ix.Stats(); st.Used != len(m) {
						t.Fatalf("op %d: %d slots used, model has %d hashes", op, st.Used, len(m))
					}
					prompt := make([]uint64, r.IntN(200))
					for i := range prompt {
						prompt[i] = r.Uint64N(tc.keySpace)
					}
					if r.IntN(2) == 0 { // make long leading runs likely
						prompt = append(m.endpoint(r.IntN(tc.eps)), prompt...)
					}
					eligible := epset.FirstN(tc.eps)
					eligible.Remove(r.IntN(tc.eps))
					for _, run := range []bool{true, false} {
						var got [epset.Max]uint32
						ix.Score(prompt, eligible, run, &got)
						if want := m.score(prompt, eligible, run); got != want {
							t.Fatalf("op %d: Score(run=%v) differs", op, run)
						}
					}
				}
				for e := range tc.eps {
					must(t, ix.ClearEndpoint(e))
				}
				st := ix.Stats()
				if st.Used != 0 || st.Sets > tc.eps*tc.rank+1 {
					t.Errorf("after clearing everything: %+v", st)
				}
				if st.Slots > numShards*minShardSlots {
					t.Errorf("empty index keeps %d slots: shards did not shrink", st.Slots)
				}
				if slabs && st.ArenaBytes != 0 {
					t.Errorf("empty index keeps %d bytes of slabs", st.ArenaBytes)
				}
			})
		}
	}
}

// useTinySlabs moves segments into huge-page slabs at a few hundred slots
// instead of megabytes, so small tests exercise slab growth, segment rebuilds
// and the way back to the Go heap.
func useTinySlabs(ix *Index) {
	ix.writeMu.Lock()
	ix.gpu.arena.enter, ix.gpu.arena.exit = 16384, 4096
	ix.writeMu.Unlock()
}

// TestSlabMappingFails: when mapping a slab fails, segments already in slabs
// move back to the Go heap at their next rebuild, nothing is lost, and the
// index stays on the heap from then on.
func TestSlabMappingFails(t *testing.T) {
	ix := newIndex(t, MaxMaxBlocks)
	useTinySlabs(ix)
	r := rand.New(rand.NewPCG(2, 2))
	m := model{}
	add := func(n int) {
		batch := make([]uint64, n)
		for i := range batch {
			batch[i] = r.Uint64()
			m[batch[i]] = map[member]bool{makeMember(0, 0): true}
		}
		must(t, ix.Add(0, 0, "", batch))
	}
	add(20000)
	if runtime.GOOS == "linux" && ix.Stats().ArenaBytes == 0 {
		t.Fatal("no slabs before the failure")
	}
	ix.writeMu.Lock()
	ix.gpu.arena.mapSlab = func(int) ([]byte, []byte, error) { return nil, nil, errors.New("injected mapping failure") }
	ix.writeMu.Unlock()
	add(60000) // grows every segment past its slab
	want := m.endpoint(0)
	if got := ix.Snapshot(0); !slices.Equal(got, want) {
		t.Fatalf("snapshot after mapping failures: %d entries, want %d", len(got), len(want))
	}
	var counts [epset.Max]uint32
	ix.Score(want, epset.Of(0), true, &counts)
	if counts[0] != uint32(len(want)) {
		t.Fatalf("score %d, want %d", counts[0], len(want))
	}
	if st := ix.Stats(); st.ArenaBytes != 0 {
		t.Fatalf("slabs remain after mapping failed: %+v", st)
	}
}

// TestSlabsUsed checks that a big enough table actually moves into slabs and
// that they are accounted for.
func TestSlabsUsed(t *testing.T) {
	ix := newIndex(t, MaxMaxBlocks)
	useTinySlabs(ix)
	r := rand.New(rand.NewPCG(1, 1))
	batch := make([]uint64, 20000)
	for i := range batch {
		batch[i] = r.Uint64()
	}
	must(t, ix.Add(0, 0, "", batch))
	st := ix.Stats()
	if runtime.GOOS == "linux" && (st.ArenaBytes == 0 || st.ArenaBytes < st.Slots*slotSize/2) {
		t.Fatalf("slabs not used: %+v", st)
	}
	var counts [epset.Max]uint32
	ix.Score(batch, epset.Of(0), true, &counts)
	if counts[0] != uint32(len(batch)) {
		t.Fatalf("score %d, want %d", counts[0], len(batch))
	}
	must(t, ix.ClearEndpoint(0))
	if st := ix.Stats(); st.ArenaBytes != 0 || st.Used != 0 {
		t.Fatalf("after clear: %+v", st)
	}
}

type evictionRecorder struct{ n [epset.Max]atomic.Int64 }

func (r *evictionRecorder) CapEvicted(ep, n int) { r.n[ep].Add(int64(n)) }

func TestCapEvictsOldestFirst(t *testing.T) {
	const capBlocks = 1000
	rec := &evictionRecorder{}
	ix, err := New(Options{MaxBlocks: capBlocks, Observer: rec})
	must(t, err)
	must(t, ix.Add(1, 0, "", []uint64{1, 2, 3})) // another endpoint is not affected
	const total = 5000
	for start := 0; start < total; start += 50 {
		batch := make([]uint64, 50)
		for i := range batch {
			batch[i] = uint64(1000 + start + i)
		}
		must(t, ix.Add(0, 0, "", batch))
		if ix.Blocks(0) > capBlocks {
			t.Fatalf("after %d adds: %d blocks, cap %d", start+50, ix.Blocks(0), capBlocks)
		}
	}
	if ix.Blocks(0) != capBlocks {
		t.Errorf("Blocks = %d, want %d", ix.Blocks(0), capBlocks)
	}
	if got := rec.n[0].Load(); got != total-capBlocks {
		t.Errorf("evictions reported = %d, want %d", got, total-capBlocks)
	}
	have := map[uint64]bool{}
	for _, h := range ix.Snapshot(0) {
		have[h] = true
	}
	// Age is tracked in generations of cap/16 adds: blocks older than the
	// newest cap+2 generations must be gone, the newest cap−2 generations kept.
	gen := capBlocks / genSpanDiv
	for i := range total {
		h := uint64(1000 + i)
		switch {
		case i < total-capBlocks-2*gen && have[h]:
			t.Fatalf("old block %d (of %d) survived", i, total)
		case i >= total-capBlocks+2*gen && !have[h]:
			t.Fatalf("recent block %d (of %d) evicted", i, total)
		}
	}
	if ix.Blocks(1) != 3 || rec.n[1].Load() != 0 {
		t.Errorf("endpoint 1: %d blocks, %d evictions", ix.Blocks(1), rec.n[1].Load())
	}
	// Re-storing a block refreshes its age.
	ix2 := newIndex(t, capBlocks)
	for start := 0; start < 3*capBlocks; start += 100 {
		batch := []uint64{7} // hot block, stored again and again
		for i := range 99 {
			batch = append(batch, uint64(10_000+start+i))
		}
		must(t, ix2.Add(0, 0, "", batch))
	}
	if !slices.Contains(ix2.Snapshot(0), 7) {
		t.Error("a block stored in every batch was evicted")
	}
}

// TestAgingNeverWraps runs far more generations than the 8-bit counter holds
// and checks that old blocks keep being evicted before new ones.
func TestAgingNeverWraps(t *testing.T) {
	const capBlocks = 1000
	ix := newIndex(t, capBlocks)
	// An old resident set on endpoint 1 that is never touched again.
	old := make([]uint64, 500)
	for i := range old {
		old[i] = uint64(1<<40 + i)
	}
	must(t, ix.Add(1, 0, "", old))
	// Churn endpoint 0 through ~600 generations.
	next := uint64(1)
	for range 600 * capBlocks / genSpanDiv / 100 {
		batch := make([]uint64, 100)
		for i := range batch {
			batch[i] = next
			next++
		}
		must(t, ix.Add(0, 0, "", batch))
	}
	// Now push endpoint 1 over its cap: the old blocks must go first.
	fresh := make([]uint64, 800)
	for i := range fresh {
		fresh[i] = uint64(1<<41 + i)
	}
	must(t, ix.Add(1, 0, "", fresh))
	snap := ix.Snapshot(1)
	kept := 0
	for _, h := range snap {
		if h >= 1<<41 {
			kept++
		}
	}
	if kept != len(fresh) {
		t.Errorf("%d of %d fresh blocks kept; the old ones should have been evicted first", kept, len(fresh))
	}
}

// TestConcurrentScoreAndIngest runs a scorer and a snapshotter against
// writers (run with -race).
func TestConcurrentScoreAndIngest(t *testing.T) {
	ix := newIndex(t, MinMaxBlocks*10)
	prompt := make([]uint64, 256)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	must(t, ix.Add(0, 0, "", prompt))
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; i < 300; i++ {
				ep := 1 + r.IntN(6)
				batch := make([]uint64, 200)
				for j := range batch {
					batch[j] = r.Uint64N(20000)
				}
				if err := ix.Add(ep, w, "", batch); err != nil {
					t.Error(err)
					return
				}
				if err := ix.Remove(ep, w, "", batch[:100]); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					if err := ix.ClearRank(ep, w); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	readers.Add(1)
	go func() {
		defer readers.Done()
		var counts [epset.Max]uint32
		for {
			select {
			case <-stop:
				return
			default:
			}
			ix.Score(prompt, epset.FirstN(8), true, &counts)
			if counts[0] != uint32(len(prompt)) {
				t.Errorf("endpoint 0 run = %d, want %d", counts[0], len(prompt))
				return
			}
			ix.Score(prompt, epset.FirstN(8), false, &counts)
			_ = ix.Snapshot(3)
		}
	}()
	writers.Wait()
	close(stop)
	readers.Wait()
}

// TestScoreDuringSlotChurn changes the very slots a scorer reads (endpoint 1
// joins and leaves the prompt's blocks, shards grow and shrink) while the
// scorer checks that endpoint 0, which never changes, always scores fully.
func TestScoreDuringSlotChurn(t *testing.T) {
	for _, slabs := range []bool{false, true} {
		t.Run(map[bool]string{false: "heap", true: "slabs"}[slabs], func(t *testing.T) {
			ix := newIndex(t, 0)
			if slabs {
				useTinySlabs(ix)
			}
			scoreDuringSlotChurn(t, ix)
		})
	}
}

func scoreDuringSlotChurn(t *testing.T, ix *Index) {
	prompt := make([]uint64, 512)
	for i := range prompt {
		prompt[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	must(t, ix.Add(0, 0, "", prompt))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		filler := make([]uint64, 20000)
		for i := range filler {
			filler[i] = uint64(i) * 0x2545f4914f6cdd1d
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = ix.Add(1, i%2, "", prompt)
			_ = ix.Add(2, 0, "", filler) // grows shards
			_ = ix.Remove(1, i%2, "", prompt[:256])
			_ = ix.ClearEndpoint(2) // shrinks them again
			_ = ix.ClearRank(1, i%2)
		}
	}()
	var counts [epset.Max]uint32
	deadline := time.Now().Add(2 * time.Second)
	for n := 0; time.Now().Before(deadline) || n < 50; n++ {
		for _, run := range []bool{true, false} {
			ix.Score(prompt, epset.FirstN(3), run, &counts)
			if counts[0] != uint32(len(prompt)) || counts[1] > uint32(len(prompt)) || counts[2] != 0 {
				close(stop)
				wg.Wait()
				t.Fatalf("torn score (run=%v): %v %v %v", run, counts[0], counts[1], counts[2])
			}
		}
	}
	close(stop)
	wg.Wait()
}
