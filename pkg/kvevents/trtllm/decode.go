// Package trtllm decodes TensorRT-LLM's KV-cache events as trtllm-serve
// returns them from POST /kv_cache_events: a destructive drain whose body is
// a JSON list of {event_id, window_size, attention_dp_rank?, data}, data
// being "created", "stored" (blocks with their tokens), "removed" or
// "updated" (docs/engines.md). Block hashes are C++ size_t values and can
// exceed 2^63; they decode as uint64, exactly.
//
// Union folds drained events into the set of block hashes an endpoint
// holds, unioned over its attention-DP ranks.
//
// Knobs: none. Metrics: none; Union counts what it dropped.
package trtllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Bounds on one drain body. Beyond them Decode is an error (ErrTooLarge).
const (
	MaxBody           = 64 << 20
	MaxEvents         = 1 << 18
	MaxBlocksPerEvent = 1 << 16
	MaxTokensPerBlock = 1 << 20
)

// ErrTooLarge matches (errors.Is) a body beyond one of the bounds above.
var ErrTooLarge = errors.New("trtllm kv events: drain body beyond bounds")

// EventType tags an event's data.
type EventType string

// The data types TensorRT-LLM's KVCacheEventSerializer writes.
const (
	Created EventType = "created"
	Stored  EventType = "stored"
	Removed EventType = "removed"
	Updated EventType = "updated"
)

// Token is one unique token of a stored block.
type Token struct {
	TokenID      int64  `json:"token_id"`
	TokenExtraID uint64 `json:"token_extra_id"`
}

// Block is one stored block.
type Block struct {
	BlockHash  uint64  `json:"block_hash"`
	Tokens     []Token `json:"tokens"`
	CacheLevel int     `json:"cache_level"`
	Priority   int     `json:"priority"`
}

// Diff is an updated field's old and new value.
type Diff struct {
	New int64 `json:"new_value"`
	Old int64 `json:"old_value"`
}

// Data is an event's payload; which fields are set depends on Type.
type Data struct {
	Type EventType `json:"type"`
	// created
	NumBlocksPerCacheLevel []int64 `json:"num_blocks_per_cache_level,omitempty"`
	// stored: ParentHash nil when the first block has no parent.
	ParentHash *uint64 `json:"parent_hash,omitempty"`
	Blocks     []Block `json:"blocks,omitempty"`
	// removed
	BlockHashes []uint64 `json:"block_hashes,omitempty"`
	// updated
	BlockHash  uint64 `json:"block_hash,omitempty"`
	CacheLevel *Diff  `json:"cache_level,omitempty"`
	Priority   *Diff  `json:"priority,omitempty"`
}

// Event is one drained event.
type Event struct {
	EventID    int64 `json:"event_id"`
	WindowSize int64 `json:"window_size"`
	// AttentionDPRank is nil when the engine runs no attention DP.
	AttentionDPRank *int `json:"attention_dp_rank,omitempty"`
	Data            Data `json:"data"`
}

// Rank is the event's attention-DP rank, 0 when it has none.
func (e *Event) Rank() int {
	if e.AttentionDPRank == nil {
		return 0
	}
	return *e.AttentionDPRank
}

// Decode decodes one drain body. Unknown keys are ignored (newer engines
// add fields); an unknown data type is an error naming it, as is any value
// out of its type's range (a negative or fractional hash, for one).
func Decode(body []byte) ([]Event, error) {
	if len(body) > MaxBody {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrTooLarge, len(body), MaxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var evs []Event
	if err := dec.Decode(&evs); err != nil {
		return nil, fmt.Errorf("trtllm kv events: not a drain body (a JSON list of events): %w", err)
	}
	if evs == nil {
		return nil, errors.New("trtllm kv events: body is null, want a JSON list")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trtllm kv events: trailing data after the JSON list")
	}
	if len(evs) > MaxEvents {
		return nil, fmt.Errorf("%w: %d events (max %d)", ErrTooLarge, len(evs), MaxEvents)
	}
	for i := range evs {
		if err := evs[i].check(); err != nil {
			return nil, fmt.Errorf("trtllm kv events: event %d (event_id %d): %w", i, evs[i].EventID, err)
		}
	}
	return evs, nil
}

func (e *Event) check() error {
	if e.AttentionDPRank != nil && (*e.AttentionDPRank < 0 || *e.AttentionDPRank > 1<<20) {
		return fmt.Errorf("attention_dp_rank %d out of range", *e.AttentionDPRank)
	}
	d := &e.Data
	switch d.Type {
	case Created, Updated:
	case Stored:
		if len(d.Blocks) > MaxBlocksPerEvent {
			return fmt.Errorf("%w: %d blocks in one event (max %d)", ErrTooLarge, len(d.Blocks), MaxBlocksPerEvent)
		}
		for j := range d.Blocks {
			if len(d.Blocks[j].Tokens) > MaxTokensPerBlock {
				return fmt.Errorf("%w: %d tokens in block %d (max %d)", ErrTooLarge, len(d.Blocks[j].Tokens), j, MaxTokensPerBlock)
			}
		}
	case Removed:
		if len(d.BlockHashes) > MaxBlocksPerEvent {
			return fmt.Errorf("%w: %d hashes in one event (max %d)", ErrTooLarge, len(d.BlockHashes), MaxBlocksPerEvent)
		}
	case "":
		return errors.New(`data has no "type"`)
	default:
		return fmt.Errorf("unknown data type %q (want created, stored, removed or updated)", string(d.Type))
	}
	return nil
}

// Union is the set of block hashes one endpoint holds, unioned over its
// attention-DP ranks: a hash stays while any rank holds it. Only full blocks
// (TokensPerBlock tokens) are kept, since a request only matches full blocks;
// TensorRT-LLM also publishes a trailing partial block. Not safe for
// concurrent use.
type Union struct {
	// TokensPerBlock is the engine's tokens_per_block; 0 keeps every block.
	TokensPerBlock int
	// MaxBlocks bounds the set (0: 1<<22); stores beyond it are dropped
	// and counted.
	MaxBlocks int

	held map[uint64]map[int]struct{}
	// Partial and Dropped count blocks not kept (partial, over MaxBlocks).
	Partial, Dropped int
}

// Apply folds one event into u.
func (u *Union) Apply(e *Event) {
	if u.held == nil {
		u.held = map[uint64]map[int]struct{}{}
	}
	limit := u.MaxBlocks
	if limit <= 0 {
		limit = 1 << 22
	}
	rank := e.Rank()
	switch e.Data.Type {
	case Created:
		// A (re)created KV cache manager starts empty: forget what this rank held.
		for h, ranks := range u.held {
			delete(ranks, rank)
			if len(ranks) == 0 {
				delete(u.held, h)
			}
		}
	case Stored:
		for _, b := range e.Data.Blocks {
			if u.TokensPerBlock > 0 && len(b.Tokens) != u.TokensPerBlock {
				u.Partial++
				continue
			}
			ranks := u.held[b.BlockHash]
			if ranks == nil {
				if len(u.held) >= limit {
					u.Dropped++
					continue
				}
				ranks = map[int]struct{}{}
				u.held[b.BlockHash] = ranks
			}
			ranks[rank] = struct{}{}
		}
	case Removed:
		for _, h := range e.Data.BlockHashes {
			if ranks := u.held[h]; ranks != nil {
				delete(ranks, rank)
				if len(ranks) == 0 {
					delete(u.held, h)
				}
			}
		}
	}
}

// Has reports whether any rank holds h.
func (u *Union) Has(h uint64) bool { _, ok := u.held[h]; return ok }

// Len is the number of distinct hashes held.
func (u *Union) Len() int { return len(u.held) }
