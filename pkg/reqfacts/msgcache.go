package reqfacts

import (
	"bytes"
	"container/list"
	"hash/maphash"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// A chat that grows turn by turn sends its whole conversation again each
// time: the messages array of turn N+1 starts with the bytes of turn N's
// messages. MessageCache keeps the decoded messages of recent arrays so that
// a new body decodes only the messages after the longest byte-identical
// leading run (docs/tokenizer.md, "Decision cost at long context").
//
// Why reuse is exact: a message's decoded value depends only on its own
// bytes, and the decoder's state after message i depends only on the bytes
// before message i's end; reuse covers only messages that end within the
// common byte prefix of the cached array and the new one, and a message is
// an object, so its closing brace ends it whatever follows.

const (
	// DefaultMessageCacheBytes bounds one rule's cache (estimated decoded
	// size plus the raw bytes kept for comparison).
	DefaultMessageCacheBytes = 32 << 20
	// minCachedMessageBytes: arrays smaller than this decode faster than
	// they are worth keeping.
	minCachedMessageBytes = 8 << 10
	// messageStartBytes: candidate arrays share this many leading bytes
	// (the lookup key), and at most entriesPerStart of them are kept per
	// key, the least recently used going first.
	messageStartBytes = 512
	entriesPerStart   = 8
)

// MessageCache is safe for concurrent use. Its messages are shared between
// requests: Facts.Messages must be treated as read-only (the chat template
// copies what it renders). A nil *MessageCache caches nothing.
type MessageCache struct {
	limit int64
	seed  maphash.Seed
	// minBytes and startBytes are minCachedMessageBytes and
	// messageStartBytes; tests lower them to exercise the cache on small
	// arrays.
	minBytes, startBytes int

	mu      sync.Mutex
	used    int64
	byStart map[uint64][]*messageEntry
	lru     list.List // of *messageEntry, most recently used first

	lookups, hits, reusedBytes atomic.Int64
	observe                    func(hit bool, reusedBytes int) // nil: none
}

// Observe calls fn after every lookup of an array large enough to cache
// (for the daemon's metrics). Call it before the cache is used.
func (c *MessageCache) Observe(fn func(hit bool, reusedBytes int)) {
	if c != nil {
		c.observe = fn
	}
}

type messageEntry struct {
	// raw is the whole array, from '[' to ']', in segments: the bytes an
	// entry reused from the one it replaced stay in that entry's segments
	// (never written after they are stored), so a turn copies only its new
	// bytes.
	raw   [][]byte
	dec   decodedMessages
	cost  int64
	start uint64
	elem  *list.Element
}

// decodedMessages are an array's messages with, for each, the offset just
// after it (from the array's '[') and the estimated size of the messages up
// to it.
type decodedMessages struct {
	msgs  []map[string]any
	ends  []int
	costs []int64
}

// prefix is the first k messages; appending to the result never writes
// into the cached slices.
func (d decodedMessages) prefix(k int) decodedMessages {
	return decodedMessages{msgs: d.msgs[:k:k], ends: d.ends[:k:k], costs: d.costs[:k:k]}
}

func (d *decodedMessages) add(m map[string]any, end int) {
	total := valueCost(m)
	if n := len(d.costs); n > 0 {
		total += d.costs[n-1]
	}
	d.msgs = append(d.msgs, m)
	d.ends = append(d.ends, end)
	d.costs = append(d.costs, total)
}

// NewMessageCache returns a cache of at most limit estimated bytes; limit
// ≤ 0 gives nil (no cache).
func NewMessageCache(limit int64) *MessageCache {
	if limit <= 0 {
		return nil
	}
	return newMessageCache(limit, minCachedMessageBytes, messageStartBytes)
}

func newMessageCache(limit int64, minBytes, startBytes int) *MessageCache {
	startBytes = max(min(startBytes, minBytes), 1) // the lookup key must exist in every cached array
	return &MessageCache{limit: limit, seed: maphash.MakeSeed(), minBytes: max(minBytes, 1), startBytes: startBytes, byStart: map[uint64][]*messageEntry{}}
}

// MessageCacheStats are a cache's counters since it was made.
type MessageCacheStats struct {
	Lookups, Hits, ReusedBytes int64 // lookups of arrays large enough to cache, those that reused messages, bytes not decoded again
	Bytes                      int64 // estimated bytes held now
	Entries                    int
}

// Stats reads the counters.
func (c *MessageCache) Stats() MessageCacheStats {
	if c == nil {
		return MessageCacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return MessageCacheStats{Lookups: c.lookups.Load(), Hits: c.hits.Load(), ReusedBytes: c.reusedBytes.Load(), Bytes: c.used, Entries: c.lru.Len()}
}

func (c *MessageCache) startKey(rest []byte) (uint64, bool) {
	if len(rest) < c.minBytes {
		return 0, false
	}
	return maphash.Bytes(c.seed, rest[:c.startBytes]), true
}

// lookup finds the cached array sharing the most leading messages with
// rest (the body from the messages array's '['), and how many it shares.
func (c *MessageCache) lookup(rest []byte) (*messageEntry, int) {
	if c == nil {
		return nil, 0
	}
	key, ok := c.startKey(rest)
	if !ok {
		return nil, 0
	}
	c.lookups.Add(1)
	c.mu.Lock()
	candidates := append([]*messageEntry(nil), c.byStart[key]...)
	c.mu.Unlock()
	// Entries never change once stored, so they are compared unlocked.
	var best *messageEntry
	bestN := 0
	for _, e := range candidates {
		common := commonPrefixSegments(e.raw, rest)
		n := sort.Search(len(e.dec.ends), func(i int) bool { return e.dec.ends[i] > common })
		if n > bestN {
			best, bestN = e, n
		}
	}
	if best == nil {
		if c.observe != nil {
			c.observe(false, 0)
		}
		return nil, 0
	}
	c.hits.Add(1)
	c.reusedBytes.Add(int64(best.dec.ends[bestN-1]))
	if c.observe != nil {
		c.observe(true, best.dec.ends[bestN-1])
	}
	c.mu.Lock()
	if best.elem != nil {
		c.lru.MoveToFront(best.elem)
	}
	c.mu.Unlock()
	return best, bestN
}

// prevBytes is the length of e's raw array.
func prevBytes(e *messageEntry) int64 {
	n := int64(0)
	for _, seg := range e.raw {
		n += int64(len(seg))
	}
	return n
}

// commonPrefixSegments is commonPrefix of the concatenated segments and b.
func commonPrefixSegments(segs [][]byte, b []byte) int {
	n := 0
	for _, seg := range segs {
		c := commonPrefix(seg, b[n:])
		n += c
		if c < len(seg) {
			break
		}
	}
	return n
}

// maxSegments bounds an entry's segments: past it the array is copied
// whole again.
const maxSegments = 64

// segmentsFor is raw as segments: its first reused bytes taken from prev's
// segments, the rest copied.
func segmentsFor(raw []byte, prev *messageEntry, reused int) [][]byte {
	var segs [][]byte
	if prev != nil && reused > 0 && len(prev.raw) < maxSegments {
		for _, seg := range prev.raw {
			if reused <= 0 {
				break
			}
			take := min(len(seg), reused)
			segs = append(segs, seg[:take])
			reused -= take
		}
	}
	if reused > 0 || segs == nil {
		return [][]byte{bytes.Clone(raw)}
	}
	n := 0
	for _, seg := range segs {
		n += len(seg)
	}
	return append(segs, bytes.Clone(raw[n:]))
}

// segmentsCost is the memory the segments keep alive: whole backing arrays
// (a reused segment keeps all of its array, shared or not).
func segmentsCost(segs [][]byte) int64 {
	n := int64(0)
	for _, seg := range segs {
		n += int64(cap(seg)) + 24
	}
	return n
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	const chunk = 4096
	i := 0
	for i+chunk <= n && bytes.Equal(a[i:i+chunk], b[i:i+chunk]) {
		i += chunk
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// store keeps a decoded array (raw is copied, but for its first reused
// bytes, which prev holds already); it replaces prev, the entry its leading
// messages came from, which it extends.
func (c *MessageCache) store(raw []byte, dec decodedMessages, prev *messageEntry, reused int) {
	if c == nil || len(dec.msgs) == 0 {
		return
	}
	key, ok := c.startKey(raw)
	if !ok {
		return
	}
	if int64(len(raw)) > c.limit {
		return
	}
	segs := segmentsFor(raw, prev, reused)
	cost := segmentsCost(segs) + dec.costs[len(dec.costs)-1] + 64
	if cost > c.limit {
		return
	}
	e := &messageEntry{raw: segs, dec: dec.prefix(len(dec.msgs)), cost: cost, start: key}
	c.mu.Lock()
	defer c.mu.Unlock()
	// prev is replaced only by the same conversation moving on: an array
	// reusing at least 3/4 of its bytes. Another user's conversation under
	// the same system prompt reuses only that and leaves prev cached (as
	// pkg/tokenizer's conversation cache does; docs/tokenizer.md).
	if prev != nil && prev.elem != nil && 4*reused >= 3*int(prevBytes(prev)) {
		c.remove(prev)
	}
	if bucket := c.byStart[key]; len(bucket) >= entriesPerStart {
		oldest := bucket[0]
		for _, b := range bucket[1:] {
			if b.lastUseBefore(oldest, &c.lru) {
				oldest = b
			}
		}
		c.remove(oldest)
	}
	c.byStart[key] = append(c.byStart[key], e)
	e.elem = c.lru.PushFront(e)
	c.used += cost
	for c.used > c.limit {
		c.remove(c.lru.Back().Value.(*messageEntry))
	}
}

// lastUseBefore reports whether e was used less recently than o.
func (e *messageEntry) lastUseBefore(o *messageEntry, lru *list.List) bool {
	for el := lru.Back(); el != nil; el = el.Prev() {
		switch el.Value.(*messageEntry) {
		case e:
			return true
		case o:
			return false
		}
	}
	return false
}

// remove drops e; the caller holds c.mu.
func (c *MessageCache) remove(e *messageEntry) {
	if e.elem == nil {
		return
	}
	c.lru.Remove(e.elem)
	e.elem = nil
	c.used -= e.cost
	bucket := c.byStart[e.start]
	for i, b := range bucket {
		if b == e {
			bucket = append(bucket[:i:i], bucket[i+1:]...)
			break
		}
	}
	if len(bucket) == 0 {
		delete(c.byStart, e.start)
	} else {
		c.byStart[e.start] = bucket
	}
}

// valueCost estimates the heap bytes of a decoded value: headers, slots
// and string bytes.
func valueCost(v any) int64 {
	switch x := v.(type) {
	case string:
		return 16 + int64(len(x))
	case map[string]any:
		n := int64(48)
		for k, e := range x {
			n += 48 + int64(len(k)) + valueCost(e)
		}
		return n
	case *chattemplate.Dict:
		n := int64(72)
		for _, k := range x.Keys() {
			e, _ := x.Get(k)
			n += 48 + int64(len(k)) + valueCost(e)
		}
		return n
	case []any:
		n := int64(24)
		for _, e := range x {
			n += 16 + valueCost(e)
		}
		return n
	}
	return 16
}
