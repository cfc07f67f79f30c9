package ingest

import (
	"fmt"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"strconv"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// Ingester decodes payloads of one (endpoint, rank) and applies them to the
// rule's inventory. It reuses its decode buffers, so steady-state ingest does
// not allocate. Not safe for concurrent use: one per subscription.
type Ingester struct {
	Inventory Sink
	EPIdx     int
	Rank      int
	// Engine picks the payload adapter (engine.go); the zero value is vLLM.
	Engine Engine
	// Granularity, when set, learns the block size the engine publishes
	// against the rule's kvBlockSize; blocks of a size that is not a
	// multiple are not stored, since no request hash can match them.
	Granularity *Granularity

	lastBlockSize int
	badBlockSize  bool

	parity *parityRank // nil: no parity check (EnableParity)

	dec   kvevents.Decoder
	batch kvevents.Batch

	// primaryGroup is the KV-cache group whose blocks make up the scored
	// inventory: the full-attention group as announced by BlockStored's
	// kv_cache_spec_kind, group 0 until one is seen.
	primaryGroup int64
	groupKnown   bool
	groupNames   map[groupBucket]string
}

// bucket names where an event's blocks go. Hybrid models (sliding-window or
// Mamba layers beside full attention) announce the same block hashes once per
// KV-cache group, and each group evicts on its own: a sliding-window group's
// BlockRemoved must not erase a block the full-attention group still holds.
// So only the primary group's GPU blocks are scored; other groups' blocks are
// counted apart under "<medium>#g<idx>", like other media.
func (in *Ingester) bucket(e *kvevents.Event) string {
	if e.Type == kvevents.BlockStored && e.HasGroupIdx && !in.groupKnown {
		switch e.KVCacheSpecKind {
		case "full_attention", "mla_attention":
			in.primaryGroup, in.groupKnown = e.GroupIdx, true
		}
	}
	if !e.HasGroupIdx || e.GroupIdx == in.primaryGroup {
		return e.Medium
	}
	k := groupBucket{medium: mediumOrGPU(e.Medium), group: e.GroupIdx}
	if name, ok := in.groupNames[k]; ok {
		return name
	}
	name := k.medium + "#g" + strconv.FormatInt(k.group, 10)
	if in.groupNames == nil {
		in.groupNames = map[groupBucket]string{}
	}
	if len(in.groupNames) < 64 { // bounded: names are built per event beyond that
		in.groupNames[k] = name
	}
	return name
}

type groupBucket struct {
	medium string
	group  int64
}

func mediumOrGPU(m string) string {
	if inventory.IsGPU(m) {
		return inventory.MediumGPU
	}
	return m
}

// IngestResult counts what one payload did to the inventory.
type IngestResult struct {
	Stored, Removed int  // hashes in BlockStored / BlockRemoved events
	Cleared         bool // an AllBlocksCleared event was applied
	Skipped         int  // events the decoder skipped (unknown or malformed)
	// BlockSize is the primary group's block size when this payload changed
	// it (0: unchanged); BadBlockSize reports it is not a multiple of the
	// rule's kvBlockSize, and Unmatchable counts the hashes not stored.
	BlockSize    int
	BadBlockSize bool
	Unmatchable  int
}

// Apply decodes payload and applies its events in order: BlockStored adds
// the hashes for this rank (on the event's medium and KV-cache group, see
// bucket), BlockRemoved removes them, AllBlocksCleared clears this rank. The batch's own
// data_parallel_rank is not trusted: the rank is the publisher's port.
func (in *Ingester) Apply(payload []byte) (IngestResult, error) {
	switch in.Engine {
	case EngineSGLang:
		return in.applySGLang(payload)
	case EngineTRTLLM:
		return IngestResult{}, fmt.Errorf("apply: TensorRT-LLM events come from the drain poller, not from payloads")
	}
	var res IngestResult
	if err := in.dec.Decode(payload, &in.batch); err != nil {
		return res, fmt.Errorf("decode batch: %w", err)
	}
	res.Skipped = in.batch.UnknownEvents + in.batch.BadEvents
	for i := range in.batch.Events {
		e := &in.batch.Events[i]
		var err error
		switch e.Type {
		case kvevents.BlockStored:
			b := in.bucket(e)
			if in.parity != nil && b == e.Medium && (e.Medium == "" || inventory.IsGPU(e.Medium)) {
				in.parity.check(e)
			}
			if in.Granularity != nil && e.BlockSize > 0 && b == e.Medium && inventory.IsGPU(e.Medium) && in.blockSizeBad(e.BlockSize, &res) {
				res.Unmatchable += len(e.BlockHashes)
				continue
			}
			err = in.Inventory.Add(in.EPIdx, in.Rank, b, e.BlockHashes)
			res.Stored += len(e.BlockHashes)
		case kvevents.BlockRemoved:
			err = in.Inventory.Remove(in.EPIdx, in.Rank, in.bucket(e), e.BlockHashes)
			res.Removed += len(e.BlockHashes)
		case kvevents.AllBlocksCleared:
			err = in.Inventory.ClearRank(in.EPIdx, in.Rank)
			res.Cleared = true
		}
		if err != nil {
			return res, fmt.Errorf("apply %s: %w", e.Type, err)
		}
	}
	return res, nil
}

// blockSizeBad checks a primary-group GPU block size against the rule's
// kvBlockSize, telling the rule's Granularity when it changes.
func (in *Ingester) blockSizeBad(bs int, res *IngestResult) bool {
	if bs != in.lastBlockSize {
		_, ok, _ := in.Granularity.observe(in.EPIdx, bs)
		in.lastBlockSize, in.badBlockSize = bs, !ok
		res.BlockSize, res.BadBlockSize = bs, !ok
	}
	return in.badBlockSize
}

// EnableParity checks this ingester's BlockStored events against p's
// contract (see Parity); ref names the endpoint in metrics and logs.
func (in *Ingester) EnableParity(p *Parity, ref EndpointRef) {
	if p == nil {
		in.parity = nil
		return
	}
	in.parity = p.rank(ref)
}

// Connected restarts the parity check's always-check window: the first
// BlockStored events after each subscriber connect are always checked.
func (in *Ingester) Connected() {
	if in.parity != nil {
		in.parity.connected()
	}
}

// Stats returns the decoder's cumulative counters.
func (in *Ingester) Stats() kvevents.DecodeStats { return in.dec.Stats }
