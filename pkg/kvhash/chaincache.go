package kvhash

import (
	"slices"
	"sync"
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

type chainEntry struct {
	lora, salt string
	tokens     []uint32 // full blocks only
	digests    []byte   // DigestLen bytes per block
	hashes     []uint64
}

func (e *chainEntry) cost() int { return 4*len(e.tokens) + len(e.digests) + 8*len(e.hashes) + 96 }

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
		limit := min(len(e.tokens), len(tokens)) / bs * bs
		n := commonTokens(e.tokens[:limit], tokens[:limit]) / bs // the leading blocks equal in full
		if n > bestN {
			best, bestN = e, n
		}
	}
	return best, bestN
}

// commonTokens is the length of the longest common prefix of a and b,
// compared a thousand tokens at a time (a block-by-block comparison cost
// more in calls than in comparing on a 100k-token prompt).
func commonTokens(a, b []uint32) int {
	n := min(len(a), len(b))
	const span = 1024
	i := 0
	for i+span <= n && slices.Equal(a[i:i+span], b[i:i+span]) {
		i += span
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

func (c *chainCache) store(from *chainEntry, e *chainEntry) {
	cost := e.cost()
	if cost > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.entries, from); from != nil && i >= 0 {
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
	e := &chainEntry{lora: extra.LoRAName, salt: extra.CacheSalt,
		tokens: slices.Clone(tokens[:n*bs]), digests: make([]byte, n*dl), hashes: make([]uint64, n)}
	parent := h.noneHash
	if shared > 0 {
		copy(e.digests, from.digests[:shared*dl])
		copy(e.hashes, from.hashes[:shared])
		parent = e.digests[(shared-1)*dl : shared*dl]
	}
	s := h.scratch.Get().(*scratch)
	for i := shared; i < n; i++ {
		s.input = h.serialize(s.input[:0], parent, tokens[i*bs:(i+1)*bs], extra.LoRAName, saltFor(i, extra))
		d := h.digest(&s.parent, s.input)
		parent = e.digests[i*dl : (i+1)*dl]
		copy(parent, d)
		e.hashes[i] = WireHash(d)
	}
	h.scratch.Put(s)
	h.chains.store(from, e)
	return append(dst, e.hashes...)
}
