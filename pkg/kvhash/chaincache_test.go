package kvhash

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// cachedAndFull are two hashers of contract c: one with a chain cache, one
// without, whose full walk a cached result must equal.
func cachedAndFull(t *testing.T, c Contract) (cached, full *Hasher) {
	t.Helper()
	cached, err := New(c, WithChainCache(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	full, err = New(c)
	if err != nil {
		t.Fatal(err)
	}
	return cached, full
}

// Random conversation growth (kept, rewritten tails, other extra keys) with
// the chain cache gives exactly a full walk's hashes, for every vLLM
// algorithm and block size.
func TestChainCacheEqualsFullWalk(t *testing.T) {
	for _, algo := range []Algo{SHA256CBOR, XXHashCBOR, SHA256, XXHash} {
		for _, bs := range []int{1, 16} {
			c := Contract{Algo: algo, BlockSize: bs, Seed: SeedOf("42")}
			cached, full := cachedAndFull(t, c)
			r := rand.New(rand.NewPCG(uint64(bs), uint64(len(algo))))
			extras := []Extra{{}, {LoRAName: "adapter"}, {CacheSalt: "salt"}}
			var tokens []uint32
			for step := range 200 {
				if r.IntN(3) == 0 && len(tokens) > 0 {
					tokens = tokens[:r.IntN(len(tokens))] // a rewritten tail
				}
				for range r.IntN(5 * bs) {
					tokens = append(tokens, uint32(r.IntN(4))) // few values: equal blocks recur
				}
				if r.IntN(10) == 0 {
					tokens = nil // another conversation
				}
				extra := extras[r.IntN(len(extras))]
				got := cached.AppendHashes([]uint64{7}, tokens, extra)
				want := full.AppendHashes([]uint64{7}, tokens, extra)
				if !slices.Equal(got, want) {
					t.Fatalf("%s bs=%d step %d: cached chain differs from a full walk", algo, bs, step)
				}
			}
			if cached.chains.bytes > 1<<20 || len(cached.chains.entries) > chainCacheEntries {
				t.Fatalf("cache over its bounds: %d bytes, %d entries", cached.chains.bytes, len(cached.chains.entries))
			}
		}
	}
}

func TestChainCacheBounded(t *testing.T) {
	h, err := New(Contract{Algo: SHA256CBOR, BlockSize: 16, Seed: SeedOf("1")}, WithChainCache(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		tokens := make([]uint32, 16*(1+r.IntN(400)))
		for i := range tokens {
			tokens[i] = r.Uint32()
		}
		h.AppendHashes(nil, tokens, Extra{})
		if h.chains.bytes > 64<<10 {
			t.Fatalf("%d bytes cached, bound 64 KiB", h.chains.bytes)
		}
	}
}
