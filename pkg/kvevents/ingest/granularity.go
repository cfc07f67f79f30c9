package ingest

import (
	"slices"
	"sync"
	"sync/atomic"
)

// maxGranularityStep bounds the hash stride a rule scores with: vLLM's group
// block sizes are small multiples of the hash block size.
const maxGranularityStep = 64

// Granularity is what a rule's engines publish per block, learned from their
// BlockStored events, against the rule's kvBlockSize (the hash block size
// kvgate computes the chain at). vLLM publishes, for a KV-cache group whose
// block size is k × the hash block size (hybrid models, prefix_match_unit),
// the fine chain's hash at each group block's last hash boundary: every k-th
// hash of the chain kvgate computes. So a request scores every Step()-th of
// its hashes. A block size that is not a multiple can never match; Unusable
// reports it so the request skips the tier by name instead of scoring 0.
// See docs/parity.md, "Hash granularity". Safe for concurrent use.
type Granularity struct {
	hashBlock int
	// exact: only a block size equal to the hash block size matches. SGLang
	// hashes whole pages, so a page of k × kvBlockSize tokens carries one
	// hash no request chain contains (docs/engines.md).
	exact bool

	mu  sync.Mutex
	eps map[int]int // ep_idx → the block size its primary group last published
	// algo holds the endpoints whose engine reports a block-hash algorithm
	// kvgate does not compute (TensorRT-LLM's /server_info), by ep_idx.
	algo    map[int]string
	refused atomic.Pointer[string] // set while every endpoint heard from refuses

	step     atomic.Int32 // lcm of the usable k, ≥ 1
	badSize  atomic.Int32 // a non-multiple block size, when no endpoint is usable
	unusable atomic.Bool
}

// NewGranularity returns the state for a rule whose kvBlockSize is hashBlockSize.
func NewGranularity(hashBlockSize int) *Granularity {
	g := &Granularity{hashBlock: max(hashBlockSize, 1), eps: map[int]int{}}
	g.step.Store(1)
	return g
}

// NewExactGranularity returns the state for a rule whose engine publishes
// one hash per block of exactly hashBlockSize tokens (SGLang, TensorRT-LLM):
// any other block size is unusable.
func NewExactGranularity(hashBlockSize int) *Granularity {
	g := NewGranularity(hashBlockSize)
	g.exact = true
	return g
}

// usable reports whether an engine block of blockSize tokens can match.
func (g *Granularity) usable(blockSize int) bool {
	if g.exact {
		return blockSize == g.hashBlock
	}
	return blockSize%g.hashBlock == 0
}

// HashBlockSize is the rule's kvBlockSize.
func (g *Granularity) HashBlockSize() int { return g.hashBlock }

// Step is the stride a request scores its hashes with (1: every hash).
func (g *Granularity) Step() int { return int(g.step.Load()) }

// Unusable reports whether every endpoint heard from publishes a block size
// that is not a multiple of kvBlockSize, and one such size.
func (g *Granularity) Unusable() (blockSize int, bad bool) {
	if !g.unusable.Load() {
		return 0, false
	}
	return int(g.badSize.Load()), true
}

// observe records that ep published blockSize and reports whether it is a
// multiple of the hash block size (k = blockSize / hash block size) and
// whether the rule's state changed.
func (g *Granularity) observe(ep, blockSize int) (k int, ok, changed bool) {
	ok = g.usable(blockSize)
	if ok {
		k = blockSize / g.hashBlock
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.eps[ep] == blockSize {
		return k, ok, false
	}
	g.eps[ep] = blockSize
	return k, ok, g.recompute()
}

// forget drops ep (it left the rule).
func (g *Granularity) forget(ep int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.algo, ep)
	if _, ok := g.eps[ep]; ok {
		delete(g.eps, ep)
		g.recompute()
	}
	g.recomputeAlgo()
}

// refuseAlgo records that ep's engine hashes blocks with algo, which kvgate
// does not compute ("" clears it).
func (g *Granularity) refuseAlgo(ep int, algo string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if algo == "" {
		delete(g.algo, ep)
	} else {
		if g.algo == nil {
			g.algo = map[int]string{}
		}
		g.algo[ep] = algo
	}
	g.recomputeAlgo()
}

// recomputeAlgo sets refused when every endpoint heard from refuses;
// callers hold mu.
func (g *Granularity) recomputeAlgo() {
	if len(g.algo) == 0 {
		g.refused.Store(nil)
		return
	}
	var one string
	for ep := range g.eps {
		a, ok := g.algo[ep]
		if !ok {
			g.refused.Store(nil)
			return
		}
		one = a
	}
	if one == "" {
		for _, a := range g.algo {
			one = a
			break
		}
	}
	g.refused.Store(&one)
}

// Refused reports whether every endpoint heard from runs a block-hash
// algorithm kvgate does not compute, and one such algorithm: requests then
// skip the KV tier by name (guard hashes, kvgate_kv_skip_total{cause=
// "hash_algo"}), see docs/engines.md.
func (g *Granularity) Refused() (algo string, bad bool) {
	if p := g.refused.Load(); p != nil {
		return *p, true
	}
	return "", false
}

// recompute derives step and the unusable flag; callers hold mu.
func (g *Granularity) recompute() (changed bool) {
	var ks []int
	bad := 0
	for _, bs := range g.eps {
		if !g.usable(bs) {
			bad = max(bad, bs)
			continue
		}
		ks = append(ks, bs/g.hashBlock)
	}
	usable := len(ks)
	// Folded in order so the result does not depend on map order; a k whose
	// lcm would pass the bound is left out (its endpoint then scores only
	// where the strides meet).
	slices.Sort(ks)
	step := 1
	for _, k := range ks {
		if l := lcm(step, k); l <= maxGranularityStep {
			step = l
		}
	}
	unusable := usable == 0 && bad != 0
	changed = int32(step) != g.step.Load() || unusable != g.unusable.Load()
	g.step.Store(int32(step))
	g.badSize.Store(int32(bad))
	g.unusable.Store(unusable)
	return changed
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// EveryKth keeps every k-th hash of a chain (indices k-1, 2k-1, …), in place:
// the hashes vLLM publishes for blocks of k hash blocks.
func EveryKth(hashes []uint64, k int) []uint64 {
	if k <= 1 {
		return hashes
	}
	out := hashes[:0]
	for i := k - 1; i < len(hashes); i += k {
		out = append(out, hashes[i])
	}
	return out
}
