package enginesim

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"time"
)

// MediumCPU is the medium vLLM's CPU offloading backend names its blocks with
// (vllm/v1/kv_offload/mediums.py, CPULoadStoreSpec.medium()).
const MediumCPU = "CPU"

// cpuTier is the simulated CPU offload tier of vLLM's OffloadingConnector
// with its LRU manager (vllm/v1/kv_offload/lru_manager.py,
// LRUOffloadingManager): every block that becomes full on the GPU is also
// stored in CPU memory (write-through, not on GPU eviction), the least
// recently used CPU blocks make room, and a prompt whose GPU prefix hit
// stops early reloads the following blocks from CPU instead of recomputing
// them. Events follow the manager's: a BlockRemoved for the blocks evicted
// when a store is prepared, a BlockStored (no parent, no tokens, medium
// "CPU") when the store completes, which vLLM reports once the request has
// finished (or was preempted). docs/enginesim.md ("CPU offload tier") has
// the event sequence. Loop-owned, like blockPool.
type cpuTier struct {
	capacity int
	lru      *list.List // of *cpuBlock, front = evicted first
	byHash   map[string]*list.Element
	events   []poolEvent
}

type cpuBlock struct {
	digest string
	wire   uint64
	ready  bool // stored: a hit; not ready while the store is in flight
}

func newCPUTier(numCPUBlocks int) *cpuTier {
	if numCPUBlocks <= 0 {
		return nil
	}
	return &cpuTier{capacity: numCPUBlocks, lru: list.New(), byHash: make(map[string]*list.Element, numCPUBlocks)}
}

// lookup is the number of leading blocks of chain ready in CPU memory.
func (c *cpuTier) lookup(chain []blockHash) int {
	if c == nil {
		return 0
	}
	for i, h := range chain {
		el, ok := c.byHash[string(h.Digest)]
		if !ok || !el.Value.(*cpuBlock).ready {
			return i
		}
	}
	return len(chain)
}

// touch marks chain's blocks as recently used, the last block first so the
// prefix outlives its tail, as LRUOffloadingManager.touch does.
func (c *cpuTier) touch(chain []blockHash) {
	if c == nil {
		return
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if el, ok := c.byHash[string(chain[i].Digest)]; ok {
			c.lru.MoveToBack(el)
		}
	}
}

// prepareStore allocates CPU blocks for the hashes of chain not yet there,
// evicting ready LRU blocks to make room (one BlockRemoved for them), and
// returns the digests whose store is now in flight. It stores nothing when
// there is not enough room even after evicting, as vLLM skips the store.
func (c *cpuTier) prepareStore(chain []blockHash) []string {
	if c == nil {
		return nil
	}
	var todo []blockHash
	for _, h := range chain {
		if _, ok := c.byHash[string(h.Digest)]; !ok {
			todo = append(todo, h)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	need := len(todo) - (c.capacity - c.lru.Len())
	var evict []*list.Element
	for el := c.lru.Front(); el != nil && need > 0; el = el.Next() {
		if el.Value.(*cpuBlock).ready {
			evict = append(evict, el)
			need--
		}
	}
	if need > 0 {
		return nil
	}
	if len(evict) > 0 {
		ev := poolEvent{kind: eventRemoved, medium: MediumCPU}
		for _, el := range evict {
			b := c.lru.Remove(el).(*cpuBlock)
			delete(c.byHash, b.digest)
			ev.hashes = append(ev.hashes, b.wire)
			ev.digests = append(ev.digests, []byte(b.digest))
		}
		c.events = append(c.events, ev)
	}
	pending := make([]string, 0, len(todo))
	for _, h := range todo {
		key := string(h.Digest)
		c.byHash[key] = c.lru.PushBack(&cpuBlock{digest: key, wire: h.Wire})
		pending = append(pending, key)
	}
	return pending
}

// completeStore marks in-flight stores done and reports them in one
// BlockStored.
func (c *cpuTier) completeStore(pending []string) {
	if c == nil || len(pending) == 0 {
		return
	}
	ev := poolEvent{kind: eventStored, medium: MediumCPU}
	for _, key := range pending {
		el, ok := c.byHash[key]
		if !ok {
			continue
		}
		b := el.Value.(*cpuBlock)
		if b.ready {
			continue
		}
		b.ready = true
		ev.hashes = append(ev.hashes, b.wire)
		ev.digests = append(ev.digests, []byte(b.digest))
	}
	if len(ev.hashes) > 0 {
		c.events = append(c.events, ev)
	}
}

// readyBlocks counts the CPU blocks that are hits.
func (c *cpuTier) readyBlocks() int {
	if c == nil {
		return 0
	}
	n := 0
	for el := c.lru.Front(); el != nil; el = el.Next() {
		if el.Value.(*cpuBlock).ready {
			n++
		}
	}
	return n
}

// takeEvents returns and forgets the tier's events since the last call.
func (c *cpuTier) takeEvents() []poolEvent {
	if c == nil {
		return nil
	}
	ev := c.events
	c.events = nil
	return ev
}

// offloadStore starts the CPU store of r's blocks that just became full
// (chain), as the connector's _get_reqs_to_store does each step; r's whole
// chain so far (full) is then touched, so the prefix outlives the tail.
func (e *Engine) offloadStore(st *loopState, r *request, full, chain []blockHash) {
	pending := st.cpu.prepareStore(chain)
	if len(pending) == 0 {
		return
	}
	st.cpu.touch(full)
	r.offloadPending = append(r.offloadPending, pending...)
}

// offloadFinish completes r's in-flight CPU stores: vLLM completes them when
// the worker reports the request's stores done, after it finished or was
// preempted.
func (e *Engine) offloadFinish(st *loopState, r *request) {
	st.cpu.completeStore(r.offloadPending)
	r.offloadPending = nil
}

// offloadHit is how many blocks of chain after the first hit GPU blocks (up
// to capBlocks) reload from CPU memory; it touches the whole chain first, as
// get_num_new_matched_tokens does.
func (e *Engine) offloadHit(st *loopState, chain []blockHash, hit, capBlocks int) int {
	if st.cpu == nil {
		return 0
	}
	st.cpu.touch(chain)
	return st.cpu.lookup(chain[hit:min(capBlocks, len(chain))])
}

// stepEvents are one step's events in vLLM's order: the GPU block pool's,
// then the connector's (Scheduler.update_from_output extends the former with
// connector.take_events()).
func (st *loopState) stepEvents() []poolEvent {
	return append(st.pool.takeEvents(), st.cpu.takeEvents()...)
}

// validateOffload checks the CPU tier's flags.
func (c Config) validateOffload() error {
	switch {
	case c.NumCPUBlocks < 0 || c.NumCPUBlocks > 1<<26:
		return fmt.Errorf("num-cpu-blocks %d: want 0..67108864", c.NumCPUBlocks)
	case c.CPUReloadUsPerToken < 0 || math.IsNaN(c.CPUReloadUsPerToken) || c.CPUReloadUsPerToken > 1e6:
		return fmt.Errorf("cpu-reload-us-per-token %v: want 0..1000000", c.CPUReloadUsPerToken)
	case c.NumCPUBlocks > 0 && c.Engine != "" && c.Engine != EngineVLLM:
		return fmt.Errorf("num-cpu-blocks: the CPU offload tier is vLLM's OffloadingConnector; engine %q has none here", c.Engine)
	case c.NumCPUBlocks > 0 && c.HashBlockSize > 0 && c.HashBlockSize != c.BlockSize:
		return errors.New("num-cpu-blocks: not with hash-block-size (the simulated tier stores whole KV blocks)")
	}
	return nil
}

// reloadTime is the timing model's cost of reloading tokens from the CPU tier.
func (e *Engine) reloadTime(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	return e.wall(time.Duration(e.cfg.CPUReloadUsPerToken * float64(tokens) * float64(time.Microsecond)))
}
