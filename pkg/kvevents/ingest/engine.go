package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents/sglang"
)

// Engine selects the wire adapter a target's payloads go through. The
// transport (one ZeroMQ SUB per rank, the sequence window, replay) is the
// same for every ZeroMQ engine; only the payload codec and how its events
// map onto the inventory differ (docs/engines.md, docs/ingest.md).
type Engine uint8

const (
	// EngineVLLM decodes vLLM's KVEventBatch (package kvevents).
	EngineVLLM Engine = iota
	// EngineSGLang decodes SGLang's EventBatch (package kvevents/sglang).
	EngineSGLang
	// EngineTRTLLM polls TensorRT-LLM's POST /kv_cache_events drain on the
	// target's Port (the endpoint's HTTP port) instead of subscribing.
	EngineTRTLLM
)

func (e Engine) String() string {
	switch e {
	case EngineVLLM:
		return "vllm"
	case EngineSGLang:
		return "sglang"
	case EngineTRTLLM:
		return "trtllm"
	}
	return fmt.Sprintf("engine(%d)", uint8(e))
}

// ParseEngine maps a rule's kvEngineType ("" is vllm) to its adapter.
// llama.cpp has none: it publishes no KV events.
func ParseEngine(s string) (Engine, error) {
	switch s {
	case "", "vllm":
		return EngineVLLM, nil
	case "sglang":
		return EngineSGLang, nil
	case "trtllm":
		return EngineTRTLLM, nil
	}
	return 0, fmt.Errorf("kv engine %q has no ingest adapter", s)
}

// applySGLang is the SGLang adapter. SGLang publishes one hash per page and
// coalesces consecutive pages of one insert into one BlockStored, so every
// hash of the event is a page the engine holds; their chaining
// (Event.Parents) matters to a replayer of the radix tree, not to the
// inventory, which keys on the hashes alone. The batch's attn_dp_rank is not
// trusted: the rank is the publisher's port, as for vLLM. A medium of nil
// means GPU (SGLang's default); other media are kept apart and never score.
func (in *Ingester) applySGLang(payload []byte) (IngestResult, error) {
	var res IngestResult
	b, err := sglang.Decode(payload)
	if err != nil {
		return res, fmt.Errorf("decode sglang batch: %w", err)
	}
	res.Skipped = b.UnknownEvents + b.BadEvents
	for i := range b.Events {
		e := &b.Events[i]
		medium := mediumOrGPU(e.Medium)
		switch e.Type {
		case sglang.BlockStored:
			if in.Granularity != nil && e.BlockSize > 0 && inventory.IsGPU(medium) && in.blockSizeBad(e.BlockSize, &res) {
				res.Unmatchable += len(e.BlockHashes)
				continue
			}
			err = in.Inventory.Add(in.EPIdx, in.Rank, medium, e.BlockHashes)
			res.Stored += len(e.BlockHashes)
		case sglang.BlockRemoved:
			err = in.Inventory.Remove(in.EPIdx, in.Rank, medium, e.BlockHashes)
			res.Removed += len(e.BlockHashes)
		case sglang.AllBlocksCleared:
			err = in.Inventory.ClearRank(in.EPIdx, in.Rank)
			res.Cleared = true
		}
		if err != nil {
			return res, fmt.Errorf("apply sglang %s: %w", e.Type, err)
		}
	}
	return res, nil
}

// readSGLangPageSize asks an SGLang endpoint for its effective page size
// (GET /get_server_info on its targetPort) so a kvBlockSize that differs is
// reported before the first request, not after the first BlockStored. It
// retries with the rebuild backoff until it gets an answer, a server that
// has no such route (404), or ctx ends; the events' block_size decides
// either way.
func readSGLangPageSize(ctx context.Context, t Target, opts Options, log *slog.Logger) {
	ec := t.httpClient()
	url := ec.URL(t.IP, t.HTTPPort, "/get_server_info")
	client := ec.HTTP(opts.DrainTimeout)
	delay := opts.RebuildDelay
	for ctx.Err() == nil {
		size, done, err := getPageSize(ctx, client, url, t)
		if done {
			if size > 0 {
				if _, ok, _ := t.Granularity.observe(t.EPIdx, size); !ok {
					log.Warn("kv subscriber: the SGLang engine's page_size is not kvBlockSize; its pages can never match a request (requests skip the KV tier with reason hashes, kvgate_kv_skip_total{cause=\"block_size\"})",
						"page_size", size, "kvBlockSize", t.Granularity.HashBlockSize())
				}
			}
			return
		}
		log.Debug("kv subscriber: /get_server_info not read yet", "err", err, "retry", delay)
		if !sleepCtx(ctx, delay) {
			return
		}
		delay = min(2*delay, opts.RebuildMaxDelay)
	}
}

// getPageSize reads page_size from /get_server_info; done is false when it
// should be asked again.
func getPageSize(ctx context.Context, client *http.Client, url string, t Target) (size int, done bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, true, err
	}
	t.authorize(req)
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return 0, true, nil // not SGLang's server, or too old: the events tell
	case resp.StatusCode != http.StatusOK:
		return 0, false, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	var info struct {
		PageSize int `json:"page_size"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info); err != nil {
		return 0, true, fmt.Errorf("decode /get_server_info: %w", err)
	}
	return info.PageSize, true, nil
}
