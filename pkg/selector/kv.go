package selector

import (
	"math/bits"

	"github.com/kvgate/kvgate/pkg/epset"
)

// minBlocks is the shallow threshold: ceil(LLB_KV_MIN_MATCH_TOKENS / block
// size), capped at the request's block count, at least 1; 0 when the guard
// is off.
func minBlocks(minTokens, blockSize, nHashes int) int {
	if minTokens <= 0 {
		return 0
	}
	m := (minTokens + blockSize - 1) / blockSize
	if m > nHashes {
		m = nHashes
	}
	if m < 1 {
		m = 1
	}
	return m
}

// capacity is ĉ_i: num_gpu_blocks × controller weight / 100, clamped to
// [1, 8,000,000]; 1 while unknown.
func (s *Selector) capacity(c *compiled, ep int) int64 {
	blocks, known := s.engine.GPUBlocks(ep)
	if !known || blocks <= 0 {
		return 1
	}
	if blocks > maxCapacity*100 {
		blocks = maxCapacity * 100
	}
	v := blocks * c.capWeight[ep] / 100
	return max(1, min(v, maxCapacity))
}

// capFor is cap_i = max(1, ceil(mlf · L · ĉ_i / (100 · Σĉ))), exact in 128 bits.
func capFor(mlf, total, ci, sum int64) int64 {
	if sum <= 0 {
		return 1
	}
	hi, lo := bits.Mul64(uint64(mlf*total), uint64(ci))
	den := uint64(100 * sum)
	if hi >= den { // cannot happen with clamped inputs; saturate rather than panic
		return 1 << 62
	}
	q, r := bits.Div64(hi, lo, den)
	if r != 0 {
		q++
	}
	if q > 1<<62 {
		q = 1 << 62
	}
	return max(1, int64(q))
}

// underCap reports L_i < cap_i without dividing: for an integer load,
// load < max(1, ceil(X/den)) ⇔ load == 0 || load·den < X, where
// X = mlf·L·ĉ_i and den = 100·Σĉ. It is the hot-path form of capFor.
func underCap(load, mlf, total, ci, sum int64) bool {
	if load == 0 {
		return true
	}
	xhi, xlo := bits.Mul64(uint64(mlf*total), uint64(ci))
	yhi, ylo := bits.Mul64(uint64(load), uint64(100*sum))
	return yhi < xhi || (yhi == xhi && ylo < xlo)
}

// adaptiveMLF: 175 at L ≤ 16, 300 at L ≥ 26, linear (floored) in between.
func adaptiveMLF(total int64) int64 {
	switch {
	case total <= 16:
		return 175
	case total >= 26:
		return 300
	}
	return 175 + 125*(total-16)/10
}

// adaptiveLambda: 50,000 at L ≤ 16, 100,000 at L ≥ 26, linear in between.
func adaptiveLambda(total int64) int64 {
	switch {
	case total <= 16:
		return 50000
	case total >= 26:
		return 100000
	}
	return 50000 + 5000*(total-16)
}

// tier15 runs the guard ladder and the selection. It fills d and reports a
// hit; on a miss d.Reason holds exactly one miss reason.
func (s *Selector) tier15(a *Attempt, c *compiled, elig epset.Set, sc *scratch, d *Decision) bool {
	req := a.req
	if r := requestGuard(c, req); r != ReasonNone {
		d.Reason = r
		return false
	}
	nh := len(req.Hashes)
	mb := minBlocks(s.opts.MinMatchTokens, c.blockSize, nh)
	d.MinBlocks = mb
	if nh == 0 {
		// A prompt shorter than one block has no hashes.
		if mb > 0 {
			d.Reason = ReasonShallow
		} else {
			d.Reason = ReasonNoWorker
		}
		return false
	}

	counts := &sc.counts
	el := list(elig, &sc.elig)
	for _, m := range el {
		counts[m] = 0
	}
	if len(el) > 0 {
		s.scorer.Score(req.Hashes, elig, s.opts.Score == ScorePrefix, counts)
	}
	best, arg := uint32(0), -1
	for _, m := range el {
		if counts[m] > best {
			best, arg = counts[m], int(m)
		}
	}
	d.BestScore, d.Argmax = int(best), arg
	s.watchdog(c, elig, best)
	if best == 0 {
		d.Reason = ReasonNoWorker
		return false
	}
	if mb > 0 && int(best) < mb {
		d.Reason = ReasonShallow
		return false
	}

	var w int
	var spilled bool
	var mlf int64
	if s.opts.LBMode == LBCost {
		// The cost arm weighs every eligible endpoint against the fleet
		// cap itself, so spill relief has nothing left to do.
		w = s.costArm(c, el, sc, req, arg)
		spilled = w != arg
	} else {
		w, spilled, mlf = s.blend(c, el, sc, int64(best), arg, nh)
	}
	if !spilled && s.opts.LBMode != LBOff && s.opts.LBMode != LBCost && c.relief {
		if r := s.relief(c, el, sc, w, mlf, s.gainCap(el, sc, nh)); r != w {
			w, spilled = r, true
		}
	}
	// A prefix held only by this replica's predictions goes where every
	// replica would place it (coldplace.go).
	if s.onlyPredicted(req, mb, el, elig, sc) {
		w = boundedHashPick(elig, coldKey(req.Hashes, mb), sc, s.opts.MeanLoadFactor)
		spilled, d.ColdPlaced = w != arg, true
	}
	score := int(counts[w])

	w, seeded := s.coldSeed(a, elig, w)

	// Post-filter on a fresh read of the state: a transition since the
	// exclusion mask was seeded misses as excluded.
	st := s.states.States()
	bad := st.Unavailable().Or(a.excluded)
	if c.rule.PD {
		bad = bad.Or(st.Saturated)
	}
	if bad.Has(w) || !elig.Has(w) {
		d.Reason = ReasonExcluded
		return false
	}
	d.Endpoint, d.Tier, d.Reason = w, TierKV, ReasonHit
	d.Score, d.Spilled, d.ColdSeed = score, spilled, seeded
	return true
}

// requestGuard runs the guards that need only the rule and the request's
// facts, in the ladder's order (docs/selection.md); ReasonNone means the
// request goes on to scoring.
func requestGuard(c *compiled, req *Request) Reason {
	switch {
	case c.rule.KVExactMode != 1 && c.rule.KVExactMode != 3:
		return ReasonModeOff
	// Guard B (warmup) is inert: kvWarmupSec is stored but never arms a timer.
	case !req.HasText || req.Upstream == ReasonTextEmpty:
		return ReasonTextEmpty
	case req.Model == "" || req.Upstream == ReasonModelEmpty:
		return ReasonModelEmpty
	case req.Upstream == ReasonTokenize:
		return ReasonTokenize
	case req.Upstream != ReasonNone:
		return ReasonHashes
	}
	return ReasonNone
}

// coldSeed is cold-start seeding: every Nth tier-1.5 hit of the rule goes to
// the lowest-index eligible endpoint other than the winner w whose inventory
// is still cold. The tick is drawn once per request, so retries of one
// request do not advance it.
func (s *Selector) coldSeed(a *Attempt, elig epset.Set, w int) (int, bool) {
	n := uint64(s.opts.ColdStartSeedN)
	if n == 0 {
		return w, false
	}
	if a.tick == 0 {
		a.tick = s.coldTick.Add(1)
	}
	if a.tick%n != 0 {
		return w, false
	}
	minB := max(1, s.opts.ColdStartMinBlocks)
	for ep := elig.Next(0); ep >= 0; ep = elig.Next(ep + 1) {
		if ep != w && s.scorer.Blocks(ep) < minB {
			return ep, true
		}
	}
	return w, false
}

// gainCapFor scales the cap factor mlf of an endpoint by its overlap gain
// over the fleet's least-loaded endpoint: the full mlf once the gain reaches
// full blocks, less in proportion below, down to 100 (the mean) for no gain.
// A hit that saves little prefill is not worth queueing behind others
// (docs/selection.md, "Gain-scaled cap"). full ≤ 0 turns the scaling off.
func gainCapFor(mlf, gain, full int64) int64 {
	switch {
	case full <= 0 || gain >= full:
		return mlf
	case gain <= 0:
		return min(mlf, 100)
	}
	return 100 + (mlf-100)*gain/full
}

// gainRef is what the gain-scaled cap measures gains against: the score of
// the least-loaded eligible endpoint (ties to the higher score, so the gain
// is never overstated) and the gain in blocks that earns the full cap
// (LOXILB_KV_CAP_FULL_GAIN percent of the prompt's blocks, at least 1).
// full is 0 when the scaling is off or the mode does not use it.
type gainRef struct {
	refScore int64
	full     int64
}

func (g gainRef) mlf(mlf int64, score uint32) int64 {
	return gainCapFor(mlf, int64(score)-g.refScore, g.full)
}

// gainCap computes the gain reference over the eligible endpoints. Only the
// modes with a bounded-load cap (hard, adaptive, cost) scale it.
func (s *Selector) gainCap(el []int16, sc *scratch, nh int) gainRef {
	pct := int64(s.opts.CapFullGain)
	mode := s.opts.LBMode
	if pct <= 0 || len(el) == 0 || (mode != LBHard && mode != LBAdaptive && mode != LBCost) {
		return gainRef{}
	}
	ref := -1
	for _, m := range el {
		ep := int(m)
		if ref < 0 || sc.load[ep] < sc.load[ref] || (sc.load[ep] == sc.load[ref] && sc.counts[ep] > sc.counts[ref]) {
			ref = ep
		}
	}
	full := max(1, (pct*int64(nh)+99)/100)
	return gainRef{refScore: int64(sc.counts[ref]), full: full}
}

// blend applies LOXILB_KV_LB_MODE to the positive-overlap candidates. It
// returns the winner, whether it spilled off the argmax, and the mlf used
// (for spill relief).
func (s *Selector) blend(c *compiled, el []int16, sc *scratch, best int64, arg, nh int) (int, bool, int64) {
	mode := s.opts.LBMode
	if mode == LBOff {
		return arg, false, int64(s.opts.MeanLoadFactor)
	}
	n := 0
	var total, sum int64
	for _, m := range el {
		ep := int(m)
		if sc.counts[ep] == 0 {
			continue
		}
		sc.cands[n] = int16(ep)
		n++
		total += sc.load[ep]
		ci := s.capacity(c, ep)
		sc.capc[ep] = ci
		sum += ci
	}
	mlf := int64(s.opts.MeanLoadFactor)
	if mode == LBAdaptive || mode == LBAdaptiveSoft {
		mlf = adaptiveMLF(total)
	}
	w := -1
	switch mode {
	case LBHard, LBAdaptive:
		w = hardArm(sc, sc.cands[:n], mlf, total, sum, s.gainCap(el, sc, nh))
	case LBSoft, LBAdaptiveSoft:
		lambda := int64(s.opts.LoadPenalty)
		if mode == LBAdaptiveSoft {
			lambda = adaptiveLambda(total)
		}
		w = softArm(sc, sc.cands[:n], best, lambda)
	}
	if w < 0 {
		return arg, false, mlf
	}
	return w, w != arg, mlf
}

// hardArm is the bounded-load arm (hard, adaptive): the best overlap under
// its cap (scaled by its gain, g), ties to the least loaded, then the lowest
// ep_idx; when every candidate is at or over its cap, the least loaded, then
// the best overlap. It returns -1 only for no candidates.
func hardArm(sc *scratch, cands []int16, mlf, total, sum int64, g gainRef) int {
	w := -1
	for _, e := range cands {
		ep := int(e)
		if !underCap(sc.load[ep], g.mlf(mlf, sc.counts[ep]), total, sc.capc[ep], sum) {
			continue
		}
		if w < 0 || sc.counts[ep] > sc.counts[w] || (sc.counts[ep] == sc.counts[w] && sc.load[ep] < sc.load[w]) {
			w = ep
		}
	}
	if w >= 0 {
		return w
	}
	for _, e := range cands {
		ep := int(e)
		if w < 0 || sc.load[ep] < sc.load[w] || (sc.load[ep] == sc.load[w] && sc.counts[ep] > sc.counts[w]) {
			w = ep
		}
	}
	return w
}

// softArm is the cost arm (soft, adaptive-soft): the lowest
// (best-overlap)·1000 + λ·L/ĉ, ties to the better overlap, then the least
// loaded, then the lowest ep_idx. It returns -1 only for no candidates.
func softArm(sc *scratch, cands []int16, best, lambda int64) int {
	w := -1
	var wc int64
	for _, e := range cands {
		ep := int(e)
		cost := (best-int64(sc.counts[ep]))*1000 + lambda*sc.load[ep]/sc.capc[ep]
		if w < 0 || cost < wc ||
			(cost == wc && (sc.counts[ep] > sc.counts[w] || (sc.counts[ep] == sc.counts[w] && sc.load[ep] < sc.load[w]))) {
			w, wc = ep, cost
		}
	}
	return w
}

// relief is spill relief: when the chosen endpoint is at or over its cap
// computed over the whole eligible fleet (scaled by its gain, g), move to
// the least-loaded endpoint under its fleet cap (ties to the lowest
// ep_idx), overlap ignored. With LLB_KV_RELIEF_TARGET=holders it prefers
// an endpoint holding part of the prefix, and moves onto one with none only
// at holdersMissPct percent of the fleet cap (replica_relief.go).
func (s *Selector) relief(c *compiled, el []int16, sc *scratch, w int, mlf int64, g gainRef) int {
	if len(el) < 2 {
		return w
	}
	var total, sum int64
	for _, m := range el {
		ep := int(m)
		total += sc.load[ep]
		if sc.counts[ep] == 0 { // candidates already have ĉ from blend
			sc.capc[ep] = s.capacity(c, ep)
		}
		sum += sc.capc[ep]
	}
	if underCap(sc.load[w], g.mlf(mlf, sc.counts[w]), total, sc.capc[w], sum) {
		return w
	}
	to := -1
	if s.opts.ReliefTarget == ReliefToHolders {
		to = reliefTo(el, sc, mlf, total, sum, true)
		if to < 0 && underCap(sc.load[w], g.mlf(mlf, sc.counts[w])*holdersMissPct/100, total, sc.capc[w], sum) {
			return w
		}
	}
	if to < 0 {
		to = reliefTo(el, sc, mlf, total, sum, false)
	}
	if to < 0 {
		return w
	}
	return to
}

// watchdog tracks consecutive zero-overlap lookups against a non-empty
// inventory. At LOXILB_KV_ZERO_HIT_N in a row it counts every further one
// and warns once per transition.
func (s *Selector) watchdog(c *compiled, elig epset.Set, best uint32) {
	if best > 0 {
		s.zeroStreak.Store(0)
		return
	}
	nonEmpty := false
	for ep := elig.Next(0); ep >= 0; ep = elig.Next(ep + 1) {
		if s.scorer.Blocks(ep) > 0 {
			nonEmpty = true
			break
		}
	}
	if !nonEmpty {
		return
	}
	n := s.zeroStreak.Add(1)
	if n < int64(s.opts.ZeroHitN) {
		return
	}
	s.obs.ZeroHitWatchdog(c.rule.ServiceID)
	if n == int64(s.opts.ZeroHitN) {
		s.log.Warn("kv zero-hit watchdog: consecutive zero-overlap lookups against a non-empty inventory; block-hash parity is probably broken",
			"service_id", c.rule.ServiceID, "lookups", n,
			"check", "LLB_KV_NONE_HASH_SEED must equal vLLM PYTHONHASHSEED; kvBlockSize must equal vLLM --block-size; kvHashAlgo must match --prefix-caching-hash-algo; the staged tokenizer must be the model's")
	}
}
