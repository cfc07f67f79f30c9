package selector

import "strings"

// ReliefTarget is LLB_KV_RELIEF_TARGET: where spill relief may move a hit
// (docs/replicas.md, "Spill relief across replicas").
type ReliefTarget uint8

const (
	// ReliefToFleet is the spec's relief: the least-loaded endpoint under its
	// fleet cap anywhere in the eligible fleet, even with zero overlap (the
	// default).
	ReliefToFleet ReliefTarget = iota
	// ReliefToHolders moves a hit to the least-loaded endpoint under its
	// fleet cap that holds part of its prefix (score > 0); with none, onto
	// one without overlap only when the hit's endpoint is at
	// holdersMissPct percent of its fleet cap. A move onto an endpoint with no
	// overlap computes the whole prefix again, for a queue that, with
	// several replicas, relief judges through a view a scrape old; a hot
	// prefix on one endpoint must still spread.
	ReliefToHolders
)

func (t ReliefTarget) String() string {
	if t == ReliefToHolders {
		return "holders"
	}
	return "fleet"
}

// ParseReliefTarget parses a LLB_KV_RELIEF_TARGET value: fleet (also empty)
// or holders, case-insensitive.
func ParseReliefTarget(s string) (ReliefTarget, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "fleet":
		return ReliefToFleet, nil
	case "holders":
		return ReliefToHolders, nil
	}
	return 0, &ParseError{What: "relief target", Value: strings.TrimSpace(s), Allowed: "fleet (the default), holders"}
}

// holdersMissPct scales the cap factor at which ReliefToHolders moves a hit
// onto an endpoint without overlap: 1.5 times the fleet cap (with the
// default mlf 175, 2.6 times the fleet's mean load). Twice would never move
// a lone holder of a three-endpoint fleet (2 × 1.75 / 3 > 1).
const holdersMissPct = 150

// reliefTo is the least-loaded endpoint of el under its fleet cap (ties to
// the lowest ep_idx), only among those with a positive score when
// holdersOnly; -1 for none.
func reliefTo(el []int16, sc *scratch, mlf, total, sum int64, holdersOnly bool) int {
	to := -1
	for _, m := range el {
		ep := int(m)
		if (holdersOnly && sc.counts[ep] == 0) || !underCap(sc.load[ep], mlf, total, sc.capc[ep], sum) {
			continue
		}
		if to < 0 || sc.load[ep] < sc.load[to] {
			to = ep
		}
	}
	return to
}
