package inventory

import (
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/kvgate/kvgate/pkg/epset"
)

const (
	// MaxRanks is the number of data-parallel ranks an endpoint can have.
	MaxRanks = 256

	// DefaultMaxBlocks, MinMaxBlocks and MaxMaxBlocks are LOXILB_KV_MAX_BLOCKS'
	// default and accepted range: the per-endpoint cap on stored blocks.
	DefaultMaxBlocks = 1_000_000
	MinMaxBlocks     = 1_000
	MaxMaxBlocks     = 100_000_000

	// MediumGPU is the medium that counts toward the inventory used for
	// scoring. An event without a medium is a GPU event.
	MediumGPU = "GPU"

	// maxMedia bounds the distinct non-GPU media an index tracks; further
	// names share the MediumOther bucket.
	maxMedia       = 8
	maxMediumName  = 32
	MediumOther    = "OTHER"
	scoreChunkSize = 64
)

// Observer receives what the index counts. Every method is called without any
// index lock held. Implementations must be safe for concurrent use.
type Observer interface {
	// CapEvicted reports that n blocks of endpoint ep were evicted because the
	// endpoint exceeded the cap (any medium). It feeds
	// loxilb_kv_inv_cap_evictions_total{service,ep}.
	CapEvicted(ep int, n int)
}

// Options configure an Index.
type Options struct {
	// MaxBlocks is the per-endpoint cap (LOXILB_KV_MAX_BLOCKS), applied to the
	// GPU inventory and to each other medium separately. 0 means
	// DefaultMaxBlocks; otherwise it must lie in [MinMaxBlocks, MaxMaxBlocks].
	MaxBlocks int
	// Observer, if not nil, receives eviction counts.
	Observer Observer
	// TierWeights is LLB_KV_TIER_WEIGHTS, what Score credits a block on each
	// tier with; the zero value means DefaultTierWeights (see tiers.go).
	TierWeights TierWeights
}

// Index is the block-hash inventory of one rule's endpoints. Endpoints are
// named by ep_idx in [0, epset.Max); each endpoint has up to MaxRanks
// data-parallel ranks whose inventories it holds as a union.
//
// All methods are safe for concurrent use. Mutations are serialized and
// applied in bounded chunks, so Score never waits behind a whole batch.
type Index struct {
	writeMu  sync.Mutex   // serializes mutations and the sweeps that follow them
	rw       sync.RWMutex // held for reading by Score, for writing around bounded chunks
	observer Observer
	max      int
	gpu      *table
	media    map[string]*table // other media, by upper-case name; guarded by writeMu
	weights  TierWeights
	scored   []scoredMedium // media Score credits, best first; changed under rw (tiers.go)
}

// New returns an empty index.
func New(opts Options) (*Index, error) {
	if opts.MaxBlocks == 0 {
		opts.MaxBlocks = DefaultMaxBlocks
	}
	if opts.MaxBlocks < MinMaxBlocks || opts.MaxBlocks > MaxMaxBlocks {
		return nil, fmt.Errorf("inventory: max blocks %d outside [%d, %d]", opts.MaxBlocks, MinMaxBlocks, MaxMaxBlocks)
	}
	ix := &Index{observer: opts.Observer, max: opts.MaxBlocks, media: make(map[string]*table), weights: opts.TierWeights.orDefault()}
	ix.gpu = newTable(&ix.rw, opts.MaxBlocks, true)
	// The GPU table's huge-page slabs are not Go heap: unmap them with the index.
	runtime.AddCleanup(ix, func(a *arena) { a.release() }, ix.gpu.arena)
	return ix, nil
}

// MaxBlocks is the per-endpoint cap the index enforces.
func (ix *Index) MaxBlocks() int { return ix.max }

func checkMember(ep, rank int) (member, error) {
	if ep < 0 || ep >= epset.Max {
		return 0, fmt.Errorf("inventory: endpoint index %d outside [0, %d)", ep, epset.Max)
	}
	if rank < 0 || rank >= MaxRanks {
		return 0, fmt.Errorf("inventory: rank %d outside [0, %d)", rank, MaxRanks)
	}
	return makeMember(ep, rank), nil
}

// IsGPU reports whether an event's medium counts toward the scored inventory:
// "GPU" in any case, or no medium at all.
func IsGPU(medium string) bool { return medium == "" || strings.EqualFold(medium, MediumGPU) }

func normalizeMedium(medium string) string {
	if len(medium) > maxMediumName {
		medium = medium[:maxMediumName]
	}
	return strings.ToUpper(medium)
}

// tableFor returns the table of a medium, creating it. Writer mutex held.
func (ix *Index) tableFor(medium string) *table {
	if IsGPU(medium) {
		return ix.gpu
	}
	name := normalizeMedium(medium)
	if t, ok := ix.media[name]; ok {
		return t
	}
	if len(ix.media) >= maxMedia {
		name = MediumOther
		if t, ok := ix.media[name]; ok {
			return t
		}
	}
	ix.rw.Lock()
	t := newTable(&ix.rw, ix.max, false)
	ix.media[name] = t
	ix.rebuildScored()
	ix.rw.Unlock()
	return t
}

// Add records that rank rank of endpoint ep stores hashes on medium.
func (ix *Index) Add(ep, rank int, medium string, hashes []uint64) error {
	m, err := checkMember(ep, rank)
	if err != nil || len(hashes) == 0 {
		return err
	}
	ix.writeMu.Lock()
	t := ix.tableFor(medium)
	err = t.add(m, hashes)
	ev := ix.collectEvictions()
	ix.writeMu.Unlock()
	ix.report(ev)
	if err != nil {
		return fmt.Errorf("inventory: add for endpoint %d rank %d: %w", ep, rank, err)
	}
	return nil
}

// Remove records that rank rank of endpoint ep dropped hashes from medium.
// Hashes it does not hold are ignored.
func (ix *Index) Remove(ep, rank int, medium string, hashes []uint64) error {
	m, err := checkMember(ep, rank)
	if err != nil || len(hashes) == 0 {
		return err
	}
	ix.writeMu.Lock()
	var t *table
	if IsGPU(medium) {
		t = ix.gpu
	} else if t = ix.media[normalizeMedium(medium)]; t == nil && len(ix.media) >= maxMedia {
		t = ix.media[MediumOther]
	}
	if t != nil {
		err = t.remove(m, hashes)
	}
	ix.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("inventory: remove for endpoint %d rank %d: %w", ep, rank, err)
	}
	return nil
}

// ClearRank drops every block rank rank of endpoint ep holds, on every medium
// (AllBlocksCleared carries no medium). Blocks the endpoint's other ranks hold
// stay.
func (ix *Index) ClearRank(ep, rank int) error {
	m, err := checkMember(ep, rank)
	if err != nil {
		return err
	}
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	if err := ix.gpu.clearMember(m); err != nil {
		return fmt.Errorf("inventory: clear endpoint %d rank %d: %w", ep, rank, err)
	}
	for name, t := range ix.media {
		if err := t.clearMember(m); err != nil {
			return fmt.Errorf("inventory: clear endpoint %d rank %d medium %s: %w", ep, rank, name, err)
		}
	}
	return nil
}

// ClearEndpoint drops everything endpoint ep holds, for every rank and medium
// (endpoint removal, rule teardown).
func (ix *Index) ClearEndpoint(ep int) error {
	if _, err := checkMember(ep, 0); err != nil {
		return err
	}
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	if err := ix.gpu.clearEndpoint(ep); err != nil {
		return fmt.Errorf("inventory: clear endpoint %d: %w", ep, err)
	}
	for name, t := range ix.media {
		if err := t.clearEndpoint(ep); err != nil {
			return fmt.Errorf("inventory: clear endpoint %d medium %s: %w", ep, name, err)
		}
	}
	return nil
}

// collectEvictions takes the eviction counts accumulated by the tables.
// Writer mutex held.
func (ix *Index) collectEvictions() (ev []evictionCount) {
	collect := func(t *table) {
		for e := range t.evicted {
			if n := t.evicted[e]; n > 0 {
				ev = append(ev, evictionCount{ep: e, n: int(n)})
				t.evicted[e] = 0
			}
		}
	}
	collect(ix.gpu)
	for _, t := range ix.media {
		collect(t)
	}
	return ev
}

type evictionCount struct{ ep, n int }

func (ix *Index) report(ev []evictionCount) {
	if ix.observer == nil {
		return
	}
	for _, c := range ev {
		ix.observer.CapEvicted(c.ep, c.n)
	}
}

// Blocks is endpoint ep's GPU inventory size: the number of distinct hashes
// any of its ranks holds. It feeds loxilb_pd_kv_blocks{service,ep_idx}.
func (ix *Index) Blocks(ep int) int {
	if ep < 0 || ep >= epset.Max {
		return 0
	}
	return int(ix.gpu.blocks[ep].Load())
}

// RankBlocks is the number of GPU blocks rank rank of endpoint ep holds.
func (ix *Index) RankBlocks(ep, rank int) int {
	m, err := checkMember(ep, rank)
	if err != nil {
		return 0
	}
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	if int(m) >= len(ix.gpu.memberCount) {
		return 0
	}
	return int(ix.gpu.memberCount[m])
}

// MediumBlocks returns endpoint ep's block count on each non-GPU medium it
// has stored on, by upper-case medium name. Those whose medium maps to a
// slower tier take part in the leading-run score (tiers.go).
func (ix *Index) MediumBlocks(ep int) map[string]int {
	out := map[string]int{}
	if ep < 0 || ep >= epset.Max {
		return out
	}
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	for name, t := range ix.media {
		if n := t.blocks[ep].Load(); n > 0 {
			out[name] = int(n)
		}
	}
	return out
}

// Snapshot returns endpoint ep's GPU inventory in ascending order, for
// GET /netlox/v1/config/ai/kv/inventory. It is consistent: it excludes
// writers (not scorers) while it reads.
func (ix *Index) Snapshot(ep int) []uint64 {
	if ep < 0 || ep >= epset.Max {
		return nil
	}
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	t := ix.gpu
	out := make([]uint64, 0, t.blocks[ep].Load())
	for si := range t.shards {
		s := &t.shards[si]
		for i := range s.slots {
			if id := s.slots[i].id; id != emptySet && t.sets.eps[id].Has(ep) {
				out = append(out, unmix(uint64(si)<<keyBits|s.slots[i].key()&keyMask))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Stats describe the index's memory, for benchmarks and diagnostics.
type Stats struct {
	Slots     int // allocated slots in the GPU table (12 bytes each)
	Used      int // occupied slots: distinct hashes stored by any endpoint
	Sets      int // live holder sets
	MediaUsed int // occupied slots over the non-GPU media tables
	// ArenaBytes bounds the resident memory of the GPU table's huge-page
	// slabs, which live outside the Go heap (see arena.go).
	ArenaBytes int
	// Reserved is the hashes endpoints announced they are about to store
	// (ExpectStored), summed.
	Reserved int
}

// Stats returns the current Stats.
func (ix *Index) Stats() Stats {
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	var st Stats
	for i := range ix.gpu.shards {
		st.Slots += len(ix.gpu.shards[i].slots)
		st.Used += ix.gpu.shards[i].used
	}
	st.Sets = ix.gpu.sets.liveSets()
	st.ArenaBytes = ix.gpu.arena.residentBytes()
	st.Reserved = ix.gpu.reservedSum
	for _, t := range ix.media {
		for i := range t.shards {
			st.MediaUsed += t.shards[i].used
		}
	}
	return st
}

// Score counts, for every endpoint in eligible, how many of the prompt's block
// hashes its GPU inventory holds, into counts (endpoints outside eligible get
// 0).
//
// With leadingRun, an endpoint's count is the number of consecutive blocks it
// holds from block 0: the prefix vLLM can actually reuse, because a block's
// hash chains over its parent. Without it, the count is the raw overlap (the
// spec's literal definition), which also credits blocks after a hole.
//
// Once an endpoint has published blocks on a slower tier whose weight is
// above 0 (CPU, STORAGE), the leading run goes on across tiers and counts
// each block at its tier's weight (tiers.go, docs/selection.md). The overlap
// count stays GPU only.
//
// Score takes one read lock for the whole prompt and does not allocate.
func (ix *Index) Score(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32) {
	*counts = [epset.Max]uint32{}
	if len(hashes) == 0 || eligible.Empty() {
		return
	}
	ix.rw.RLock()
	switch {
	case leadingRun && len(ix.scored) > 0:
		ix.scoreRunTiered(hashes, eligible, counts, nil)
	case leadingRun:
		ix.gpu.scoreRun(hashes, eligible, counts)
		if gw := ix.weights[TierGPU]; gw != weightScale {
			scaleCounts(counts, eligible, uint32(gw))
		}
	default:
		ix.gpu.scoreOverlap(hashes, eligible, counts)
	}
	ix.rw.RUnlock()
}

func (t *table) scoreRun(hashes []uint64, eligible epset.Set, counts *[epset.Max]uint32) {
	var ph [scoreChunkSize]uint64
	var sink uint64
	// Work on the words of the bitset that can hold eligible endpoints only:
	// one word for rules of up to 64 endpoints.
	nw := len(eligible)
	for nw > 0 && eligible[nw-1] == 0 {
		nw--
	}
	alive := eligible
	left := eligible.Len()
	eps := t.sets.eps
	for start := 0; start < len(hashes); start += scoreChunkSize {
		part := hashes[start:min(start+scoreChunkSize, len(hashes))]
		sink += t.prefetch(part, ph[:])
		for j := range part {
			p := ph[j]
			held := &eps[t.shards[p>>keyBits].lookup(p&keyMask)]
			for w := 0; w < nw; w++ {
				a := alive[w]
				if m := a & held[w]; m != a {
					for d := a &^ m; d != 0; d &= d - 1 {
						counts[w<<6|bits.TrailingZeros64(d)] = uint32(start + j)
						left--
					}
					alive[w] = m
				}
			}
			if left == 0 {
				return
			}
		}
	}
	_ = sink
	for e := alive.Next(0); e >= 0; e = alive.Next(e + 1) {
		counts[e] = uint32(len(hashes))
	}
}

// scoreOverlap counts, for every eligible endpoint, the prompt blocks its
// holder sets contain. Adding each block's holder set to 64 per-endpoint
// counters would cost O(blocks × endpoints) (2.7 µs for a 64-block prompt
// over 64 endpoints with a different holder set per block); instead the
// counters are bit-sliced: plane k of word w holds bit k of the count of the
// 64 endpoints of that word, so adding a block is a ripple-carry add of one
// bitmask per word, and the planes are expanded into counts once at the end.
// Runs of blocks with the same holder set are added as one multiple.
func (t *table) scoreOverlap(hashes []uint64, eligible epset.Set, counts *[epset.Max]uint32) {
	var ph [scoreChunkSize]uint64
	var sink uint64
	var planes [epset.Max / 64][32]uint64
	nw := len(eligible)
	for nw > 0 && eligible[nw-1] == 0 {
		nw--
	}
	eps := t.sets.eps
	run, runLen := uint32(emptySet), uint32(0)
	flush := func() {
		if run == emptySet {
			return
		}
		held := &eps[run]
		for w := 0; w < nw; w++ {
			x := held[w] & eligible[w]
			if x == 0 {
				continue
			}
			addPlanes(&planes[w], x, runLen)
		}
	}
	for start := 0; start < len(hashes); start += scoreChunkSize {
		part := hashes[start:min(start+scoreChunkSize, len(hashes))]
		sink += t.prefetch(part, ph[:])
		for j := range part {
			p := ph[j]
			id := t.shards[p>>keyBits].lookup(p & keyMask)
			if id != run {
				flush()
				run, runLen = id, 0
			}
			runLen++
		}
	}
	flush()
	_ = sink
	for w := 0; w < nw; w++ {
		for k, v := range planes[w] {
			for ; v != 0; v &= v - 1 {
				counts[w<<6|bits.TrailingZeros64(v)] += 1 << k
			}
		}
	}
}

// addPlanes adds n to the count of every endpoint in mask x, in the
// bit-sliced counters p (plane k holds bit k of 64 endpoints' counts): for
// each set bit k of n, a ripple-carry add of x starting at plane k
// (docs/ingest.md, "Inventory index design").
func addPlanes(p *[32]uint64, x uint64, n uint32) {
	for r, k := n, 0; r != 0; r, k = r>>1, k+1 {
		if r&1 == 0 {
			continue
		}
		for y, j := x, k; y != 0 && j < len(p); j++ {
			c := p[j] & y
			p[j] ^= y
			y = c
		}
	}
}

// Best returns the eligible endpoint with the highest count, ties going to the
// lowest ep_idx, or (-1, 0) when every eligible count is zero.
func Best(counts *[epset.Max]uint32, eligible epset.Set) (ep int, score uint32) {
	ep = -1
	for e := eligible.Next(0); e >= 0; e = eligible.Next(e + 1) {
		if c := counts[e]; c > score {
			ep, score = e, c
		}
	}
	return ep, score
}
