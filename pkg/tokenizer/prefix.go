package tokenizer

import (
	"container/list"
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/segslice"
)

// prefixCache makes the encode of a growing conversation incremental: it
// keeps the ids of recent long texts together with the places where the
// text can be cut without changing any id (the start of an added token that
// the raw-text split matched), so the next text sharing a byte prefix reuses
// the ids before the last such cut inside the shared bytes and encodes only
// the rest. The ids are those of a full encode (docs/tokenizer.md, "Decision
// cost at long context", says why each cut is exact).
//
// Memory is bounded by maxBytes (text bytes + 4 per id kept alive, shared
// segments counted in every entry holding them, + 16 per cut);
// entries leave least recently used first.
type prefixCache struct {
	maxBytes int
	seed     maphash.Seed
	observe  func(hit bool, reusedBytes int) // nil: none

	mu      sync.Mutex
	lru     *list.List // of *prefixEntry, most recent at the front
	buckets map[uint64][]*list.Element
	bytes   int
	stats   PrefixStats
}

// PrefixStats counts the prefix cache's work since the tokenizer loaded.
type PrefixStats struct {
	// Hits are encodes that reused cached ids, Misses long encodes that
	// found nothing to reuse; ReusedBytes the text bytes not encoded again.
	Hits, Misses, ReusedBytes uint64
	// Bytes and Entries are what the cache holds now.
	Bytes, Entries int
}

type prefixEntry struct {
	key uint64
	// text is a copy: the caller's string may be a buffer reused after the
	// encode (AppendChat). The next turn's entry shares its segments.
	text sharedText
	// ids of text, without post-processor specials; the next turn's entry
	// shares the storage of the ids it reused.
	ids  segslice.Slice[uint32]
	cuts []prefixCut
	// maxWordBytes is the word bound the ids were produced under (0: none):
	// they are reused only by encodes bounded at least as loosely.
	maxWordBytes int
}

// prefixCut says text[at:] encodes, on its own, to ids[index:].
type prefixCut struct{ at, index int }

const (
	// minPrefixText is the shortest text worth caching: below it a full
	// encode costs less than the bookkeeping.
	minPrefixText = 8 << 10
	// prefixKeyBytes is how much of a text's start picks its bucket.
	prefixKeyBytes = 512
	// perBucket bounds the conversations sharing one start that stay cached.
	perBucket = 8
	// DefaultConversationCacheBytes is the default prefix cache budget.
	DefaultConversationCacheBytes = 64 << 20
)

func newPrefixCache(maxBytes int) *prefixCache {
	return &prefixCache{maxBytes: maxBytes, seed: maphash.MakeSeed(), lru: list.New(), buckets: map[uint64][]*list.Element{}}
}

func (c *prefixCache) keyOf(text string) uint64 {
	return maphash.String(c.seed, text[:min(len(text), prefixKeyBytes)])
}

// commonPrefix is the length of the longest common byte prefix of a and b,
// compared 4 KiB at a time, then 64 bytes, then bytes: on a 400 KB prompt
// 64-byte steps alone cost more in calls than in comparing.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for _, step := range [...]int{4096, 64} {
		for i+step <= n && a[i:i+step] == b[i:i+step] {
			i += step
		}
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// validUTF8 is text with invalid UTF-8 replaced by U+FFFD, as the
// reference tokenizer receives a Python str.
func validUTF8(text string) string {
	if utf8.ValidString(text) {
		return text
	}
	return strings.ToValidUTF8(text, "\uFFFD")
}

// find returns the ids that text's encode can start from, the byte offset
// where encoding must resume and how many bytes text shares with the
// entry's text, or (nil, 0, 0).
func (c *prefixCache) find(text string, maxAdded, maxWordBytes int) (*prefixEntry, prefixCut, int) {
	if len(text) < minPrefixText {
		return nil, prefixCut{}, 0
	}
	key := c.keyOf(text)
	c.mu.Lock()
	cands := make([]*prefixEntry, 0, perBucket)
	for _, el := range c.buckets[key] {
		cands = append(cands, el.Value.(*prefixEntry))
	}
	c.mu.Unlock()
	var best *prefixEntry
	var bestCut prefixCut
	bestCommon := 0
	for _, e := range cands {
		if e.maxWordBytes != 0 && (maxWordBytes == 0 || maxWordBytes < e.maxWordBytes) {
			continue
		}
		if e.maxWordBytes == 0 && maxWordBytes != 0 {
			continue
		}
		common := e.text.commonPrefix(text)
		cut, ok := lastSafeCut(e.cuts, common, maxAdded)
		if ok && cut.at > bestCut.at {
			best, bestCut, bestCommon = e, cut, common
		}
	}
	return best, bestCut, bestCommon
}

// record counts one lookup of a long text: a hit reused reusedBytes.
func (c *prefixCache) record(hit bool, reusedBytes int) {
	c.mu.Lock()
	if !hit {
		c.stats.Misses++
	} else {
		c.stats.Hits++
		c.stats.ReusedBytes += uint64(reusedBytes)
	}
	c.mu.Unlock()
	if c.observe != nil {
		c.observe(hit, reusedBytes)
	}
}

// lastSafeCut is the last cut whose decision the shared bytes settle: the
// raw split matched an added token at cut.at after reading at most maxAdded
// bytes from any earlier position and one rune past a match, so a cut that
// far inside the common prefix is reached, and matched, the same way in
// both texts.
func lastSafeCut(cuts []prefixCut, common, maxAdded int) (prefixCut, bool) {
	limit := common - maxAdded - utf8.UTFMax
	lo, hi := 0, len(cuts) // first cut with at > limit
	for lo < hi {
		mid := (lo + hi) / 2
		if cuts[mid].at <= limit {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return prefixCut{}, false
	}
	return cuts[lo-1], cuts[lo-1].at > 0
}

// store keeps a copy of text and its ids; from, when not nil, is the entry
// the encode started from, whose first common bytes text shares (only the
// rest is copied), and which the new entry supersedes when it shares most
// of it (see supersedes).
func (c *prefixCache) store(from *prefixEntry, common int, text string, ids segslice.Slice[uint32], cuts []prefixCut, maxWordBytes int) {
	if len(text) < minPrefixText || len(cuts) == 0 {
		return
	}
	var kept sharedText
	if from != nil {
		kept = from.text.prefix(common) // equal to text[:common]
	}
	e := &prefixEntry{key: c.keyOf(text), text: kept.extend(text[kept.Len():]), ids: ids, cuts: cuts, maxWordBytes: maxWordBytes}
	cost := e.cost()
	if cost > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	replaces := from != nil && supersedes(common, from.text.Len())
	bucket := c.buckets[e.key]
	for i, el := range bucket {
		if old := el.Value.(*prefixEntry); (old == from && replaces) || old.text.equal(text) {
			c.removeLocked(el, i)
			break
		}
	}
	if b := c.buckets[e.key]; len(b) >= perBucket {
		c.removeLocked(b[0], 0) // the bucket's oldest
	}
	c.buckets[e.key] = append(c.buckets[e.key], c.lru.PushFront(e))
	c.bytes += cost
	for c.bytes > c.maxBytes {
		back := c.lru.Back()
		old := back.Value.(*prefixEntry)
		for i, el := range c.buckets[old.key] {
			if el == back {
				c.removeLocked(el, i)
				break
			}
		}
	}
}

// supersedes reports whether a new entry sharing common of the n elements
// of the entry it started from replaces that entry: it shares at least 3/4
// of it, so it is the same conversation moving on (a new turn, the last one
// rewritten). Another user's conversation under the same system prompt
// shares only that prompt and leaves the entry cached: replacing it made
// users of one application evict each other's conversations on every
// request (docs/tokenizer.md, "Decision cost at long context"). The same
// rule holds in reqfacts' message cache and kvhash's chain cache.
func supersedes(common, n int) bool { return 4*common >= 3*n }

func (c *prefixCache) removeLocked(el *list.Element, i int) {
	e := el.Value.(*prefixEntry)
	b := c.buckets[e.key]
	b = append(b[:i], b[i+1:]...)
	if len(b) == 0 {
		delete(c.buckets, e.key)
	} else {
		c.buckets[e.key] = b
	}
	c.lru.Remove(el)
	c.bytes -= e.cost()
}

func (e *prefixEntry) cost() int { return e.text.held() + 4*e.ids.Held() + 16*len(e.cuts) + 128 }

func (c *prefixCache) snapshot() PrefixStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Bytes, s.Entries = c.bytes, c.lru.Len()
	return s
}

// encodeReusing appends text's ids to ids (which holds only post-processor
// specials so far), starting from the ids of a cached text that shares a
// prefix with it when there is one, and caches the result.
func (t *Tokenizer) encodeReusing(text string, ids []uint32, lim Limits) ([]uint32, error) {
	base := len(ids)
	b := newBudget(lim, base)
	c := t.prefixes
	if c == nil || len(text) < minPrefixText {
		return t.encodeText(validUTF8(text), ids, b, nil, 0, 0)
	}
	from, cut, common := c.find(text, t.maxAdded, lim.MaxWordBytes)
	// text[:cut.at] equals a cached text's bytes up to a rune boundary (an
	// added token's start), and cached texts are valid UTF-8, so only the
	// rest needs checking: a 400 KB prompt is not scanned again per turn.
	if !utf8.ValidString(text[cut.at:]) {
		text = validUTF8(text)
		from, cut, common = c.find(text, t.maxAdded, lim.MaxWordBytes)
	}
	c.record(from != nil, cut.at)
	var cuts []prefixCut
	if from != nil {
		if !b.ids(base + cut.index) {
			return nil, b.failed()
		}
		ids = from.ids.AppendTo(ids, cut.index)
		n := 0
		for n < len(from.cuts) && from.cuts[n].at < cut.at {
			n++
		}
		cuts = append(make([]prefixCut, 0, n+64), from.cuts[:n]...)
	}
	ids, err := t.encodeText(text[cut.at:], ids, b, &cuts, cut.at, base)
	if err != nil {
		return nil, err
	}
	var kept segslice.Slice[uint32]
	if from != nil {
		kept = from.ids.Prefix(cut.index) // equal to ids[base : base+cut.index]
	}
	c.store(from, common, text, kept.Extend(ids[base+cut.index:]), cuts, lim.MaxWordBytes)
	return ids, nil
}

// PrefixStats reports the conversation prefix cache's counters (zero when
// it is disabled).
func (t *Tokenizer) PrefixStats() PrefixStats {
	if t.prefixes == nil {
		return PrefixStats{}
	}
	return t.prefixes.snapshot()
}
