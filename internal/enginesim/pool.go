package enginesim

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// blockID names a physical KV block of the simulated GPU. Like vLLM, block 0
// is the reserved "null" block and never holds data, so an engine with
// numGPUBlocks blocks can use numGPUBlocks-1 of them.
type blockID int32

// blockHash is one prefix-cache block hash: the full digest chains the next
// block, the wire value (last 8 digest bytes, big-endian) is what events carry.
type blockHash struct {
	Digest []byte
	Wire   uint64
}

// physBlock is a physical block: a reference count (running requests using it),
// its hash once it is full and computed, and its place in the free queue.
type physBlock struct {
	id       blockID
	refs     int
	hash     string // digest as a map key; "" while the block is not cached
	wire     uint64
	prev     *physBlock // free-queue links; nil when not queued
	next     *physBlock
	inFreeQ  bool
	dupIndex int // position in byHash[hash], for O(1) removal
}

// poolEvent is what the block pool reports for the engine step: a store of
// consecutive blocks of one request, an eviction, or a full clear.
type poolEvent struct {
	kind      eventKind
	medium    string // "" for the GPU block pool's own events, else an offload tier's (offload.go)
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	// The full digests behind hashes (and parent), for
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, where events carry raw bytes.
	digests      [][]byte
	parentDigest []byte
	// For BlockStored: the request's extra hash keys and the index of the
	// first stored block in the request, which decide extra_keys per block.
	extra      kvhash.Extra
	firstBlock int
}

type eventKind uint8

const (
	eventStored eventKind = iota + 1
	eventRemoved
	eventCleared
)

// errPoolBusy is returned by reset while requests still hold blocks.
var errPoolBusy = errors.New("some KV blocks are still in use by running requests")

// blockPool is the simulated GPU KV cache with vLLM's prefix-caching rules:
// free blocks sit in an LRU queue (head = evicted first) and keep their hash
// until they are reallocated, so a freed block is still a cache hit; blocks
// referenced by running requests are pinned and never evicted. Allocation pops
// the queue head and, if that block held a hash, drops it from the index and
// reports a BlockRemoved. Not safe for concurrent use: the engine loop owns it.
type blockPool struct {
	blocks   []physBlock
	head     *physBlock // least recently used free block
	tail     *physBlock
	numFree  int
	reserved int // free blocks promised to admitted requests, not yet allocated
	byHash   map[string][]*physBlock
	events   []poolEvent
}

func newBlockPool(numGPUBlocks int) (*blockPool, error) {
	if numGPUBlocks < 2 {
		return nil, fmt.Errorf("num-gpu-blocks %d: need at least 2 (block 0 is reserved)", numGPUBlocks)
	}
	p := &blockPool{
		blocks: make([]physBlock, numGPUBlocks),
		byHash: make(map[string][]*physBlock),
	}
	for i := range p.blocks {
		p.blocks[i].id = blockID(i)
	}
	for i := 1; i < numGPUBlocks; i++ {
		p.pushTail(&p.blocks[i])
	}
	return p, nil
}

// usable is the number of blocks requests can use (all but the null block).
func (p *blockPool) usable() int { return len(p.blocks) - 1 }

// usage is vLLM's kv_cache_usage_perc: the fraction of usable blocks that are
// not free (pinned by running requests).
func (p *blockPool) usage() float64 {
	return 1 - float64(p.numFree)/float64(p.usable())
}

// cachedBlocks counts blocks that currently hold a hash (pinned or free).
func (p *blockPool) cachedBlocks() int {
	n := 0
	for _, bs := range p.byHash {
		n += len(bs)
	}
	return n
}

func (p *blockPool) pushTail(b *physBlock) {
	b.prev, b.next = p.tail, nil
	if p.tail != nil {
		p.tail.next = b
	} else {
		p.head = b
	}
	p.tail = b
	b.inFreeQ = true
	p.numFree++
}

func (p *blockPool) unlink(b *physBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFreeQ = nil, nil, false
	p.numFree--
}

// lookup returns how many leading hashes of chain are cached, stopping at the
// first miss, as vLLM's find_longest_cache_hit does. It changes nothing.
func (p *blockPool) lookup(chain []blockHash) int {
	for i, h := range chain {
		if len(p.byHash[string(h.Digest)]) == 0 {
			return i
		}
	}
	return len(chain)
}

// canAdmit reports whether a request that reuses the first hit blocks of chain
// and needs total blocks overall can be given them without evicting anything
// pinned. Touching a free cached block takes it off the free queue too.
func (p *blockPool) canAdmit(chain []blockHash, hit, total int) bool {
	freeHits := 0
	for _, h := range chain[:hit] {
		if b := p.byHash[string(h.Digest)][0]; b.refs == 0 {
			freeHits++
		}
	}
	return p.numFree-p.reserved-freeHits >= total-hit
}

// acquireHits pins the first hit cached blocks of chain (moving free ones out
// of the LRU queue) and returns their ids in order.
func (p *blockPool) acquireHits(chain []blockHash, hit int) []blockID {
	ids := make([]blockID, 0, hit)
	for _, h := range chain[:hit] {
		b := p.byHash[string(h.Digest)][0]
		if b.refs == 0 && b.inFreeQ {
			p.unlink(b)
		}
		b.refs++
		ids = append(ids, b.id)
	}
	return ids
}

// reserve promises n free blocks to an admitted request; allocate draws them.
func (p *blockPool) reserve(n int) { p.reserved += n }

// release gives back a promise that was not used (request finished early).
func (p *blockPool) release(n int) {
	p.reserved -= n
	if p.reserved < 0 {
		p.reserved = 0
	}
}

// allocate takes one block from the head of the free queue for a request that
// reserved it, evicting the hash it held (BlockRemoved).
func (p *blockPool) allocate() (blockID, error) {
	b := p.head
	if b == nil {
		return 0, errors.New("no free KV block")
	}
	p.unlink(b)
	if p.reserved > 0 {
		p.reserved--
	}
	if b.hash != "" {
		wire, digest := b.wire, []byte(b.hash)
		p.dropHash(b)
		p.events = append(p.events, poolEvent{kind: eventRemoved, hashes: []uint64{wire}, digests: [][]byte{digest}})
	}
	b.refs = 1
	return b.id, nil
}

func (p *blockPool) dropHash(b *physBlock) {
	list := p.byHash[b.hash]
	last := len(list) - 1
	list[b.dupIndex] = list[last]
	list[b.dupIndex].dupIndex = b.dupIndex
	list = list[:last]
	if len(list) == 0 {
		delete(p.byHash, b.hash)
	} else {
		p.byHash[b.hash] = list
	}
	b.hash, b.wire, b.dupIndex = "", 0, 0
}

// cacheFull marks blocks (owned by one request, consecutive, all full and
// computed) with their hashes and reports one BlockStored for them, with the
// wire hash of the block before them as parent. tokens are the blocks'
// token ids concatenated. Like vLLM, a hash that is already cached in another
// block is indexed (and announced) again.
func (p *blockPool) cacheFull(ids []blockID, hashes []blockHash, parent *blockHash, tokens []uint32, extra kvhash.Extra, firstBlock int) {
	if len(ids) == 0 {
		return
	}
	ev := poolEvent{kind: eventStored, hashes: make([]uint64, 0, len(ids)), tokens: tokens, extra: extra, firstBlock: firstBlock}
	if parent != nil {
		ev.parent, ev.hasParent, ev.parentDigest = parent.Wire, true, parent.Digest
	}
	for i, id := range ids {
		b := &p.blocks[id]
		key := string(hashes[i].Digest)
		b.hash, b.wire = key, hashes[i].Wire
		b.dupIndex = len(p.byHash[key])
		p.byHash[key] = append(p.byHash[key], b)
		ev.hashes = append(ev.hashes, hashes[i].Wire)
		ev.digests = append(ev.digests, hashes[i].Digest)
	}
	p.events = append(p.events, ev)
}

// free unpins a request's blocks. They go to the tail of the LRU queue in
// reverse order, so a request's last blocks are evicted before its first ones
// (its prefix is the part most likely to be shared), as vLLM does.
func (p *blockPool) free(ids []blockID) {
	for i := len(ids) - 1; i >= 0; i-- {
		b := &p.blocks[ids[i]]
		if b.refs <= 0 {
			continue
		}
		b.refs--
		if b.refs == 0 {
			p.pushTail(b)
		}
	}
}

// reset drops every cached hash (AllBlocksCleared). Like vLLM it refuses while
// any block is in use, because running requests would lose their prefix.
func (p *blockPool) reset() error {
	if p.numFree != p.usable() {
		return errPoolBusy
	}
	for i := range p.blocks {
		b := &p.blocks[i]
		b.hash, b.wire, b.dupIndex = "", 0, 0
	}
	clear(p.byHash)
	p.events = append(p.events, poolEvent{kind: eventCleared})
	return nil
}

// takeEvents returns and forgets the events gathered since the last call.
func (p *blockPool) takeEvents() []poolEvent {
	ev := p.events
	p.events = nil
	return ev
}
