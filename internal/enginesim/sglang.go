package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/kvgate/kvgate/pkg/kvevents/sglang"
)

// encodeSGLangBatch is one SGLang EventBatch for a step's pool events, as
// SGLang's radix cache records them (docs/engines.md, "SGLang events"): one
// BlockStored per insert carrying all its new pages (coalesced, chained
// through parent_block_hash, nil at the radix root), BlockRemoved per
// eviction, medium GPU, the LoRA adapter as lora_name (map shape only) and
// the publishing attention-DP rank. Hashes are the published (LoRA
// namespaced) int64 values the hasher returns.
func encodeSGLangBatch(evs []poolEvent, pageSize int, ts float64, rank int, layout string) ([]byte, error) {
	shape := sglang.ShapeMap
	if layout == "array" {
		shape = sglang.ShapeArray
	}
	b := sglang.Batch{TS: ts, AttnDPRank: rank, HasRank: true, Events: make([]sglang.Event, 0, len(evs))}
	for _, ev := range evs {
		switch ev.kind {
		case eventStored:
			tokens := make([]uint64, len(ev.tokens))
			for i, t := range ev.tokens {
				tokens[i] = uint64(t)
			}
			out := sglang.Event{
				Type: sglang.BlockStored, BlockHashes: ev.hashes, ParentBlockHash: ev.parent, HasParent: ev.hasParent,
				TokenIDs: tokens, BlockSize: pageSize, Medium: sglang.MediumGPU,
			}
			if shape == sglang.ShapeMap {
				out.CacheSalt, out.LoRAName = ev.extra.CacheSalt, ev.extra.LoRAName
			}
			b.Events = append(b.Events, out)
		case eventRemoved:
			b.Events = append(b.Events, sglang.Event{Type: sglang.BlockRemoved, BlockHashes: ev.hashes, Medium: sglang.MediumGPU})
		case eventCleared:
			b.Events = append(b.Events, sglang.Event{Type: sglang.AllBlocksCleared})
		}
	}
	return sglang.AppendEncode(nil, &b, shape)
}

// handleServerInfo is SGLang's GET /get_server_info, reduced to the fields
// a router reads: the effective page size (kvBlockSize must equal it), the
// served model and whether the radix cache is on.
func (e *Engine) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"page_size":           e.cfg.BlockSize,
		"served_model_name":   e.cfg.Model,
		"model_path":          e.cfg.Model,
		"disable_radix_cache": false,
		"dp_size":             max(e.cfg.DPSize, 1),
		"enable_dp_attention": e.cfg.DPSize > 1,
		"version":             "enginesim",
	})
}

// startDPRanks starts attention-DP ranks 1..DPSize-1 beside e (rank 0):
// same model, tokenizer and cache size, each its own radix cache and
// publisher on the events (and replay) port + rank, answering as e.
func (e *Engine) startDPRanks() error {
	for r := 1; r < e.cfg.DPSize; r++ {
		rc := e.cfg
		rc.DPSize, rc.Port, rc.DataParallelRank, rc.ID = 0, 0, r, e.cfg.ID
		var err error
		if rc.KVEventsEndpoint, err = offsetEndpoint(e.cfg.KVEventsEndpoint, r); err != nil {
			return fmt.Errorf("enginesim: dp rank %d: %w", r, err)
		}
		if e.cfg.ReplayEndpoint != "" && e.cfg.ReplayEndpoint != "none" {
			if rc.ReplayEndpoint, err = offsetEndpoint(e.cfg.ReplayEndpoint, r); err != nil {
				return fmt.Errorf("enginesim: dp rank %d: %w", r, err)
			}
		}
		re, err := New(rc)
		if err != nil {
			for _, started := range e.dpRanks {
				started.Close()
			}
			e.dpRanks = nil
			return fmt.Errorf("enginesim: dp rank %d: %w", r, err)
		}
		e.dpRanks = append(e.dpRanks, re)
	}
	return nil
}

// pickRank chooses the rank that serves the next generation request, round
// robin as SGLang's DataParallelController does by default, and names it in
// x-enginesim-dp-rank.
func (e *Engine) pickRank(w http.ResponseWriter) *Engine {
	if len(e.dpRanks) == 0 {
		return e
	}
	i := int(e.dpNext.Add(1)-1) % (len(e.dpRanks) + 1)
	w.Header().Set("x-enginesim-dp-rank", strconv.Itoa(i))
	if i == 0 {
		return e
	}
	return e.dpRanks[i-1]
}

// DPRanks lists the attention-DP ranks after rank 0 (Config.DPSize), for
// tests and the benchmarks' oracle.
func (e *Engine) DPRanks() []*Engine { return append([]*Engine(nil), e.dpRanks...) }
