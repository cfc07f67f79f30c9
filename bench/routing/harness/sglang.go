package harness

import (
	"sort"
	"sync"
	"time"
)

// SGLangConfig are the SGLang router's cache-aware knobs. The defaults are
// the router's command-line defaults; docs/routing-benchmark.md ("The SGLang
// router port") names the sources and commits.
type SGLangConfig struct {
	CacheThreshold      float64 // match rate above which the best-matching worker wins
	BalanceAbsThreshold int     // imbalanced when max−min load exceeds this …
	BalanceRelThreshold float64 // … and max > min × this
	EvictionInterval    time.Duration
	MaxTreeSize         int // characters per tenant kept after an eviction pass
}

// SGLangDefaults is the router as shipped.
func SGLangDefaults() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5,
		EvictionInterval: 120 * time.Second, MaxTreeSize: 1 << 26}
}

// SGLangScaled is the router as an operator would tune it for this fleet:
// balance thresholds from the tuning grid (TunePlan, on the tune profile),
// and the tree bounded to about what one engine's KV cache holds, so the
// approximate tree forgets roughly when the engine does. cacheChars is one
// engine's KV capacity in characters (tokens × ~chars per token).
func SGLangScaled(cacheChars int) SGLangConfig {
	c := SGLangDefaults()
	// The winner of TunePlan (docs/routing-benchmark.md, "Tuning the SGLang
	// router"): the lowest sum of TTFT p90 over the best, capacity plus
	// herding.
	c.BalanceAbsThreshold = 4
	c.BalanceRelThreshold = 1.25
	c.CacheThreshold = 0.3
	c.EvictionInterval = 2 * time.Second
	c.MaxTreeSize = max(1024, cacheChars)
	return c
}

// sglangPolicy is a Go port of the SGLang router's cache-aware policy over
// its approximate multi-tenant character radix tree
// (docs/routing-benchmark.md, "The SGLang router port"): it decides on the
// text the router saw, not on the engines' real caches.
type sglangPolicy struct {
	name string
	cfg  SGLangConfig
	n    int

	mu       sync.Mutex
	tree     *radixTree
	inflight []int
	stop     chan struct{}
	once     sync.Once
}

func newSGLang(name string, n int, cfg SGLangConfig) *sglangPolicy {
	p := &sglangPolicy{name: name, cfg: cfg, n: n, tree: newRadixTree(n), inflight: make([]int, n), stop: make(chan struct{})}
	if cfg.EvictionInterval > 0 {
		go p.evictLoop()
	}
	return p
}

func (p *sglangPolicy) Name() string { return p.name }

func (p *sglangPolicy) evictLoop() {
	t := time.NewTicker(p.cfg.EvictionInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.tree.evictBySize(p.cfg.MaxTreeSize)
			p.mu.Unlock()
		}
	}
}

func (p *sglangPolicy) Close() { p.once.Do(func() { close(p.stop) }) }

// Pick follows select_worker: shortest queue when the router's own
// in-flight counts are imbalanced (the text still enters the tree under the
// chosen worker), otherwise the best prefix match above the cache threshold,
// else the worker whose tree is smallest.
func (p *sglangPolicy) Pick(r *PickRequest) int {
	text := []rune(r.Text)
	p.mu.Lock()
	defer p.mu.Unlock()
	maxL, minL := p.inflight[0], p.inflight[0]
	for _, l := range p.inflight {
		maxL, minL = max(maxL, l), min(minL, l)
	}
	imbalanced := maxL-minL > p.cfg.BalanceAbsThreshold && float64(maxL) > float64(minL)*p.cfg.BalanceRelThreshold
	var pick int
	if imbalanced {
		pick = p.shortestQueue()
	} else {
		pick = p.cacheAware(text)
	}
	p.tree.insert(text, pick)
	p.inflight[pick]++
	return pick
}

// shortestQueue is the lowest-numbered worker with the fewest requests in
// flight through this router.
func (p *sglangPolicy) shortestQueue() int {
	var pick int
	for i, l := range p.inflight {
		if l < p.inflight[pick] {
			pick = i
		}
	}
	return pick
}

// cacheAware is the balanced branch: the worker with the longest prefix
// match if its match rate beats the cache threshold, else the worker whose
// tree is smallest.
func (p *sglangPolicy) cacheAware(text []rune) int {
	matched, tenant := p.tree.prefixMatch(text)
	rate := 0.0
	if len(text) > 0 {
		rate = float64(matched) / float64(len(text))
	}
	if rate > p.cfg.CacheThreshold && tenant >= 0 {
		return tenant
	}
	return p.tree.smallestTenant()
}

func (p *sglangPolicy) Done(i int) {
	p.mu.Lock()
	p.inflight[i]--
	p.mu.Unlock()
}

// radixTree is a character radix tree shared by all tenants (workers): each
// node records, per tenant, when that tenant last touched it. A tenant's
// size is the number of characters on its nodes.
type radixTree struct {
	root  *rnode
	chars []int // per tenant
	clock int64 // logical time: strictly increasing, so LRU order is exact
}

type rnode struct {
	text     []rune
	children map[rune]*rnode
	parent   *rnode
	access   map[int]int64 // tenant → last access
}

func newRadixTree(tenants int) *radixTree {
	t := &radixTree{root: &rnode{children: map[rune]*rnode{}, access: map[int]int64{}}, chars: make([]int, tenants)}
	for i := 0; i < tenants; i++ {
		t.root.access[i] = 0 // every worker is a tenant from the start, as init_workers inserts ""
	}
	return t
}

func (t *radixTree) tick() int64 { t.clock++; return t.clock }

func sharedPrefix(a, b []rune) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func (t *radixTree) touch(n *rnode, tenant int, now int64) {
	if _, ok := n.access[tenant]; !ok {
		t.chars[tenant] += len(n.text)
	}
	n.access[tenant] = now
}

func (t *radixTree) insert(text []rune, tenant int) {
	now := t.tick()
	t.root.access[tenant] = now
	cur := t.root
	for i := 0; i < len(text); {
		child, ok := cur.children[text[i]]
		if !ok {
			nn := &rnode{text: append([]rune(nil), text[i:]...), children: map[rune]*rnode{}, parent: cur, access: map[int]int64{}}
			cur.children[text[i]] = nn
			t.touch(nn, tenant, now)
			return
		}
		k := sharedPrefix(child.text, text[i:])
		if k < len(child.text) {
			// Split: the shared head becomes a new node that inherits the
			// child's tenants (their sizes are unchanged: the characters
			// are only redistributed).
			head := &rnode{text: append([]rune(nil), child.text[:k]...), children: map[rune]*rnode{}, parent: cur, access: map[int]int64{}}
			for tn, ts := range child.access {
				head.access[tn] = ts
			}
			child.text = child.text[k:]
			child.parent = head
			head.children[child.text[0]] = child
			cur.children[text[i]] = head
			child = head
		}
		t.touch(child, tenant, now)
		cur = child
		i += k
	}
}

// prefixMatch returns how many characters of text the tree holds and the
// tenant of the deepest node reached (a partially matched node counts), as
// the router's tree does. Where the router takes the node's first tenant in
// hash-map order, this takes the lowest-numbered one: a fixed arbitrary
// order all the same. It refreshes that tenant's access times up to the
// root.
func (t *radixTree) prefixMatch(text []rune) (int, int) {
	cur := t.root
	i := 0
	for i < len(text) {
		child, ok := cur.children[text[i]]
		if !ok {
			break
		}
		k := sharedPrefix(child.text, text[i:])
		i += k
		cur = child
		if k < len(child.text) {
			break
		}
	}
	tenant := -1
	for tn := range cur.access {
		if tenant < 0 || tn < tenant {
			tenant = tn
		}
	}
	if tenant >= 0 {
		now := t.tick()
		for n := cur; n != nil; n = n.parent {
			if _, ok := n.access[tenant]; ok {
				n.access[tenant] = now
			}
		}
	}
	return i, tenant
}

func (t *radixTree) smallestTenant() int {
	best := 0
	for i, c := range t.chars {
		if c < t.chars[best] {
			best = i
		}
	}
	return best
}

type evictEntry struct {
	ts     int64
	tenant int
	node   *rnode
}

// isLeafOf reports whether no child of n carries tenant.
func isLeafOf(n *rnode, tenant int) bool {
	for _, c := range n.children {
		if _, ok := c.access[tenant]; ok {
			return false
		}
	}
	return true
}

// evictBySize drops each oversized tenant's least recently used leaves
// until its size is at most maxSize (evict_tenant_by_size).
func (t *radixTree) evictBySize(maxSize int) {
	over := false
	for _, c := range t.chars {
		over = over || c > maxSize
	}
	if !over {
		return
	}
	var q []evictEntry
	var walk func(n *rnode)
	walk = func(n *rnode) {
		for _, c := range n.children {
			walk(c)
		}
		if n == t.root {
			return
		}
		for tn, ts := range n.access {
			if isLeafOf(n, tn) {
				q = append(q, evictEntry{ts, tn, n})
			}
		}
	}
	walk(t.root)
	sort.Slice(q, func(i, j int) bool { return q[i].ts < q[j].ts })
	for len(q) > 0 {
		e := q[0]
		q = q[1:]
		if t.chars[e.tenant] <= maxSize {
			continue
		}
		if _, ok := e.node.access[e.tenant]; !ok {
			continue
		}
		delete(e.node.access, e.tenant)
		t.chars[e.tenant] -= len(e.node.text)
		par := e.node.parent
		if len(e.node.access) == 0 && len(e.node.children) == 0 && par != nil {
			delete(par.children, e.node.text[0])
		}
		if par != nil && par != t.root {
			if ts, ok := par.access[e.tenant]; ok && isLeafOf(par, e.tenant) {
				// Keep the queue ordered: the parent was touched no later
				// than its child, so it goes in by its own timestamp.
				at := sort.Search(len(q), func(i int) bool { return q[i].ts > ts })
				q = append(q, evictEntry{})
				copy(q[at+1:], q[at:])
				q[at] = evictEntry{ts, e.tenant, par}
			}
		}
	}
}
