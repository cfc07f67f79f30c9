package kvhash

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

var supportedAlgos = []Algo{SHA256CBOR, XXHashCBOR, SHA256, XXHash}

func mustNew(t testing.TB, c Contract, opts ...Option) *Hasher {
	t.Helper()
	h, err := New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func randomTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		switch r.IntN(4) {
		case 0:
			out[i] = uint32(r.IntN(300))
		case 1:
			out[i] = uint32(r.IntN(200000))
		case 2:
			out[i] = r.Uint32()
		default:
			out[i] = uint32(r.IntN(70000))
		}
	}
	return out
}

// TestCBORMatchesFxamacker proves the hand-written encoder byte-equal to
// fxamacker/cbor's canonical mode for random blocks, parents and extra keys.
func TestCBORMatchesFxamacker(t *testing.T) {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	extras := []Extra{{}, {LoRAName: "my-lora"}, {CacheSalt: "tenant-a"}, {LoRAName: "ü", CacheSalt: "ü"},
		{LoRAName: strings.Repeat("l", 23)}, {LoRAName: strings.Repeat("l", 24), CacheSalt: strings.Repeat("s", 256)},
		{CacheSalt: strings.Repeat("s", 65536)}}
	for i := 0; i < 2000; i++ {
		n := []int{0, 1, 15, 16, 23, 24, 255, 256, 300, 65535, 65536}[r.IntN(11)]
		if n >= 65535 && i%50 != 0 {
			n = 16
		}
		tokens := randomTokens(r, n)
		parent := make([]byte, []int{16, 32, 0, 1, 24, 255, 256}[r.IntN(7)])
		for j := range parent {
			parent[j] = byte(r.Uint32())
		}
		extra := extras[r.IntN(len(extras))]
		var keys any
		var ks []string
		if extra.LoRAName != "" {
			ks = append(ks, extra.LoRAName)
		}
		if extra.CacheSalt != "" {
			ks = append(ks, extra.CacheSalt)
		}
		if ks != nil {
			keys = ks
		}
		want, err := em.Marshal([]any{parent, tokens, keys})
		if err != nil {
			t.Fatal(err)
		}
		got := appendCBORBlock(nil, parent, tokens, extra.LoRAName, extra.CacheSalt)
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d (n=%d parent=%d extra=%+v):\n got %x\nwant %x", i, n, len(parent), extra, got, want)
		}
		seed := strings.Repeat("s", r.IntN(300))
		if want, _ := em.Marshal(seed); !bytes.Equal(appendCBORText(nil, seed), want) {
			t.Fatalf("seed of %d bytes differs", len(seed))
		}
	}
}

// TestPrefixProperty: the hashes of a prefix are a prefix of the hashes,
// every way of computing them agrees, and a trailing partial block adds none.
func TestPrefixProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, algo := range supportedAlgos {
		for _, bs := range []int{1, 3, 16, 64} {
			h := mustNew(t, Contract{Algo: algo, BlockSize: bs, Seed: SeedOf("0")})
			for iter := 0; iter < 20; iter++ {
				tokens := randomTokens(r, r.IntN(8*bs+bs))
				extra := []Extra{{}, {LoRAName: "lora"}, {CacheSalt: "salt"}}[iter%3]
				all := h.AppendHashes(nil, tokens, extra)
				if len(all) != len(tokens)/bs {
					t.Fatalf("%s bs=%d: %d hashes for %d tokens", algo, bs, len(all), len(tokens))
				}
				for cut := 0; cut <= len(tokens); cut += 1 + r.IntN(bs) {
					pre := h.AppendHashes(nil, tokens[:cut], extra)
					if len(pre) != cut/bs {
						t.Fatalf("%s bs=%d cut=%d: %d hashes", algo, bs, cut, len(pre))
					}
					for i := range pre {
						if pre[i] != all[i] {
							t.Fatalf("%s bs=%d: prefix %d hash %d differs", algo, bs, cut, i)
						}
					}
				}
				// Incremental Extend, as an engine fills blocks during decode.
				var parent []byte
				buf := make([]byte, 0, 32)
				for i := range all {
					var u uint64
					parent, u = h.Extend(parent, i, tokens[i*bs:(i+1)*bs], extra, append([]byte(nil), buf...))
					if u != all[i] {
						t.Fatalf("%s bs=%d: Extend block %d = %d, want %d", algo, bs, i, u, all[i])
					}
				}
			}
		}
	}
}

// Extra keys change every block (LoRA) or only block 0 (cache_salt).
func TestExtraKeysScope(t *testing.T) {
	tokens := randomTokens(rand.New(rand.NewPCG(5, 6)), 64)
	for _, algo := range supportedAlgos {
		h := mustNew(t, Contract{Algo: algo, BlockSize: 16, Seed: SeedOf("0")})
		plain := h.AppendBlocks(nil, tokens, Extra{})
		lora := h.AppendBlocks(nil, tokens, Extra{LoRAName: "a"})
		salt := h.AppendBlocks(nil, tokens, Extra{CacheSalt: "s"})
		for i := range plain {
			if lora[i].Hash == plain[i].Hash {
				t.Errorf("%s: LoRA did not change block %d", algo, i)
			}
			if salt[i].Hash == plain[i].Hash {
				t.Errorf("%s: cache_salt did not change block %d (chained)", algo, i)
			}
		}
		// Block 1 onward: salt only acts through the parent, not the block's own keys.
		d1, _ := h.Extend(salt[0].Digest, 1, tokens[16:32], Extra{}, nil)
		if !bytes.Equal(d1, salt[1].Digest) {
			t.Errorf("%s: cache_salt applied beyond block 0", algo)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	tokens := randomTokens(rand.New(rand.NewPCG(7, 8)), 160)
	for _, algo := range supportedAlgos {
		h := mustNew(t, Contract{Algo: algo, BlockSize: 16, Seed: SeedOf("0")})
		dst := make([]uint64, 0, 16)
		buf := make([]byte, 0, 32)
		extra := Extra{LoRAName: "lora", CacheSalt: "salt"}
		if n := testing.AllocsPerRun(200, func() { dst = h.AppendHashes(dst[:0], tokens, extra) }); n != 0 {
			t.Errorf("%s: AppendHashes allocates %.1f per call", algo, n)
		}
		if n := testing.AllocsPerRun(200, func() { buf, _ = h.Extend(nil, 0, tokens[:16], extra, buf) }); n != 0 {
			t.Errorf("%s: Extend allocates %.1f per call", algo, n)
		}
	}
}

func TestDebugHook(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	h := mustNew(t, Contract{Algo: SHA256CBOR, BlockSize: 16, Seed: SeedOf("0")}, WithDebugLogger(log))
	blocks := h.AppendBlocks(nil, tokens, Extra{})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d debug lines, want 2:\n%s", len(lines), out.String())
	}
	for i, line := range lines {
		in := h.HashInput(nil, blocksParent(h, blocks, i), i, tokens[i*16:(i+1)*16], Extra{})
		for _, want := range []string{
			fmt.Sprintf("blk=%d", i), "algo=sha256_cbor", "n_tokens=16",
			fmt.Sprintf("u64=%d", blocks[i].Hash), fmt.Sprintf("hash=0x%016x", blocks[i].Hash),
			"input=" + hex.EncodeToString(in),
		} {
			if !strings.Contains(line, want) {
				t.Errorf("line %d %q lacks %q", i, line, want)
			}
		}
	}
	// Off: nothing logged, and the hasher without a logger gives the same hashes.
	plain := mustNew(t, Contract{Algo: SHA256CBOR, BlockSize: 16, Seed: SeedOf("0")})
	if got := plain.AppendHashes(nil, tokens, Extra{}); got[0] != blocks[0].Hash || got[1] != blocks[1].Hash {
		t.Error("debug logger changed the hashes")
	}
}

func blocksParent(h *Hasher, blocks []Block, i int) []byte {
	if i == 0 {
		return h.NoneHash()
	}
	return blocks[i-1].Digest
}
