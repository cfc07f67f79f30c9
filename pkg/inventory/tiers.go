package inventory

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/pkg/epset"
)

// Tier is kvgate's name for a class of KV storage, whatever an engine calls
// it. docs/selection.md ("Offload tiers in the score") has the table of each
// engine's medium names and why the default weights are what they are.
type Tier uint8

const (
	TierGPU     Tier = iota // device memory: the engine reuses the block as is
	TierCPU                 // host memory: reloaded over PCIe before use
	TierStorage             // local disk or a remote store: reloaded from storage
	numTiers
)

var tierNames = [numTiers]string{"GPU", "CPU", "STORAGE"}

func (t Tier) String() string {
	if t < numTiers {
		return tierNames[t]
	}
	return "Tier(" + strconv.Itoa(int(t)) + ")"
}

// mediumTiers maps each engine's medium names (upper case) to a tier:
// vLLM's block pool and its OffloadingConnector ("GPU", "CPU"), LMCache and
// vLLM's storage media ("STORAGE"), SGLang's StorageMedium ("CPU_PINNED",
// "DISK", "EXTERNAL") and TensorRT-LLM's secondary (host) memory, which
// pkg/kvevents/ingest records as "CPU". A medium not listed here is counted
// apart and never scored.
var mediumTiers = map[string]Tier{
	"GPU":        TierGPU,
	"CPU":        TierCPU,
	"CPU_PINNED": TierCPU,
	"STORAGE":    TierStorage,
	"DISK":       TierStorage,
	"EXTERNAL":   TierStorage,
}

// TierOf maps an event's medium to its tier; no medium at all is GPU, as in
// vLLM, whose block pool publishes its own blocks with medium "GPU".
func TierOf(medium string) (Tier, bool) {
	if IsGPU(medium) {
		return TierGPU, true
	}
	t, ok := mediumTiers[normalizeMedium(medium)]
	return t, ok
}

// weightScale is the fixed-point unit of a TierWeights entry: weights are
// kept in thousandths so scoring adds integers.
const weightScale = 1000

// TierWeights is LLB_KV_TIER_WEIGHTS: what a block on each tier is worth to
// the score, in thousandths of a block already on the GPU. The zero value
// means DefaultTierWeights.
type TierWeights [numTiers]uint16

// DefaultTierWeights is GPU=1.0,CPU=0.8,STORAGE=0.25.
func DefaultTierWeights() TierWeights { return TierWeights{1000, 800, 250} }

func (w TierWeights) orDefault() TierWeights {
	if w == (TierWeights{}) {
		return DefaultTierWeights()
	}
	return w
}

// String writes the weights in LLB_KV_TIER_WEIGHTS' syntax.
func (w TierWeights) String() string {
	w = w.orDefault()
	parts := make([]string, numTiers)
	for t := range numTiers {
		parts[t] = tierNames[t] + "=" + strconv.FormatFloat(float64(w[t])/weightScale, 'f', -1, 64)
	}
	return strings.Join(parts, ",")
}

// TierWeightError is an entry ParseTierWeights does not accept.
type TierWeightError struct {
	Entry string
	Why   string
}

func (e *TierWeightError) Error() string {
	return fmt.Sprintf("entry %q: %s", e.Entry, e.Why)
}

// maxTierWeightsLen bounds the text ParseTierWeights reads.
const maxTierWeightsLen = 256

// ParseTierWeights reads "TIER=weight,..." (GPU, CPU, STORAGE, any case).
// Tiers not named keep their default; a weight lies in [0, 1] with at most
// three decimals; GPU's must be above 0, since the GPU block is the unit of
// the score. A weight of 0 takes the tier out of the score.
func ParseTierWeights(s string) (TierWeights, error) {
	w := DefaultTierWeights()
	if len(s) > maxTierWeightsLen {
		return w, &TierWeightError{Entry: s[:32] + "…", Why: fmt.Sprintf("longer than %d bytes", maxTierWeightsLen)}
	}
	var seen [numTiers]bool
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, val, ok := strings.Cut(entry, "=")
		if !ok {
			return w, &TierWeightError{Entry: entry, Why: "want TIER=weight"}
		}
		t := slices.Index(tierNames[:], strings.ToUpper(strings.TrimSpace(name)))
		if t < 0 {
			return w, &TierWeightError{Entry: entry, Why: "unknown tier; allowed: GPU, CPU, STORAGE"}
		}
		if seen[t] {
			return w, &TierWeightError{Entry: entry, Why: "tier given twice"}
		}
		seen[t] = true
		milli, err := parseWeight(strings.TrimSpace(val))
		if err != nil {
			return w, &TierWeightError{Entry: entry, Why: err.Error()}
		}
		if Tier(t) == TierGPU && milli == 0 {
			return w, &TierWeightError{Entry: entry, Why: "the GPU weight must be above 0"}
		}
		w[t] = milli
	}
	return w, nil
}

// parseWeight reads a decimal in [0, 1] with at most three decimals into
// thousandths, exactly (no float rounding).
func parseWeight(v string) (uint16, error) {
	bad := fmt.Errorf("weight %q: want a decimal in 0..1 with at most 3 decimals", v)
	whole, frac, _ := strings.Cut(v, ".")
	if (whole == "" && frac == "") || len(frac) > 3 || len(whole) > 1 {
		return 0, bad
	}
	for _, c := range whole + frac {
		if c < '0' || c > '9' {
			return 0, bad
		}
	}
	n := 0
	if whole != "" {
		n = int(whole[0]-'0') * weightScale
	}
	f := frac + strings.Repeat("0", 3-len(frac))
	x, _ := strconv.Atoi(f)
	n += x
	if n > weightScale {
		return 0, bad
	}
	return uint16(n), nil
}

// numSlowTiers is the number of tiers below the GPU.
const numSlowTiers = int(numTiers) - 1

// scoredMedium is a non-GPU table that takes part in scoring. Index keeps
// them in Index.scored, highest weight first, so a block held on several
// slower tiers is credited at the best of them.
type scoredMedium struct {
	t    *table
	slow int // its tier's index among the slower tiers (Tier - 1)
}

// rebuildScored recomputes ix.scored from ix.media. Called with ix.rw held
// for writing (and the writer mutex), so Score never sees it half-built.
func (ix *Index) rebuildScored() {
	ix.scored = ix.scored[:0]
	for name, t := range ix.media {
		tier, ok := mediumTiers[name]
		if !ok || tier == TierGPU || ix.weights[tier] == 0 {
			continue
		}
		ix.scored = append(ix.scored, scoredMedium{t: t, slow: int(tier) - 1})
	}
	slices.SortFunc(ix.scored, func(a, b scoredMedium) int {
		return int(ix.weights[b.slow+1]) - int(ix.weights[a.slow+1])
	})
}

// TierWeights returns the weights the index scores with.
func (ix *Index) TierWeights() TierWeights { return ix.weights }

// tieredRun is the state of one scoreRunTiered call. The blocks of each
// endpoint's run credited on each slower tier are counted in bit-sliced
// planes, as scoreOverlap counts (addPlanes), so a block costs a few word
// operations per tier rather than one per endpoint.
type tieredRun struct {
	ix       *Index
	alive    epset.Set
	nw, left int
	planes   [numSlowTiers][epset.Max / 64][32]uint64
}

// scoreRunTiered is scoreRun over every scored tier: an endpoint's leading
// run goes on while each block is on any of its scored tiers, and its count
// is the weighted sum of the run (GPU blocks at the GPU weight, the others
// at the best slower tier holding them), rounded to whole blocks. Only
// blocks an alive endpoint lacks on the GPU cost the slower tiers' lookups.
//
// runs, if not nil, receives every eligible endpoint's unweighted run length.
func (ix *Index) scoreRunTiered(hashes []uint64, eligible epset.Set, counts, runs *[epset.Max]uint32) {
	var ph [scoreChunkSize]uint64
	var sink uint64
	r := &tieredRun{ix: ix, alive: eligible, nw: len(eligible), left: eligible.Len()}
	for r.nw > 0 && eligible[r.nw-1] == 0 {
		r.nw--
	}
	gpu := ix.gpu
	for start := 0; start < len(hashes) && r.left > 0; start += scoreChunkSize {
		part := hashes[start:min(start+scoreChunkSize, len(hashes))]
		sink += gpu.prefetch(part, ph[:])
		for j := range part {
			p := ph[j]
			r.block(p, &gpu.sets.eps[gpu.shards[p>>keyBits].lookup(p&keyMask)], uint32(start+j), counts)
			if r.left == 0 {
				break
			}
		}
	}
	_ = sink
	for e := r.alive.Next(0); e >= 0; e = r.alive.Next(e + 1) {
		counts[e] = uint32(len(hashes))
	}
	if runs != nil {
		*runs = *counts
	}
	r.weigh(eligible, counts)
}

// block advances the run over block p (position pos), whose GPU holder set
// is held: endpoints that hold it on no scored tier end their run at pos.
func (r *tieredRun) block(p uint64, held *epset.Set, pos uint32, counts *[epset.Max]uint32) {
	var slow [8]*epset.Set // holder sets on r.ix.scored (at most maxMedia + 1 tables)
	looked := false
	for w := 0; w < r.nw; w++ {
		a := r.alive[w]
		rest := a &^ held[w]
		if rest == 0 {
			continue
		}
		if !looked {
			for i, m := range r.ix.scored[:min(len(r.ix.scored), len(slow))] {
				slow[i] = &m.t.sets.eps[m.t.shards[p>>keyBits].lookup(p&keyMask)]
			}
			looked = true
		}
		for i, m := range r.ix.scored[:min(len(r.ix.scored), len(slow))] {
			if on := rest & slow[i][w]; on != 0 {
				addPlanes(&r.planes[m.slow][w], on, 1)
				rest &^= on
			}
		}
		for d := rest; d != 0; d &= d - 1 {
			counts[w<<6|bits.TrailingZeros64(d)] = pos
			r.left--
		}
		r.alive[w] = a &^ rest
	}
}

// weigh turns each eligible endpoint's run length in counts into its
// weighted score.
func (r *tieredRun) weigh(eligible epset.Set, counts *[epset.Max]uint32) {
	var slowBlocks [numSlowTiers][epset.Max]uint32
	for k := range r.planes {
		for w := 0; w < r.nw; w++ {
			for b, v := range r.planes[k][w] {
				for ; v != 0; v &= v - 1 {
					slowBlocks[k][w<<6|bits.TrailingZeros64(v)] += 1 << b
				}
			}
		}
	}
	wt := r.ix.weights
	for e := eligible.Next(0); e >= 0; e = eligible.Next(e + 1) {
		run := counts[e]
		if run == 0 {
			continue
		}
		var credit uint64
		for k := range numSlowTiers {
			n := slowBlocks[k][e]
			run -= n
			credit += uint64(n) * uint64(wt[k+1])
		}
		credit += uint64(run) * uint64(wt[TierGPU])
		counts[e] = uint32((credit + weightScale/2) / weightScale)
	}
}

// scaleCounts applies a GPU weight below 1 to GPU-only leading runs, as
// scoreRunTiered does, so a score means the same whichever path made it.
func scaleCounts(counts *[epset.Max]uint32, eligible epset.Set, milli uint32) {
	for e := eligible.Next(0); e >= 0; e = eligible.Next(e + 1) {
		counts[e] = uint32((uint64(counts[e])*uint64(milli) + weightScale/2) / weightScale)
	}
}

// OtherMediaBlocks is endpoint ep's block count over every non-GPU medium
// (kvgate_kv_blocks_other_medium), without MediumBlocks' map.
func (ix *Index) OtherMediaBlocks(ep int) int {
	if ep < 0 || ep >= epset.Max {
		return 0
	}
	ix.writeMu.Lock()
	defer ix.writeMu.Unlock()
	n := 0
	for _, t := range ix.media {
		n += int(t.blocks[ep].Load())
	}
	return n
}

// scoreLeadingRuns is Score with leadingRun that also writes each eligible
// endpoint's unweighted leading run into runs: where the run really ends,
// which the weighted count no longer says once a run reaches a slower tier
// (Overlay extends the run from there with predicted blocks).
func (ix *Index) scoreLeadingRuns(hashes []uint64, eligible epset.Set, counts, runs *[epset.Max]uint32) {
	*counts, *runs = [epset.Max]uint32{}, [epset.Max]uint32{}
	if len(hashes) == 0 || eligible.Empty() {
		return
	}
	ix.rw.RLock()
	defer ix.rw.RUnlock()
	if len(ix.scored) > 0 {
		ix.scoreRunTiered(hashes, eligible, counts, runs)
		return
	}
	ix.gpu.scoreRun(hashes, eligible, counts)
	*runs = *counts
	if gw := ix.weights[TierGPU]; gw != weightScale {
		scaleCounts(counts, eligible, uint32(gw))
	}
}

// OtherMediaBlocks is the base index's count: predictions are GPU blocks.
func (o *Overlay) OtherMediaBlocks(ep int) int { return o.base.OtherMediaBlocks(ep) }
