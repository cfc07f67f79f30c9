package inventory

import "github.com/kvgate/kvgate/pkg/epset"

// Growing by an eighth at a time keeps the table dense, but a table filled
// from empty to millions of hashes is then rebuilt dozens of times on the
// way, every entry moved about nine times (docs/ingest.md "Growth"). When
// the caller knows a burst is coming (a subscriber's receive backlog), it
// reserves the room instead, and each segment grows once, to the size the
// burst will fill at reserveLoad.

const (
	// A reservation sizes a shard so that its reserved hashes bring it to
	// this load: inside the range ordinary growth keeps (0.755–0.85).
	reserveLoadNum, reserveLoadDen = 4, 5
	// Reservations below this many hashes are left to ordinary growth.
	minReserve = 1 << 16
)

// BurstReserver is a sink that can prepare for a burst of stored hashes;
// *Index, *Overlay and ModelSink (over one of those) are.
type BurstReserver interface {
	// ExpectStored tells the sink that endpoint ep is about to store about
	// n more distinct GPU hashes, replacing what ep announced before (0
	// withdraws it).
	ExpectStored(ep, n int)
}

var (
	_ BurstReserver = (*Index)(nil)
	_ BurstReserver = (*Overlay)(nil)
	_ BurstReserver = ModelSink{}
)

// ExpectStored tells the index that endpoint ep is about to store about n more
// distinct GPU hashes (all of ep's ranks together), replacing ep's previous
// reservation; 0 withdraws it. The reservations of all endpoints add up, and
// shards whose ordinary growth would not cover their share grow at once to
// hold it. The table never grows past what the cap allows: every endpoint
// that holds or reserves blocks at LOXILB_KV_MAX_BLOCKS. A reservation only
// sizes the table; it stores nothing and changes no count or score.
func (ix *Index) ExpectStored(ep, n int) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	ix.writeMu.Lock()
	ix.gpu.reserve(ep, max(n, 0))
	ix.writeMu.Unlock()
}

// reserve records ep's reservation and grows the segments it needs. Writer
// mutex held, write lock not held.
func (t *table) reserve(ep, n int) {
	t.reservedSum += n - t.reserved[ep]
	t.reserved[ep] = n
	if t.reservedSum < minReserve {
		return
	}
	used, active := 0, 0
	for i := range t.shards {
		used += t.shards[i].used
	}
	for e := range epset.Max {
		if t.count[e] > 0 || t.reserved[e] > 0 {
			active++
		}
	}
	want := min(t.reservedSum, max(0, active*int(t.maxBlocks)-used))
	if want < minReserve {
		return
	}
	perShard := (want + numShards - 1) / numShards
	for seg := range numSegments {
		var sizes [shardsPerSegment]int
		grow := false
		for k := range sizes {
			s := &t.shards[seg*shardsPerSegment+k]
			sizes[k] = len(s.slots)
			target := ((s.used+perShard)*reserveLoadDen + reserveLoadNum - 1) / reserveLoadNum
			if target > grownSize(len(s.slots)) {
				sizes[k] = target
				grow = true
			}
		}
		if grow {
			t.resizeSegment(seg, sizes)
		}
	}
}

// resizeSegment gives the shards of segment seg the given slot counts in one
// rebuild: in a slab when the segment is in one or becomes big enough for
// one, otherwise shard by shard on the Go heap.
func (t *table) resizeSegment(seg int, sizes [shardsPerSegment]int) {
	if a := t.arena; a != nil {
		total := 0
		for _, m := range sizes {
			total += alignedBytes(m)
		}
		if (a.slabs[seg] != nil || (!a.failed && total >= a.enter)) && t.rebuildSegmentSizes(seg, sizes) {
			return
		}
	}
	for k, m := range sizes {
		if si := seg*shardsPerSegment + k; m != len(t.shards[si].slots) {
			t.resizeOnHeap(si, m)
		}
	}
}
