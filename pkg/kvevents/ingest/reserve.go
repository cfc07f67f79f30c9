package ingest

import (
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// A fill (a publisher that sends faster than kvgate applies, or a replay)
// waits in the rank's queue, so the rank knows how many hashes are about to
// be stored: it tells the inventory, which then grows each segment once to
// fit them instead of an eighth at a time (docs/ingest.md "Growth").

// minBacklogReserve is the smallest backlog, in hashes, worth reserving for:
// below it ordinary growth costs little.
const minBacklogReserve = 1 << 16

// backlog is what a rank reserved, and the history it estimates from.
type backlog struct {
	storedSeen float64 // hashes of BlockStored events applied by this rank
	bytesSeen  float64 // bytes of the live messages that carried them
	reserved   int     // this rank's last estimate, 0 when none
}

// noteApplied records one handled live message of size bytes that stored
// stored hashes.
func (b *backlog) noteApplied(size int64, stored int) {
	b.bytesSeen += float64(size)
	b.storedSeen += float64(stored)
}

// estimate is the hashes that queued bytes of live messages will store, at
// the rate this rank has seen so far (0 before any history).
func (b *backlog) estimate(queued int64) int {
	if b.bytesSeen == 0 {
		return 0
	}
	n := int(float64(queued) * b.storedSeen / b.bytesSeen)
	if n < minBacklogReserve {
		return 0
	}
	return n
}

// changed reports whether a new estimate differs enough from the last one
// reserved to tell the inventory again (by an eighth, or to or from none).
func (b *backlog) changed(n int) bool {
	last := b.reserved
	if (n == 0) != (last == 0) {
		return true
	}
	d := n - last
	return d > last/8 || -d > last/8
}

// reserveBacklog tells the rule's inventory how many hashes this endpoint's
// ranks have queued (the sum over its ranks, since the inventory keeps one
// reservation per endpoint).
func (r *rankSub) reserveBacklog(queued int64) {
	res, ok := r.ingest.Inventory.(inventory.BurstReserver)
	if !ok {
		return
	}
	n := r.backlog.estimate(queued)
	if !r.backlog.changed(n) {
		return
	}
	r.backlog.reserved = n
	r.ep.backlog[r.rank].Store(int64(n))
	total := 0
	for i := range r.ep.backlog {
		total += int(r.ep.backlog[i].Load())
	}
	res.ExpectStored(r.ingest.EPIdx, total)
}

// endpointBacklog holds each rank's reserved estimate; ranks write their own
// and read all.
type endpointBacklog []atomic.Int64
