package selector

import (
	"encoding/binary"
	"strings"

	"github.com/kvgate/kvgate/pkg/epset"
)

// Cold placement (docs/replicas.md, "Cold placement"; docs/selection.md,
// "Fallbacks"): where a request goes when the KV tier knows no engine that
// holds its prefix. The rule's sel (round-robin by default) depends on each
// replica's own cursor, so the first requests of a new prefix that reach
// different replicas before the first placement's KV events arrive start the
// prefix on several engines. Placing by a rendezvous hash of the prompt's own
// first blocks, under the bounded-load cap, sends them to one engine from
// every replica that numbers endpoints alike.

// ColdPlacement is LLB_KV_COLD_PLACEMENT.
type ColdPlacement uint8

const (
	// ColdPlacementSel leaves cold requests to the rule's sel (the spec's
	// fallback).
	ColdPlacementSel ColdPlacement = iota
	// ColdPlacementHash places them by a bounded-load rendezvous hash of
	// the prompt's first blocks.
	ColdPlacementHash
	// ColdPlacementCost places them on the endpoint with the least
	// predicted time to first token: the prefill work pending there plus
	// the whole prompt, times its learned per-token time (costPick).
	ColdPlacementCost
)

func (p ColdPlacement) String() string {
	switch p {
	case ColdPlacementHash:
		return "hash"
	case ColdPlacementCost:
		return "cost"
	}
	return "sel"
}

// DefaultColdPlacement is LLB_KV_COLD_PLACEMENT's default: by cost. The
// spec's fallback, the rule's sel, lost the routing benchmark's herding
// workload (docs/routing-benchmark.md, "Cold placement by cost").
const DefaultColdPlacement = ColdPlacementCost

// ParseColdPlacement parses a LLB_KV_COLD_PLACEMENT value: cost (also
// empty, the default), sel or hash, case-insensitively.
func ParseColdPlacement(s string) (ColdPlacement, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return DefaultColdPlacement, nil
	case "sel":
		return ColdPlacementSel, nil
	case "hash":
		return ColdPlacementHash, nil
	case "cost":
		return ColdPlacementCost, nil
	}
	return 0, &ParseError{What: "cold placement", Value: strings.TrimSpace(s), Allowed: "cost (the default), sel, hash"}
}

// coldKeyBlocks is how many leading blocks key a cold placement: the shallow
// guard's threshold (at least one block, at most the prompt's), so prompts
// that would score as sharing a usable prefix once one of them is stored hash
// alike, and prompts that share less spread.
func coldKeyBlocks(minBlocks, nHashes int) int {
	return min(max(minBlocks, 1), nHashes)
}

// coldKey is the placement key of a prompt: its k-th block hash, which
// vLLM's chained hashing makes a digest of the first k blocks. The block
// hashes are the engines' own, so every replica derives the same key.
func coldKey(hashes []uint64, minBlocks int) uint64 {
	return mix64(hashes[coldKeyBlocks(minBlocks, len(hashes))-1])
}

// coldPlace is the cold placement of a request tier 1.5 did not route for
// want of a holder (no_worker, or shallow: too little overlap to count):
// with hash, the eligible endpoint of highest rendezvous weight among the
// least loaded (coldHashPick), sc.load holding the loads; with cost, the
// least predicted TTFT (costPick), single-pool rules only: a P/D rule's
// Tier 2 already picks by load. -1 when the option is sel, the prompt has
// no full block (hash) or nothing is eligible.
func (s *Selector) coldPlace(req *Request, elig epset.Set, sc *scratch, d *Decision, pd bool) int {
	if d.Reason != ReasonNoWorker && d.Reason != ReasonShallow {
		return -1
	}
	switch s.opts.ColdPlacement {
	case ColdPlacementHash:
		if len(req.Hashes) == 0 {
			return -1
		}
		return coldHashPick(elig, coldKey(req.Hashes, d.MinBlocks), sc)
	case ColdPlacementCost:
		if pd {
			return -1
		}
		return s.costPick(req, elig, sc)
	}
	return -1
}

// coldSlack is how far above the least-loaded eligible endpoint a cold
// prompt's endpoint may be. A cold prompt has no cached prefix to keep, so
// its cap is the tightest that still lets replicas agree: the rule's
// bounded-load cap (LOXILB_KV_MEAN_LOAD_FACTOR) let unique prompts pile up
// on whichever endpoints their hashes favoured, and the routing benchmark's
// nosharing TTFT p90 rose 1.8× over round-robin (docs/replicas.md).
const coldSlack = 1

// coldHashPick is the eligible endpoint of highest rendezvous weight among
// those whose load is at most the least load plus coldSlack; sc.load must
// hold the loads. -1 for an empty set. Replicas whose views of the loads
// differ by less than the slack pick alike, and a key moves only when its
// endpoint leaves or loads up.
func coldHashPick(set epset.Set, h uint64, sc *scratch) int {
	members := list(set, &sc.memb)
	if len(members) == 0 {
		return -1
	}
	least := sc.load[members[0]]
	for _, m := range members[1:] {
		least = min(least, sc.load[m])
	}
	best, bw := -1, uint64(0)
	for _, m := range members {
		if sc.load[m] > least+coldSlack {
			continue
		}
		if w := rendezvousWeight(h, int(m)); best < 0 || w > bw {
			best, bw = int(m), w
		}
	}
	return best
}

// onlyPredicted reports, with cold placement on and a provisional overlay
// in front of the inventory, that no eligible endpoint has confirmed (by an
// engine's BlockStored) the blocks that key the prompt's placement: every
// holder tier 1.5 found is a prediction of this replica's own, which other
// replicas do not share. Such a prompt is placed by the same rendezvous
// order, under the rule's bounded-load cap (a predicted prefix is worth
// keeping, so not the cold slack), so the replicas agree on where its prefix
// is computed even when the cap moves it.
func (s *Selector) onlyPredicted(req *Request, mb int, el []int16, elig epset.Set, sc *scratch) bool {
	if s.opts.ColdPlacement != ColdPlacementHash || s.confirmed == nil {
		return false
	}
	k := coldKeyBlocks(mb, len(req.Hashes))
	s.confirmed.Score(req.Hashes[:k], elig, true, &sc.confirmed)
	for _, m := range el {
		// Any credit counts: an offloaded block scores below a whole one
		// (LLB_KV_TIER_WEIGHTS) but is still the engine's own.
		if sc.confirmed[m] > 0 {
			return false
		}
	}
	return true
}

// rendezvousWeight is the weight of endpoint ep for key h, the one
// boundedHashPick ranks by: no per-process seed, so alike on every replica.
func rendezvousWeight(h uint64, ep int) uint64 {
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(ep))
	return mix64(h ^ mix64(binary.LittleEndian.Uint64(buf[:])+0x9e3779b97f4a7c15))
}
