package inventory

import (
	"encoding/binary"
	"slices"

	"github.com/kvgate/kvgate/pkg/epset"
)

// member names one publisher: an endpoint's data-parallel rank. Ranks are
// tracked separately so that a rank's clear or remove leaves the blocks the
// endpoint's other ranks hold; the endpoint's inventory is the union.
type member uint16

func makeMember(ep, rank int) member { return member(ep<<8 | rank) }

func (m member) ep() int { return int(m >> 8) }

// A slot of the table does not hold its members inline (that would cost a
// 32-byte endpoint bitset per hash); it holds the id of an interned holder
// set. Fleets hold few distinct combinations of (endpoint, rank) per block, so
// the registry stays small and the dense eps array stays in cache while
// scoring.
type holderSet struct {
	members []member // sorted, distinct
	refs    int      // slots that point at this set
	inc     uint32   // incarnation: bumped when the id is freed, invalidating cached transitions
	live    bool
	pinned  bool // singletons are kept for the table's life: they are created and dropped constantly
}

type transitionOp uint32

const (
	opAdd      transitionOp = 1 << 16 // | member
	opRemove   transitionOp = 2 << 16 // | member
	opRemoveEp transitionOp = 3 << 16 // | ep
)

type transition struct {
	from, fromInc uint32
	op            transitionOp
	to, toInc     uint32
}

const transitionCacheSize = 1024 // power of two

// emptySet is the id of the empty holder set; a slot whose id is emptySet is free.
const emptySet = 0

// maxSets bounds the registry; ids are uint32 but a table never needs more
// sets than slots, so hitting this means something is badly wrong.
const maxSets = 1 << 30

type setRegistry struct {
	sets    []holderSet
	eps     []epset.Set // eps[id]: endpoints with at least one member in set id; read by Score
	byKey   map[string]uint32
	free    []uint32
	singles []uint32 // singles[member]: id of {member}, 0 when not created yet
	cache   [transitionCacheSize]transition
	keyBuf  []byte
	scratch []member
}

func newSetRegistry() *setRegistry {
	r := &setRegistry{byKey: make(map[string]uint32)}
	r.sets = append(r.sets, holderSet{live: true, pinned: true})
	r.eps = append(r.eps, epset.Set{})
	return r
}

func (r *setRegistry) key(ms []member) []byte {
	b := r.keyBuf[:0]
	for _, m := range ms {
		b = binary.BigEndian.AppendUint16(b, uint16(m))
	}
	r.keyBuf = b
	return b
}

// intern returns the id of the set with exactly members ms (sorted), creating it.
// ms may alias scratch space; it is copied on creation.
func (r *setRegistry) intern(ms []member) (uint32, bool) {
	if len(ms) == 0 {
		return emptySet, true
	}
	k := r.key(ms)
	if id, ok := r.byKey[string(k)]; ok {
		return id, true
	}
	var id uint32
	if n := len(r.free); n > 0 {
		id = r.free[n-1]
		r.free = r.free[:n-1]
	} else {
		if len(r.sets) >= maxSets {
			return 0, false
		}
		id = uint32(len(r.sets))
		r.sets = append(r.sets, holderSet{})
		r.eps = append(r.eps, epset.Set{})
	}
	s := &r.sets[id]
	s.members = append(s.members[:0], ms...)
	s.refs = 0
	s.live = true
	s.pinned = len(ms) == 1
	var eps epset.Set
	for _, m := range ms {
		eps.Add(m.ep())
	}
	r.eps[id] = eps
	r.byKey[string(k)] = id
	return id, true
}

func (r *setRegistry) single(m member) (uint32, bool) {
	if int(m) < len(r.singles) {
		if id := r.singles[m]; id != 0 {
			return id, true
		}
	} else {
		r.singles = append(r.singles, make([]uint32, int(m)+1-len(r.singles))...)
	}
	id, ok := r.intern([]member{m})
	if ok {
		r.singles[m] = id
	}
	return id, ok
}

// apply returns the set that results from applying op to set from. ok is false
// only when the registry is exhausted.
func (r *setRegistry) apply(from uint32, op transitionOp) (uint32, bool) {
	if from == emptySet {
		if op&0xffff0000 == opAdd {
			return r.single(member(op & 0xffff))
		}
		return emptySet, true
	}
	c := &r.cache[(from*0x9e3779b1^uint32(op)*0x85ebca6b)>>22&(transitionCacheSize-1)]
	if c.from == from && c.op == op && c.fromInc == r.sets[from].inc && c.toInc == r.sets[c.to].inc && r.sets[c.to].live {
		return c.to, true
	}
	cur := r.sets[from].members
	out := r.scratch[:0]
	arg := uint16(op & 0xffff)
	switch op & 0xffff0000 {
	case opAdd:
		m := member(arg)
		i, found := slices.BinarySearch(cur, m)
		if found {
			return from, true
		}
		out = append(out, cur[:i]...)
		out = append(out, m)
		out = append(out, cur[i:]...)
	case opRemove:
		m := member(arg)
		i, found := slices.BinarySearch(cur, m)
		if !found {
			return from, true
		}
		out = append(out, cur[:i]...)
		out = append(out, cur[i+1:]...)
	case opRemoveEp:
		for _, m := range cur {
			if m.ep() != int(arg) {
				out = append(out, m)
			}
		}
		if len(out) == len(cur) {
			return from, true
		}
	}
	r.scratch = out
	to, ok := r.intern(out)
	if !ok {
		return 0, false
	}
	*c = transition{from: from, fromInc: r.sets[from].inc, op: op, to: to, toInc: r.sets[to].inc}
	return to, true
}

func (r *setRegistry) ref(id uint32) {
	if id != emptySet {
		r.sets[id].refs++
	}
}

func (r *setRegistry) unref(id uint32) {
	if id == emptySet {
		return
	}
	s := &r.sets[id]
	s.refs--
	if s.refs > 0 || s.pinned {
		return
	}
	s.live = false
	s.inc++
	delete(r.byKey, string(r.key(s.members)))
	r.eps[id] = epset.Set{}
	r.free = append(r.free, id)
}

// liveSets counts sets in use, for tests and memory reports.
func (r *setRegistry) liveSets() int { return len(r.sets) - len(r.free) }
