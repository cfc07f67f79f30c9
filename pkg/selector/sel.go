package selector

import (
	"strconv"
	"strings"
)

// Sel is a rule's serviceArguments.sel: LoxiLB's endpoint selector, which
// kvgate runs as the single-pool fallback after a tier-1.5 miss
// (docs/selection.md, "Fallbacks"). The numbers are LoxiLB's wire values.
type Sel int

const (
	SelRR        Sel = 0  // round-robin
	SelHash      Sel = 1  // hash of the client address
	SelPriority  Sel = 2  // highest weight, ties to the lowest ep_idx
	SelPersist   Sel = 3  // a client sticks to its endpoint for the session TTL
	SelLeastConn Sel = 4  // least connections (lc)
	SelN2        Sel = 5  // hash of the client address (LoxiLB's n2)
	SelN3        Sel = 6  // hash of the client address (LoxiLB's n3)
	SelReserved  Sel = 7  // reserved by LoxiLB; the API rejects it, the selector round-robins
	SelCHWBL     Sel = 8  // least in-flight per unit of capacity
	SelGPUAware  Sel = 9  // least in-flight per unit of capacity
	SelWRRHash   Sel = 10 // hash of the client address (alias chwbl-wrr)

	// SelMax is the largest sel value.
	SelMax = SelWRRHash
)

// selNames are the names kvctl's --select takes; index = value.
var selNames = [...]string{"rr", "hash", "priority", "persist", "lc", "n2", "n3", "reserved", "chwbl", "gpuaware", "wrr-hash"}

// SelAllowed lists the accepted sel values, for error messages.
const SelAllowed = "0 rr, 1 hash, 2 priority, 3 persist, 4 lc, 5 n2, 6 n3, 8 chwbl, 9 gpuaware, 10 wrr-hash"

// String is the value's name (its number when it has none).
func (s Sel) String() string {
	if s >= 0 && s <= SelMax {
		return selNames[s]
	}
	return strconv.Itoa(int(s))
}

// Valid reports whether a rule may carry s: a defined value, not the
// reserved 7.
func (s Sel) Valid() bool { return s >= SelRR && s <= SelMax && s != SelReserved }

// NeedsFullProxy reports whether s runs only in fullproxy mode (mode 4), as
// in LoxiLB.
func (s Sel) NeedsFullProxy() bool {
	switch s {
	case SelN2, SelCHWBL, SelGPUAware, SelWRRHash:
		return true
	}
	return false
}

// ParseSel reads a sel by name (case-insensitive; chwbl-wrr is an alias of
// wrr-hash) or by number. The reserved 7 and unknown values are errors.
func ParseSel(v string) (Sel, error) {
	t := strings.ToLower(strings.TrimSpace(v))
	if t == "chwbl-wrr" {
		return SelWRRHash, nil
	}
	for i, n := range selNames {
		if t == n && Sel(i) != SelReserved {
			return Sel(i), nil
		}
	}
	if n, err := strconv.Atoi(t); err == nil && Sel(n).Valid() {
		return Sel(n), nil
	}
	return 0, &ParseError{What: "selector", Value: strings.TrimSpace(v), Allowed: SelAllowed}
}
