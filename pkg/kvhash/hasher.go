// Package kvhash computes prefix-cache block hashes as pure functions: vLLM
// v1's four algorithms, SGLang's page hash (sha256_sglang) and TensorRT-LLM's
// v1 block key (blockhash_trtllm); the last two are specified in
// docs/engines.md.
//
// The contract (algorithm, block size, NONE_HASH seed) is an explicit value;
// the package never reads the environment. Block i of a token sequence is
// hashed as H(serialize((parent, tuple(tokens[i*bs:(i+1)*bs]), extra_keys)))
// where parent is the previous block's full digest (NONE_HASH = H(serialize(seed))
// for block 0), serialize is canonical CBOR (sha256_cbor, xxhash_cbor) or
// pickle protocol 5 (vLLM's default sha256 and xxhash), and H is SHA-256 or
// XXH3-128 (16 bytes, big-endian). Only full blocks are hashed. The 64-bit
// value vLLM publishes in KV events is the last 8 digest bytes, big-endian.
//
// Knobs: none of its own. The daemon and kvctl map LLB_KV_NONE_HASH_SEED to
// Contract.Seed and LLB_KV_HASH_DEBUG=1 to WithDebugLogger.
// Metrics: none; callers time AppendHashes if they want a histogram.
package kvhash

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"

	"github.com/zeebo/xxh3"
)

// maxDigestLen is the longest digest of a supported algorithm (SHA-256).
const maxDigestLen = 32

// Contract is what must match between kvgate and every vLLM engine for the
// block hashes to agree.
type Contract struct {
	Algo      Algo
	BlockSize int
	Seed      Seed
}

// String renders the contract for logs.
func (c Contract) String() string {
	return fmt.Sprintf("algo=%s block_size=%d seed=%s", string(c.Algo), c.BlockSize, c.Seed)
}

// Extra holds a request's extra hash keys. vLLM: the LoRA adapter name goes
// into every block, cache_salt into block 0 only. SGLang: cache_salt seeds
// the chain and the LoRA name namespaces every published hash. TensorRT-LLM:
// the LoRA task id goes into every block (the name is not hashed) and the
// cache_salt's id into the first. Empty strings mean absent (the engines skip
// a falsy cache_salt).
type Extra struct {
	LoRAName  string
	CacheSalt string
	// LoRATaskID is TensorRT-LLM's lora_task_id, used only when
	// HasLoRATaskID is set (0 is a valid task id).
	LoRATaskID    uint64
	HasLoRATaskID bool
}

// Block is one hashed block.
type Block struct {
	Index  int
	Digest []byte // full digest: the next block's parent
	Hash   uint64 // the value the engine publishes (vLLM: last 8 digest bytes, big-endian)
}

// engineKind picks the hash family of a contract.
type engineKind uint8

const (
	engineVLLM engineKind = iota
	engineSGLang
	engineTRTLLM
)

// Option configures a Hasher.
type Option func(*Hasher)

// WithDebugLogger logs one line per hashed block (index, algorithm, token
// count, u64 and the serialized hash input in hex) to l at Info level.
// A nil l leaves logging off, which costs one nil check per block.
func WithDebugLogger(l *slog.Logger) Option {
	return func(h *Hasher) { h.debug = l }
}

// Hasher computes block hashes for one contract. It is immutable (apart from
// the optional chain cache) and safe for concurrent use; per-call scratch space comes from a pool, so hashing does
// not allocate in steady state.
type Hasher struct {
	contract Contract
	kind     engineKind
	noneHash []byte // vLLM's NONE_HASH; empty for SGLang, 8 zero bytes for TensorRT-LLM
	debug    *slog.Logger
	scratch  sync.Pool   // *scratch
	chains   *chainCache // nil: every call hashes every block (WithChainCache)
}

type scratch struct {
	input  []byte
	parent [maxDigestLen]byte
}

// New validates c and computes its NONE_HASH. Errors: *UnknownAlgoError,
// *UnsupportedError (sha256_sglang, blockhash_trtllm), *UnsetSeedError
// (xxhash family without a seed), *BlockSizeError.
func New(c Contract, opts ...Option) (*Hasher, error) {
	if !c.Algo.known() {
		return nil, &UnknownAlgoError{Name: string(c.Algo)}
	}
	if !c.Algo.Supported() {
		return nil, &UnsupportedError{Algo: c.Algo}
	}
	if c.BlockSize < 1 || c.BlockSize > MaxBlockSize {
		return nil, &BlockSizeError{Size: c.BlockSize}
	}
	h := &Hasher{contract: c}
	for _, o := range opts {
		o(h)
	}
	h.scratch.New = func() any { return &scratch{input: make([]byte, 0, 64+8*c.BlockSize)} }
	switch c.Algo {
	case SHA256SGLang:
		// No parent and no seed: the seed is ignored, PYTHONHASHSEED plays no part.
		h.kind, h.noneHash = engineSGLang, []byte{}
		return h, nil
	case BlockHashTRTLLM:
		h.kind, h.noneHash = engineTRTLLM, make([]byte, 8)
		return h, nil
	}
	seed, err := c.Seed.effective(c.Algo)
	if err != nil {
		return nil, err
	}
	var in []byte
	if c.Algo.usesPickle() {
		in = appendPickleStr(nil, seed)
	} else {
		in = appendCBORText(nil, seed)
	}
	var d [maxDigestLen]byte
	h.noneHash = append([]byte(nil), h.digest(&d, in)...)
	return h, nil
}

// Contract returns the contract h was built for.
func (h *Hasher) Contract() Contract { return h.contract }

// NoneHash returns a copy of NONE_HASH, the parent of block 0.
func (h *Hasher) NoneHash() []byte { return append([]byte(nil), h.noneHash...) }

// DigestLen is the length of every digest h produces.
func (h *Hasher) DigestLen() int { return h.contract.Algo.DigestLen() }

// WireHash is the 64-bit value vLLM publishes for a digest
// (int.from_bytes(digest, "big") & (2**64-1)): its last 8 bytes, big-endian.
func WireHash(digest []byte) uint64 {
	if len(digest) >= 8 {
		return binary.BigEndian.Uint64(digest[len(digest)-8:])
	}
	var v uint64
	for _, b := range digest {
		v = v<<8 | uint64(b)
	}
	return v
}

// digest hashes in into d and returns the digest slice of d.
func (h *Hasher) digest(d *[maxDigestLen]byte, in []byte) []byte {
	if h.contract.Algo.usesXXH3() {
		s := xxh3.Hash128(in)
		binary.BigEndian.PutUint64(d[0:8], s.Hi)
		binary.BigEndian.PutUint64(d[8:16], s.Lo)
		return d[:16]
	}
	*d = sha256.Sum256(in)
	return d[:32]
}

// serialize appends the hash input of one block to dst.
func (h *Hasher) serialize(dst, parent []byte, tokens []uint32, lora, salt string) []byte {
	if h.contract.Algo.usesPickle() {
		return appendPickleBlock(dst, parent, tokens, lora, salt)
	}
	return appendCBORBlock(dst, parent, tokens, lora, salt)
}

// HashInput appends the exact bytes vLLM feeds to the digest for one block
// (parent nil = NONE_HASH). blockIndex decides whether cache_salt applies.
//
// SGLang: the prior digest (nil = the chain root, the cache_salt prior if
// any) and the page's little-endian u32 tokens. TensorRT-LLM mixes integers
// and has no byte input: dst is returned unchanged.
func (h *Hasher) HashInput(dst, parent []byte, blockIndex int, block []uint32, extra Extra) []byte {
	switch h.kind {
	case engineSGLang:
		if parent == nil {
			parent = SGLangSaltPrior(extra.CacheSalt)
		}
		return appendSGLangInput(dst, parent, block)
	case engineTRTLLM:
		return dst
	}
	if parent == nil {
		parent = h.noneHash
	}
	return h.serialize(dst, parent, block, extra.LoRAName, saltFor(blockIndex, extra))
}

func saltFor(blockIndex int, extra Extra) string {
	if blockIndex == 0 {
		return extra.CacheSalt
	}
	return ""
}

// walk hashes every full block of tokens in order, calling emit with each
// block's index, digest (valid until the next call) and wire value.
func (h *Hasher) walk(tokens []uint32, extra Extra, emit func(i int, digest []byte, hash uint64)) {
	bs := h.contract.BlockSize
	n := len(tokens) / bs
	if n == 0 {
		return
	}
	if h.kind != engineVLLM {
		h.walkEngine(tokens, extra, emit)
		return
	}
	s := h.scratch.Get().(*scratch)
	parent := h.noneHash
	for i := 0; i < n; i++ {
		block := tokens[i*bs : (i+1)*bs]
		s.input = h.serialize(s.input[:0], parent, block, extra.LoRAName, saltFor(i, extra))
		parent = h.digest(&s.parent, s.input)
		u := WireHash(parent)
		if h.debug != nil {
			h.logBlock(i, len(block), u, s.input)
		}
		emit(i, parent, u)
	}
	h.scratch.Put(s)
}

// AppendHashes appends the wire value of every full block of tokens to dst.
// A trailing partial block has no hash. Steady state: no allocations beyond
// growing dst.
func (h *Hasher) AppendHashes(dst []uint64, tokens []uint32, extra Extra) []uint64 {
	bs := h.contract.BlockSize
	n := len(tokens) / bs
	if n == 0 {
		return dst
	}
	switch h.kind {
	case engineSGLang:
		return h.appendSGLang(dst, tokens, extra)
	case engineTRTLLM:
		return h.appendTRTLLM(dst, tokens, extra)
	}
	if h.chains != nil && h.debug == nil {
		return h.appendCached(dst, tokens, extra)
	}
	s := h.scratch.Get().(*scratch)
	parent := h.noneHash
	for i := 0; i < n; i++ {
		block := tokens[i*bs : (i+1)*bs]
		s.input = h.serialize(s.input[:0], parent, block, extra.LoRAName, saltFor(i, extra))
		parent = h.digest(&s.parent, s.input)
		u := WireHash(parent)
		if h.debug != nil {
			h.logBlock(i, len(block), u, s.input)
		}
		dst = append(dst, u)
	}
	h.scratch.Put(s)
	return dst
}

// AppendBlocks appends every full block of tokens, with its full digest, to dst.
// The digests of one call share one allocation.
func (h *Hasher) AppendBlocks(dst []Block, tokens []uint32, extra Extra) []Block {
	n := len(tokens) / h.contract.BlockSize
	if n == 0 {
		return dst
	}
	dl := h.DigestLen()
	digests := make([]byte, n*dl)
	h.walk(tokens, extra, func(i int, digest []byte, hash uint64) {
		d := digests[i*dl : (i+1)*dl : (i+1)*dl]
		copy(d, digest)
		dst = append(dst, Block{Index: i, Digest: d, Hash: hash})
	})
	return dst
}

// Extend hashes one block given its parent digest (nil = NONE_HASH), as an
// engine does when a decode step fills a block. blockIndex is the block's
// position in the request (cache_salt applies to block 0 only). The caller
// passes a full block; its length is not checked against the block size.
// The digest is appended to digestDst[:0], so a caller that reuses a buffer
// with room for DigestLen bytes does not allocate.
//
// SGLang: parent nil is the chain root (the cache_salt prior, if any) and
// hash carries the LoRA namespace. TensorRT-LLM: parent is the parent's
// uint64, big-endian (nil = 0, the first block, which takes the salt id).
func (h *Hasher) Extend(parent []byte, blockIndex int, block []uint32, extra Extra, digestDst []byte) (digest []byte, hash uint64) {
	if h.kind != engineVLLM {
		return h.extendEngine(parent, blockIndex, block, extra, digestDst)
	}
	if parent == nil {
		parent = h.noneHash
	}
	s := h.scratch.Get().(*scratch)
	s.input = h.serialize(s.input[:0], parent, block, extra.LoRAName, saltFor(blockIndex, extra))
	d := h.digest(&s.parent, s.input)
	hash = WireHash(d)
	if h.debug != nil {
		h.logBlock(blockIndex, len(block), hash, s.input)
	}
	digest = digestDst[:0] // the caller's buffer, reused
	digest = append(digest, d...)
	h.scratch.Put(s)
	return digest, hash
}

// logBlock writes the debug line for one block. Kept out of line so the
// disabled path costs only the nil check.
//
//go:noinline
func (h *Hasher) logBlock(index, nTokens int, hash uint64, input []byte) {
	h.debug.LogAttrs(context.Background(), slog.LevelInfo, "kv_hash",
		slog.Int("blk", index),
		slog.String("algo", string(h.contract.Algo)),
		slog.Int("n_tokens", nTokens),
		slog.Int("input_len", len(input)),
		slog.String("hash", fmt.Sprintf("0x%016x", hash)),
		slog.Uint64("u64", hash),
		slog.String("input", hex.EncodeToString(input)),
	)
}
