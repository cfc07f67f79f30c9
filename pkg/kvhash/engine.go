package kvhash

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// The SGLang and TensorRT-LLM paths of Hasher. Both chain from the previous
// block like vLLM, so they share Hasher's API; they differ in what a digest
// is (SGLang: the raw SHA-256; TensorRT-LLM: the uint64 itself) and in how
// the request's extras enter (docs/engines.md).

// trtKeys returns the LoRA task id and cache-salt id of a request.
func trtKeys(extra Extra) TRTLLMKeys {
	k := TRTLLMKeys{LoRATaskID: extra.LoRATaskID, HasLoRATaskID: extra.HasLoRATaskID}
	k.SaltID, k.HasSaltID = TRTLLMCacheSaltID(extra.CacheSalt)
	return k
}

// appendSGLang appends the published hash of every full page of tokens.
func (h *Hasher) appendSGLang(dst []uint64, tokens []uint32, extra Extra) []uint64 {
	bs := h.contract.BlockSize
	n := len(tokens) / bs
	lora := newSGLangLoRA(extra.LoRAName)
	s := h.scratch.Get().(*scratch)
	var parent []byte
	if extra.CacheSalt != "" {
		parent = append(s.parent[:0], SGLangSaltPrior(extra.CacheSalt)...)
	}
	for i := 0; i < n; i++ {
		s.input = appendSGLangInput(s.input[:0], parent, tokens[i*bs:(i+1)*bs])
		s.parent = sha256.Sum256(s.input)
		parent = s.parent[:]
		u := lora.apply(SGLangWire(parent))
		if h.debug != nil {
			h.logBlock(i, bs, u, s.input)
		}
		dst = append(dst, u)
	}
	h.scratch.Put(s)
	return dst
}

// appendTRTLLM appends the hash of every full block of tokens.
func (h *Hasher) appendTRTLLM(dst []uint64, tokens []uint32, extra Extra) []uint64 {
	bs := h.contract.BlockSize
	n := len(tokens) / bs
	k := trtKeys(extra)
	var parent uint64
	for i := 0; i < n; i++ {
		parent = TRTLLMBlockHash(tokens[i*bs:(i+1)*bs], parent, k)
		if h.debug != nil {
			h.logBlock(i, bs, parent, nil)
		}
		dst = append(dst, parent)
	}
	return dst
}

// walkEngine is walk for the SGLang and TensorRT-LLM contracts.
func (h *Hasher) walkEngine(tokens []uint32, extra Extra, emit func(i int, digest []byte, hash uint64)) {
	bs := h.contract.BlockSize
	n := len(tokens) / bs
	var d [maxDigestLen]byte
	var parent []byte
	for i := 0; i < n; i++ {
		digest, u := h.extendEngine(parent, i, tokens[i*bs:(i+1)*bs], extra, d[:0])
		emit(i, digest, u)
		parent = digest
	}
}

// extendEngine is Extend for the SGLang and TensorRT-LLM contracts.
func (h *Hasher) extendEngine(parent []byte, blockIndex int, block []uint32, extra Extra, digestDst []byte) ([]byte, uint64) {
	if h.kind == engineTRTLLM {
		var p uint64
		if len(parent) == 8 {
			p = binary.BigEndian.Uint64(parent)
		}
		u := TRTLLMBlockHash(block, p, trtKeys(extra))
		if h.debug != nil {
			h.logBlock(blockIndex, len(block), u, nil)
		}
		return binary.BigEndian.AppendUint64(digestDst[:0], u), u
	}
	if parent == nil {
		parent = SGLangSaltPrior(extra.CacheSalt)
	}
	s := h.scratch.Get().(*scratch)
	s.input = appendSGLangInput(s.input[:0], parent, block)
	s.parent = sha256.Sum256(s.input)
	u := newSGLangLoRA(extra.LoRAName).apply(SGLangWire(s.parent[:]))
	if h.debug != nil {
		h.logBlock(blockIndex, len(block), u, s.input)
	}
	digest := digestDst[:0] // the caller's buffer, reused
	digest = append(digest, s.parent[:]...)
	h.scratch.Put(s)
	return digest, u
}

// AppendBlocksWide is AppendBlocks for 64-bit token ids. Ids that fit in
// uint32 hash exactly as AppendBlocks does. SGLang's native hasher accepts
// ids up to 2^63-1 and hashes a page holding one above uint32 in its wide
// form; every other algorithm takes uint32 ids only. An id out of range is a
// *TokenRangeError.
func (h *Hasher) AppendBlocksWide(dst []Block, tokens []uint64, extra Extra) ([]Block, error) {
	limit := uint64(math.MaxUint32)
	if h.kind == engineSGLang {
		limit = math.MaxInt64
	}
	narrow := true
	for i, t := range tokens {
		if t > limit {
			return dst, &TokenRangeError{Algo: h.contract.Algo, Index: i, Token: t, Max: limit}
		}
		narrow = narrow && t <= math.MaxUint32
	}
	if narrow {
		ids := make([]uint32, len(tokens))
		for i, t := range tokens {
			ids[i] = uint32(t)
		}
		return h.AppendBlocks(dst, ids, extra), nil
	}
	bs := h.contract.BlockSize
	n := len(tokens) / bs
	lora := newSGLangLoRA(extra.LoRAName)
	parent := SGLangSaltPrior(extra.CacheSalt)
	digests := make([]byte, n*32)
	hh := sha256.New()
	var d [maxDigestLen]byte
	for i := 0; i < n; i++ {
		out := sglangWidePage(hh, &d, parent, tokens[i*bs:(i+1)*bs])
		dg := digests[i*32 : (i+1)*32 : (i+1)*32]
		copy(dg, out)
		dst = append(dst, Block{Index: i, Digest: dg, Hash: lora.apply(SGLangWire(dg))})
		parent = dg
	}
	return dst, nil
}
