package kvhash

import (
	"slices"
	"sync"

	"github.com/kvgate/kvgate/internal/segslice"
)

// chainCache makes the block hashes of a growing conversation incremental:
// it keeps the token blocks, digests and wire values of recent requests, so
// a request whose first blocks equal a cached request's (same extra keys)
// takes their hashes and continues the chain from the last shared block's
// digest. The values are a full walk's: block i's hash depends only on the
// blocks 0..i and the extra keys, which are compared exactly.
type chainCache struct {
	maxBytes int

	mu      sync.Mutex
	entries []*chainEntry // most recent last
	bytes   int
}

// chainEntry is one request's chain. Its sequences share the storage of the
// entry it extended for the blocks they have in common, so a new turn copies
// only its new blocks.
type chainEntry struct {
	lora, salt string
	tokens     segslice.Slice[uint32] // full blocks only
	digests    segslice.Slice[byte]   // DigestLen bytes per block
	hashes     segslice.Slice[uint64]
}

// cost counts the arrays the entry keeps alive; storage shared with other
// entries is counted in each, so the bound holds whatever is evicted first.
func (e *chainEntry) cost() int {
	return 4*e.tokens.Held() + e.digests.Held() + 8*e.hashes.Held() + 96
}

// chainCacheEntries bounds the chains compared per request.
const chainCacheEntries = 8

// WithChainCache keeps the hash chains of recent requests, up to maxBytes
// (tokens, digests and wire values), so a prompt that extends one is hashed
// only past the shared blocks (vLLM algorithms; docs/tokenizer.md, "Decision
// cost at long context"). Without it, or with WithDebugLogger, every block
// is hashed.
func WithChainCache(maxBytes int) Option {
	return func(h *Hasher) {
		if maxBytes > 0 {
			h.chains = &chainCache{maxBytes: maxBytes}
		}
	}
}

// longest returns the cached entry sharing the most leading blocks with
// tokens under extra, and that count.
func (c *chainCache) longest(tokens []uint32, extra Extra, bs int) (*chainEntry, int) {
	c.mu.Lock()
	cands := slices.Clone(c.entries)
	c.mu.Unlock()
	var best *chainEntry
	bestN := 0
	for _, e := range cands {
		if e.lora != extra.LoRAName || e.salt != extra.CacheSalt {
			continue
		}
		limit := min(e.tokens.Len(), len(tokens)) / bs * bs
		n := e.tokens.CommonPrefix(tokens[:limit]) / bs // the leading blocks equal in full
		if n > bestN {
			best, bestN = e, n
		}
	}
	return best, bestN
}

// store keeps e. It replaces from, the entry it extended, only when e
// shares at least 3/4 of from's blocks (the same conversation moving on):
// another user's request under the same system prompt shares only that and
// leaves from cached (as pkg/tokenizer's conversation cache does;
// docs/tokenizer.md, "Decision cost at long context").
func (c *chainCache) store(from *chainEntry, shared int, e *chainEntry) {
	cost := e.cost()
	if cost > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.entries, from); from != nil && i >= 0 && 4*shared >= 3*from.hashes.Len() {
		c.bytes -= from.cost()
		c.entries = slices.Delete(c.entries, i, i+1)
	}
	c.entries = append(c.entries, e)
	c.bytes += cost
	for len(c.entries) > chainCacheEntries || c.bytes > c.maxBytes {
		c.bytes -= c.entries[0].cost()
		c.entries = slices.Delete(c.entries, 0, 1)
	}
}

// appendCached is AppendHashes for the vLLM family through the chain cache.
func (h *Hasher) appendCached(dst []uint64, tokens []uint32, extra Extra) []uint64 {
	bs, dl := h.contract.BlockSize, h.DigestLen()
	n := len(tokens) / bs
	from, shared := h.chains.longest(tokens, extra, bs)
	digests, hashes := make([]byte, (n-shared)*dl), make([]uint64, n-shared)
	parent := h.noneHash
	e := &chainEntry{lora: extra.LoRAName, salt: extra.CacheSalt}
	if shared > 0 {
		parent = from.digests.Range(make([]byte, 0, dl), (shared-1)*dl, shared*dl)
		e.tokens, e.digests, e.hashes = from.tokens.Prefix(shared*bs), from.digests.Prefix(shared*dl), from.hashes.Prefix(shared)
	}
	s := h.scratch.Get().(*scratch)
	for i := shared; i < n; i++ {
		s.input = h.serialize(s.input[:0], parent, tokens[i*bs:(i+1)*bs], extra.LoRAName, saltFor(i, extra))
		d := h.digest(&s.parent, s.input)
		j := i - shared
		parent = digests[j*dl : (j+1)*dl]
		copy(parent, d)
		hashes[j] = WireHash(d)
	}
	h.scratch.Put(s)
	e.tokens = e.tokens.Extend(tokens[shared*bs : n*bs])
	e.digests, e.hashes = e.digests.ExtendOwned(digests), e.hashes.ExtendOwned(hashes)
	h.chains.store(from, shared, e)
	dst = e.hashes.AppendTo(dst, shared)
	return append(dst, hashes...)
}
