package selector

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// The cost mode (LOXILB_KV_LB_MODE=cost, docs/selection.md "Cost mode")
// predicts each eligible endpoint's time to first token for the request,
//
//	TTFT_i = (pending_i + uncached_i) × perToken_i
//
// plus, with LOXILB_KV_COST_WORK_WEIGHT w > 0, w × uncached_i × perToken_i:
// the prefill work the choice adds to the fleet.
//
// where pending_i is the uncached prompt tokens kvgate sent i that have not
// produced a first body byte, uncached_i the request's prompt tokens minus
// its scored overlap on i, and perToken_i i's prefill time per token,
// learned online (Costs). The lowest prediction under the fleet-wide load
// cap wins.

const (
	// DefaultPrefillPerToken is the cold-start prefill time per token, used
	// for an endpoint without a sample while no endpoint has one (with
	// samples elsewhere, the fleet mean is used): about an 8B model's
	// prefill on one H100-class GPU (docs/enginesim.md).
	DefaultPrefillPerToken = 50 * time.Microsecond
	// MinLearnTokens: a request whose predicted work is smaller teaches
	// nothing, because its TTFT is mostly the engine's step floor and the
	// hop, not prefill.
	MinLearnTokens = 256
	// costEWMAWeight is the weight of a new sample in the per-token EWMA.
	costEWMAWeight = 0.2
	// Per-token samples are clamped to this range so one stalled or
	// instant response cannot swing the estimate by orders of magnitude.
	minPerTokenNs = 100.0
	maxPerTokenNs = 100e6
	// maxPendingTokens bounds an endpoint's pending counter.
	maxPendingTokens = 1 << 40
)

// costArm is the cost mode's choice among every eligible endpoint: the
// lowest predicted TTFT among those under their fleet cap (mlf over the
// whole eligible fleet, as spill relief computes it, scaled by the
// endpoint's overlap gain with LOXILB_KV_CAP_FULL_GAIN), ties to the higher
// overlap, then the least loaded, then the lowest ep_idx. When every
// endpoint is at or over its cap (unreachable while mlf ≥ 100), the least
// loaded wins.
func (s *Selector) costArm(c *compiled, el []int16, sc *scratch, req *Request, arg int) int {
	bs := int64(c.blockSize)
	if req.BlockTokens > 0 {
		bs = int64(req.BlockTokens)
	}
	prompt := max(int64(req.PromptTokens), int64(len(req.Hashes))*bs)
	var total, sum int64
	var knownSum float64
	known := 0
	for _, m := range el {
		ep := int(m)
		total += sc.load[ep]
		sc.capc[ep] = s.capacity(c, ep)
		sum += sc.capc[ep]
		if v, ok := s.cost.PrefillPerToken(ep); ok && v > 0 {
			knownSum += float64(v)
			known++
		}
	}
	fallback := float64(DefaultPrefillPerToken)
	if known > 0 {
		fallback = knownSum / float64(known)
	}
	mlf := int64(s.opts.MeanLoadFactor)
	g := s.gainCap(el, sc, len(req.Hashes))
	work := float64(s.opts.CostWorkWeight) / 100
	w := -1
	for _, m := range el {
		ep := int(m)
		per := fallback
		if v, ok := s.cost.PrefillPerToken(ep); ok && v > 0 {
			per = float64(v)
		}
		uncached := max(prompt-int64(sc.counts[ep])*bs, 0)
		pending := min(max(s.cost.PendingTokens(ep), 0), maxPendingTokens)
		sc.cost[ep] = (float64(pending+uncached) + work*float64(uncached)) * per
		if !underCap(sc.load[ep], g.mlf(mlf, sc.counts[ep]), total, sc.capc[ep], sum) {
			continue
		}
		if w < 0 || costBetter(sc, ep, w) {
			w = ep
		}
	}
	if w >= 0 {
		return w
	}
	for _, m := range el {
		ep := int(m)
		if w < 0 || sc.load[ep] < sc.load[w] {
			w = ep
		}
	}
	if w < 0 {
		return arg
	}
	return w
}

// costBetter orders a before b: lower predicted TTFT, then higher overlap,
// then lower load (the caller visits endpoints in ep_idx order, so equal
// ones stay with the lower index).
func costBetter(sc *scratch, a, b int) bool {
	switch {
	case sc.cost[a] != sc.cost[b]:
		return sc.cost[a] < sc.cost[b]
	case sc.counts[a] != sc.counts[b]:
		return sc.counts[a] > sc.counts[b]
	}
	return sc.load[a] < sc.load[b]
}

// Costs tracks, per endpoint, the prefill work in flight and the learned
// prefill time per token, for the cost mode. The proxy calls Dispatch when
// a request is sent, then exactly one of FirstByte (its first response
// body byte arrived) or Abandon (it ended without one). It implements
// CostSource and is safe for concurrent use.
type Costs struct {
	pending [epset.Max]atomic.Int64
	ewma    [epset.Max]atomic.Uint64 // float64 bits, ns per token; 0 = no sample yet
}

// CostTicket is one dispatched request's share of an endpoint's pending
// work. Use it once.
type CostTicket struct {
	c      *Costs
	ep     int
	tokens int64
	ahead  int64 // pending tokens on ep when the request was sent
	done   atomic.Bool
}

// Dispatch records that tokens uncached prompt tokens were sent to ep.
// It returns nil for an out-of-range endpoint (nothing to track).
func (c *Costs) Dispatch(ep int, tokens int64) *CostTicket {
	if c == nil || ep < 0 || ep >= epset.Max {
		return nil
	}
	tokens = min(max(tokens, 0), maxPendingTokens)
	ahead := c.pending[ep].Add(tokens) - tokens
	return &CostTicket{c: c, ep: ep, tokens: tokens, ahead: max(ahead, 0)}
}

// Tokens is the ticket's uncached prompt tokens.
func (t *CostTicket) Tokens() int64 {
	if t == nil {
		return 0
	}
	return t.tokens
}

// FirstByte ends the ticket's pending work and learns from its time to
// first body byte: the prediction multiplies (work ahead + own work) by the
// per-token time, so the sample divides the observed time by the same sum.
// Work under MinLearnTokens teaches nothing.
func (t *CostTicket) FirstByte(ttft time.Duration) {
	if t == nil || !t.done.CompareAndSwap(false, true) {
		return
	}
	t.c.pending[t.ep].Add(-t.tokens)
	work := t.ahead + t.tokens
	if work < MinLearnTokens || ttft <= 0 {
		return
	}
	t.c.learn(t.ep, float64(ttft)/float64(work))
}

// Abandon ends the ticket's pending work without a sample (the request
// failed, or ended before its first body byte).
func (t *CostTicket) Abandon() {
	if t == nil || !t.done.CompareAndSwap(false, true) {
		return
	}
	t.c.pending[t.ep].Add(-t.tokens)
}

func (c *Costs) learn(ep int, sample float64) {
	sample = min(max(sample, minPerTokenNs), maxPerTokenNs)
	for {
		old := c.ewma[ep].Load()
		next := sample
		if old != 0 {
			prev := math.Float64frombits(old)
			next = prev + costEWMAWeight*(sample-prev)
		}
		if c.ewma[ep].CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// PendingTokens implements CostSource.
func (c *Costs) PendingTokens(ep int) int64 {
	if c == nil || ep < 0 || ep >= epset.Max {
		return 0
	}
	return max(c.pending[ep].Load(), 0)
}

// PrefillPerToken implements CostSource.
func (c *Costs) PrefillPerToken(ep int) (time.Duration, bool) {
	if c == nil || ep < 0 || ep >= epset.Max {
		return 0, false
	}
	v := c.ewma[ep].Load()
	if v == 0 {
		return 0, false
	}
	return time.Duration(math.Float64frombits(v)), true
}

// Forget drops ep's learned speed (the endpoint was replaced by another
// engine). Its pending work stays: the tickets in flight settle it.
func (c *Costs) Forget(ep int) {
	if c == nil || ep < 0 || ep >= epset.Max {
		return
	}
	c.ewma[ep].Store(0)
}

// coldCostTolerance is the margin, in percent of the least prediction,
// within which cold placement counts endpoints as tied. Without it the
// endpoint whose learned per-token time happens to be lowest would take
// every cold prompt of an idle fleet, its estimate's noise deciding where
// whole prefixes start; a prompt's own pending prefill elsewhere still
// separates endpoints (it doubles a prediction).
const coldCostTolerance = 10

// costPick is the cold placement by cost (LLB_KV_COLD_PLACEMENT=cost): the
// eligible endpoint with the least predicted time to first token for a
// prompt no endpoint holds, (pending_i + prompt) × perToken_i. Endpoints
// within coldCostTolerance of the least are tied; among them the fewest in
// flight (sc.load), then round-robin. -1 for an empty set.
func (s *Selector) costPick(req *Request, elig epset.Set, sc *scratch) int {
	members := list(elig, &sc.memb)
	if len(members) == 0 {
		return -1
	}
	prompt := max(int64(req.PromptTokens), int64(len(req.Hashes))*int64(max(req.BlockTokens, 1)), 1)
	var knownSum float64
	known := 0
	for _, m := range members {
		if v, ok := s.cost.PrefillPerToken(int(m)); ok && v > 0 {
			knownSum += float64(v)
			known++
		}
	}
	fallback := float64(DefaultPrefillPerToken)
	if known > 0 {
		fallback = knownSum / float64(known)
	}
	least := math.Inf(1)
	for _, m := range members {
		ep := int(m)
		per := fallback
		if v, ok := s.cost.PrefillPerToken(ep); ok && v > 0 {
			per = float64(v)
		}
		pending := min(max(s.cost.PendingTokens(ep), 0), maxPendingTokens)
		sc.cost[ep] = float64(pending+prompt) * per
		least = min(least, sc.cost[ep])
	}
	limit := least * (100 + coldCostTolerance) / 100
	n := 0
	fewest := int64(-1)
	for _, m := range members {
		ep := int(m)
		if sc.cost[ep] > limit {
			continue
		}
		switch l := sc.load[ep]; {
		case fewest < 0 || l < fewest:
			fewest, n = l, 0
			sc.tied[n] = m
			n++
		case l == fewest:
			sc.tied[n] = m
			n++
		}
	}
	return pickTied(sc.tied[:n], &s.rrCold)
}
