package enginesim

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// TestGroupHasher: with a group block of k hash blocks, the published hashes
// are every k-th hash of the fine chain (vLLM's example: 64 tokens, hash
// block 16, group block 32 → the 2nd and 4th 16-token hashes), and extending
// block by block gives the same chain as hashing the prompt at once.
func TestGroupHasher(t *testing.T) {
	prompt := seqIDs(1, 64)
	extra := kvhash.Extra{CacheSalt: "s"}
	fine, err := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})
	if err != nil {
		t.Fatal(err)
	}
	chain := fine.AppendHashes(nil, prompt, extra)
	cases := []struct {
		group int
		want  []uint64
	}{
		{16, chain},
		{32, []uint64{chain[1], chain[3]}},
		{64, []uint64{chain[3]}},
	}
	for _, tc := range cases {
		g, err := newHasher(Config{HashAlgo: "sha256_cbor", BlockSize: tc.group, HashBlockSize: 16, PythonHashSeed: "0", HashSeedSet: true, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if got := g.AppendHashes(nil, prompt, extra); !slices.Equal(got, tc.want) {
			t.Errorf("group %d: hashes %x, want %x", tc.group, got, tc.want)
		}
		var parent []byte
		for i, b := range g.AppendBlocks(nil, prompt, extra) {
			d, h := g.Extend(parent, i, prompt[i*tc.group:(i+1)*tc.group], extra, nil)
			if h != b.Hash || string(d) != string(b.Digest) || b.Index != i {
				t.Errorf("group %d block %d: Extend %x, AppendBlocks %x (index %d)", tc.group, i, h, b.Hash, b.Index)
			}
			parent = d
		}
	}
	if _, err := newHasher(Config{HashAlgo: "sha256_cbor", BlockSize: 24, HashBlockSize: 16, Logger: quietLogger()}); err == nil {
		t.Error("block-size 24 over hash-block-size 16 accepted")
	}
	if err := (Config{BlockSize: 24, HashBlockSize: 16}).withDefaults().validate(); err == nil {
		t.Error("validate accepted block-size 24 over hash-block-size 16")
	}
}
