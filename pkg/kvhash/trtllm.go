package kvhash

import (
	"crypto/sha256"
	"encoding/binary"
)

// TensorRT-LLM's v1 block key hash (docs/engines.md, "TensorRT-LLM block
// hashes"): BlockKeyHasher::hash folds a block's token ids, the request's
// LoRA task id and, on the first block only, its cache-salt id into a uint64
// seeded by the block length and the parent block's hash (0 for the first).

const (
	trtHash32Const  = 0x45D9F3B
	trtHash64Const1 = 0xBF58476D1CE4E5B9
	trtHash64Const2 = 0x94D049BB133111EB
	trtCombineConst = 0x9E3779B9
	trtParentConst  = 0xBF58476D1CE4E5B9
)

// trtMix32 mixes a 32-bit value. The golden-ratio constant is added in 32
// bits (uint32 + uint32 in the C++), before the 64-bit seed terms.
func trtMix32(a uint32, seed uint64) uint64 {
	a = ((a >> 16) ^ a) * trtHash32Const
	a = ((a >> 16) ^ a) * trtHash32Const
	a = (a >> 16) ^ a
	a += trtCombineConst
	return seed ^ (uint64(a) + (seed << 6) + (seed >> 2))
}

// trtMix64 mixes a 64-bit value (splitmix64's finalizer, then a 64-bit combine).
func trtMix64(b, seed uint64) uint64 {
	b = (b ^ (b >> 30)) * trtHash64Const1
	b = (b ^ (b >> 27)) * trtHash64Const2
	b ^= b >> 31
	return seed ^ (b + trtCombineConst + (seed << 6) + (seed >> 2))
}

// TRTLLMCacheSaltID derives TensorRT-LLM's cache-salt id from a cache_salt:
// the first 8 bytes of SHA-256 over its UTF-8 bytes, little-endian, as
// tensorrt_llm/runtime/kv_cache_hash.py get_cache_salt_id does in the version
// docs/engines.md names. ok is false for an empty salt (absent).
func TRTLLMCacheSaltID(salt string) (id uint64, ok bool) {
	if salt == "" {
		return 0, false
	}
	d := sha256.Sum256([]byte(salt))
	return binary.LittleEndian.Uint64(d[:8]), true
}

// TRTLLMKeys are the per-request inputs of a block key besides its tokens:
// the LoRA task id (every block) and the cache-salt id (the first block).
type TRTLLMKeys struct {
	LoRATaskID    uint64
	HasLoRATaskID bool
	SaltID        uint64
	HasSaltID     bool
}

// TRTLLMBlockHash is BlockKeyHasher::hash for one text block (no
// prompt-tuning extra ids, no multimodal keys). As in the engine, the salt
// id enters when the parent hash is 0, which is the first block.
func TRTLLMBlockHash(tokens []uint32, parent uint64, k TRTLLMKeys) uint64 {
	seed := uint64(len(tokens)) ^ parent*trtParentConst
	if parent == 0 && k.HasSaltID {
		seed = trtMix64(k.SaltID, seed)
	}
	for _, t := range tokens {
		seed = trtMix32(t, seed)
	}
	if k.HasLoRATaskID {
		seed = trtMix64(k.LoRATaskID, seed)
	}
	return seed
}

// TRTLLMRequestTokens returns the prefix of a prompt whose blocks
// TensorRT-LLM's KV cache manager stores and reuses: every token but the
// last, whose KV state is not yet computed when blocks are keyed
// (kvCacheManager.cpp, usableSize = size - 1). The request path hashes this
// prefix; kvctl hash hashes exactly what it is given.
func TRTLLMRequestTokens(prompt []uint32) []uint32 {
	if len(prompt) == 0 {
		return prompt
	}
	return prompt[:len(prompt)-1]
}
