package kvhash

import (
	"crypto/sha256"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

// Benchmarks report ns per 16-token block for every algorithm, beside the
// floor: raw SHA-256 (and XXH3-128) of an input of the same size as that
// algorithm's serialized block, measured in the same run. Compare with
//
//	go test -run '^$' -bench 'Block' -benchmem ./pkg/kvhash/
//
// hashing rate / floor rate = floor ns / algo ns (goal >= 0.8 for SHA-256).

const benchBlocks = 64

func benchTokens() []uint32 {
	// Realistic vocabulary ids (Qwen/Llama range): mostly 3-byte CBOR / 5-byte pickle ints.
	r := rand.New(rand.NewPCG(9, 10))
	t := make([]uint32, 16*benchBlocks)
	for i := range t {
		t[i] = uint32(r.IntN(152000))
	}
	return t
}

func BenchmarkBlock(b *testing.B) {
	tokens := benchTokens()
	for _, algo := range supportedAlgos {
		h := mustNew(b, Contract{Algo: algo, BlockSize: 16, Seed: SeedOf("0")})
		in := h.HashInput(nil, nil, 1, tokens[16:32], Extra{})
		b.Run(string(algo), func(b *testing.B) {
			dst := make([]uint64, 0, benchBlocks)
			b.SetBytes(int64(len(in)) * benchBlocks)
			b.ReportAllocs()
			for b.Loop() {
				dst = h.AppendHashes(dst[:0], tokens, Extra{})
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBlocks), "ns/block")
		})
		b.Run(string(algo)+"/raw_sha256_same_size", func(b *testing.B) {
			b.SetBytes(int64(len(in)) * benchBlocks)
			for b.Loop() {
				for range benchBlocks {
					s := sha256.Sum256(in)
					in[0] ^= s[0] // chain like the real thing so nothing is hoisted
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBlocks), "ns/block")
		})
		if algo.usesXXH3() {
			b.Run(string(algo)+"/raw_xxh3_128_same_size", func(b *testing.B) {
				b.SetBytes(int64(len(in)) * benchBlocks)
				for b.Loop() {
					for range benchBlocks {
						s := xxh3.Hash128(in)
						in[0] ^= byte(s.Lo)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBlocks), "ns/block")
			})
		}
	}
}

// BenchmarkExtend is the engine simulator's path: one block at a time.
func BenchmarkExtend(b *testing.B) {
	tokens := benchTokens()
	for _, algo := range supportedAlgos {
		h := mustNew(b, Contract{Algo: algo, BlockSize: 16, Seed: SeedOf("0")})
		b.Run(string(algo), func(b *testing.B) {
			buf := make([]byte, 0, 32)
			parent := make([]byte, 0, 32)
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = h.Extend(nil, 1, tokens[:16], Extra{}, buf)
				parent = append(parent[:0], buf...)
			}
			_ = parent
		})
	}
}
