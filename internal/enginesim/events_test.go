package enginesim

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

type eventVectors struct {
	BlockHashSource struct {
		DigestsHex []string `json:"digests_hex"`
		WireU64    []uint64 `json:"wire_u64"`
	} `json:"block_hash_source"`
	TS       float64 `json:"ts"`
	Payloads []struct {
		Name       string            `json:"name"`
		PayloadHex string            `json:"payload_hex"`
		Decoded    []json.RawMessage `json:"decoded"`
	} `json:"payloads"`
}

func loadEventVectors(t *testing.T) eventVectors {
	t.Helper()
	data, err := os.ReadFile("testdata/vllm_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v eventVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// vectorTokens recovers the 48-token sequence behind the vectors: blocks 0-1
// from the root BlockStored, block 2 from the one with a parent.
func vectorTokens(t *testing.T, v eventVectors) []uint32 {
	t.Helper()
	var toks []uint32
	for _, name := range []string{"map/block_stored_root", "map/block_stored_with_parent"} {
		for _, p := range v.Payloads {
			if p.Name != name {
				continue
			}
			var evs []struct {
				TokenIDs []uint32 `json:"token_ids"`
			}
			if err := json.Unmarshal(p.Decoded[1], &evs); err != nil {
				t.Fatal(err)
			}
			toks = append(toks, evs[0].TokenIDs...)
		}
	}
	if len(toks) != 48 {
		t.Fatalf("recovered %d tokens, want 48", len(toks))
	}
	return toks
}

// TestEventBytesEqualVectors drives the real block pool through the vectors'
// story (store blocks 0-1, decode fills block 2, evict it, reset) with the
// engine's own hasher and encoder, and compares every payload byte for byte
// with what vLLM's msgspec encoder wrote.
func TestEventBytesEqualVectors(t *testing.T) {
	v := loadEventVectors(t)
	tokens := vectorTokens(t, v)
	h, err := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})
	if err != nil {
		t.Fatal(err)
	}
	var chain []blockHash
	for _, b := range h.AppendBlocks(nil, tokens, kvhash.Extra{}) {
		chain = append(chain, blockHash{Digest: b.Digest, Wire: b.Hash})
	}
	for i, want := range v.BlockHashSource.DigestsHex {
		if got := hex.EncodeToString(chain[i].Digest); got != want || chain[i].Wire != v.BlockHashSource.WireU64[i] {
			t.Fatalf("block %d: digest %s wire %d, want %s %d", i, got, chain[i].Wire, want, v.BlockHashSource.WireU64[i])
		}
	}

	p, _ := newBlockPool(4) // 3 usable blocks
	p.reserve(3)
	var ids []blockID
	for range 2 {
		id, _ := p.allocate()
		ids = append(ids, id)
	}
	p.cacheFull(ids, chain[:2], nil, tokens[:32], kvhash.Extra{}, 0)
	stored := p.takeEvents()
	id, _ := p.allocate()
	ids = append(ids, id)
	p.cacheFull(ids[2:], chain[2:], &chain[1], tokens[32:], kvhash.Extra{}, 2)
	storedChild := p.takeEvents()
	p.free(ids) // reverse order: block 2 is now least recently used
	p.reserve(1)
	if _, err := p.allocate(); err != nil {
		t.Fatal(err)
	}
	removed := p.takeEvents()
	p.free([]blockID{ids[2]})
	if err := p.reset(); err != nil {
		t.Fatal(err)
	}
	cleared := p.takeEvents()
	if len(stored) != 1 || len(storedChild) != 1 || len(removed) != 1 || len(cleared) != 1 {
		t.Fatalf("events: %d %d %d %d", len(stored), len(storedChild), len(removed), len(cleared))
	}
	cat := func(parts ...[]poolEvent) []poolEvent {
		var out []poolEvent
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		vector string
		layout string
		events []poolEvent
		rank   int
	}{
		{"map/block_stored_root", "map", stored, 0},
		{"map/block_stored_with_parent", "map", storedChild, 0},
		{"map/block_removed", "map", removed, 0},
		{"map/all_blocks_cleared", "map", cleared, 0},
		{"map/mixed_batch_dp3", "map", cat(stored, storedChild, removed, cleared), 3},
		{"array/block_stored_root", "array", stored, 0},
		{"array/block_stored_with_parent", "array", storedChild, 0},
		{"array/block_removed", "array", removed, 0},
		{"array/all_blocks_cleared", "array", cleared, 0},
		{"array/mixed_batch_dp3", "array", cat(stored, storedChild, removed, cleared), 3},
		{"array_v0.11/mixed", "array-v0.11", cat(stored, removed, cleared), 0},
		{"array_v0.9/mixed", "array-v0.9", cat(stored, removed, cleared), 0},
	}
	for _, tc := range tests {
		t.Run(tc.vector, func(t *testing.T) {
			var want string
			for _, p := range v.Payloads {
				if p.Name == tc.vector {
					want = p.PayloadHex
				}
			}
			if want == "" {
				t.Fatalf("vector %s not found", tc.vector)
			}
			layout, err := parseEventLayout(tc.layout)
			if err != nil {
				t.Fatal(err)
			}
			got, err := encodeBatch(tc.events, 16, v.TS, tc.rank, layout, false)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != want {
				t.Errorf("payload\n got %x\nwant %s", got, want)
			}
		})
	}
}

// TestBytesHashesVector checks VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (raw
// digests on the wire) against the vector, whose event also carries a LoRA
// adapter the simulator does not serve; those fields are set by hand.
func TestBytesHashesVector(t *testing.T) {
	v := loadEventVectors(t)
	tokens := vectorTokens(t, v)
	h, _ := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})
	b := h.AppendBlocks(nil, tokens[:16], kvhash.Extra{})[0]
	p, _ := newBlockPool(3)
	p.reserve(1)
	id, _ := p.allocate()
	p.cacheFull([]blockID{id}, []blockHash{{Digest: b.Digest, Wire: b.Hash}}, nil, tokens[:16], kvhash.Extra{LoRAName: "my-lora"}, 0)
	evs := toWireEvents(p.takeEvents(), 16, true)
	evs[0].LoRAID, evs[0].HasLoRAID = 1, true
	for name, layout := range map[string]kvevents.Layout{"map/block_stored_bytes_hash_lora": kvevents.LayoutMap, "array/block_stored_bytes_hash_lora": kvevents.LayoutArrayV0_25} {
		batch := kvevents.Batch{TS: v.TS, Events: evs, HasRank: true}
		got, err := kvevents.AppendEncode(nil, &batch, layout)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range v.Payloads {
			if p.Name == name && hex.EncodeToString(got) != p.PayloadHex {
				t.Errorf("%s\n got %x\nwant %s", name, got, p.PayloadHex)
			}
		}
	}
	// A child block carries its parent as bytes too.
	p.reserve(1)
	id2, _ := p.allocate()
	b2 := h.AppendBlocks(nil, tokens[:32], kvhash.Extra{})[1]
	p.cacheFull([]blockID{id2}, []blockHash{{Digest: b2.Digest, Wire: b2.Hash}}, &blockHash{Digest: b.Digest, Wire: b.Hash}, tokens[16:32], kvhash.Extra{}, 1)
	child := toWireEvents(p.takeEvents(), 16, true)[0]
	if string(child.ParentDigest) != string(b.Digest) || string(child.HashBytes) != string(b2.Digest) || child.HashBytesLen != 32 {
		t.Errorf("child event %+v", child)
	}
}

func TestExtraKeysPerBlock(t *testing.T) {
	tests := []struct {
		name       string
		extra      kvhash.Extra
		firstBlock int
		n          int
		want       string
	}{
		{"plain", kvhash.Extra{}, 0, 2, "92c0c0"},
		{"salt on block 0 only", kvhash.Extra{CacheSalt: "s"}, 0, 2, "9291a173c0"},
		{"salt past block 0", kvhash.Extra{CacheSalt: "s"}, 1, 1, "91c0"},
		{"lora and salt", kvhash.Extra{LoRAName: "l", CacheSalt: "s"}, 0, 2, "9292a16ca17391a16c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := hex.EncodeToString(extraKeysMsgpack(tc.extra, tc.firstBlock, tc.n)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestParseEventLayout(t *testing.T) {
	for name, want := range map[string]kvevents.Layout{"map": kvevents.LayoutMap, "array": kvevents.LayoutArrayV0_25, "array-v0.9": kvevents.LayoutArrayV0_9} {
		if got, err := parseEventLayout(name); err != nil || got != want {
			t.Errorf("%s: %v %v", name, got, err)
		}
	}
	if _, err := parseEventLayout("yaml"); err == nil {
		t.Error("accepted an unknown layout")
	}
}
