package harness

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/selector"
)

// TestReplicaPolicyNames: kvgate-xN takes its variants as suffixes in any
// order; an unknown suffix or an N out of range is not a replica policy.
func TestReplicaPolicyNames(t *testing.T) {
	hash, sel := selector.ColdPlacementHash, selector.ColdPlacementSel
	for _, c := range []struct {
		name  string
		n     int
		flags ReplicaFlags
		ok    bool
	}{
		{"kvgate-x1", 1, ReplicaFlags{}, true},
		{"kvgate-x3-local", 3, ReplicaFlags{LocalOnly: true}, true},
		{"kvgate-x3-hash", 3, ReplicaFlags{ColdPlacement: &hash}, true},
		{"kvgate-x3-sel-local", 3, ReplicaFlags{LocalOnly: true, ColdPlacement: &sel}, true},
		{"kvgate-x3-hash-decay500", 3, ReplicaFlags{ColdPlacement: &hash, HalfLife: 500 * time.Millisecond}, true},
		{"kvgate-x3-scrape250-local", 3, ReplicaFlags{LocalOnly: true, Scrape: 250 * time.Millisecond}, true},
		{"kvgate-x3-lc", 3, ReplicaFlags{LeastConn: true}, true},
		{"kvgate-x3-mirror", 3, ReplicaFlags{Mirror: true}, true},
		{"kvgate-x3-holders-mirror", 3, ReplicaFlags{Mirror: true, Holders: true}, true},
		{"kvgate-x1-holders", 1, ReplicaFlags{Holders: true}, true},
		{"kvgate-x3-decay0", 0, ReplicaFlags{}, false},
		{"kvgate-x3-scrape", 0, ReplicaFlags{}, false},
		{"kvgate-x3-fast", 0, ReplicaFlags{}, false},
		{"kvgate-x9", 0, ReplicaFlags{}, false},
		{"kvgate-cost", 0, ReplicaFlags{}, false},
	} {
		n, flags, ok := replicaCount(c.name)
		if ok != c.ok || !ok {
			if ok != c.ok {
				t.Errorf("%s: ok %v, want %v", c.name, ok, c.ok)
			}
			continue
		}
		same := (flags.ColdPlacement == nil) == (c.flags.ColdPlacement == nil) &&
			(flags.ColdPlacement == nil || *flags.ColdPlacement == *c.flags.ColdPlacement)
		if n != c.n || flags.LocalOnly != c.flags.LocalOnly || flags.LeastConn != c.flags.LeastConn || flags.Mirror != c.flags.Mirror || flags.Holders != c.flags.Holders || flags.HalfLife != c.flags.HalfLife || flags.Scrape != c.flags.Scrape || !same {
			t.Errorf("%s: %d %+v, want %d %+v", c.name, n, flags, c.n, c.flags)
		}
	}
}
