package tokenizer

// idTable maps strings to id sequences in storage the garbage collector
// does not need to scan: an open-addressing table of 64-bit hashes and
// offsets, and the strings and ids packed into blocks. The word and chunk caches used to be
// map[string][]uint32, two small heap objects per entry: tens of thousands
// of objects that every GC cycle marked, and a GC cycle running beside a
// request is what made the warm decision's p99 (docs/tokenizer.md,
// "Decision cost at long context"). Lookups compare the stored string, so a
// hash collision is a miss, never a wrong answer.
//
// Not safe for concurrent use; the caches lock around it. A slice get
// returns stays valid and unchanged after later puts and resets: blocks are
// only appended to and never reused (reset drops them).
type idTable struct {
	slots      []idRef  // power-of-two length, at most half used; linear probing
	text       [][]byte // blocks, the last one filling
	ids        [][]uint32
	textBlock  int // bytes per text block
	idsBlock   int // ids per ids block
	entries    int
	usedBytes  int // len(s) + 4*len(ids) of the entries put since reset
	blockBytes int // bytes of the blocks allocated since reset
}

// idRef locates one entry: its string and its ids.
type idRef struct {
	h                           uint64
	used                        bool
	textBlock, textOff, textLen uint32
	idsBlock, idsOff, idsLen    uint32
}

const minIDTableSlots = 64

func newIDTable(textBlock, idsBlock int) *idTable {
	return &idTable{slots: make([]idRef, minIDTableSlots), textBlock: textBlock, idsBlock: idsBlock}
}

// slot is the index of h's entry, or of the free slot where it goes. The
// table is never full (at most half used), so the probe ends.
func (t *idTable) slot(h uint64) int {
	mask := len(t.slots) - 1
	i := int(h) & mask
	for t.slots[i].used && t.slots[i].h != h {
		i = (i + 1) & mask
	}
	return i
}

func (t *idTable) get(h uint64, s string) ([]uint32, bool) {
	r := &t.slots[t.slot(h)]
	if !r.used {
		return nil, false
	}
	if string(t.text[r.textBlock][r.textOff:r.textOff+r.textLen]) != s {
		return nil, false // another string with the same hash
	}
	end := r.idsOff + r.idsLen
	return t.ids[r.idsBlock][r.idsOff:end:end], true
}

// put stores a copy of s and ids under h, replacing an entry of another
// string with the same hash (whose storage stays counted until reset). It
// reports whether it stored anything: false when s was there already.
func (t *idTable) put(h uint64, s string, ids []uint32) bool {
	i := t.slot(h)
	old := t.slots[i]
	had := old.used
	if had && string(t.text[old.textBlock][old.textOff:old.textOff+old.textLen]) == s {
		return false
	}
	r := idRef{h: h, used: true}
	r.textBlock, r.textOff = t.reserveText(len(s))
	blk := t.text[r.textBlock]
	t.text[r.textBlock] = append(blk, s...)
	r.textLen = uint32(len(s))
	r.idsBlock, r.idsOff = t.reserveIDs(len(ids))
	iblk := t.ids[r.idsBlock]
	t.ids[r.idsBlock] = append(iblk, ids...)
	r.idsLen = uint32(len(ids))
	t.slots[i] = r
	t.usedBytes += len(s) + 4*len(ids)
	if !had {
		t.entries++
		if 2*t.entries > len(t.slots) {
			t.grow()
		}
	}
	return true
}

// grow doubles the slots, keeping the load at most one half.
func (t *idTable) grow() {
	old := t.slots
	t.slots = make([]idRef, 2*len(old))
	for _, r := range old {
		if r.used {
			t.slots[t.slot(r.h)] = r
		}
	}
}

// reserveText returns the block and offset where n more bytes go: the last
// block when they fit in its capacity (appending there never moves it), else
// a new block, of n bytes when n is larger than a block.
func (t *idTable) reserveText(n int) (block, off uint32) {
	if k := len(t.text); k > 0 && cap(t.text[k-1])-len(t.text[k-1]) >= n {
		return uint32(k - 1), uint32(len(t.text[k-1]))
	}
	size := max(n, t.textBlock)
	t.text = append(t.text, make([]byte, 0, size))
	t.blockBytes += size
	return uint32(len(t.text) - 1), 0
}

func (t *idTable) reserveIDs(n int) (block, off uint32) {
	if k := len(t.ids); k > 0 && cap(t.ids[k-1])-len(t.ids[k-1]) >= n {
		return uint32(k - 1), uint32(len(t.ids[k-1]))
	}
	size := max(n, t.idsBlock)
	t.ids = append(t.ids, make([]uint32, 0, size))
	t.blockBytes += 4 * size
	return uint32(len(t.ids) - 1), 0
}

// reset empties the table. The blocks are dropped, not reused: slices get
// returned may still be read.
func (t *idTable) reset() {
	if len(t.slots) > minIDTableSlots<<4 {
		t.slots = make([]idRef, minIDTableSlots) // a table grown by a burst shrinks back
	} else {
		clear(t.slots)
	}
	t.text, t.ids = nil, nil
	t.entries, t.usedBytes, t.blockBytes = 0, 0, 0
}
