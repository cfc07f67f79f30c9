// Package kvevents is the wire codec for vLLM's KV-cache events: the ZeroMQ
// frames [topic, seq, payload], the msgpack EventBatch payload in the map
// layout of vLLM >= 0.26 and the array layouts of older releases, and the
// replay protocol's frames. Decoding is hand-written, allocation-free in
// steady state and tolerant: unknown fields and event types are skipped and
// counted, never fatal. Encoding reproduces msgspec's bytes exactly, for the
// engine simulator and test publishers.
//
// Knobs: none. Metrics: none directly; Decoder.Stats counts batches, events,
// skipped unknown fields and events, and malformed events for the subscriber
// to export.
package kvevents

// EventType tags an event. The zero value is Unknown.
type EventType uint8

const (
	// Unknown is an event type this codec does not know (skipped on decode).
	Unknown EventType = iota
	// BlockStored announces newly cached blocks.
	BlockStored
	// BlockRemoved announces evicted blocks.
	BlockRemoved
	// AllBlocksCleared announces that the engine dropped its whole prefix cache.
	AllBlocksCleared
)

// String returns the tag vLLM uses on the wire ("BlockStored", ...).
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

// Event is one decoded KV event. Slices are reused by Decoder.Decode across
// calls: copy what must outlive the next Decode.
//
// Strings use "" for absent (msgpack nil); vLLM never sends empty strings
// for these fields.
type Event struct {
	Type EventType

	// BlockHashes are the 64-bit block hashes (vLLM's wire value: the last 8
	// digest bytes, big-endian). Signed msgpack ints keep their 64 bits;
	// bytes hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) give their
	// trailing 8 bytes.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before BlockHashes[0]; valid
	// when HasParent (nil on the wire for a request's first blocks).
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are all tokens of the stored blocks, concatenated. They may
	// be missing, empty or not match the hash count; the event still applies.
	TokenIDs []uint32
	// BlockSize is valid when HasBlockSize: the decoder clears it for a nil,
	// missing or out-of-range (negative, >= 2^32) block_size.
	BlockSize    int
	HasBlockSize bool
	Medium       string // "GPU", "CPU", "STORAGE", ... or "" when absent
	LoRAName     string
	// HasMedium and HasLoRAName tell a present empty string ("") from nil or
	// absent; the encoder writes "" back for them.
	HasMedium   bool
	HasLoRAName bool
	LoRAID      int64 // deprecated LoRA adapter id; valid when HasLoRAID
	HasLoRAID   bool

	// Fields kept so the encoder can reproduce payloads byte for byte.

	// HashBytes holds the raw digests, concatenated, when every block hash
	// came as msgpack bin of the same length HashBytesLen (0 otherwise).
	HashBytes    []byte
	HashBytesLen int
	// ParentDigest is the raw parent digest when it came as bin.
	ParentDigest []byte
	// ExtraKeys is the raw msgpack of extra_keys (one entry per block); empty
	// when absent or nil.
	ExtraKeys        []byte
	GroupIdx         int64
	HasGroupIdx      bool
	KVCacheSpecKind  string // "full_attention", "sliding_window", ... ("" absent)
	SlidingWindow    int64  // kv_cache_spec_sliding_window; valid when HasSlidingWindow
	HasSlidingWindow bool
	Locality         string // "LOCAL" / "REMOTE" (vLLM >= 0.26), "" absent
}

// reset clears e for reuse, keeping slice capacity.
func (e *Event) reset() {
	*e = Event{
		BlockHashes:  e.BlockHashes[:0],
		TokenIDs:     e.TokenIDs[:0],
		HashBytes:    e.HashBytes[:0],
		ParentDigest: e.ParentDigest[:0],
		ExtraKeys:    e.ExtraKeys[:0],
	}
}

// Batch is one EventBatch: [ts, events, data_parallel_rank].
type Batch struct {
	TS     float64
	Events []Event
	// DataParallelRank is the publisher's DP rank; valid when HasRank.
	DataParallelRank int
	HasRank          bool
	// Legacy marks the 2-element [ts, events] form of vLLM 0.9.
	Legacy bool

	// Per-batch decode counts (also accumulated in Decoder.Stats).
	UnknownFields int // unknown map keys / extra array positions skipped
	UnknownEvents int // events with an unknown tag or shape, skipped
	BadEvents     int // events with a malformed known field, skipped
	BadFields     int // malformed optional fields dropped (event kept)
}

// Layout selects the payload layout AppendEncode writes.
type Layout int

const (
	// LayoutMap is vLLM >= 0.26 (PR #42892): each event a map with "type"
	// first, required fields always, optional fields omitted when nil.
	LayoutMap Layout = iota
	// LayoutArrayV0_25 is the last array layout, before the switch to maps:
	// BlockStored [tag, block_hashes, parent_block_hash, token_ids,
	// block_size, lora_id, medium, lora_name, extra_keys, group_idx,
	// kv_cache_spec_kind, kv_cache_spec_sliding_window],
	// BlockRemoved [tag, block_hashes, medium, group_idx].
	LayoutArrayV0_25
	// LayoutArrayV0_15 adds lora_name (PR #27577): BlockStored has 7 fields
	// (through lora_name), BlockRemoved [tag, block_hashes, medium].
	LayoutArrayV0_15
	// LayoutArrayV0_11 adds medium: BlockStored [tag, block_hashes,
	// parent_block_hash, token_ids, block_size, lora_id, medium],
	// BlockRemoved [tag, block_hashes, medium].
	LayoutArrayV0_11
	// LayoutArrayV0_9 is vLLM 0.9: EventBatch [ts, events] without the rank,
	// BlockStored [tag, block_hashes, parent_block_hash, token_ids,
	// block_size, lora_id], BlockRemoved [tag, block_hashes].
	LayoutArrayV0_9
)

// String names the layout.
func (l Layout) String() string {
	switch l {
	case LayoutMap:
		return "map"
	case LayoutArrayV0_25:
		return "array-v0.25"
	case LayoutArrayV0_15:
		return "array-v0.15"
	case LayoutArrayV0_11:
		return "array-v0.11"
	case LayoutArrayV0_9:
		return "array-v0.9"
	}
	return "unknown"
}

// arrayFields is how many fields (after the tag) each event type has in an
// array layout.
func (l Layout) arrayFields(t EventType) int {
	switch t {
	case BlockStored:
		switch l {
		case LayoutArrayV0_25:
			return 11
		case LayoutArrayV0_15:
			return 7
		case LayoutArrayV0_11:
			return 6
		case LayoutArrayV0_9:
			return 5
		}
	case BlockRemoved:
		switch l {
		case LayoutArrayV0_25:
			return 3
		case LayoutArrayV0_15, LayoutArrayV0_11:
			return 2
		case LayoutArrayV0_9:
			return 1
		}
	}
	return 0
}

// Wire names of the event fields, in declaration order.
const (
	keyType           = "type"
	keyBlockHashes    = "block_hashes"
	keyParent         = "parent_block_hash"
	keyTokenIDs       = "token_ids"
	keyBlockSize      = "block_size"
	keyLoRAID         = "lora_id"
	keyMedium         = "medium"
	keyLoRAName       = "lora_name"
	keyExtraKeys      = "extra_keys"
	keyGroupIdx       = "group_idx"
	keySpecKind       = "kv_cache_spec_kind"
	keySlidingWindow  = "kv_cache_spec_sliding_window"
	keyLocality       = "locality"
	keyBatchTS        = "ts"
	keyBatchEvents    = "events"
	keyBatchRank      = "data_parallel_rank"
	tagBlockStored    = "BlockStored"
	tagBlockRemoved   = "BlockRemoved"
	tagAllBlocksClear = "AllBlocksCleared"
)
