package tokenizer

import (
	"bytes"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// byteEncoder and byteDecoder are GPT-2's byte-level alphabet, computed once
// and never modified.
var byteEncoder, byteDecoder = bytesToUnicode()

// bytesToUnicode is GPT-2's reversible byte → printable-rune table.
func bytesToUnicode() (enc [256]rune, dec map[rune]byte) {
	dec = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			enc[b] = rune(b)
		} else {
			enc[b] = rune(256 + n)
			n++
		}
		dec[enc[b]] = byte(b)
	}
	return enc, dec
}

// mergeValue is what merging a pair yields: its rank (priority) and the id of
// the merged token.
type mergeValue struct {
	rank uint32
	id   uint32
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// bpeModel is HF's BPE model. In byte-level mode its vocabulary keys are raw
// bytes (decoded from GPT-2's byte alphabet), so words need no remapping.
type bpeModel struct {
	vocab       *vocabIndex // spellings in the internal alphabet
	merges      map[uint64]mergeValue
	byteLevel   bool
	byteIDs     [256]int64 // id of each single byte (byte-level), -1 when absent
	unkID       int64      // -1 when no unk token
	fuseUnk     bool
	byteFallbck bool
	fallbackIDs [256]int64 // id of "<0xXX>" tokens, -1 when absent
	ignoreMerge bool
	prefix      string // continuing_subword_prefix
	suffix      string // end_of_word_suffix
	cache       *wordCache
}

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// parseMerges accepts both ["a b", ...] and [["a", "b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		out := make([][2]string, len(asStrings))
		for i, m := range asStrings {
			a, b, ok := strings.Cut(m, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("merge %d %q is not two tokens", i, m)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var asPairs [][2]string
	if err := json.Unmarshal(raw, &asPairs); err != nil {
		return nil, fmt.Errorf("merges: neither \"a b\" strings nor [a, b] pairs: %w", err)
	}
	return asPairs, nil
}

func newBPE(raw json.RawMessage, byteLevel bool, cacheWords int) (*bpeModel, error) {
	ty, err := modelType(raw)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if ty != "" && ty != "BPE" {
		return nil, &UnsupportedError{Component: "model", Type: ty}
	}
	var j bpeJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if j.Type == "" && j.Vocab == nil {
		return nil, errors.New("model: no type and no vocab")
	}
	if j.Dropout != nil && *j.Dropout > 0 {
		// Dropout makes encoding random; nothing can be exact with it.
		return nil, &UnsupportedError{Component: "model", Type: "BPE with dropout"}
	}
	if len(j.Vocab) == 0 {
		return nil, errors.New("model: empty vocab")
	}
	m := &bpeModel{
		byteLevel:   byteLevel,
		unkID:       -1,
		fuseUnk:     j.FuseUnk,
		byteFallbck: j.ByteFallback,
		ignoreMerge: j.IgnoreMerges,
		cache:       newWordCache(cacheWords),
	}
	if j.ContinuingSubwordPrefix != nil {
		m.prefix = *j.ContinuingSubwordPrefix
	}
	if j.EndOfWordSuffix != nil {
		m.suffix = *j.EndOfWordSuffix
	}
	if err := m.loadVocab(j.Vocab, j.ByteFallback); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if j.UnkToken != nil {
		id, ok := m.vocab.get(*j.UnkToken)
		if !ok {
			return nil, fmt.Errorf("model: unk_token %q not in vocab", *j.UnkToken)
		}
		m.unkID = int64(id)
	}
	merges, err := parseMerges(j.Merges)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if err := m.loadMerges(j.Vocab, merges); err != nil {
		return nil, err
	}
	return m, nil
}

// loadVocab fills m.vocab from the file's vocab, in m's internal alphabet
// (raw bytes for a byte-level model), and the byte and byte-fallback id
// tables.
func (m *bpeModel) loadVocab(vocab map[string]uint32, byteFallback bool) error {
	dec := byteDecoder
	internal := func(tok string) string {
		if !m.byteLevel {
			return tok
		}
		b := make([]byte, 0, len(tok))
		for _, r := range tok {
			c, ok := dec[r]
			if !ok {
				return tok // not expressible in bytes; kept as is, never produced
			}
			b = append(b, c)
		}
		return string(b)
	}
	spellings, ids := make([]string, 0, len(vocab)), make([]uint32, 0, len(vocab))
	for tok, id := range vocab {
		spellings, ids = append(spellings, internal(tok)), append(ids, id)
	}
	var err error
	if m.vocab, err = newVocabIndex(spellings, ids); err != nil {
		return err
	}
	for i := range m.byteIDs {
		m.byteIDs[i] = -1
		m.fallbackIDs[i] = -1
	}
	if m.byteLevel {
		for b := 0; b < 256; b++ {
			if id, ok := m.vocab.get(string([]byte{byte(b)})); ok {
				m.byteIDs[b] = int64(id)
			}
		}
	}
	if byteFallback {
		for b := 0; b < 256; b++ {
			if id, ok := m.vocab.get(fmt.Sprintf("<0x%02X>", b)); ok {
				m.fallbackIDs[b] = int64(id)
			}
		}
	}
	return nil
}

// loadMerges builds m.merges from the ranked merges. Merges name tokens in
// the file's alphabet: they are looked up in the file's vocab (same ids),
// with no per-merge allocation.
func (m *bpeModel) loadMerges(vocab map[string]uint32, merges [][2]string) error {
	m.merges = make(map[uint64]mergeValue, len(merges))
	prefixLen := len(m.prefix)
	buf := make([]byte, 0, 64)
	for rank, mg := range merges {
		ida, oka := vocab[mg[0]]
		idb, okb := vocab[mg[1]]
		if !oka || !okb {
			return fmt.Errorf("model: merge %d (%q %q) names a token missing from vocab", rank, mg[0], mg[1])
		}
		right := mg[1]
		if prefixLen > 0 && strings.HasPrefix(right, m.prefix) {
			right = right[prefixLen:]
		}
		buf = append(append(buf[:0], mg[0]...), right...)
		id, ok := vocab[string(buf)]
		if !ok {
			return fmt.Errorf("model: merge %d result %q missing from vocab", rank, buf)
		}
		k := pairKey(ida, idb)
		if _, dup := m.merges[k]; !dup { // the first (best) rank wins
			m.merges[k] = mergeValue{uint32(rank), id}
		}
	}
	return nil
}

// modelType reads the model's "type" without decoding the (large) vocab when,
// as in HF's files, "type" comes first.
func modelType(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", fmt.Errorf("not a JSON object")
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		if key == "type" {
			var t string
			if err := dec.Decode(&t); err != nil {
				return "", fmt.Errorf("type: %w", err)
			}
			return t, nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", err
		}
	}
	return "", nil
}

// encodeWord appends the ids of one pre-token.
func (m *bpeModel) encodeWord(word string, dst []uint32) []uint32 {
	if word == "" {
		return dst
	}
	if m.ignoreMerge {
		if id, ok := m.vocab.get(word); ok {
			return append(dst, id)
		}
	}
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = m.bpe(word, dst)
	m.cache.put(word, dst[start:])
	return dst
}

// initialSymbols appends the starting symbols of word.
func (m *bpeModel) initialSymbols(word string, syms []uint32) []uint32 {
	if m.byteLevel && m.prefix == "" && m.suffix == "" {
		return m.initialBytes(word, syms)
	}
	prevUnk := false
	for i := 0; i < len(word); {
		var w int
		if m.byteLevel {
			w = 1
		} else {
			_, w = utf8.DecodeRuneInString(word[i:])
		}
		piece := word[i : i+w]
		if i > 0 && m.prefix != "" {
			piece = m.prefix + piece
		}
		if i+w == len(word) && m.suffix != "" {
			piece += m.suffix
		}
		i += w
		if id, ok := m.vocab.get(piece); ok {
			syms = append(syms, id)
			prevUnk = false
			continue
		}
		if m.byteFallbck {
			if out, ok := m.appendFallback(syms, word[i-w:i]); ok {
				syms = out
				prevUnk = false
				continue
			}
		}
		if m.unkID >= 0 {
			if !(m.fuseUnk && prevUnk) {
				syms = append(syms, uint32(m.unkID))
			}
			prevUnk = true
		}
	}
	return syms
}

// initialBytes is initialSymbols for a byte-level model without a prefix or
// suffix: one symbol per byte.
func (m *bpeModel) initialBytes(word string, syms []uint32) []uint32 {
	for i := 0; i < len(word); i++ {
		id := m.byteIDs[word[i]]
		if id < 0 {
			if m.unkID >= 0 {
				syms = m.appendUnk(syms)
			}
			continue
		}
		syms = append(syms, uint32(id))
	}
	return syms
}

// appendFallback appends the <0xXX> byte-fallback ids of raw; false (syms
// unchanged) when any byte has none, as tokenizers then falls back to unk.
func (m *bpeModel) appendFallback(syms []uint32, raw string) ([]uint32, bool) {
	for k := 0; k < len(raw); k++ {
		if m.fallbackIDs[raw[k]] < 0 {
			return syms, false
		}
	}
	for k := 0; k < len(raw); k++ {
		syms = append(syms, uint32(m.fallbackIDs[raw[k]]))
	}
	return syms, true
}

func (m *bpeModel) appendUnk(syms []uint32) []uint32 {
	if m.fuseUnk && len(syms) > 0 && int64(syms[len(syms)-1]) == m.unkID {
		return syms
	}
	return append(syms, uint32(m.unkID))
}

// smallWord is the symbol count up to which the quadratic merge loop beats
// the heap.
const smallWord = 48

// bpe appends the merged ids of word.
func (m *bpeModel) bpe(word string, dst []uint32) []uint32 {
	start := len(dst)
	dst = m.initialSymbols(word, dst)
	syms := dst[start:]
	if len(syms) < 2 {
		return dst
	}
	if len(syms) <= smallWord {
		n := m.mergeSmall(syms)
		return dst[:start+n]
	}
	n := m.mergeHeap(syms)
	return dst[:start+n]
}

const noRank = ^uint32(0)

// mergeSmall repeatedly merges the lowest-ranked adjacent pair (leftmost on
// ties), in place; it returns the new length.
func (m *bpeModel) mergeSmall(syms []uint32) int {
	var rankBuf [smallWord]uint32
	var idBuf [smallWord]uint32
	n := len(syms)
	ranks, ids := rankBuf[:n-1], idBuf[:n-1]
	for i := 0; i < n-1; i++ {
		if v, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok {
			ranks[i], ids[i] = v.rank, v.id
		} else {
			ranks[i] = noRank
		}
	}
	for n > 1 {
		best, bi := noRank, -1
		for i := 0; i < n-1; i++ {
			if ranks[i] < best {
				best, bi = ranks[i], i
			}
		}
		if bi < 0 {
			break
		}
		syms[bi] = ids[bi]
		copy(syms[bi+1:n], syms[bi+2:n])
		copy(ranks[bi:n-1], ranks[bi+1:n-1])
		copy(ids[bi:n-1], ids[bi+1:n-1])
		n--
		ranks, ids = ranks[:n-1], ids[:n-1]
		if bi > 0 {
			m.setPair(syms, ranks, ids, bi-1)
		}
		if bi < n-1 {
			m.setPair(syms, ranks, ids, bi)
		}
	}
	return n
}

func (m *bpeModel) setPair(syms, ranks, ids []uint32, i int) {
	if v, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok {
		ranks[i], ids[i] = v.rank, v.id
	} else {
		ranks[i] = noRank
	}
}

type mergeCand struct {
	rank  uint32
	pos   int32
	newID uint32
}

type mergeHeap []mergeCand

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(mergeCand)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeHeap is the same algorithm as HF's: a priority queue of (rank, pos)
// over a linked list of symbols, for long words.
func (m *bpeModel) mergeHeap(syms []uint32) int {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range syms {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	h := make(mergeHeap, 0, n)
	for i := 0; i < n-1; i++ {
		if v, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok {
			h = append(h, mergeCand{v.rank, int32(i), v.id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(mergeCand)
		p := c.pos
		if !alive[p] || next[p] < 0 {
			continue
		}
		q := next[p]
		v, ok := m.merges[pairKey(syms[p], syms[q])]
		if !ok || v.id != c.newID || v.rank != c.rank {
			continue
		}
		syms[p] = c.newID
		alive[q] = false
		next[p] = next[q]
		if next[q] >= 0 {
			prev[next[q]] = p
		}
		if pp := prev[p]; pp >= 0 {
			if v, ok := m.merges[pairKey(syms[pp], syms[p])]; ok {
				heap.Push(&h, mergeCand{v.rank, pp, v.id})
			}
		}
		if nn := next[p]; nn >= 0 {
			if v, ok := m.merges[pairKey(syms[p], syms[nn])]; ok {
				heap.Push(&h, mergeCand{v.rank, p, v.id})
			}
		}
	}
	out := 0
	for i := int32(0); i >= 0; i = next[i] {
		syms[out] = syms[i]
		out++
	}
	return out
}

// wordCache is a bounded, sharded map from pre-token to ids. A full shard is
// cleared rather than tracked per entry: cheap, and hot words come back at once.
type wordCache struct {
	shards   [16]wordShard
	perShard int
}

type wordShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
}

// maxCachedWord bounds the length of cached words: long runs are rare and
// would pin memory.
const maxCachedWord = 256

func newWordCache(words int) *wordCache {
	c := &wordCache{perShard: words / 16}
	if c.perShard < 1 {
		return nil
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func shardOf(s string) int {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return int(h & 15)
}

func (c *wordCache) get(word string) ([]uint32, bool) {
	if c == nil || len(word) > maxCachedWord {
		return nil, false
	}
	sh := &c.shards[shardOf(word)]
	sh.mu.RLock()
	ids, ok := sh.m[word]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []uint32) {
	if c == nil || len(word) > maxCachedWord {
		return
	}
	sh := &c.shards[shardOf(word)]
	own := append([]uint32(nil), ids...)
	key := strings.Clone(word)
	sh.mu.Lock()
	if len(sh.m) >= c.perShard {
		clear(sh.m)
	}
	sh.m[key] = own
	sh.mu.Unlock()
}
