package kvevents

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// mp builds msgpack by hand for shapes vLLM's encoder would never write.
type mp []byte

func (m mp) arr(n int) mp           { return mp(appendArrayHead(m, n)) }
func (m mp) mapn(n int) mp          { return mp(appendMapHead(m, n)) }
func (m mp) str(s string) mp        { return mp(appendStr(m, s)) }
func (m mp) uint(v uint64) mp       { return mp(appendUint(m, v)) }
func (m mp) int(v int64) mp         { return mp(appendInt(m, v)) }
func (m mp) nil() mp                { return mp(appendNil(m)) }
func (m mp) raw(b ...byte) mp       { return append(m, b...) }
func (m mp) f64(f float64) mp       { return mp(appendFloat64(m, f)) }
func (m mp) bin(b []byte) mp        { return mp(appendBin(m, b)) }
func (m mp) kv(k string, v mp) mp   { return append(m.str(k), v...) }
func batch(events ...mp) mp         { return batchN(3, events...) }
func batchN(n int, events ...mp) mp { return wrapEvents(mp(nil).arr(n).f64(1.5), n, events) }

func wrapEvents(m mp, n int, events []mp) mp {
	m = m.arr(len(events))
	for _, e := range events {
		m = append(m, e...)
	}
	if n >= 3 {
		m = m.uint(0)
		for i := 3; i < n; i++ {
			m = m.str("extra")
		}
	}
	return m
}

func storedMap(hashes mp, nHashes int) mp {
	return mp(nil).mapn(4).kv("type", mp(nil).str("BlockStored")).
		kv("block_hashes", append(mp(nil).arr(nHashes), hashes...)).
		kv("parent_block_hash", mp(nil).nil()).
		kv("block_size", mp(nil).uint(16))
}

func decodeOK(t *testing.T, payload []byte) *Batch {
	t.Helper()
	var d Decoder
	var b Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatalf("Decode(%x): %v", payload, err)
	}
	return &b
}

// Block hashes decode from every msgpack integer width, signed or unsigned
// (same 64 bits), and from bytes (trailing 8 bytes).
func TestHashWidths(t *testing.T) {
	digest32 := bytes.Repeat([]byte{0xab}, 24)
	digest32 = append(digest32, 0xd3, 0xeb, 0x9b, 0x4d, 0x6e, 0xb5, 0x9c, 0x30)
	tests := []struct {
		name string
		enc  mp
		want uint64
	}{
		{"positive fixint", mp(nil).raw(0x05), 5},
		{"uint8", mp(nil).raw(0xcc, 0xfe), 0xfe},
		{"uint16", mp(nil).raw(0xcd, 0xbe, 0xef), 0xbeef},
		{"uint32", mp(nil).raw(0xce, 0xde, 0xad, 0xbe, 0xef), 0xdeadbeef},
		{"uint64", mp(nil).raw(0xcf, 0xd3, 0xeb, 0x9b, 0x4d, 0x6e, 0xb5, 0x9c, 0x30), 15270469718401981488},
		{"negative fixint", mp(nil).raw(0xff), math.MaxUint64},
		{"int8", mp(nil).raw(0xd0, 0x80), uint64(1<<64 - 128)},
		{"int8 positive", mp(nil).raw(0xd0, 0x7f), 127},
		{"int16", mp(nil).raw(0xd1, 0x80, 0x00), uint64(1<<64 - 32768)},
		{"int32", mp(nil).raw(0xd2, 0xff, 0xff, 0xff, 0xfe), uint64(1<<64 - 2)},
		{"int64 (signed view of a u64 hash)", mp(nil).raw(0xd3, 0xd3, 0xeb, 0x9b, 0x4d, 0x6e, 0xb5, 0x9c, 0x30), 15270469718401981488},
		{"int64 positive", mp(nil).raw(0xd3, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00), 1 << 32},
		{"bin8 32 bytes", mp(nil).bin(digest32), 15270469718401981488},
		{"bin8 16 bytes", mp(nil).bin(digest32[16:]), 15270469718401981488},
		{"bin16", mp(nil).raw(0xc5, 0x00, 0x08).raw(digest32[24:]...), 15270469718401981488},
		{"bin 3 bytes", mp(nil).bin([]byte{1, 2, 3}), 0x010203},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := decodeOK(t, batch(storedMap(tt.enc, 1)))
			if len(b.Events) != 1 || len(b.Events[0].BlockHashes) != 1 {
				t.Fatalf("events %+v", b.Events)
			}
			if got := b.Events[0].BlockHashes[0]; got != tt.want {
				t.Errorf("hash = %d (%#x), want %d", got, got, tt.want)
			}
			// The parent hash follows the same rules.
			ev := mp(nil).mapn(3).kv("type", mp(nil).str("BlockStored")).
				kv("block_hashes", mp(nil).arr(1).uint(1)).kv("parent_block_hash", tt.enc)
			p := decodeOK(t, batch(ev)).Events[0]
			if !p.HasParent || p.ParentBlockHash != tt.want {
				t.Errorf("parent = %d/%v, want %d", p.ParentBlockHash, p.HasParent, tt.want)
			}
		})
	}
}

func TestTolerance(t *testing.T) {
	cleared := mp(nil).mapn(1).kv("type", mp(nil).str("AllBlocksCleared"))
	tests := []struct {
		name    string
		payload mp
		events  []EventType
		check   func(t *testing.T, b *Batch)
		unknown [2]int // fields, events
		bad     [2]int // events, fields
	}{
		{
			name: "unknown map fields skipped",
			payload: batch(mp(nil).mapn(5).kv("type", mp(nil).str("BlockRemoved")).
				kv("session_id", mp(nil).str("s-1")).
				kv("block_hashes", mp(nil).arr(1).uint(7)).
				kv("future", mp(nil).mapn(1).kv("x", mp(nil).arr(2).f64(1).bin([]byte{1}))).
				kv("medium", mp(nil).str("CPU"))),
			events: []EventType{BlockRemoved},
			check: func(t *testing.T, b *Batch) {
				eq(t, b.Events[0].Medium, "CPU")
				eq(t, b.Events[0].BlockHashes, []uint64{7})
			},
			unknown: [2]int{2, 0},
		},
		{
			name: "type key not first",
			payload: batch(mp(nil).mapn(2).kv("block_hashes", mp(nil).arr(2).uint(1).uint(2)).
				kv("type", mp(nil).str("BlockRemoved"))),
			events: []EventType{BlockRemoved},
		},
		{
			name: "unknown event types skipped",
			payload: batch(mp(nil).mapn(2).kv("type", mp(nil).str("BlockPinned")).kv("block_hashes", mp(nil).arr(0)),
				mp(nil).arr(3).str("SomethingNew").uint(1).arr(0),
				mp(nil).str("not an event"),
				mp(nil).arr(0),
				cleared),
			events:  []EventType{AllBlocksCleared},
			unknown: [2]int{0, 4},
		},
		{
			name:    "future array positions skipped",
			payload: batch(mp(nil).arr(6).str("BlockRemoved").arr(1).uint(9).str("GPU").uint(0).str("LOCAL").nil()),
			events:  []EventType{BlockRemoved},
			check: func(t *testing.T, b *Batch) {
				eq(t, b.Events[0].GroupIdx, int64(0))
				eq(t, b.Events[0].HasGroupIdx, true)
			},
			unknown: [2]int{2, 0},
		},
		{
			name: "token_ids missing, empty or mismatched still apply",
			payload: batch(storedMap(mp(nil).uint(1).uint(2), 2),
				mp(nil).mapn(3).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).arr(1).uint(3)).kv("token_ids", mp(nil).arr(0)),
				mp(nil).mapn(3).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).arr(2).uint(4).uint(5)).kv("token_ids", mp(nil).arr(3).uint(1).uint(2).uint(3)),
				mp(nil).mapn(3).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).arr(1).uint(6)).kv("token_ids", mp(nil).nil())),
			events: []EventType{BlockStored, BlockStored, BlockStored, BlockStored},
			check: func(t *testing.T, b *Batch) {
				eq(t, len(b.Events[0].TokenIDs), 0)
				eq(t, b.Events[2].TokenIDs, []uint32{1, 2, 3})
				eq(t, b.Events[3].BlockHashes, []uint64{6})
			},
		},
		{
			name: "malformed token ids dropped, event kept",
			payload: batch(mp(nil).mapn(3).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).arr(1).uint(3)).
				kv("token_ids", mp(nil).arr(3).uint(1).int(-1).uint(1<<33)),
				mp(nil).mapn(3).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).arr(1).uint(4)).
					kv("token_ids", mp(nil).str("oops"))),
			events: []EventType{BlockStored, BlockStored},
			check: func(t *testing.T, b *Batch) {
				eq(t, len(b.Events[0].TokenIDs), 0)
				eq(t, b.Events[1].BlockHashes, []uint64{4})
			},
			bad: [2]int{0, 2},
		},
		{
			name: "malformed optional fields dropped",
			payload: batch(mp(nil).mapn(6).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).arr(1).uint(3)).
				kv("block_size", mp(nil).uint(1<<40)).kv("medium", mp(nil).uint(1)).kv("lora_id", mp(nil).str("x")).
				kv("group_idx", mp(nil).uint(math.MaxUint64))),
			events: []EventType{BlockStored},
			check:  func(t *testing.T, b *Batch) { eq(t, b.Events[0].BlockSize, 0); eq(t, b.Events[0].Medium, "") },
			bad:    [2]int{0, 4},
		},
		{
			name: "malformed hashes skip the event only",
			payload: batch(mp(nil).mapn(2).kv("type", mp(nil).str("BlockStored")).kv("block_hashes", mp(nil).str("abc")),
				mp(nil).mapn(2).kv("type", mp(nil).str("BlockRemoved")).kv("block_hashes", mp(nil).arr(2).uint(1).str("x")),
				mp(nil).mapn(1).kv("type", mp(nil).str("BlockRemoved")),
				mp(nil).arr(1).str("BlockStored"),
				cleared),
			events: []EventType{AllBlocksCleared},
			bad:    [2]int{4, 0},
		},
		{
			name:    "2-element batch",
			payload: batchN(2, cleared),
			events:  []EventType{AllBlocksCleared},
			check:   func(t *testing.T, b *Batch) { eq(t, b.Legacy, true); eq(t, b.HasRank, false) },
		},
		{
			name:    "longer batch array",
			payload: batchN(5, cleared),
			events:  []EventType{AllBlocksCleared},
			check:   func(t *testing.T, b *Batch) { eq(t, b.HasRank, true) },
			unknown: [2]int{2, 0},
		},
		{
			name:    "nil rank",
			payload: mp(nil).arr(3).f64(2).arr(0).nil(),
			check:   func(t *testing.T, b *Batch) { eq(t, b.HasRank, false); eq(t, b.TS, 2.0) },
		},
		{
			name:    "integer and float32 timestamps",
			payload: mp(nil).arr(3).uint(1757500000).arr(0).uint(2),
			check:   func(t *testing.T, b *Batch) { eq(t, b.TS, 1757500000.0); eq(t, b.DataParallelRank, 2) },
		},
		{
			name: "map-shaped batch",
			payload: mp(nil).mapn(4).kv("ts", mp(nil).raw(0xca, 0x3f, 0xc0, 0x00, 0x00)).kv("events", mp(nil).arr(1).raw(cleared...)).
				kv("data_parallel_rank", mp(nil).uint(1)).kv("publisher", mp(nil).str("x")),
			events:  []EventType{AllBlocksCleared},
			check:   func(t *testing.T, b *Batch) { eq(t, b.TS, 1.5); eq(t, b.DataParallelRank, 1) },
			unknown: [2]int{1, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			var b Batch
			if err := d.Decode(tt.payload, &b); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var types []EventType
			for _, e := range b.Events {
				types = append(types, e.Type)
			}
			if !reflect.DeepEqual(types, tt.events) {
				t.Fatalf("events %v, want %v", types, tt.events)
			}
			if b.UnknownFields != tt.unknown[0] || b.UnknownEvents != tt.unknown[1] {
				t.Errorf("unknown fields/events = %d/%d, want %v", b.UnknownFields, b.UnknownEvents, tt.unknown)
			}
			if b.BadEvents != tt.bad[0] || b.BadFields != tt.bad[1] {
				t.Errorf("bad events/fields = %d/%d, want %v", b.BadEvents, b.BadFields, tt.bad)
			}
			if d.Stats.UnknownEvents != uint64(tt.unknown[1]) || d.Stats.Batches != 1 || d.Stats.Events != uint64(len(tt.events)) {
				t.Errorf("stats %+v", d.Stats)
			}
			if tt.check != nil {
				tt.check(t, &b)
			}
		})
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func eq[T any](t *testing.T, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestMalformedPayloads(t *testing.T) {
	good := batch(mp(nil).mapn(1).kv("type", mp(nil).str("AllBlocksCleared")))
	tests := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"not an array", mp(nil).str("hello")},
		{"one element", mp(nil).arr(1).f64(1)},
		{"ts not a number", mp(nil).arr(3).str("x").arr(0).nil()},
		{"events not an array", mp(nil).arr(3).f64(1).uint(3).nil()},
		{"truncated", good[:len(good)-3]},
		{"trailing bytes", append(append(mp(nil), good...), 0x00)},
		{"huge array count", mp(nil).arr(3).f64(1).raw(0xdd, 0xff, 0xff, 0xff, 0xff)},
		{"huge map count", mp(nil).arr(3).f64(1).arr(1).raw(0xdf, 0xff, 0xff, 0xff, 0xff)},
		{"huge str", mp(nil).arr(3).f64(1).arr(1).mapn(1).raw(0xdb, 0xff, 0xff, 0xff, 0xff)},
		{"0xc1", mp(nil).arr(3).f64(1).arr(1).raw(0xc1).nil()},
		{"map batch without events", mp(nil).mapn(1).kv("ts", mp(nil).f64(1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			b := Batch{TS: 9, Events: []Event{{Type: BlockStored}}}
			err := d.Decode(tt.payload, &b)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode = %v, want *DecodeError", err)
			}
			if len(b.Events) != 0 || b.TS != 0 || d.Stats.Errors != 1 {
				t.Errorf("batch not reset after error: %+v, stats %+v", b, d.Stats)
			}
		})
	}
}

// randomBatch builds a batch the encoder can write in any layout.
func randomBatch(r *rand.Rand, layout Layout) *Batch {
	b := &Batch{TS: float64(r.IntN(1<<30)) / 4, HasRank: layout != LayoutArrayV0_9 && r.IntN(2) == 0}
	if b.HasRank {
		b.DataParallelRank = r.IntN(300)
	}
	b.Legacy = layout == LayoutArrayV0_9
	for range r.IntN(6) {
		var e Event
		switch r.IntN(3) {
		case 0:
			e.Type = BlockStored
			n := 1 + r.IntN(20)
			for range n {
				e.BlockHashes = append(e.BlockHashes, r.Uint64()>>uint(r.IntN(64)))
			}
			if r.IntN(2) == 0 {
				e.HasParent, e.ParentBlockHash = true, r.Uint64()
			}
			for range n * 16 {
				e.TokenIDs = append(e.TokenIDs, r.Uint32()>>uint(r.IntN(32)))
			}
			e.BlockSize = 16
			if layout != LayoutArrayV0_9 {
				e.Medium = []string{"GPU", "CPU", "STORAGE"}[r.IntN(3)]
			}
			if layout == LayoutMap || layout == LayoutArrayV0_25 || layout == LayoutArrayV0_15 {
				if r.IntN(2) == 0 {
					e.LoRAName, e.HasLoRAID, e.LoRAID = "adapter-x", true, int64(r.IntN(100))
				}
			}
			if layout == LayoutMap || layout == LayoutArrayV0_25 {
				e.HasGroupIdx, e.GroupIdx = true, int64(r.IntN(3))
				e.KVCacheSpecKind = "sliding_window"
				e.HasSlidingWindow, e.SlidingWindow = true, int64(r.IntN(5000))
				e.ExtraKeys = appendNil(appendArrayHead(nil, 1))
			}
		case 1:
			e.Type = BlockRemoved
			for range 1 + r.IntN(40) {
				e.BlockHashes = append(e.BlockHashes, r.Uint64())
			}
			if layout != LayoutArrayV0_9 {
				e.Medium = "GPU"
			}
			if layout == LayoutMap || layout == LayoutArrayV0_25 {
				e.HasGroupIdx = true
			}
		default:
			e.Type = AllBlocksCleared
		}
		b.Events = append(b.Events, e)
	}
	return b
}

// TestRoundTripAndLibraryOracle: random batches in every layout encode,
// decode back to the same values, re-encode to the same bytes, and read the
// same through vmihailenco/msgpack.
func TestRoundTripAndLibraryOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var d Decoder
	var got Batch
	for _, layout := range []Layout{LayoutMap, LayoutArrayV0_25, LayoutArrayV0_15, LayoutArrayV0_11, LayoutArrayV0_9} {
		for i := 0; i < 300; i++ {
			want := randomBatch(r, layout)
			payload, err := AppendEncode(nil, want, layout)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(payload, &got); err != nil {
				t.Fatalf("%v: %v", layout, err)
			}
			again, _ := AppendEncode(nil, &got, layout)
			if !bytes.Equal(again, payload) {
				t.Fatalf("%v: re-encode differs", layout)
			}
			if len(got.Events) != len(want.Events) || got.TS != want.TS || got.HasRank != want.HasRank || got.DataParallelRank != want.DataParallelRank {
				t.Fatalf("%v: batch header differs", layout)
			}
			for j := range want.Events {
				w, g := &want.Events[j], &got.Events[j]
				if g.Type != w.Type || !slicesEqual(g.BlockHashes, w.BlockHashes) || g.ParentBlockHash != w.ParentBlockHash ||
					len(g.TokenIDs) != len(w.TokenIDs) || g.Medium != w.Medium || g.LoRAName != w.LoRAName || g.GroupIdx != w.GroupIdx {
					t.Fatalf("%v event %d: got %+v want %+v", layout, j, g, w)
				}
			}
			var generic []any
			if err := msgpack.Unmarshal(payload, &generic); err != nil {
				t.Fatalf("%v: library cannot read our payload: %v", layout, err)
			}
			if len(generic) != 3 && !(layout == LayoutArrayV0_9 && len(generic) == 2) {
				t.Fatalf("%v: outer length %d", layout, len(generic))
			}
			evs := generic[1].([]any)
			for j, ev := range evs {
				var hs []any
				if m, ok := ev.(map[string]any); ok {
					hs, _ = m["block_hashes"].([]any)
				} else if a := ev.([]any); len(a) > 1 {
					hs, _ = a[1].([]any)
				}
				if want.Events[j].Type != AllBlocksCleared && !reflect.DeepEqual(libHashes(hs), want.Events[j].BlockHashes) {
					t.Fatalf("%v event %d: library reads hashes %v", layout, j, hs)
				}
			}
		}
	}
}

// TestLibraryEncodedPayloads decodes payloads written by vmihailenco/msgpack,
// which picks different integer encodings (signed int64 for Go int64s).
func TestLibraryEncodedPayloads(t *testing.T) {
	hashes := []int64{-5758849010611061604, 7061248444022211509, -1, 0, 127, 128, -33}
	payload, err := msgpack.Marshal([]any{1.25, []any{
		map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": int64(-2),
			"token_ids": []int32{1, 300, 70000}, "block_size": int8(16), "medium": "GPU", "lora_name": nil},
		[]any{"BlockRemoved", []uint64{math.MaxUint64, 1}, "CPU"},
	}, int64(3)})
	if err != nil {
		t.Fatal(err)
	}
	b := decodeOK(t, payload)
	want := make([]uint64, len(hashes))
	for i, h := range hashes {
		want[i] = uint64(h)
	}
	eq(t, b.Events[0].BlockHashes, want)
	eq(t, b.Events[0].ParentBlockHash, uint64(math.MaxUint64-1))
	eq(t, b.Events[0].TokenIDs, []uint32{1, 300, 70000})
	eq(t, b.Events[0].BlockSize, 16)
	eq(t, b.Events[1].BlockHashes, []uint64{math.MaxUint64, 1})
	eq(t, b.Events[1].Medium, "CPU")
	eq(t, b.DataParallelRank, 3)
}

func TestEncodeErrors(t *testing.T) {
	if _, err := AppendEncode(nil, &Batch{Events: []Event{{Type: Unknown}}}, LayoutMap); err == nil {
		t.Error("unknown event type encoded")
	}
	if _, err := AppendEncode(nil, &Batch{}, Layout(99)); err == nil {
		t.Error("unknown layout accepted")
	}
}

func TestDecodeZeroAllocs(t *testing.T) {
	v := loadEventVectors(t)
	var payloads [][]byte
	for _, p := range v.Payloads {
		payloads = append(payloads, mustHex(t, p.PayloadHex))
	}
	var d Decoder
	var b Batch
	decodeAll := func() {
		for _, p := range payloads {
			if err := d.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
		}
	}
	decodeAll() // warm: grow slices, intern the LoRA name
	decodeAll()
	if n := testing.AllocsPerRun(100, decodeAll); n != 0 {
		t.Errorf("Decode allocates %.1f per %d payloads in steady state", n, len(payloads))
	}
}

func TestAppendExtraKeys(t *testing.T) {
	tests := []struct {
		first, n   int
		lora, salt string
		want       []any
	}{
		{0, 2, "", "", []any{nil, nil}},                      // vector map/block_stored_root
		{0, 1, "my-lora", "", []any{[]any{"my-lora"}}},       // vector map/block_stored_bytes_hash_lora
		{0, 2, "l", "s", []any{[]any{"l", "s"}, []any{"l"}}}, // salt on block 0 only
		{2, 2, "", "s", []any{nil, nil}},                     // later blocks: no salt
		{0, 0, "l", "s", []any{}},
	}
	for _, tt := range tests {
		raw := AppendExtraKeys(nil, tt.first, tt.n, tt.lora, tt.salt)
		var got []any
		if err := msgpack.Unmarshal(raw, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("AppendExtraKeys(%d,%d,%q,%q) = %v, want %v", tt.first, tt.n, tt.lora, tt.salt, got, tt.want)
		}
	}
	if got := AppendExtraKeys(nil, 0, 2, "", ""); !bytes.Equal(got, []byte{0x92, 0xc0, 0xc0}) {
		t.Errorf("plain = %x", got)
	}
}
