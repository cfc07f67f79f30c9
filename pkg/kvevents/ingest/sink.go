package ingest

import "github.com/kvgate/kvgate/pkg/inventory"

// Sink is where decoded events land: a rule's block inventory. Ingest needs
// only these five calls, so a decorator (metrics, tracing) or another index
// backend can stand in for *inventory.Index.
type Sink interface {
	// Add records that (ep, rank) holds hashes on medium.
	Add(ep, rank int, medium string, hashes []uint64) error
	// Remove forgets hashes of (ep, rank) on medium.
	Remove(ep, rank int, medium string, hashes []uint64) error
	// ClearRank forgets every block of (ep, rank).
	ClearRank(ep, rank int) error
	// ClearEndpoint forgets every block of ep, on all ranks.
	ClearEndpoint(ep int) error
	// Blocks counts the blocks ep holds.
	Blocks(ep int) int
}

var _ Sink = (*inventory.Index)(nil)

// otherMediaSink is a Sink that also counts an endpoint's blocks on media
// other than the GPU (*inventory.Index does).
type otherMediaSink interface {
	OtherMediaBlocks(ep int) int
}

// OtherMediaObserver is an Observer that also takes an endpoint's block count
// on media other than the GPU (kvgate_kv_blocks_other_medium{service,ep_idx}).
// Optional: reportBlocks calls it when both the observer and the sink have it.
type OtherMediaObserver interface {
	OtherMediaBlocks(ep EndpointRef, blocks int)
}

// reportBlocks reports endpoint ep's inventory sizes to obs.
func reportBlocks(obs Observer, ref EndpointRef, inv Sink, ep int) {
	obs.Blocks(ref, inv.Blocks(ep))
	if o, ok := obs.(OtherMediaObserver); ok {
		if s, ok := inv.(otherMediaSink); ok {
			o.OtherMediaBlocks(ref, s.OtherMediaBlocks(ep))
		}
	}
}
