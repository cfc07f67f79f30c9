package enginesim

import (
	"encoding/json"
	"net/http"
	"sync"
)

// trtDrain is TensorRT-LLM's KV-event buffer as trtllm-serve exposes it:
// events numbered from 0 (a "created" event first), kept up to
// event_buffer_max_size (the oldest dropped beyond), and handed out by
// POST /kv_cache_events, which empties the buffer (a destructive drain).
// The JSON is KVCacheEventSerializer's (docs/engines.md, "TensorRT-LLM
// events").
type trtDrain struct {
	mu     sync.Mutex
	max    int
	window int // window_size: the attention window in tokens (max-model-len)
	nextID int64
	events []trtEvent
}

type trtEvent struct {
	EventID    int64   `json:"event_id"`
	Data       trtData `json:"data"`
	WindowSize int     `json:"window_size"`
}

type trtData struct {
	Type                   string     `json:"type"`
	NumBlocksPerCacheLevel []int      `json:"num_blocks_per_cache_level,omitempty"`
	ParentHash             *uint64    `json:"parent_hash,omitempty"`
	Blocks                 []trtBlock `json:"blocks,omitempty"`
	BlockHashes            []uint64   `json:"block_hashes,omitempty"`
}

type trtBlock struct {
	Type       string     `json:"type"`
	BlockHash  uint64     `json:"block_hash"`
	Tokens     []trtToken `json:"tokens"`
	CacheLevel int        `json:"cache_level"`
	Priority   int        `json:"priority"`
}

type trtToken struct {
	Type         string `json:"type"`
	TokenID      uint32 `json:"token_id"`
	TokenExtraID int    `json:"token_extra_id"`
}

// trtDefaultPriority is TensorRT-LLM's default retention priority.
const trtDefaultPriority = 35

func newTRTDrain(max, numBlocks, window int) *trtDrain {
	d := &trtDrain{max: max, window: window}
	d.push(trtData{Type: "created", NumBlocksPerCacheLevel: []int{numBlocks, 0}})
	return d
}

// push appends one event.
func (d *trtDrain) push(data trtData) {
	if len(d.events) >= d.max {
		d.events = d.events[1:]
	}
	d.events = append(d.events, trtEvent{EventID: d.nextID, Data: data, WindowSize: d.window})
	d.nextID++
}

// add records one step's pool events. A stored event keeps the parent of
// its first block (null at the root) and every block's tokens.
func (d *trtDrain) add(evs []poolEvent, blockSize int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range evs {
		switch ev.kind {
		case eventStored:
			data := trtData{Type: "stored"}
			if ev.hasParent {
				p := ev.parent
				data.ParentHash = &p
			}
			for i, h := range ev.hashes {
				b := trtBlock{Type: "stored_block", BlockHash: h, Priority: trtDefaultPriority}
				for _, t := range ev.tokens[i*blockSize : min((i+1)*blockSize, len(ev.tokens))] {
					b.Tokens = append(b.Tokens, trtToken{Type: "unique_token", TokenID: t})
				}
				data.Blocks = append(data.Blocks, b)
			}
			d.push(data)
		case eventRemoved:
			d.push(trtData{Type: "removed", BlockHashes: ev.hashes})
		case eventCleared:
			// TensorRT-LLM has no clear event; a reset cache reads as a
			// new KV cache manager.
			d.push(trtData{Type: "created", NumBlocksPerCacheLevel: []int{0, 0}})
		}
	}
}

// take empties the buffer.
func (d *trtDrain) take() []trtEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.events
	d.events = nil
	return out
}

// handleDrain is trtllm-serve's POST /kv_cache_events.
func (e *Engine) handleDrain(w http.ResponseWriter, _ *http.Request) {
	evs := e.drain.take()
	if evs == nil {
		evs = []trtEvent{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(evs)
}

// handleTRTServerInfo is trtllm-serve's GET /server_info, reduced to what a
// router reads: tokens_per_block and the block-key algorithm.
func (e *Engine) handleTRTServerInfo(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"tokens_per_block":   e.cfg.BlockSize,
		"kv_cache_hash_algo": "v1_block_key",
		"model":              e.cfg.Model,
	})
}
