package inventory

import "unsafe"

// The GPU table of a large inventory lives in memory backed by transparent
// huge pages. Scoring a prompt is one random probe per block into a table of
// tens to hundreds of megabytes: with 4 KiB pages every probe misses the TLB
// as well as the cache, and on a VM the page walk itself misses (two
// dimensional walks, page tables evicted by other tenants), which is what
// made the p99 score latency 3-5x the p50. With 2 MiB pages the page table
// of a 100 MB table is 50 entries and stays cached.
//
// Linux runs THP in "madvise" mode by default and the Go heap never asks for
// it, so slots of big segments are placed in anonymous mappings advised with
// MADV_HUGEPAGE (arena_linux.go). Elsewhere, or when mapping fails, shards
// stay on the Go heap exactly as before.
//
// Layout: the 256 shards form numSegments segments of shardsPerSegment
// consecutive shards. A segment whose slots need at least segmentHugeMin
// bytes gets its own slab: one mapping holding its shards' slot arrays side
// by side, bump-allocated. A shard that grows or shrinks inside a slab takes
// new space from the slab's slack (the old array becomes dead space until the
// next rebuild); when the slack runs out the whole segment is rebuilt into a
// fresh slab sized to its live arrays plus 1/slabSlackDiv, and shards already
// near their growth point grow in the same pass (hashing is uniform, so the
// shards of a segment fill in lockstep and one rebuild serves them all).
// Rebuilds run off to the side like shard growth: scorers never wait for
// them, and the swap is one short write-lock hold.
//
// Slab memory is not Go heap: Stats.ArenaBytes reports it, and the memory
// benchmark counts it. A slab is unmapped when its segment is rebuilt (after
// the swap, under the write lock, so no scorer can still be reading it) and
// when the Index becomes unreachable (runtime.AddCleanup).

const (
	segmentBits      = 4
	numSegments      = 1 << segmentBits
	shardsPerSegment = numShards / numSegments

	hugePageSize = 2 << 20
	// A segment moves to a slab once its slot arrays need this many bytes:
	// below that, huge pages would mostly hold empty space.
	segmentHugeMin = 2 * hugePageSize
	// A segment that shrinks below this goes back to the Go heap.
	segmentHugeExit = hugePageSize / 2

	// At a segment rebuild, shards at or above this load grow as well.
	growAheadNum, growAheadDen = 4, 5
	// Free space left in a new slab, as a fraction of its live bytes.
	slabSlackDiv = 32

	slotSize  = int(unsafe.Sizeof(slot{}))
	slotAlign = 64 // cache line
)

// slab is one mapping holding the slot arrays of one segment.
type slab struct {
	raw  []byte // the whole mapping, for unmapSlab
	mem  []byte // its huge-page-aligned part, bump-allocated
	off  int    // bump offset: bytes handed out (and touched) so far
	live int    // bytes of arrays still in use
}

// alloc returns n zeroed slots from the slab, or nil when it has no room.
// Space is never reused before the slab is replaced, so it is always zero.
func (sb *slab) alloc(n int) []slot {
	if n == 0 {
		return []slot{}
	}
	size := alignedBytes(n)
	if sb.off+size > len(sb.mem) {
		return nil
	}
	p := unsafe.Pointer(&sb.mem[sb.off])
	sb.off += size
	sb.live += size
	return unsafe.Slice((*slot)(p), n)
}

func (sb *slab) owns(s []slot) bool {
	if len(s) == 0 || len(sb.mem) == 0 {
		return false
	}
	p := uintptr(unsafe.Pointer(&s[0]))
	base := uintptr(unsafe.Pointer(&sb.mem[0]))
	return p >= base && p < base+uintptr(len(sb.mem))
}

func (sb *slab) free(s []slot) {
	if sb.owns(s) {
		sb.live -= alignedBytes(len(s))
	}
}

// arena holds the slabs of one table. It never points back at the table, so
// a cleanup attached to the Index can release it.
type arena struct {
	slabs  [numSegments]*slab
	failed bool // mapping failed once: stay on the Go heap
	// A segment moves to a slab at enter bytes and back to the heap below
	// exit bytes (segmentHugeMin and segmentHugeExit; tests lower them).
	enter, exit int
	mapSlab     func(size int) (raw, mem []byte, err error) // the platform's mapSlab; tests make it fail
	pre         *prefaulter                                 // slabs faulted in ahead of a reserved burst (prefault.go)
}

func newArena() *arena {
	a := &arena{enter: segmentHugeMin, exit: segmentHugeExit, mapSlab: mapSlab}
	// Through a.mapSlab, so a mapping failure injected by a test reaches the
	// prepared slabs too.
	a.pre = newPrefaulter(func(n int) (raw, mem []byte, err error) { return a.mapSlab(n) })
	return a
}

func (a *arena) release() {
	if a.pre != nil {
		a.pre.discard()
	}
	for i, sb := range a.slabs {
		if sb != nil {
			unmapSlab(sb.raw)
			a.slabs[i] = nil
		}
	}
}

// residentBytes bounds the slab memory resident: what was handed out,
// rounded up to whole huge pages in the advised part (a touch faults in a
// whole 2 MiB page) and to 4 KiB pages in the unadvised tail.
func (a *arena) residentBytes() int {
	n := 0
	for _, sb := range a.slabs {
		if sb == nil {
			continue
		}
		whole := len(sb.mem) &^ (hugePageSize - 1)
		if sb.off <= whole {
			n += min((sb.off+hugePageSize-1)&^(hugePageSize-1), whole)
		} else {
			n += whole + (sb.off-whole+4095)&^4095
		}
	}
	return n
}

func alignedBytes(n int) int { return (n*slotSize + slotAlign - 1) &^ (slotAlign - 1) }

// resizeShard gives shard si n slots, re-placing its entries. Writer mutex
// held, write lock not held.
func (t *table) resizeShard(si, n int) {
	if t.arena != nil && t.resizeInArena(si, n) {
		return
	}
	t.resizeOnHeap(si, n)
}

// resizeOnHeap gives shard si n slots on the Go heap. Writer mutex held,
// write lock not held.
func (t *table) resizeOnHeap(si, n int) {
	s := &t.shards[si]
	ns := s.rebuiltInto(make([]slot, n))
	t.rw.Lock()
	t.totalSlots += len(ns.slots) - len(s.slots)
	*s = ns
	t.unlock()
}

// resizeInArena resizes shard si inside its segment's slab, rebuilding the
// segment into a new slab (or moving it to one) when needed. It reports
// false when the segment stays on the Go heap.
func (t *table) resizeInArena(si, n int) bool {
	a := t.arena
	seg := si / shardsPerSegment
	sb := a.slabs[seg]
	if sb == nil {
		if a.failed || t.segmentBytes(seg, si, n) < a.enter {
			return false
		}
		return t.rebuildSegment(seg, si, n)
	}
	// Rebuild instead when the segment became small (back to the heap) or
	// when dead arrays would outweigh live ones (shrinking frees nothing
	// until the slab is replaced).
	liveAfter := sb.live - alignedBytes(len(t.shards[si].slots)) + alignedBytes(n)
	if liveAfter < a.exit || sb.off-sb.live > liveAfter {
		return t.rebuildSegment(seg, si, n)
	}
	if dst := sb.alloc(n); dst != nil {
		s := &t.shards[si]
		ns := s.rebuiltInto(dst)
		t.rw.Lock()
		old := s.slots
		t.totalSlots += len(ns.slots) - len(s.slots)
		*s = ns
		t.unlock()
		sb.free(old)
		return true
	}
	return t.rebuildSegment(seg, si, n)
}

func (t *table) segmentBytes(seg, si, n int) int {
	total := 0
	for j := seg * shardsPerSegment; j < (seg+1)*shardsPerSegment; j++ {
		m := len(t.shards[j].slots)
		if j == si {
			m = n
		}
		total += alignedBytes(m)
	}
	return total
}

// rebuildSegment moves every shard of segment seg into a fresh slab, shard si
// with n slots and the others grown ahead, shrunk or copied as their load
// says. A segment that became small goes back to the Go heap. It reports
// false (nothing changed) when no slab could be mapped.
func (t *table) rebuildSegment(seg, si, n int) bool {
	first := seg * shardsPerSegment
	share := t.reservedShare()
	var sizes [shardsPerSegment]int
	for k := range sizes {
		j := first + k
		s := &t.shards[j]
		m := len(s.slots)
		switch {
		case j == si:
			m = n
		case m > 0 && s.used*growAheadDen >= m*growAheadNum:
			m = grownSize(m)
		case s.sparse():
			m = max(minShardSlots, s.used*5/3+1)
		}
		// A reserved burst reaches every shard: grow them all in this pass.
		if r := reservedSlots(s, share, m); r > 0 && j != si {
			m = r
		}
		sizes[k] = m
	}
	return t.rebuildSegmentSizes(seg, sizes)
}

// rebuildSegmentSizes moves every shard of segment seg into a fresh slab
// with the given slot counts (or onto the Go heap when the segment became
// small). It reports false (nothing changed) when no slab could be mapped
// for a segment still on the heap.
func (t *table) rebuildSegmentSizes(seg int, sizes [shardsPerSegment]int) bool {
	a := t.arena
	first := seg * shardsPerSegment
	total := 0
	for _, m := range sizes {
		total += alignedBytes(m)
	}
	old := a.slabs[seg]
	var next *slab
	if total >= a.exit && a.pre != nil {
		next = a.pre.take(seg, slabCapacity(total), total)
	}
	if total >= a.exit && next == nil {
		raw, mem, err := a.mapSlab(slabCapacity(total))
		if err != nil {
			a.failed = true
			if old == nil {
				return false
			}
			// Fall through to the Go heap for the whole segment.
		} else {
			next = &slab{raw: raw, mem: mem}
		}
	}
	var arrays [shardsPerSegment]shard
	for k, m := range sizes {
		s := &t.shards[first+k]
		var dst []slot
		if next != nil {
			dst = next.alloc(m)
		} else {
			dst = make([]slot, m)
		}
		if m == len(s.slots) {
			copy(dst, s.slots)
			arrays[k] = shard{slots: dst, used: s.used}
		} else {
			arrays[k] = s.rebuiltInto(dst)
		}
	}
	t.rw.Lock()
	for k := range arrays {
		s := &t.shards[first+k]
		t.totalSlots += len(arrays[k].slots) - len(s.slots)
		*s = arrays[k]
	}
	a.slabs[seg] = next
	// Unmap while still holding the write lock: no scorer can be inside the
	// old slab, and none can reach it after the swap.
	if old != nil {
		unmapSlab(old.raw)
	}
	t.unlock()
	return true
}
