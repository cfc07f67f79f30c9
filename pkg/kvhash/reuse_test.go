package kvhash

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The router hashes prompt ids held in a buffer it lends out again after
// hashing (tokenizer.IDPool): the chain cache must keep copies of the
// tokens, never the caller's array. Two conversations alternate through one
// reused buffer, which is scribbled over between requests; every result
// must equal a full walk's.
func TestChainCacheCallerReusesTokens(t *testing.T) {
	c := Contract{Algo: SHA256CBOR, BlockSize: 16, Seed: SeedOf("42")}
	cached, full := cachedAndFull(t, c)
	r := rand.New(rand.NewPCG(11, 12))
	convs := make([][]uint32, 2)
	var buf []uint32
	for step := range 40 {
		conv := &convs[step%2]
		for range 16 + r.IntN(80) {
			*conv = append(*conv, uint32(r.IntN(50000)))
		}
		buf = append(buf[:0], *conv...)
		got := cached.AppendHashes(nil, buf, Extra{})
		want := full.AppendHashes(nil, *conv, Extra{})
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: hashes through the cache differ from a full walk", step)
		}
		for i := range buf[:cap(buf)] {
			buf[:cap(buf)][i] = 0xdead // the buffer is lent to another request
		}
	}
}
