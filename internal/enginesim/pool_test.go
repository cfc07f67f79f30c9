package enginesim

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// fakeChain builds distinct block hashes for tests of the pool alone; the
// engine tests use real kvhash chains.
func fakeChain(tag byte, n int) []blockHash {
	out := make([]blockHash, n)
	for i := range out {
		d := make([]byte, 32)
		d[0] = tag
		binary.BigEndian.PutUint64(d[24:], uint64(tag)<<32|uint64(i+1))
		out[i] = blockHash{Digest: d, Wire: binary.BigEndian.Uint64(d[24:])}
	}
	return out
}

func wires(chain []blockHash) []uint64 {
	out := make([]uint64, len(chain))
	for i, h := range chain {
		out[i] = h.Wire
	}
	return out
}

// runRequest allocates, caches and frees blocks for one request whose blocks
// are all full and new, as the engine does for a cold prompt.
func runRequest(t *testing.T, p *blockPool, chain []blockHash, keepPinned bool) []blockID {
	t.Helper()
	hit := p.lookup(chain)
	if !p.canAdmit(chain, hit, len(chain)) {
		t.Fatalf("cannot admit %d blocks (free %d)", len(chain), p.numFree)
	}
	ids := p.acquireHits(chain, hit)
	p.reserve(len(chain) - hit)
	for range len(chain) - hit {
		id, err := p.allocate()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var parent *blockHash
	if hit > 0 {
		parent = &chain[hit-1]
	}
	p.cacheFull(ids[hit:], chain[hit:], parent, nil, kvhash.Extra{}, hit)
	if !keepPinned {
		p.free(ids)
	}
	return ids
}

func TestPoolLRUEvictionAndEvents(t *testing.T) {
	tests := []struct {
		name        string
		capacity    int // num-gpu-blocks (one is the null block)
		requests    [][]blockHash
		wantRemoved []uint64
		wantCached  int
	}{
		{
			name:       "fits without eviction",
			capacity:   5,
			requests:   [][]blockHash{fakeChain(1, 2), fakeChain(2, 2)},
			wantCached: 4,
		},
		{
			// Request 1's blocks are freed in reverse order, so its last block
			// is the least recently used and goes first.
			name:        "evicts the tail of the oldest request first",
			capacity:    5,
			requests:    [][]blockHash{fakeChain(1, 3), fakeChain(2, 2)},
			wantRemoved: []uint64{fakeChain(1, 3)[2].Wire},
			wantCached:  4,
		},
		{
			name:        "a hit refreshes recency",
			capacity:    5,
			requests:    [][]blockHash{fakeChain(1, 2), fakeChain(2, 2), fakeChain(1, 2), fakeChain(3, 2)},
			wantRemoved: []uint64{fakeChain(2, 2)[1].Wire, fakeChain(2, 2)[0].Wire},
			wantCached:  4,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := newBlockPool(tc.capacity)
			if err != nil {
				t.Fatal(err)
			}
			var removed []uint64
			for _, r := range tc.requests {
				runRequest(t, p, r, false)
				for _, ev := range p.takeEvents() {
					if ev.kind == eventRemoved {
						removed = append(removed, ev.hashes...)
					}
				}
			}
			if !reflect.DeepEqual(removed, tc.wantRemoved) {
				t.Errorf("removed %v, want %v", removed, tc.wantRemoved)
			}
			if got := p.cachedBlocks(); got != tc.wantCached {
				t.Errorf("cached blocks %d, want %d", got, tc.wantCached)
			}
			if p.usage() != 0 {
				t.Errorf("usage %v after all requests finished, want 0", p.usage())
			}
		})
	}
}

func TestPoolStoredEventParents(t *testing.T) {
	p, _ := newBlockPool(10)
	chain := fakeChain(7, 4)
	runRequest(t, p, chain[:2], false)
	runRequest(t, p, chain, false) // hits 2, stores 2 with parent = block 1
	var stored []poolEvent
	for _, ev := range p.takeEvents() {
		if ev.kind == eventStored {
			stored = append(stored, ev)
		}
	}
	if len(stored) != 2 {
		t.Fatalf("%d BlockStored events, want 2", len(stored))
	}
	if stored[0].hasParent || !reflect.DeepEqual(stored[0].hashes, wires(chain[:2])) {
		t.Errorf("first store %+v", stored[0])
	}
	if !stored[1].hasParent || stored[1].parent != chain[1].Wire || !reflect.DeepEqual(stored[1].hashes, wires(chain[2:])) {
		t.Errorf("second store %+v", stored[1])
	}
}

func TestPoolPinnedBlocksAreNotEvicted(t *testing.T) {
	p, _ := newBlockPool(5) // 4 usable
	pinned := fakeChain(1, 3)
	runRequest(t, p, pinned, true)
	if got := p.usage(); got != 0.75 {
		t.Errorf("usage %v, want 0.75", got)
	}
	other := fakeChain(2, 2)
	if p.canAdmit(other, 0, 2) {
		t.Fatal("admitted 2 blocks with 1 unpinned block left")
	}
	if !p.canAdmit(other, 0, 1) {
		t.Fatal("cannot admit 1 block with 1 free")
	}
	// A second request sharing the pinned prefix needs no new block for it.
	if hit := p.lookup(pinned); hit != 3 || !p.canAdmit(pinned, 3, 4) {
		t.Fatalf("shared pinned prefix: hit %d", hit)
	}
	for _, ev := range p.takeEvents() {
		if ev.kind == eventRemoved {
			t.Errorf("unexpected eviction %v", ev.hashes)
		}
	}
	if err := p.reset(); !errors.Is(err, errPoolBusy) {
		t.Errorf("reset while pinned: %v, want errPoolBusy", err)
	}
}

func TestPoolReservationsBlockAdmission(t *testing.T) {
	p, _ := newBlockPool(5)
	p.reserve(3)
	if p.canAdmit(fakeChain(1, 2), 0, 2) {
		t.Fatal("admitted past reservations")
	}
	p.release(3)
	if !p.canAdmit(fakeChain(1, 2), 0, 2) {
		t.Fatal("release did not return the blocks")
	}
}

func TestPoolDuplicateHashes(t *testing.T) {
	// Two requests computing the same prompt at once both cache it; evicting
	// one copy keeps the other findable, and each copy is announced.
	p, _ := newBlockPool(5)
	chain := fakeChain(3, 2)
	a := runRequest(t, p, chain, true)
	hit := 0 // the second request was admitted before the first one cached
	ids := p.acquireHits(chain, hit)
	p.reserve(2)
	for range 2 {
		id, _ := p.allocate()
		ids = append(ids, id)
	}
	p.cacheFull(ids, chain, nil, nil, kvhash.Extra{}, 0)
	if got := p.cachedBlocks(); got != 4 {
		t.Fatalf("cached %d, want 4", got)
	}
	p.free(a)
	p.free(ids)
	p.reserve(2)
	p.allocate()
	p.allocate()
	if got := p.lookup(chain); got != 2 {
		t.Errorf("lookup after evicting one copy = %d, want 2", got)
	}
	removed := 0
	for _, e := range p.takeEvents() {
		if e.kind == eventRemoved {
			removed++
		}
	}
	if removed != 2 {
		t.Errorf("%d BlockRemoved events, want 2 (one per evicted copy)", removed)
	}
}

func TestPoolReset(t *testing.T) {
	p, _ := newBlockPool(5)
	runRequest(t, p, fakeChain(1, 2), false)
	p.takeEvents()
	if err := p.reset(); err != nil {
		t.Fatal(err)
	}
	ev := p.takeEvents()
	if len(ev) != 1 || ev[0].kind != eventCleared {
		t.Fatalf("events %+v", ev)
	}
	if p.lookup(fakeChain(1, 2)) != 0 {
		t.Error("hash survived reset")
	}
	// Reallocating a cleared block must not report a removal.
	runRequest(t, p, fakeChain(2, 4), false)
	for _, e := range p.takeEvents() {
		if e.kind == eventRemoved {
			t.Errorf("removal after reset: %v", e.hashes)
		}
	}
}

func TestNewBlockPoolRejectsTinyCapacity(t *testing.T) {
	if _, err := newBlockPool(1); err == nil {
		t.Fatal("want error")
	}
}
