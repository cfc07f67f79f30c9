package tokenizer

import (
	"errors"
	"hash/maphash"
	"math/bits"
)

// A loaded tokenizer is held by the daemon for as long as it runs, once per
// staged model, so its vocabulary is kept in a few flat arrays instead of Go
// maps and a string per token: for Qwen3's 151,643 tokens a
// map[string]uint32 plus its key strings took 7.8 MB and the id → spelling
// table 4.6 MB, against ≈ 5 MB for both here (docs/ingest.md, "End to end":
// the idle daemon's resident memory counts against every inventory hash).

// stringTable is a list of strings stored back to back in one string.
type stringTable struct {
	text string
	ends []uint32 // string i is text[ends[i-1]:ends[i]], with ends[-1] = 0
}

func (st *stringTable) len() int { return len(st.ends) }

func (st *stringTable) at(i int) string {
	start := uint32(0)
	if i > 0 {
		start = st.ends[i-1]
	}
	return st.text[start:st.ends[i]]
}

// packStrings copies strs into one stringTable.
func packStrings(strs []string) (stringTable, error) {
	total := 0
	for _, s := range strs {
		total += len(s)
	}
	if total > maxFileBytes {
		return stringTable{}, errors.New("vocabulary strings exceed the file size limit")
	}
	buf := make([]byte, 0, total)
	ends := make([]uint32, len(strs))
	for i, s := range strs {
		buf = append(buf, s...)
		ends[i] = uint32(len(buf))
	}
	return stringTable{text: string(buf), ends: ends}, nil
}

// Slots of a vocabIndex: the entry number + 1 in the low entryBits (0 =
// empty) and the top bits of the key's hash above them, so a probe compares
// spellings only on a likely match.
const (
	entryBits = 25 // ids are below 1<<24 + 1 (buildVocab), entries as many as the file has
	entryMask = 1<<entryBits - 1
	maxVocab  = 1 << 24
)

// vocabIndex maps token spellings to ids: entry e has spelling keys.at(e)
// and id ids[e]; slots is an open-addressing (linear probing) table of
// entries at load ≤ 2/3, so a probe always ends at an empty slot.
type vocabIndex struct {
	keys  stringTable
	ids   []uint32
	slots []uint32
	seed  maphash.Seed
}

var errVocabTooLarge = errors.New("vocabulary has more than 16,777,216 tokens")

// newVocabIndex indexes spellings[i] → ids[i]. A spelling given twice keeps
// its last id, as assigning to a map does.
func newVocabIndex(spellings []string, ids []uint32) (*vocabIndex, error) {
	if len(spellings) > maxVocab {
		return nil, errVocabTooLarge
	}
	keys, err := packStrings(spellings)
	if err != nil {
		return nil, err
	}
	size := 1 << bits.Len(uint(len(spellings)*3/2)|7)
	v := &vocabIndex{keys: keys, ids: ids, slots: make([]uint32, size), seed: maphash.MakeSeed()}
	for e := range spellings {
		i, found := v.find(keys.at(e))
		if !found {
			v.slots[i] = uint32(e+1) | v.tag(keys.at(e))
			continue
		}
		v.slots[i] = uint32(e+1) | v.slots[i]&^entryMask // same spelling: the later id wins
	}
	return v, nil
}

func (v *vocabIndex) hash(s string) uint64 { return maphash.String(v.seed, s) }

func (v *vocabIndex) tag(s string) uint32 { return uint32(v.hash(s)>>(64-(32-entryBits))) << entryBits }

// find returns the slot holding key, or the empty slot where it belongs.
func (v *vocabIndex) find(key string) (int, bool) {
	h := v.hash(key)
	tag := uint32(h>>(64-(32-entryBits))) << entryBits
	mask := len(v.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		s := v.slots[i]
		if s == 0 {
			return i, false
		}
		if s&^entryMask == tag && v.keys.at(int(s&entryMask)-1) == key {
			return i, true
		}
	}
}

// get returns the id of a spelling.
func (v *vocabIndex) get(key string) (uint32, bool) {
	i, found := v.find(key)
	if !found {
		return 0, false
	}
	return v.ids[v.slots[i]&entryMask-1], true
}

// each calls fn for every indexed spelling and its id (a spelling given
// twice once, with its last id).
func (v *vocabIndex) each(fn func(spelling string, id uint32)) {
	for _, s := range v.slots {
		if s != 0 {
			e := int(s&entryMask) - 1
			fn(v.keys.at(e), v.ids[e])
		}
	}
}

// count is the number of distinct spellings.
func (v *vocabIndex) count() int {
	n := 0
	for _, s := range v.slots {
		if s != 0 {
			n++
		}
	}
	return n
}
