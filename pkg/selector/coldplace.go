package selector

import (
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
	// ColdPlacementSel leaves cold requests to the rule's sel (the default).
	ColdPlacementSel ColdPlacement = iota
	// ColdPlacementHash places them by a bounded-load rendezvous hash of
	// the prompt's first blocks.
	ColdPlacementHash
)

func (p ColdPlacement) String() string {
	if p == ColdPlacementHash {
		return "hash"
	}
	return "sel"
}

// ParseColdPlacement parses a LLB_KV_COLD_PLACEMENT value: sel (also empty,
// the default) or hash, case-insensitively.
func ParseColdPlacement(s string) (ColdPlacement, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "sel":
		return ColdPlacementSel, nil
	case "hash":
		return ColdPlacementHash, nil
	}
	return 0, &ParseError{What: "cold placement", Value: strings.TrimSpace(s), Allowed: "sel (the default), hash"}
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
// the eligible endpoint of highest rendezvous weight under the bounded-load
// cap, sc.load holding the loads. -1 when the option is off, the prompt has
// no full block or nothing is eligible.
func (s *Selector) coldPlace(req *Request, elig epset.Set, sc *scratch, d *Decision) int {
	if s.opts.ColdPlacement != ColdPlacementHash || len(req.Hashes) == 0 {
		return -1
	}
	if d.Reason != ReasonNoWorker && d.Reason != ReasonShallow {
		return -1
	}
	return boundedHashPick(elig, coldKey(req.Hashes, d.MinBlocks), sc, s.opts.MeanLoadFactor)
}

// onlyPredicted reports, with cold placement on and a provisional overlay
// in front of the inventory, that no eligible endpoint has confirmed (by an
// engine's BlockStored) the blocks that key the prompt's placement: every
// holder tier 1.5 found is a prediction of this replica's own, which other
// replicas do not share. Such a prompt is placed as a cold one, so the
// replicas agree on where its prefix is computed even when the cap moves it.
func (s *Selector) onlyPredicted(req *Request, mb int, el []int16, elig epset.Set, sc *scratch) bool {
	if s.opts.ColdPlacement != ColdPlacementHash || s.confirmed == nil {
		return false
	}
	k := coldKeyBlocks(mb, len(req.Hashes))
	s.confirmed.Score(req.Hashes[:k], elig, true, &sc.confirmed)
	for _, m := range el {
		if int(sc.confirmed[m]) >= k {
			return false
		}
	}
	return true
}
