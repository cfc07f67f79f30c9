package tokenizer

import (
	"strings"
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
	shards   [16]chunkShard
}

type chunkShard struct {
	mu    sync.RWMutex
	m     map[string][]uint32
	bytes int
}

func newChunkCache(budget, min int) *chunkCache {
	c := &chunkCache{min: min, perShard: budget / 16}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func chunkShardOf(s string) int {
	// The key's tail and length: chunks sharing a start differ at the end.
	h := uint32(len(s))
	for i := max(0, len(s)-16); i < len(s); i++ {
		h = h*31 + uint32(s[i])
	}
	return int(h & 15)
}

func (c *chunkCache) get(s string) ([]uint32, bool) {
	sh := &c.shards[chunkShardOf(s)]
	sh.mu.RLock()
	ids, ok := sh.m[s]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *chunkCache) put(s string, ids []uint32) {
	cost := len(s) + 4*len(ids) + 64
	if cost > c.perShard {
		return
	}
	sh := &c.shards[chunkShardOf(s)]
	own := append([]uint32(nil), ids...)
	key := strings.Clone(s)
	sh.mu.Lock()
	if _, dup := sh.m[key]; !dup {
		if sh.bytes+cost > c.perShard {
			clear(sh.m)
			sh.bytes = 0
		}
		sh.m[key] = own
		sh.bytes += cost
	}
	sh.mu.Unlock()
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
