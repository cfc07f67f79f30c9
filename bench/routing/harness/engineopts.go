package harness

import "github.com/kvgate/kvgate/internal/enginesim"

// applyEngineOptions sets what the profile and the oracle need beyond the
// fields every enginesim version has.
func applyEngineOptions(cfg *enginesim.Config, p Profile, debugState bool) {
	_ = cfg
	_ = p
	_ = debugState
}
