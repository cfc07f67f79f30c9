package kvhash

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"testing"
)

// engineVectors mirrors testdata/engines/engine_hash_vectors.json, produced by
// testdata/engines/gen_engine_hash_vectors.py from SGLang's and
// TensorRT-LLM's own hashing code (provenance inside the file).
type engineVectors struct {
	SGLang []struct {
		Name      string   `json:"name"`
		Tokens    []uint64 `json:"tokens"`
		PageSize  int      `json:"page_size"`
		CacheSalt *string  `json:"cache_salt"`
		LoRAName  *string  `json:"lora_name"`
		Digests   []string `json:"digests_hex"`
		Hashes    []int64  `json:"hashes_i64"`
	} `json:"sglang"`
	SGLangRejected []struct {
		Name     string   `json:"name"`
		Tokens   []uint64 `json:"tokens"`
		PageSize int      `json:"page_size"`
	} `json:"sglang_rejected"`
	TRTLLM []struct {
		Name        string   `json:"name"`
		Tokens      []uint64 `json:"tokens"`
		BlockSize   int      `json:"block_size"`
		LoRATaskID  *uint64  `json:"lora_task_id"`
		CacheSalt   *string  `json:"cache_salt"`
		CacheSaltID *uint64  `json:"cache_salt_id"`
		Hashes      []uint64 `json:"hashes_u64"`
	} `json:"trtllm"`
}

func loadEngineVectors(t testing.TB) *engineVectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/engines/engine_hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v engineVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.SGLang) == 0 || len(v.TRTLLM) == 0 || len(v.SGLangRejected) == 0 {
		t.Fatal("engine vector file has no cases")
	}
	return &v
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func narrow(tokens []uint64) ([]uint32, bool) {
	out := make([]uint32, len(tokens))
	for i, t := range tokens {
		if t > math.MaxUint32 {
			return nil, false
		}
		out[i] = uint32(t)
	}
	return out, true
}

func TestSGLangVectors(t *testing.T) {
	v := loadEngineVectors(t)
	for _, c := range v.SGLang {
		t.Run(c.Name, func(t *testing.T) {
			h, err := New(Contract{Algo: SHA256SGLang, BlockSize: c.PageSize})
			if err != nil {
				t.Fatal(err)
			}
			extra := Extra{CacheSalt: str(c.CacheSalt), LoRAName: str(c.LoRAName)}
			want := make([]uint64, len(c.Hashes))
			for i, x := range c.Hashes {
				want[i] = uint64(x) // the published int64, compared as a 64-bit pattern
			}
			blocks, err := h.AppendBlocksWide(nil, c.Tokens, extra)
			if err != nil {
				t.Fatal(err)
			}
			if len(blocks) != len(want) {
				t.Fatalf("got %d pages, want %d (full pages only)", len(blocks), len(want))
			}
			for i, b := range blocks {
				if b.Hash != want[i] || hex.EncodeToString(b.Digest) != c.Digests[i] {
					t.Errorf("page %d: hash %d digest %x; want %d %s", i, int64(b.Hash), b.Digest, c.Hashes[i], c.Digests[i])
				}
			}
			ids, ok := narrow(c.Tokens)
			if !ok {
				return
			}
			got := h.AppendHashes(nil, ids, extra)
			if len(got) != len(want) {
				t.Fatalf("AppendHashes: %d hashes, want %d", len(got), len(want))
			}
			var parent []byte
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("AppendHashes page %d = %d, want %d", i, int64(got[i]), c.Hashes[i])
				}
				d, u := h.Extend(parent, i, ids[i*c.PageSize:(i+1)*c.PageSize], extra, nil)
				if u != want[i] || hex.EncodeToString(d) != c.Digests[i] {
					t.Errorf("Extend page %d = %d %x, want %d %s", i, int64(u), d, c.Hashes[i], c.Digests[i])
				}
				parent = d
			}
		})
	}
	for _, c := range v.SGLangRejected {
		t.Run(c.Name, func(t *testing.T) {
			h, _ := New(Contract{Algo: SHA256SGLang, BlockSize: c.PageSize})
			_, err := h.AppendBlocksWide(nil, c.Tokens, Extra{})
			var re *TokenRangeError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want *TokenRangeError (SGLang rejects it too)", err)
			}
		})
	}
}

func TestTRTLLMVectors(t *testing.T) {
	v := loadEngineVectors(t)
	for _, c := range v.TRTLLM {
		t.Run(c.Name, func(t *testing.T) {
			h, err := New(Contract{Algo: BlockHashTRTLLM, BlockSize: c.BlockSize})
			if err != nil {
				t.Fatal(err)
			}
			extra := Extra{CacheSalt: str(c.CacheSalt)}
			if c.LoRATaskID != nil {
				extra.LoRATaskID, extra.HasLoRATaskID = *c.LoRATaskID, true
			}
			if c.CacheSaltID != nil {
				if id, ok := TRTLLMCacheSaltID(*c.CacheSalt); !ok || id != *c.CacheSaltID {
					t.Errorf("TRTLLMCacheSaltID(%q) = %d, %v; want %d", *c.CacheSalt, id, ok, *c.CacheSaltID)
				}
			}
			ids, ok := narrow(c.Tokens)
			if !ok {
				t.Fatal("TensorRT-LLM token ids are 32-bit")
			}
			got := h.AppendHashes(nil, ids, extra)
			if len(got) != len(c.Hashes) {
				t.Fatalf("got %d blocks, want %d (full blocks only)", len(got), len(c.Hashes))
			}
			var parent []byte
			for i := range got {
				if got[i] != c.Hashes[i] {
					t.Errorf("block %d = %d, want %d", i, got[i], c.Hashes[i])
				}
				d, u := h.Extend(parent, i, ids[i*c.BlockSize:(i+1)*c.BlockSize], extra, nil)
				if u != c.Hashes[i] || binary.BigEndian.Uint64(d) != u {
					t.Errorf("Extend block %d = %d (%x), want %d", i, u, d, c.Hashes[i])
				}
				parent = d
			}
			blocks, err := h.AppendBlocksWide(nil, c.Tokens, extra)
			if err != nil || len(blocks) != len(c.Hashes) {
				t.Fatalf("AppendBlocksWide: %d blocks, %v", len(blocks), err)
			}
		})
	}
}

// TestEngineContracts covers what the vectors cannot: seeds play no part,
// token ranges, and the request-side segmentation helper.
func TestEngineContracts(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	for _, a := range []Algo{SHA256SGLang, BlockHashTRTLLM} {
		unset, err := New(Contract{Algo: a, BlockSize: 4})
		if err != nil {
			t.Fatalf("%s unset seed: %v", a, err)
		}
		seeded, _ := New(Contract{Algo: a, BlockSize: 4, Seed: SeedOf("0")})
		x, y := unset.AppendHashes(nil, toks, Extra{}), seeded.AppendHashes(nil, toks, Extra{})
		if len(x) != 2 || x[0] != y[0] || x[1] != y[1] {
			t.Errorf("%s: seed changed the hashes: %v vs %v", a, x, y)
		}
		if _, err := New(Contract{Algo: a, BlockSize: 0}); err == nil {
			t.Errorf("%s: block size 0 accepted", a)
		}
		if got := unset.DigestLen(); got != a.DigestLen() || len(unset.NoneHash()) > got {
			t.Errorf("%s: DigestLen %d NoneHash %x", a, got, unset.NoneHash())
		}
		if a.UsesSeed() {
			t.Errorf("%s: UsesSeed", a)
		}
	}
	trt, _ := New(Contract{Algo: BlockHashTRTLLM, BlockSize: 2})
	if _, err := trt.AppendBlocksWide(nil, []uint64{1, 1 << 32}, Extra{}); err == nil {
		t.Error("blockhash_trtllm accepted a token above uint32")
	}
	if !SHA256SGLang.SignedWire() || BlockHashTRTLLM.SignedWire() || SHA256CBOR.SignedWire() {
		t.Error("SignedWire")
	}
	if got := TRTLLMRequestTokens([]uint32{1, 2, 3}); len(got) != 2 {
		t.Errorf("TRTLLMRequestTokens = %v", got)
	}
	if got := TRTLLMRequestTokens(nil); len(got) != 0 {
		t.Errorf("TRTLLMRequestTokens(nil) = %v", got)
	}
	// LoRA names do not enter TensorRT-LLM hashes; task ids do.
	a := trt.AppendHashes(nil, toks, Extra{LoRAName: "x"})
	b := trt.AppendHashes(nil, toks, Extra{})
	c := trt.AppendHashes(nil, toks, Extra{HasLoRATaskID: true})
	if a[0] != b[0] || c[0] == b[0] {
		t.Errorf("trtllm lora: name %d none %d task0 %d", a[0], b[0], c[0])
	}
}

func BenchmarkEngineHashes(b *testing.B) {
	toks := make([]uint32, 4096)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	for _, a := range []Algo{SHA256CBOR, SHA256SGLang, BlockHashTRTLLM} {
		h, _ := New(Contract{Algo: a, BlockSize: 16, Seed: SeedOf("0")})
		dst := make([]uint64, 0, 256)
		b.Run(string(a), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(toks)))
			for i := 0; i < b.N; i++ {
				dst = h.AppendHashes(dst[:0], toks, Extra{})
			}
		})
	}
}
