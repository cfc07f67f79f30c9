package inventory

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/epset"
)

// The table is one open-addressing hash set of block hashes for all endpoints
// of a rule, split into numShards shards by the top bits of the mixed hash.
// A slot is 12 bytes:
//
//	key: generation (8 bits) << 56 | low 56 bits of the mixed hash
//	id:  holder set id (0 = empty slot)
//
// The top 8 bits of the mixed hash are implied by the shard, which frees the
// key word's top byte for the generation used by cap eviction. Probing is
// Robin Hood linear probing with backward-shift deletion, so lookups of absent
// hashes stop early even at the 85% maximum load, and the table never holds
// tombstones.
//
// Shards exist so that growing is incremental: one shard (1/256 of the table)
// is rebuilt at a time, off to the side without the read lock, and swapped in
// under a short write lock. Scoring therefore never waits for a rehash.
//
// Locking: every mutation runs with the index's writer mutex held (one writer
// at a time), and takes the RWMutex for writing only around bounded chunks of
// in-place changes. The writer may read the table without the RWMutex because
// nobody else writes it; scorers read under RLock.

const (
	shardBits     = 8
	numShards     = 1 << shardBits
	keyBits       = 64 - shardBits
	keyMask       = 1<<keyBits - 1
	minShardSlots = 16

	// Growth: ×2 while small, then ×1.125 so the load stays in [0.755, 0.85]
	// and a slot (12 B) costs at most 15.9 B per stored hash. A higher
	// ceiling saves memory but lengthens Robin Hood clusters: measured at
	// 0.89 load, add+remove ran at 4.0M hashes/s of CPU, at 0.74 at 9.0M/s.
	maxLoadNum, maxLoadDen = 17, 20
	smallShard             = 1024

	// Shrink when a shard falls below 1/4 full, to about 60% load.
	shrinkDen = 4

	// Chunk sizes bound how long the write lock is held at a time.
	applyChunk = 64   // hashes per write-lock hold when adding or removing
	scanBudget = 8192 // slots per write-lock hold when sweeping

	// A generation lasts genSpanDiv-th of the cap in adds (at least minGenSpan),
	// so the 256 generations cover many caps' worth of history.
	genSpanDiv = 16
	minGenSpan = 64
	// Entries older than agingClampAge generations are clamped to that age by a
	// sweep that covers the table every agingPassGens generations, so a
	// generation number is never reused while an entry still carries it.
	agingClampAge = 128
	agingPassGens = 64
)

// slot is one table entry: the key word split in two halves so the struct
// is 12 bytes with 4-byte alignment. Key and holder id share a cache line
// (a lookup misses once, not once per array).
type slot struct {
	lo, hi uint32 // key word: generation << 56 | low 56 bits of the mixed hash
	id     uint32 // holder set; emptySet marks a free slot
}

func (sl *slot) key() uint64 { return uint64(sl.hi)<<32 | uint64(sl.lo) }

func (sl *slot) setKey(k uint64) { sl.lo, sl.hi = uint32(k), uint32(k>>32) }

type shard struct {
	slots []slot
	used  int
}

func homeOf(k56 uint64, n int) int {
	hi, _ := bits.Mul64(k56<<shardBits, uint64(n))
	return int(hi)
}

func displacement(k uint64, i, n int) int {
	d := i - homeOf(k&keyMask, n)
	if d < 0 {
		d += n
	}
	return d
}

// find returns the slot holding k56, or the slot and displacement at which it
// should be inserted.
func (s *shard) find(k56 uint64) (i, d int, found bool) {
	n := len(s.slots)
	sl := s.slots[:n]
	i = homeOf(k56, n)
	for d = 0; ; d++ {
		if sl[i].id == emptySet {
			return i, d, false
		}
		k := sl[i].key()
		if k&keyMask == k56 {
			return i, d, true
		}
		if displacement(k, i, n) < d {
			return i, d, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// lookup returns the holder set of k56, or emptySet.
func (s *shard) lookup(k56 uint64) uint32 {
	n := len(s.slots)
	if n == 0 {
		return emptySet
	}
	sl := s.slots[:n]
	i := homeOf(k56, n)
	for d := 0; ; d++ {
		id := sl[i].id
		if id == emptySet {
			return emptySet
		}
		k := sl[i].key()
		if k&keyMask == k56 {
			return id
		}
		if displacement(k, i, n) < d {
			return emptySet
		}
		if i++; i == n {
			i = 0
		}
	}
}

func (s *shard) insertAt(i, d int, k uint64, id uint32) {
	n := len(s.slots)
	cur := slot{id: id}
	cur.setKey(k)
	for {
		sl := &s.slots[i]
		if sl.id == emptySet {
			*sl = cur
			s.used++
			return
		}
		if rd := displacement(sl.key(), i, n); rd < d {
			*sl, cur = cur, *sl
			d = rd
		}
		if i++; i == n {
			i = 0
		}
		d++
	}
}

func (s *shard) deleteAt(i int) {
	n := len(s.slots)
	for {
		j := i + 1
		if j == n {
			j = 0
		}
		if s.slots[j].id == emptySet || displacement(s.slots[j].key(), j, n) == 0 {
			s.slots[i] = slot{}
			break
		}
		s.slots[i] = s.slots[j]
		i = j
	}
	s.used--
}

func (s *shard) full() bool {
	return (s.used+1)*maxLoadDen > len(s.slots)*maxLoadNum
}

func (s *shard) sparse() bool {
	return len(s.slots) > minShardSlots && s.used*shrinkDen < len(s.slots)
}

func grownSize(n int) int {
	switch {
	case n < minShardSlots:
		return minShardSlots
	case n < smallShard:
		return 2 * n
	default:
		return n + n/8
	}
}

// rebuiltInto returns the shard's entries re-placed into dst, which must be
// zeroed and larger than s.used. It only reads s.
//
// The home slot is monotone in the key for every table size, and Robin Hood
// probing keeps entries in the order of their home slot, so the shard is
// already sorted for dst: one sequential pass places each entry at its home
// or right after the previous one, without probing (a rebuild is a stream of
// reads and writes, not one probe per entry). Two kinds of entries are left
// to ordinary insertion afterwards: the cluster that wrapped past the old
// shard's end into its first slots, and the tail that would wrap past dst's
// end.
func (s *shard) rebuiltInto(dst []slot) shard {
	ns := shard{slots: dst}
	old := s.slots
	wrapped := 0
	for wrapped < len(old) && old[wrapped].id != emptySet && homeOf(old[wrapped].key()&keyMask, len(old)) > wrapped {
		wrapped++
	}
	next, i := 0, wrapped
	for ; i < len(old); i++ {
		if old[i].id != emptySet && !ns.placeInOrder(old[i], &next) {
			break
		}
	}
	for _, sl := range old[i:] {
		ns.insertSlot(sl)
	}
	for _, sl := range old[:wrapped] {
		ns.insertSlot(sl)
	}
	return ns
}

// placeInOrder puts sl at max(home, *next) of a shard being filled in home
// order, *next being the slot after the last one placed. Entries that share
// an old home slot may come in any key order, so an entry whose home is
// below the previous entry's is inserted by probing instead, which stays
// within the run that ends at *next. It reports false, placing nothing, when
// the entry would not fit before the end of the shard.
func (s *shard) placeInOrder(sl slot, next *int) bool {
	n := len(s.slots)
	h := homeOf(sl.key()&keyMask, n)
	if h >= *next {
		s.slots[h] = sl
		*next = h + 1
		s.used++
		return true
	}
	if *next >= n {
		return false
	}
	if homeOf(s.slots[*next-1].key()&keyMask, n) <= h {
		s.slots[*next] = sl
		*next++
		s.used++
		return true
	}
	// Every slot from *next on is empty, so the insertion's chain of moved
	// entries ends at *next at the latest: it never wraps.
	s.insertSlot(sl)
	if s.slots[*next].id != emptySet {
		*next++
	}
	return true
}

func (s *shard) insertSlot(sl slot) {
	if sl.id == emptySet {
		return
	}
	k := sl.key()
	j, d, _ := s.find(k & keyMask)
	s.insertAt(j, d, k, sl.id)
}

type slotPos struct {
	shard, slot int
}

// epAccount is what a table keeps per endpoint, beyond the block count.
type epAccount struct {
	hist [256]uint32 // slots holding the endpoint, by generation
	hand slotPos     // where the cap-eviction sweep continues
}

type table struct {
	rw        *sync.RWMutex
	shards    [numShards]shard
	sets      *setRegistry
	maxBlocks int64
	genSpan   int

	count       [epset.Max]int64        // endpoint union counts (writer's copy)
	blocks      [epset.Max]atomic.Int64 // count as published at the end of each write-lock hold; read lock-free
	dirty       epset.Set               // endpoints whose count changed since the last publish
	acct        [epset.Max]*epAccount
	memberCount []int64 // slots per member (endpoint rank)

	gen        uint32 // current generation; slots store its low 8 bits
	addsInGen  int
	agingDebt  int // slots the aging sweep still has to visit
	agingHand  slotPos
	over       epset.Set        // endpoints above the cap, pending eviction
	evicted    [epset.Max]int64 // cap evictions not yet reported to the observer
	totalSlots int
	sparse     [numShards / 64]uint64 // shards to consider shrinking
	arena      *arena                 // huge-page slabs for big segments; nil keeps every shard on the Go heap

	reserved    [epset.Max]int // hashes each endpoint announced it is about to store (reserve.go)
	reservedSum int
}

func newTable(rw *sync.RWMutex, maxBlocks int, huge bool) *table {
	t := &table{rw: rw, sets: newSetRegistry(), maxBlocks: int64(maxBlocks)}
	if huge {
		t.arena = newArena()
	}
	t.genSpan = max(maxBlocks/genSpanDiv, minGenSpan)
	return t
}

func (t *table) account(ep int) *epAccount {
	a := t.acct[ep]
	if a == nil {
		a = &epAccount{}
		t.acct[ep] = a
	}
	return a
}

func (t *table) countMember(m member, delta int64) {
	if int(m) >= len(t.memberCount) {
		t.memberCount = append(t.memberCount, make([]int64, int(m)+1-len(t.memberCount))...)
	}
	t.memberCount[m] += delta
}

// retarget moves one slot of generation g from set from to set to, keeping
// every count in step. Call with the write lock held.
func (t *table) retarget(from, to uint32, g uint8) {
	// Fast paths: a new hash of one rank, or the last rank dropping a hash.
	if from == emptySet {
		if ms := t.sets.sets[to].members; len(ms) == 1 {
			t.sets.ref(to)
			t.countEp(ms[0].ep(), g, 1)
			t.countMember(ms[0], 1)
			return
		}
	} else if to == emptySet {
		if ms := t.sets.sets[from].members; len(ms) == 1 {
			t.countEp(ms[0].ep(), g, -1)
			t.countMember(ms[0], -1)
			t.sets.unref(from)
			return
		}
	}
	t.sets.ref(to)
	fe, te := t.sets.eps[from], t.sets.eps[to]
	added, removed := te.AndNot(fe), fe.AndNot(te)
	for e := added.Next(0); e >= 0; e = added.Next(e + 1) {
		t.countEp(e, g, 1)
	}
	for e := removed.Next(0); e >= 0; e = removed.Next(e + 1) {
		t.countEp(e, g, -1)
	}
	fm, tm := t.sets.sets[from].members, t.sets.sets[to].members
	for len(fm) > 0 || len(tm) > 0 {
		switch {
		case len(tm) == 0 || (len(fm) > 0 && fm[0] < tm[0]):
			t.countMember(fm[0], -1)
			fm = fm[1:]
		case len(fm) == 0 || tm[0] < fm[0]:
			t.countMember(tm[0], 1)
			tm = tm[1:]
		default:
			fm, tm = fm[1:], tm[1:]
		}
	}
	t.sets.unref(from)
}

func (t *table) countEp(e int, g uint8, delta int64) {
	t.account(e).hist[g] += uint32(delta)
	t.count[e] += delta
	t.dirty.Add(e)
	if delta > 0 && t.count[e] > t.maxBlocks {
		t.over.Add(e)
	}
}

// unlock publishes the changed endpoint counts and releases the write lock.
func (t *table) unlock() {
	for e := t.dirty.Next(0); e >= 0; e = t.dirty.Next(e + 1) {
		t.blocks[e].Store(t.count[e])
	}
	t.dirty = epset.Set{}
	t.rw.Unlock()
}

func (t *table) moveGen(id uint32, from, to uint8) {
	eps := t.sets.eps[id]
	for e := eps.Next(0); e >= 0; e = eps.Next(e + 1) {
		a := t.account(e)
		a.hist[from]--
		a.hist[to]++
	}
}

// setSlot replaces slot i's set by to (deleting the slot when to is empty).
// It reports whether the slot was deleted, in which case its successor now
// sits at i.
func (t *table) setSlot(s *shard, i int, to uint32) bool {
	from := s.slots[i].id
	if to == from {
		return false
	}
	t.retarget(from, to, uint8(s.slots[i].key()>>keyBits))
	if to == emptySet {
		s.deleteAt(i)
		return true
	}
	s.slots[i].id = to
	return false
}

// grow rebuilds shard si larger. Called with the writer mutex held and the
// write lock NOT held; it takes the write lock only to swap.
func (t *table) grow(si int) {
	s := &t.shards[si]
	n := grownSize(len(s.slots))
	if r := reservedSlots(s, t.reservedShare(), n); r > 0 {
		n = r
	}
	t.resizeShard(si, n)
}

func (t *table) markSparse(si int) { t.sparse[si>>6] |= 1 << (si & 63) }

// shrinkSparse rebuilds the shards that removals left mostly empty. Called
// with the writer mutex held and the write lock not held.
func (t *table) shrinkSparse() {
	for w := range t.sparse {
		for v := t.sparse[w]; v != 0; v &= v - 1 {
			si := w<<6 | bits.TrailingZeros64(v)
			s := &t.shards[si]
			if !s.sparse() {
				continue
			}
			t.resizeShard(si, max(minShardSlots, s.used*5/3+1))
		}
		t.sparse[w] = 0
	}
}

// prefetch mixes a chunk of hashes into ph and touches each home slot, so the
// cache misses of the whole chunk overlap instead of being taken one by one.
// (A two-pass variant, all addresses first and then a tight loop of loads,
// was measured slower: 27 vs 22 µs per 2,048-block prompt.)
func (t *table) prefetch(hashes []uint64, ph []uint64) uint64 {
	var sink uint64
	for j, h := range hashes {
		p := mix(h)
		ph[j] = p
		s := &t.shards[p>>keyBits]
		if n := len(s.slots); n > 0 {
			i := homeOf(p&keyMask, n)
			sink += uint64(s.slots[i].lo)
		}
	}
	return sink
}

// errTableFull is returned when the holder-set registry is exhausted.
type errTableFull struct{}

func (errTableFull) Error() string { return "inventory: holder-set registry exhausted" }

// add stores hashes for member m. Writer mutex held, write lock not held.
func (t *table) add(m member, hashes []uint64) error {
	var ph [applyChunk]uint64
	var sink uint64
	for start := 0; start < len(hashes); start += applyChunk {
		part := hashes[start:min(start+applyChunk, len(hashes))]
		sink += t.prefetch(part, ph[:])
		t.rw.Lock()
		for j := range part {
			p := ph[j]
			si := int(p >> keyBits)
			s := &t.shards[si]
			if s.full() {
				t.unlock()
				t.grow(si)
				t.rw.Lock()
			}
			if err := t.addOne(s, p&keyMask, m); err != nil {
				t.unlock()
				return err
			}
		}
		t.unlock()
		t.maintain()
	}
	_ = sink
	return nil
}

// addMember adds member m to the hash already in slot i and refreshes the
// slot to generation g (a re-stored block is young again).
func (t *table) addMember(s *shard, i int, k56 uint64, m member, g uint8) error {
	from := s.slots[i].id
	to, ok := t.sets.apply(from, opAdd|transitionOp(m))
	if !ok {
		return errTableFull{}
	}
	old := uint8(s.slots[i].key() >> keyBits)
	if to != from {
		t.retarget(from, to, old)
		s.slots[i].id = to
	}
	if old != g {
		t.moveGen(to, old, g)
		s.slots[i].setKey(uint64(g)<<keyBits | k56)
	}
	return nil
}

func (t *table) addOne(s *shard, k56 uint64, m member) error {
	g := uint8(t.gen)
	i, d, found := s.find(k56)
	if found {
		if err := t.addMember(s, i, k56, m, g); err != nil {
			return err
		}
	} else {
		to, ok := t.sets.single(m)
		if !ok {
			return errTableFull{}
		}
		s.insertAt(i, d, uint64(g)<<keyBits|k56, to)
		t.retarget(emptySet, to, g)
	}
	if t.addsInGen++; t.addsInGen >= t.genSpan {
		t.addsInGen = 0
		t.gen++
		t.agingDebt += t.totalSlots/agingPassGens + 1
	}
	return nil
}

// remove drops hashes for member m. Writer mutex held, write lock not held.
func (t *table) remove(m member, hashes []uint64) error {
	var ph [applyChunk]uint64
	var sink uint64
	op := opRemove | transitionOp(m)
	for start := 0; start < len(hashes); start += applyChunk {
		part := hashes[start:min(start+applyChunk, len(hashes))]
		sink += t.prefetch(part, ph[:])
		t.rw.Lock()
		for j := range part {
			p := ph[j]
			si := int(p >> keyBits)
			s := &t.shards[si]
			if len(s.slots) == 0 {
				continue
			}
			i, _, found := s.find(p & keyMask)
			if !found {
				continue
			}
			to, ok := t.sets.apply(s.slots[i].id, op)
			if !ok {
				t.unlock()
				return errTableFull{}
			}
			t.setSlot(s, i, to)
			if s.sparse() {
				t.markSparse(si)
			}
		}
		t.unlock()
	}
	_ = sink
	t.shrinkSparse()
	return nil
}

// sweep visits every slot once, in write-lock holds of at most scanBudget
// slots, applying op to slots whose set changes under it. It stops early when
// done reports true. Writer mutex held, write lock not held.
func (t *table) sweep(op transitionOp, done func() bool) error {
	for si := 0; si < numShards; si++ {
		s := &t.shards[si]
		for i := 0; i < len(s.slots); {
			if done() {
				t.shrinkSparse()
				return nil
			}
			t.rw.Lock()
			end := min(i+scanBudget, len(s.slots))
			for i < end {
				id := s.slots[i].id
				if id == emptySet {
					i++
					continue
				}
				to, ok := t.sets.apply(id, op)
				if !ok {
					t.unlock()
					return errTableFull{}
				}
				if !t.setSlot(s, i, to) {
					i++
				}
			}
			if s.sparse() {
				t.markSparse(si)
			}
			t.unlock()
		}
	}
	t.shrinkSparse()
	return nil
}

func (t *table) clearMember(m member) error {
	if int(m) >= len(t.memberCount) || t.memberCount[m] == 0 {
		return nil
	}
	return t.sweep(opRemove|transitionOp(m), func() bool { return t.memberCount[m] == 0 })
}

func (t *table) clearEndpoint(ep int) error {
	if t.count[ep] == 0 {
		return nil
	}
	return t.sweep(opRemoveEp|transitionOp(ep), func() bool { return t.count[ep] == 0 })
}

func (t *table) advance(p *slotPos) {
	p.slot++
	for p.slot >= len(t.shards[p.shard].slots) {
		p.slot = 0
		p.shard = (p.shard + 1) % numShards
		if t.totalSlots == 0 {
			return
		}
	}
}

// maintain runs the work that adds leave behind: cap evictions and the aging
// sweep. Writer mutex held, write lock not held.
func (t *table) maintain() {
	for !t.over.Empty() {
		e := t.over.Min()
		t.over.Remove(e)
		t.evict(e)
	}
	for t.agingDebt > 0 && t.totalSlots > 0 {
		t.rw.Lock()
		g := uint8(t.gen)
		for n := min(t.agingDebt, scanBudget); n > 0; n-- {
			p := &t.agingHand
			if p.slot < len(t.shards[p.shard].slots) {
				s := &t.shards[p.shard]
				if id := s.slots[p.slot].id; id != emptySet {
					k := s.slots[p.slot].key()
					old := uint8(k >> keyBits)
					if g-old > agingClampAge {
						clamped := g - agingClampAge
						t.moveGen(id, old, clamped)
						s.slots[p.slot].setKey(uint64(clamped)<<keyBits | k&keyMask)
					}
				}
			}
			t.advance(p)
			t.agingDebt--
		}
		t.unlock()
	}
	t.agingDebt = max(t.agingDebt, 0)
}

func (t *table) oldestGen(a *epAccount) (uint8, bool) {
	g := uint8(t.gen)
	for age := 255; age >= 0; age-- {
		c := g - uint8(age)
		if a.hist[c] > 0 {
			return c, true
		}
	}
	return 0, false
}

// evict removes endpoint e's oldest blocks (by generation) until it is back
// at the cap. Writer mutex held, write lock not held.
func (t *table) evict(e int) {
	a := t.account(e)
	op := opRemoveEp | transitionOp(e)
	idle := 0 // slots visited without an eviction, to stop if counts ever disagree with the table
	for t.count[e] > t.maxBlocks && idle <= t.totalSlots {
		target, ok := t.oldestGen(a)
		if !ok {
			return
		}
		t.rw.Lock()
		for n := scanBudget; n > 0 && t.count[e] > t.maxBlocks && a.hist[target] > 0; n-- {
			evicted, stay := t.evictSlot(e, &a.hand, target, op)
			if evicted {
				idle = 0
			}
			if stay {
				continue // the successor moved into this slot
			}
			idle++
			t.advance(&a.hand)
		}
		t.unlock()
	}
}

// evictSlot drops endpoint e from the slot under the hand p when that slot
// holds e at generation target. It reports whether it evicted, and whether
// the slot's successor moved into it (backward-shift deletion), in which
// case the hand must stay. Write lock held.
func (t *table) evictSlot(e int, p *slotPos, target uint8, op transitionOp) (evicted, stay bool) {
	s := &t.shards[p.shard]
	if p.slot >= len(s.slots) {
		return false, false
	}
	id := s.slots[p.slot].id
	if id == emptySet || !t.sets.eps[id].Has(e) || uint8(s.slots[p.slot].key()>>keyBits) != target {
		return false, false
	}
	to, ok := t.sets.apply(id, op)
	if !ok {
		return false, false
	}
	t.evicted[e]++
	if !t.setSlot(s, p.slot, to) {
		return true, false
	}
	if s.sparse() {
		t.markSparse(p.shard)
	}
	return true, true
}
