package inventory

import "github.com/kvgate/kvgate/pkg/epset"

// Growing by an eighth at a time keeps the table dense, but a table filled
// from empty to millions of hashes is then rebuilt dozens of times on the
// way, every entry moved about nine times (docs/ingest.md "Growth"). When
// the caller knows a burst is coming (a subscriber's receive backlog), it
// reserves the room instead: the next time a shard fills up it grows
// straight to the size the burst will fill at reserveLoad, and a segment
// rebuild grows its other shards to theirs, so a burst costs a rebuild or
// two instead of dozens.

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
// a shard that must grow while they stand grows to hold its share of them
// rather than by an eighth. The table never grows past what the cap allows:
// every endpoint that holds or reserves blocks at LOXILB_KV_MAX_BLOCKS. A
// reservation only sizes the table; it stores nothing and changes no count
// or score.
func (ix *Index) ExpectStored(ep, n int) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	ix.writeMu.Lock()
	ix.gpu.reserve(ep, max(n, 0))
	ix.writeMu.Unlock()
}

// reserve records ep's reservation. Nothing grows yet: the shards grow when
// they next fill up, straight to the size the reservation asks for
// (reservedSlots), by which time the other endpoints of the burst have
// announced theirs too. Writer mutex held.
func (t *table) reserve(ep, n int) {
	t.reservedSum += n - t.reserved[ep]
	t.reserved[ep] = n
	t.prefaultReserved()
}

// reservedShare is the reserved hashes each shard should expect, bounded by
// the cap: every hash is held by an endpoint, and every endpoint that holds
// or reserves blocks holds at most LOXILB_KV_MAX_BLOCKS. 0 when nothing
// worth growing for is reserved.
func (t *table) reservedShare() int {
	if t.reservedSum < minReserve {
		return 0
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
		return 0
	}
	return (want + numShards - 1) / numShards
}

// reservedSlots is the size a growing shard takes to hold its share of the
// reservation at reserveLoad, or 0 when that is not more than n, the size
// ordinary growth gives it.
func reservedSlots(s *shard, share, n int) int {
	if share == 0 {
		return 0
	}
	if target := ((s.used+share)*reserveLoadDen + reserveLoadNum - 1) / reserveLoadNum; target > n {
		return target
	}
	return 0
}
