package enginesim

import (
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// parseEventLayout maps --event-layout to the codec's layouts: "map" is
// vLLM >= 0.26, "array" the last array layout before it; the versioned
// names select older releases.
func parseEventLayout(s string) (kvevents.Layout, error) {
	switch s {
	case "map":
		return kvevents.LayoutMap, nil
	case "array", "array-v0.25":
		return kvevents.LayoutArrayV0_25, nil
	case "array-v0.15":
		return kvevents.LayoutArrayV0_15, nil
	case "array-v0.11":
		return kvevents.LayoutArrayV0_11, nil
	case "array-v0.9":
		return kvevents.LayoutArrayV0_9, nil
	}
	return 0, fmt.Errorf("event-layout %q: want map, array, array-v0.25, array-v0.15, array-v0.11 or array-v0.9", s)
}

// toWireEvents converts one step's pool events into the codec's events as
// vLLM's GPU block pool fills them: medium "GPU", group_idx 0,
// kv_cache_spec_kind "full_attention", extra_keys one entry per block.
// With bytesHashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) block and parent
// hashes are sent as the raw digests.
func toWireEvents(evs []poolEvent, blockSize int, bytesHashes bool) []kvevents.Event {
	out := make([]kvevents.Event, 0, len(evs))
	for _, ev := range evs {
		switch {
		case ev.medium != "":
			out = append(out, offloadWireEvent(ev, blockSize))
		case ev.kind == eventStored:
			out = append(out, kvevents.Event{
				Type:            kvevents.BlockStored,
				BlockHashes:     ev.hashes,
				ParentBlockHash: ev.parent,
				HasParent:       ev.hasParent,
				TokenIDs:        ev.tokens,
				BlockSize:       blockSize,
				Medium:          "GPU",
				LoRAName:        ev.extra.LoRAName,
				ExtraKeys:       extraKeysMsgpack(ev.extra, ev.firstBlock, len(ev.hashes)),
				HasGroupIdx:     true,
				KVCacheSpecKind: "full_attention",
			})
		case ev.kind == eventRemoved:
			out = append(out, kvevents.Event{
				Type:        kvevents.BlockRemoved,
				BlockHashes: ev.hashes,
				Medium:      "GPU",
				HasGroupIdx: true,
			})
		case ev.kind == eventCleared:
			out = append(out, kvevents.Event{Type: kvevents.AllBlocksCleared})
			continue
		}
		if bytesHashes && len(ev.digests) > 0 {
			w := &out[len(out)-1]
			w.HashBytesLen = len(ev.digests[0])
			for _, d := range ev.digests {
				w.HashBytes = append(w.HashBytes, d...)
			}
			if ev.hasParent {
				w.ParentDigest = ev.parentDigest
			}
		}
	}
	return out
}

// offloadWireEvent is an offload tier's event as OffloadingConnector.take_events
// builds it (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py):
// BlockStored with the tier's medium and block size, parent nil, token_ids
// empty, lora_id and lora_name nil and no group fields; BlockRemoved with
// the hashes and the medium only.
func offloadWireEvent(ev poolEvent, blockSize int) kvevents.Event {
	if ev.kind == eventRemoved {
		return kvevents.Event{Type: kvevents.BlockRemoved, BlockHashes: ev.hashes, Medium: ev.medium, HasMedium: true}
	}
	return kvevents.Event{
		Type:        kvevents.BlockStored,
		BlockHashes: ev.hashes,
		TokenIDs:    []uint32{},
		BlockSize:   blockSize,
		Medium:      ev.medium,
		HasMedium:   true,
	}
}

// extraKeysMsgpack is the raw msgpack value of BlockStored.extra_keys: per
// block the block's extra-keys tuple (LoRA name on every block, cache_salt on
// block 0) or nil. The codec takes this field pre-encoded.
func extraKeysMsgpack(extra kvhash.Extra, firstBlock, n int) []byte {
	keys := make([]any, n)
	for i := range keys {
		var k []any
		if extra.LoRAName != "" {
			k = append(k, extra.LoRAName)
		}
		if firstBlock+i == 0 && extra.CacheSalt != "" {
			k = append(k, extra.CacheSalt)
		}
		if k != nil {
			keys[i] = k
		}
	}
	b, err := msgpack.Marshal(keys)
	if err != nil {
		return nil
	}
	return b
}

// publishStep encodes one engine step's events as one batch and publishes it.
// Steps without events publish nothing, as in vLLM.
func (e *Engine) publishStep(evs []poolEvent, now time.Time) {
	if e.drain != nil && len(evs) > 0 {
		e.drain.add(evs, e.cfg.BlockSize)
		return
	}
	if e.pub == nil || len(evs) == 0 {
		return
	}
	ts := float64(now.UnixNano()) / 1e9
	var payload []byte
	var err error
	if e.cfg.Engine == EngineSGLang {
		payload, err = encodeSGLangBatch(evs, e.cfg.BlockSize, ts, e.cfg.DataParallelRank, e.cfg.EventLayout)
	} else {
		payload, err = encodeBatch(evs, e.cfg.BlockSize, ts, e.cfg.DataParallelRank, e.layout, e.cfg.BytesBlockHashes)
	}
	if err != nil {
		e.cfg.Logger.Error("kv events: encode failed", "err", err)
		return
	}
	e.pub.publish(payload)
}

// encodeBatch is one KVEventBatch's payload: [ts, events, data_parallel_rank]
// (vLLM's publisher always fills the rank).
func encodeBatch(evs []poolEvent, blockSize int, ts float64, rank int, layout kvevents.Layout, bytesHashes bool) ([]byte, error) {
	batch := kvevents.Batch{
		TS:               ts,
		Events:           toWireEvents(evs, blockSize, bytesHashes),
		DataParallelRank: rank,
		HasRank:          true,
	}
	return kvevents.AppendEncode(nil, &batch, layout)
}
