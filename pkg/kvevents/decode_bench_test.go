package kvevents

import (
	"math/rand/v2"
	"testing"
)

// benchPayload is a realistic busy step: 32 BlockStored events of 4 blocks
// (64 tokens) each plus 32 BlockRemoved events of 4 hashes, map layout.
func benchPayload(b *testing.B, layout Layout) ([]byte, int) {
	r := rand.New(rand.NewPCG(13, 14))
	batch := &Batch{TS: 1757500000.25, HasRank: true}
	for i := 0; i < 32; i++ {
		e := Event{Type: BlockStored, BlockSize: 16, Medium: "GPU", HasParent: i%2 == 1, ParentBlockHash: r.Uint64(),
			HasGroupIdx: true, KVCacheSpecKind: "full_attention", ExtraKeys: []byte{0x94, 0xc0, 0xc0, 0xc0, 0xc0}}
		for range 4 {
			e.BlockHashes = append(e.BlockHashes, r.Uint64())
		}
		for range 64 {
			e.TokenIDs = append(e.TokenIDs, uint32(r.IntN(152000)))
		}
		batch.Events = append(batch.Events, e, Event{Type: BlockRemoved, Medium: "GPU", HasGroupIdx: true,
			BlockHashes: []uint64{r.Uint64(), r.Uint64(), r.Uint64(), r.Uint64()}})
	}
	p, err := AppendEncode(nil, batch, layout)
	if err != nil {
		b.Fatal(err)
	}
	return p, len(batch.Events)
}

// BenchmarkDecode reports events decoded per second.
//
//	go test -run '^$' -bench Decode -benchmem ./pkg/kvevents/
func BenchmarkDecode(b *testing.B) {
	for _, layout := range []Layout{LayoutMap, LayoutArrayV0_25} {
		b.Run(layout.String(), func(b *testing.B) {
			payload, events := benchPayload(b, layout)
			var d Decoder
			var batch Batch
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	payload, events := benchPayload(b, LayoutMap)
	var d Decoder
	var batch Batch
	if err := d.Decode(payload, &batch); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, len(payload))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendEncode(buf[:0], &batch, LayoutMap)
	}
	b.ReportMetric(float64(b.N*events)/b.Elapsed().Seconds(), "events/s")
}
