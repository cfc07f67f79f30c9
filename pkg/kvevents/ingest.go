package kvevents

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// Ingester decodes payloads of one (endpoint, rank) and applies them to the
// rule's inventory. It reuses its decode buffers, so steady-state ingest does
// not allocate. Not safe for concurrent use: one per subscription.
type Ingester struct {
	Inventory *inventory.Index
	EPIdx     int
	Rank      int

	dec   Decoder
	batch Batch
}

// IngestResult counts what one payload did to the inventory.
type IngestResult struct {
	Stored, Removed int  // hashes in BlockStored / BlockRemoved events
	Cleared         bool // an AllBlocksCleared event was applied
	Skipped         int  // events the decoder skipped (unknown or malformed)
}

// Apply decodes payload and applies its events in order: BlockStored adds
// the hashes for this rank (on the event's medium), BlockRemoved removes
// them, AllBlocksCleared clears this rank. The batch's own
// data_parallel_rank is not trusted: the rank is the publisher's port.
func (in *Ingester) Apply(payload []byte) (IngestResult, error) {
	var res IngestResult
	if err := in.dec.Decode(payload, &in.batch); err != nil {
		return res, fmt.Errorf("decode batch: %w", err)
	}
	res.Skipped = in.batch.UnknownEvents + in.batch.BadEvents
	for i := range in.batch.Events {
		e := &in.batch.Events[i]
		var err error
		switch e.Type {
		case BlockStored:
			err = in.Inventory.Add(in.EPIdx, in.Rank, e.Medium, e.BlockHashes)
			res.Stored += len(e.BlockHashes)
		case BlockRemoved:
			err = in.Inventory.Remove(in.EPIdx, in.Rank, e.Medium, e.BlockHashes)
			res.Removed += len(e.BlockHashes)
		case AllBlocksCleared:
			err = in.Inventory.ClearRank(in.EPIdx, in.Rank)
			res.Cleared = true
		}
		if err != nil {
			return res, fmt.Errorf("apply %s: %w", e.Type, err)
		}
	}
	return res, nil
}

// Stats returns the decoder's cumulative counters.
func (in *Ingester) Stats() DecodeStats { return in.dec.Stats }
