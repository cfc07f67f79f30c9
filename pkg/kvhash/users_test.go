package kvhash

import (
	"math/rand/v2"
	"testing"
)

// Requests of several users under one system prompt share only its blocks:
// a user's request must not evict another user's chain (it used to replace
// the entry it started from whatever it shared), while the same
// conversation moving on still replaces its own.
func TestChainCacheKeepsOtherUsers(t *testing.T) {
	h, err := New(Contract{Algo: SHA256CBOR, BlockSize: 16, Seed: SeedOf("7")}, WithChainCache(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(17, 18))
	random := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = r.Uint32N(150000)
		}
		return out
	}
	system := random(64)
	users := make([][]uint32, 3)
	for i := range users {
		users[i] = append(append([]uint32(nil), system...), random(1600)...)
		h.AppendHashes(nil, users[i], Extra{})
	}
	for i, u := range users {
		next := append(append([]uint32(nil), u...), random(100)...)
		from, shared := h.chains.longest(next, Extra{}, 16)
		if from == nil || shared != len(u)/16 {
			t.Fatalf("user %d's next turn shares %d cached blocks, want their whole history (%d)", i, shared, len(u)/16)
		}
		h.AppendHashes(nil, next, Extra{})
	}
	if n := len(h.chains.entries); n != len(users) {
		t.Fatalf("%d chains cached, want one per user", n)
	}
}
