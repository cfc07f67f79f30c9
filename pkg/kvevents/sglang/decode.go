// Package sglang decodes SGLang's KV-event payloads: the msgpack EventBatch
// [ts, events, attn_dp_rank?] that SGLang's ZmqEventPublisher sends in the
// third frame of [topic, seq, payload], with events in both wire shapes SGLang
// has used (docs/engines.md): the legacy tagged arrays, with and without
// medium (and the trailing metadata map of BlockStoredWithMetadata), and the
// tagged maps that followed when SGLang dropped array_like from its events.
//
// Block hashes are SGLang's signed int64 values, kept as their 64-bit
// pattern in a uint64 (the inventory compares patterns). A BlockStored may be
// coalesced: many pages in one event, each page's parent the hash before it,
// the first page's parent parent_block_hash.
//
// Knobs: none. Metrics: none; Batch counts what the decoder skipped.
package sglang

import (
	"errors"
	"fmt"
)

// Bounds on one payload. A payload beyond them is an error, never a large
// allocation: the reader also checks every length against the bytes left.
const (
	MaxPayload        = 64 << 20
	MaxEvents         = 1 << 16
	MaxHashesPerEvent = 1 << 16 // SGLang's own router caps an event at 65,536 hashes
	MaxTokensPerEvent = 1 << 22
)

// DecodeError is a malformed payload.
type DecodeError struct {
	Offset int
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("sglang kv events: byte %d: %s", e.Offset, e.Reason)
}

// ErrTooLarge matches (errors.Is) a payload beyond one of the bounds above.
var ErrTooLarge = errors.New("sglang kv events: payload beyond bounds")

// EventType tags an event.
type EventType uint8

const (
	// Unknown is an event tag this decoder does not know (skipped).
	Unknown EventType = iota
	// BlockStored announces newly cached pages.
	BlockStored
	// BlockRemoved announces evicted pages.
	BlockRemoved
	// AllBlocksCleared announces that the cache was dropped.
	AllBlocksCleared
)

func (t EventType) String() string {
	switch t {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Shape is the wire shape an event came in.
type Shape uint8

const (
	// ShapeArray is the legacy tagged array [tag, field, ...].
	ShapeArray Shape = iota + 1
	// ShapeMap is the tagged map {"type": tag, field: value, ...}.
	ShapeMap
)

func (s Shape) String() string {
	switch s {
	case ShapeArray:
		return "array"
	case ShapeMap:
		return "map"
	}
	return "unknown"
}

// The storage tiers SGLang's StorageMedium names.
const (
	MediumGPU       = "GPU"
	MediumCPUPinned = "CPU_PINNED"
	MediumDisk      = "DISK"
	MediumExternal  = "EXTERNAL"
)

// KnownMedium reports whether m is one of SGLang's four storage tiers.
func KnownMedium(m string) bool {
	switch m {
	case MediumGPU, MediumCPUPinned, MediumDisk, MediumExternal:
		return true
	}
	return false
}

// Event is one decoded event. Strings are "" when absent or nil.
type Event struct {
	Type  EventType
	Shape Shape
	// BlockHashes are the pages' published hashes, in order.
	BlockHashes []uint64
	// ParentBlockHash is the hash the first page chains from; valid when
	// HasParent (nil when the parent is the radix root).
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are the pages' tokens, concatenated (informational).
	TokenIDs  []uint64
	BlockSize int
	LoRAID    int64
	HasLoRAID bool
	// Medium is the storage tier; "" when absent (SGLang's default, GPU).
	Medium    string
	CacheSalt string
	SessionID string
	LoRAName  string
}

// Parents returns the parent of each page of a BlockStored: page 0's is
// ParentBlockHash (has[0] false when it has none), page i's is page i-1's
// hash. A coalesced event chains this way through all its pages.
func (e *Event) Parents() (parents []uint64, has []bool) {
	parents = make([]uint64, len(e.BlockHashes))
	has = make([]bool, len(e.BlockHashes))
	for i := range e.BlockHashes {
		if i == 0 {
			parents[0], has[0] = e.ParentBlockHash, e.HasParent
			continue
		}
		parents[i], has[i] = e.BlockHashes[i-1], true
	}
	return parents, has
}

// Batch is one EventBatch.
type Batch struct {
	TS     float64
	Events []Event
	// AttnDPRank is the publishing attention-DP rank; valid when HasRank.
	AttnDPRank int
	HasRank    bool
	// What the decoder skipped: unknown map keys and trailing array
	// elements, events with an unknown tag, events with a malformed known
	// field (SGLang's typed decoder rejects those too, e.g. EAGLE bigram
	// token pairs), and unknown medium values (kept in Event.Medium).
	UnknownFields  int
	UnknownEvents  int
	BadEvents      int
	UnknownMediums int
}

// Decode decodes one payload.
func Decode(payload []byte) (*Batch, error) {
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrTooLarge, len(payload), MaxPayload)
	}
	r := &reader{b: payload}
	n, err := r.arrayLen()
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return nil, r.errf("batch has %d elements, want [ts, events] or [ts, events, attn_dp_rank]", n)
	}
	b := &Batch{}
	if b.TS, err = r.readFloat(); err != nil {
		return nil, fmt.Errorf("batch ts: %w", err)
	}
	ne, err := r.arrayLen()
	if err != nil {
		return nil, fmt.Errorf("batch events: %w", err)
	}
	if ne > MaxEvents {
		return nil, fmt.Errorf("%w: %d events (max %d)", ErrTooLarge, ne, MaxEvents)
	}
	b.Events = make([]Event, 0, ne)
	for i := 0; i < ne; i++ {
		start := r.off
		ev, ok, err := decodeEvent(r, b)
		if errors.Is(err, ErrTooLarge) {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if err != nil {
			// A malformed event is skipped whole, as SGLang's typed decoder
			// would reject it; the batch goes on if its bytes can be stepped over.
			r.off = start
			if serr := r.skip(0); serr != nil {
				return nil, fmt.Errorf("event %d: %w", i, err)
			}
			b.BadEvents++
			continue
		}
		if ok {
			b.Events = append(b.Events, ev)
		}
	}
	if n >= 3 {
		if !r.nilNext() {
			bits, neg, err := r.readInt()
			if err != nil || neg || bits > 1<<31 {
				return nil, r.errf("attn_dp_rank is not a rank (non-negative integer or nil)")
			}
			b.AttnDPRank, b.HasRank = int(bits), true
		}
		for i := 3; i < n; i++ {
			if err := r.skip(0); err != nil {
				return nil, fmt.Errorf("batch: %w", err)
			}
			b.UnknownFields++
		}
	}
	if r.off != len(r.b) {
		return nil, r.errf("%d trailing bytes after the batch", len(r.b)-r.off)
	}
	return b, nil
}

func tagType(tag string) EventType {
	switch tag {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return Unknown
}

// decodeEvent reads one event; ok is false for an unknown tag (skipped and
// counted).
func decodeEvent(r *reader, b *Batch) (Event, bool, error) {
	if r.isMap() {
		return decodeMapEvent(r, b)
	}
	n, err := r.arrayLen()
	if err != nil {
		return Event{}, false, err
	}
	if n == 0 {
		return Event{}, false, r.errf("empty event array")
	}
	tag, err := r.readStr()
	if err != nil {
		return Event{}, false, fmt.Errorf("event tag: %w", err)
	}
	ev := Event{Type: tagType(tag), Shape: ShapeArray}
	rest := n - 1
	var fields []func(*reader, *Event, *Batch) error
	switch ev.Type {
	case BlockStored:
		if rest < 5 {
			return ev, false, r.errf("BlockStored array has %d fields, want at least 5", rest)
		}
		fields = []func(*reader, *Event, *Batch) error{readHashes, readParent, readTokens, readBlockSize, readLoRAID, readMedium, readMetadata}
	case BlockRemoved:
		if rest < 1 {
			return ev, false, r.errf("BlockRemoved array has no block_hashes")
		}
		fields = []func(*reader, *Event, *Batch) error{readHashes, readMedium}
	case AllBlocksCleared:
	default:
		b.UnknownEvents++
		for i := 0; i < rest; i++ {
			if err := r.skip(0); err != nil {
				return ev, false, err
			}
		}
		return ev, false, nil
	}
	for i := 0; i < rest; i++ {
		if i < len(fields) {
			if err := fields[i](r, &ev, b); err != nil {
				return ev, false, err
			}
			continue
		}
		if err := r.skip(0); err != nil {
			return ev, false, err
		}
		b.UnknownFields++
	}
	return ev, true, nil
}

func decodeMapEvent(r *reader, b *Batch) (Event, bool, error) {
	n, err := r.mapLen()
	if err != nil {
		return Event{}, false, err
	}
	ev := Event{Shape: ShapeMap}
	seen := map[string]bool{}
	unknownTag := false
	for i := 0; i < n; i++ {
		key, err := r.readStr()
		if err != nil {
			return ev, false, fmt.Errorf("event key: %w", err)
		}
		if seen[key] {
			return ev, false, r.errf("duplicate key %q", key)
		}
		seen[key] = true
		var f func(*reader, *Event, *Batch) error
		switch key {
		case "type":
			tag, err := r.readStr()
			if err != nil {
				return ev, false, fmt.Errorf("type: %w", err)
			}
			ev.Type = tagType(tag)
			unknownTag = ev.Type == Unknown
			continue
		case "block_hashes":
			f = readHashes
		case "parent_block_hash":
			f = readParent
		case "token_ids":
			f = readTokens
		case "block_size":
			f = readBlockSize
		case "lora_id":
			f = readLoRAID
		case "medium":
			f = readMedium
		case "cache_salt":
			f = func(r *reader, e *Event, _ *Batch) error { return readOptStr(r, &e.CacheSalt, "cache_salt") }
		case "session_id":
			f = func(r *reader, e *Event, _ *Batch) error { return readOptStr(r, &e.SessionID, "session_id") }
		case "lora_name":
			f = func(r *reader, e *Event, _ *Batch) error { return readOptStr(r, &e.LoRAName, "lora_name") }
		case "metadata":
			f = readMetadata
		default:
			if err := r.skip(0); err != nil {
				return ev, false, err
			}
			b.UnknownFields++
			continue
		}
		if err := f(r, &ev, b); err != nil {
			return ev, false, err
		}
	}
	switch {
	case unknownTag:
		b.UnknownEvents++
		return ev, false, nil
	case !seen["type"]:
		return ev, false, r.errf("event map without \"type\"")
	case ev.Type == BlockStored && !(seen["block_hashes"] && seen["block_size"]):
		return ev, false, r.errf("BlockStored map without block_hashes or block_size")
	case ev.Type == BlockRemoved && !seen["block_hashes"]:
		return ev, false, r.errf("BlockRemoved map without block_hashes")
	}
	return ev, true, nil
}

func readHashes(r *reader, e *Event, _ *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("block_hashes: %w", err)
	}
	if n > MaxHashesPerEvent {
		return fmt.Errorf("%w: %d block hashes in one event (max %d)", ErrTooLarge, n, MaxHashesPerEvent)
	}
	e.BlockHashes = make([]uint64, n)
	for i := range e.BlockHashes {
		// SGLang sends non-negative hashes as msgpack uint and negative ones
		// as int; either way the 64-bit pattern is the hash.
		if e.BlockHashes[i], _, err = r.readInt(); err != nil {
			return fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
	}
	return nil
}

func readParent(r *reader, e *Event, _ *Batch) error {
	if r.nilNext() {
		return nil
	}
	v, _, err := r.readInt()
	if err != nil {
		return fmt.Errorf("parent_block_hash: %w", err)
	}
	e.ParentBlockHash, e.HasParent = v, true
	return nil
}

func readTokens(r *reader, e *Event, _ *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("token_ids: %w", err)
	}
	if n > MaxTokensPerEvent {
		return fmt.Errorf("%w: %d token ids in one event (max %d)", ErrTooLarge, n, MaxTokensPerEvent)
	}
	e.TokenIDs = make([]uint64, n)
	for i := range e.TokenIDs {
		v, neg, err := r.readInt()
		if err != nil || neg {
			// Bigram pairs (EAGLE) and negative ids fail SGLang's list[int].
			return r.errf("token_ids[%d] is not a non-negative integer", i)
		}
		e.TokenIDs[i] = v
	}
	return nil
}

func readBlockSize(r *reader, e *Event, _ *Batch) error {
	v, neg, err := r.readInt()
	if err != nil || neg || v == 0 || v > 1<<20 {
		return r.errf("block_size is not an integer in 1..%d", 1<<20)
	}
	e.BlockSize = int(v)
	return nil
}

func readLoRAID(r *reader, e *Event, _ *Batch) error {
	if r.nilNext() {
		return nil
	}
	v, _, err := r.readInt()
	if err != nil {
		return fmt.Errorf("lora_id: %w", err)
	}
	e.LoRAID, e.HasLoRAID = int64(v), true
	return nil
}

func readMedium(r *reader, e *Event, b *Batch) error {
	if err := readOptStr(r, &e.Medium, "medium"); err != nil {
		return err
	}
	if e.Medium != "" && !KnownMedium(e.Medium) {
		b.UnknownMediums++
	}
	return nil
}

func readOptStr(r *reader, dst *string, name string) error {
	if r.nilNext() {
		return nil
	}
	s, err := r.readStr()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	*dst = s
	return nil
}

// readMetadata reads BlockStoredWithMetadata's trailing metadata map
// ({"cache_salt": ...}); other keys are counted and skipped.
func readMetadata(r *reader, e *Event, b *Batch) error {
	if r.nilNext() {
		return nil
	}
	n, err := r.mapLen()
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	for i := 0; i < n; i++ {
		k, err := r.readStr()
		if err != nil {
			return fmt.Errorf("metadata key: %w", err)
		}
		if k == "cache_salt" {
			if err := readOptStr(r, &e.CacheSalt, "metadata.cache_salt"); err != nil {
				return err
			}
			continue
		}
		if err := r.skip(0); err != nil {
			return err
		}
		b.UnknownFields++
	}
	return nil
}
