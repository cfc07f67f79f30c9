package inventory

import (
	"sync"
	"sync/atomic"
)

// Faulting in a fresh slab is most of what a fill's growth costs: the
// kernel zeroes every huge page the rebuild first touches, and on a VM whose
// guest memory is backed lazily a huge page never used before costs 10-25 ns
// per byte to fault (docs/ingest.md, "Growth"), on the writer's thread,
// while it holds the writer mutex. A reservation says which sizes the
// segments are about to grow to, so the arena maps and faults in those slabs
// ahead, on one background goroutine (another core, when there is one), and
// the rebuild takes the prepared slab instead of mapping a fresh one. Only
// the bytes the rebuild is predicted to fill are faulted in, and whatever a
// rebuild does not use is handed back (dropPages), so resident memory is
// what it would have been. A prepared slab that turns out too small, or
// that no rebuild takes before the reservation is withdrawn, is unmapped.

// preparedSlab is a slab being faulted in, or ready, for one segment.
type preparedSlab struct {
	capacity int           // bytes mapped
	fill     int           // bytes faulted in from the start
	done     chan struct{} // closed once sb is set (nil when mapping failed or cancelled)
	sb       *slab
	// started: the worker has begun mapping it; cancelled: nobody wants it
	// any more, and the worker skips it. Both under prefaulter.mu.
	started, cancelled bool
}

// prefaulter prepares slabs for an arena. Its own mutex, never the table's
// locks, guards it: the background goroutine touches nothing else.
type prefaulter struct {
	mu       sync.Mutex
	prepared [numSegments]*preparedSlab
	running  bool             // the worker goroutine is running
	queue    []*preparedSlab  // waiting for the worker, in order
	populate func(mem []byte) // populateSlab; tests count calls
	mapSlab  func(int) (raw, mem []byte, err error)
	taken    atomic.Int64 // prepared slabs a rebuild used
}

func newPrefaulter(mapFn func(int) (raw, mem []byte, err error)) *prefaulter {
	return &prefaulter{populate: populateSlab, mapSlab: mapFn}
}

// prepare asks for a slab of capacity bytes, fill of them faulted in, for
// segment seg, unless one at least that large is prepared or on its way.
func (p *prefaulter) prepare(seg, capacity, fill int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.prepared[seg]; old != nil {
		if old.capacity >= capacity {
			return
		}
		if old.started {
			select {
			case <-old.done:
				go unmapPrepared(old) // off the writer's path
			default:
				return // being faulted in; a rebuild will find it too small
			}
		}
		old.cancelled = true // a no-op once started
		p.prepared[seg] = nil
	}
	ps := &preparedSlab{capacity: capacity, fill: fill, done: make(chan struct{})}
	p.prepared[seg] = ps
	p.queue = append(p.queue, ps)
	if !p.running {
		p.running = true
		go p.work()
	}
}

// work maps and faults in the queued slabs one at a time (one core: the
// writer shares the machine).
func (p *prefaulter) work() {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		ps := p.queue[0]
		p.queue = p.queue[1:]
		skip := ps.cancelled
		ps.started = true
		p.mu.Unlock()
		if skip {
			close(ps.done)
			continue
		}
		if raw, mem, err := p.mapSlab(ps.capacity); err == nil {
			p.populate(mem[:min(ps.fill, len(mem))])
			ps.sb = &slab{raw: raw, mem: mem}
		}
		close(ps.done)
	}
}

// take returns segment seg's prepared slab when it holds capacity bytes, with
// the pages past used bytes handed back, or nil (the caller maps its own).
// It waits for a slab being faulted in (the rebuild would otherwise fault
// the same memory in itself), not for one still queued behind other
// segments': that one is cancelled and the caller maps its own.
func (p *prefaulter) take(seg, capacity, used int) *slab {
	p.mu.Lock()
	ps := p.prepared[seg]
	p.prepared[seg] = nil
	if ps != nil && !ps.started {
		ps.cancelled = true
		ps = nil
	}
	p.mu.Unlock()
	if ps == nil {
		return nil
	}
	<-ps.done
	sb := ps.sb
	if sb == nil || len(sb.mem) < capacity {
		unmapPrepared(ps)
		return nil
	}
	if keep := keptBytes(len(sb.mem), used); keep < ps.fill {
		dropPages(sb.mem[keep:min(ps.fill, len(sb.mem))])
	}
	p.taken.Add(1)
	return sb
}

// keptBytes is how much of a prepared slab of size bytes stays faulted in
// when used bytes are filled: whole huge pages in its advised part (handing
// back part of one would split it), 4 KiB pages in its unadvised tail.
func keptBytes(size, used int) int {
	if keep := (used + hugePageSize - 1) &^ (hugePageSize - 1); keep <= size&^(hugePageSize-1) {
		return keep
	}
	return (used + 4095) &^ 4095
}

// discard unmaps every prepared slab (the reservation was withdrawn, or the
// index is going away), waiting for those being faulted in.
func (p *prefaulter) discard() {
	p.mu.Lock()
	all := p.prepared
	p.prepared = [numSegments]*preparedSlab{}
	for _, ps := range all {
		if ps != nil && !ps.started {
			ps.cancelled = true // never mapped: nothing to fault in only to unmap
		}
	}
	p.mu.Unlock()
	for _, ps := range all {
		if ps != nil {
			<-ps.done
			unmapPrepared(ps)
		}
	}
}

// pending reports how many segments have a slab prepared or on its way.
func (p *prefaulter) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ps := range p.prepared {
		if ps != nil {
			n++
		}
	}
	return n
}

func unmapPrepared(ps *preparedSlab) {
	<-ps.done
	if ps.sb != nil {
		unmapSlab(ps.sb.raw)
	}
}

// prefaultReserved prepares the slabs that the standing reservation will
// grow the segments into, or discards them once it is withdrawn. Writer mutex
// held.
func (t *table) prefaultReserved() {
	a := t.arena
	if a == nil || a.pre == nil {
		return
	}
	share := 0
	if !a.failed {
		share = t.reservedShare()
	}
	if share == 0 {
		if a.pre.pending() > 0 {
			go a.pre.discard() // off the writer's path
		}
		return
	}
	for seg := range numSegments {
		var sizes [shardsPerSegment]int
		for k := range sizes {
			s := &t.shards[seg*shardsPerSegment+k]
			sizes[k] = max(len(s.slots), reservedSlots(s, share, len(s.slots)))
		}
		total := 0
		for _, m := range sizes {
			total += alignedBytes(m)
		}
		if total < a.enter {
			continue // stays on the Go heap
		}
		if sb := a.slabs[seg]; sb != nil && len(sb.mem)-sb.off >= total-sb.live {
			continue // grows in place
		}
		// A margin over the prediction: the segment's other shards may grow
		// ahead in the same rebuild, and the share moves as the burst lands.
		capacity := slabCapacity(total + total/prefaultMarginDiv)
		a.pre.prepare(seg, capacity, total&^4095)
	}
}

// prefaultMarginDiv: a prepared slab is this fraction larger than predicted.
const prefaultMarginDiv = 16

// slabCapacity is the mapping a segment of total live bytes gets: its
// arrays plus the slack of in-place growth, in whole 4 KiB pages.
func slabCapacity(total int) int {
	c := total + total/slabSlackDiv
	return (c + 4095) &^ 4095
}
