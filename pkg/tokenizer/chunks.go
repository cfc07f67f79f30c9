package tokenizer

import (
	"hash/maphash"
	"sync"
	"unicode/utf8"
)

// chunkCache is the warm path: the ids of text chunks cut at boundaries the
// GPT-4 family pre-tokenizer never crosses. Chunks are cut from the start of a
// section at the first safe boundary after min bytes, so two prompts sharing a
// prefix share all their chunks but the one where they diverge.
type chunkCache struct {
	min      int
	perShard int // byte budget per shard
	seed     maphash.Seed
	shards   [16]chunkShard
}

// chunkShard's entries live in an idTable, which the GC does not scan: a
// full cache holds tens of thousands of chunks.
type chunkShard struct {
	mu    sync.RWMutex
	t     *idTable
	bytes int
}

// Chunk shard blocks: chunks are about chunkMin (1 KiB) of text each. 8 KiB
// blocks keep a nearly empty cache small (64 KiB ones made the cold encode
// of a 32k-token prompt 12% slower after a reset, in fresh memory) and a
// full shard (4 MiB) at a few hundred GC objects instead of ~8k.
const (
	chunkTextBlock = 8 << 10
	chunkIDsBlock  = 2 << 10
)

func newChunkCache(budget, min int) *chunkCache {
	c := &chunkCache{min: min, perShard: budget / 16, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].t = newIDTable(chunkTextBlock, chunkIDsBlock)
	}
	return c
}

// get returns the cached ids of s, which the caller must not modify.
func (c *chunkCache) get(s string) ([]uint32, bool) {
	h := maphash.String(c.seed, s)
	sh := &c.shards[h&15]
	sh.mu.RLock()
	ids, ok := sh.t.get(h, s)
	sh.mu.RUnlock()
	return ids, ok
}

func (c *chunkCache) put(s string, ids []uint32) {
	cost := len(s) + 4*len(ids) + 64
	if cost > c.perShard {
		return
	}
	h := maphash.String(c.seed, s)
	sh := &c.shards[h&15]
	sh.mu.Lock()
	if _, dup := sh.t.get(h, s); !dup {
		if sh.bytes+cost > c.perShard {
			sh.t.reset()
			sh.bytes = 0
		}
		sh.t.put(h, s, ids)
		sh.bytes += cost
	}
	sh.mu.Unlock()
}

// reset empties the cache (benchmarks of the cold path).
func (c *chunkCache) reset() {
	for i := range c.shards {
		c.shards[i].mu.Lock()
		c.shards[i].t.reset()
		c.shards[i].bytes = 0
		c.shards[i].mu.Unlock()
	}
}

// safeBoundary reports whether the GPT-4 family scanner always has a match
// boundary at p (0 < p < len(s)) and matches from p on independently of what
// precedes p. Two cases qualify:
//   - s[p-1] is '\n' and s[p] is not whitespace: no alternative can hold a
//     newline followed by a non-newline, non-space character, except
//     ` ?[^\s\p{L}\p{N}]+[\r\n]*` which must end right there;
//   - s[p] is ' ' between two letters: the letter run before p ends at p
//     (letters only appear in a contraction or `[^\r\n\p{L}\p{N}]?\p{L}+`).
//
// The pattern has no lookbehind, so matching from p ignores what precedes it.
func safeBoundary(s string, p int) bool {
	switch s[p] {
	case ' ':
		if p+1 >= len(s) {
			return false
		}
		before, _ := utf8.DecodeLastRuneInString(s[:p])
		after, _ := decode(s, p+1)
		return classOf(before) == classLetter && classOf(after) == classLetter
	default:
		if s[p-1] != '\n' {
			return false
		}
		c, _ := classAt(s, p)
		return c != classSpace
	}
}

// nextChunkEnd returns the end of the chunk starting at start.
func (c *chunkCache) nextChunkEnd(s string, start int) int {
	p := start + c.min
	if p >= len(s) {
		return len(s)
	}
	// Step to a rune start.
	for p < len(s) && !utf8.RuneStart(s[p]) {
		p++
	}
	for ; p < len(s); p++ {
		b := s[p]
		if (b == ' ' || s[p-1] == '\n') && safeBoundary(s, p) {
			return p
		}
	}
	return len(s)
}

func (t *Tokenizer) encodeChunked(s string, ids []uint32, sc *encodeScratch) []uint32 {
	b := sc.budget
	for start := 0; start < len(s); {
		if !b.ids(len(ids)) || !b.clock() {
			return ids
		}
		end := t.chunks.nextChunkEnd(s, start)
		chunk := s[start:end]
		if cached, ok := t.chunks.get(chunk); ok {
			ids = append(ids, cached...)
		} else {
			from := len(ids)
			// atStart only matters to Metaspace, which never chunks.
			ids = t.encodeWords(chunk, false, ids, sc)
			if b.failed() != nil {
				return ids // a partial chunk must not be cached
			}
			t.chunks.put(chunk, ids[from:])
		}
		start = end
	}
	return ids
}
