package ingest

import "github.com/kvgate/kvgate/pkg/inventory"

// Sink is where decoded events land: a rule's block inventory. Ingest needs
// only these five calls, so a decorator (metrics, tracing) or another index
// backend can stand in for *inventory.Index.
type Sink interface {
	// Add records that (ep, rank) holds hashes on medium.
	Add(ep, rank int, medium string, hashes []uint64) error
	// Remove forgets hashes of (ep, rank) on medium.
	Remove(ep, rank int, medium string, hashes []uint64) error
	// ClearRank forgets every block of (ep, rank).
	ClearRank(ep, rank int) error
	// ClearEndpoint forgets every block of ep, on all ranks.
	ClearEndpoint(ep int) error
	// Blocks counts the blocks ep holds.
	Blocks(ep int) int
}

var _ Sink = (*inventory.Index)(nil)
