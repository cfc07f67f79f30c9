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
	// ReliefToHolders moves a hit only to an endpoint that holds part of
	// its prefix (score > 0); with none under its fleet cap the hit stays.
	// With several replicas the view relief judges by lags a scrape, and a
	// move onto an endpoint with no overlap computes the whole prefix again.
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
