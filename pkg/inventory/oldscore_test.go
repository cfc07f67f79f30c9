package inventory

import (
	"math/bits"

	"github.com/kvgate/kvgate/pkg/epset"
)

// scoreOverlapByRuns is the previous overlap scorer, kept for side-by-side
// benchmarks: it adds each run's length to every holder endpoint, which is
// O(blocks × endpoints) when neighbouring blocks have different holders.
func (t *table) scoreOverlapByRuns(hashes []uint64, eligible epset.Set, counts *[epset.Max]uint32) {
	var ph [scoreChunkSize]uint64
	var sink uint64
	eps := t.sets.eps
	run, runLen := uint32(emptySet), uint32(0)
	flush := func() {
		if run == emptySet || runLen == 0 {
			return
		}
		m := eps[run].And(eligible)
		for w, v := range m {
			for ; v != 0; v &= v - 1 {
				counts[w<<6|bits.TrailingZeros64(v)] += runLen
			}
		}
	}
	for start := 0; start < len(hashes); start += scoreChunkSize {
		part := hashes[start:min(start+scoreChunkSize, len(hashes))]
		sink += t.prefetch(part, ph[:])
		for j := range part {
			p := ph[j]
			id := t.shards[p>>keyBits].lookup(p & keyMask)
			if id != run {
				flush()
				run, runLen = id, 0
			}
			runLen++
		}
	}
	flush()
	_ = sink
}

// scoreOld is Index.Score with the previous overlap scorer.
func (ix *Index) scoreOld(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32) {
	*counts = [epset.Max]uint32{}
	if len(hashes) == 0 || eligible.Empty() {
		return
	}
	ix.rw.RLock()
	if leadingRun {
		ix.gpu.scoreRun(hashes, eligible, counts)
	} else {
		ix.gpu.scoreOverlapByRuns(hashes, eligible, counts)
	}
	ix.rw.RUnlock()
}
