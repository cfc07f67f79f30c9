package enginesim

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// groupHasher hashes the engine's KV blocks (--block-size tokens) the way
// vLLM does when a KV-cache group's block is a multiple k of the hash block
// size (--hash-block-size; hybrid models, prefix_match_unit): the request's
// chain is computed at the hash block size, and a group block's hash is the
// fine-grained hash at its last hash boundary (vLLM's
// BlockHashListWithBlockSize; docs/parity.md, "Hash granularity"). With k = 1
// it is the plain hasher.
type groupHasher struct {
	h *kvhash.Hasher // at the hash block size
	k int            // group block size / hash block size
	n int            // hash block size in tokens
}

func newGroupHasher(h *kvhash.Hasher, blockSize, hashBlockSize int) (*groupHasher, error) {
	if hashBlockSize == 0 {
		hashBlockSize = blockSize
	}
	if hashBlockSize < 1 || blockSize%hashBlockSize != 0 {
		return nil, fmt.Errorf("hash-block-size %d: block-size %d must be a multiple of it", hashBlockSize, blockSize)
	}
	return &groupHasher{h: h, k: blockSize / hashBlockSize, n: hashBlockSize}, nil
}

// AppendBlocks appends every full group block of tokens: index, the digest at
// its last hash boundary (the next block's parent) and that hash.
func (g *groupHasher) AppendBlocks(dst []kvhash.Block, tokens []uint32, extra kvhash.Extra) []kvhash.Block {
	if g.k == 1 {
		return g.h.AppendBlocks(dst, tokens, extra)
	}
	for _, b := range g.h.AppendBlocks(nil, tokens, extra) {
		if (b.Index+1)%g.k == 0 {
			dst = append(dst, kvhash.Block{Index: b.Index / g.k, Digest: b.Digest, Hash: b.Hash})
		}
	}
	return dst
}

// Extend hashes group block blockIndex (k hash blocks) after parent, the
// previous group block's digest.
func (g *groupHasher) Extend(parent []byte, blockIndex int, block []uint32, extra kvhash.Extra, digestDst []byte) ([]byte, uint64) {
	if g.k == 1 {
		return g.h.Extend(parent, blockIndex, block, extra, digestDst)
	}
	var hash uint64
	d := parent
	for j := range g.k {
		d, hash = g.h.Extend(d, blockIndex*g.k+j, block[j*g.n:(j+1)*g.n], extra, nil)
	}
	return append(digestDst[:0], d...), hash
}

// AppendHashes appends the published hash of every full group block.
func (g *groupHasher) AppendHashes(dst []uint64, tokens []uint32, extra kvhash.Extra) []uint64 {
	if g.k == 1 {
		return g.h.AppendHashes(dst, tokens, extra)
	}
	for _, b := range g.AppendBlocks(nil, tokens, extra) {
		dst = append(dst, b.Hash)
	}
	return dst
}
