package ingest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// TestBacklogEstimate: a rank estimates its queued hashes from the stored
// hashes per byte it has applied, reserves nothing below minBacklogReserve
// or before any history, and tells the inventory again only when the
// estimate moved by more than an eighth or to or from nothing.
func TestBacklogEstimate(t *testing.T) {
	for _, tc := range []struct {
		name         string
		bytes        int64 // applied so far
		stored       int   // hashes those bytes stored
		queued       int64
		reserved     int // the last estimate told
		wantEstimate int
		wantChanged  bool
	}{
		{"no history", 0, 0, 1 << 30, 0, 0, false},
		{"removes only", 1 << 20, 0, 1 << 30, 0, 0, false},
		{"small backlog", 9 << 10, 1024, 9 * 1000, 0, 0, false},
		{"burst", 9 << 10, 1024, 9 << 20, 0, 1 << 20, true},
		{"burst, same estimate", 9 << 10, 1024, 9 << 20, 1 << 20, 1 << 20, false},
		{"burst, an eighth less", 9 << 10, 1024, 9 << 20, (1 << 20) * 8 / 7, 1 << 20, false},
		{"burst, much less", 9 << 10, 1024, 9 << 20, 2 << 20, 1 << 20, true},
		{"burst drained", 9 << 10, 1024, 0, 1 << 20, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b backlog
			b.noteApplied(tc.bytes, tc.stored)
			b.reserved = tc.reserved
			got := b.estimate(tc.queued)
			if got != tc.wantEstimate {
				t.Fatalf("estimate %d, want %d", got, tc.wantEstimate)
			}
			if ch := b.changed(got); ch != tc.wantChanged {
				t.Fatalf("changed %v, want %v", ch, tc.wantChanged)
			}
		})
	}
}

// gatedSink holds every Add until open is closed, so a burst waits in the
// subscriber's queue, and records the reservations it passes on.
type gatedSink struct {
	*inventory.Index
	open chan struct{}
	mu   sync.Mutex
	seen []int
}

func (g *gatedSink) Add(ep, rank int, medium string, hashes []uint64) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	<-open
	return g.Index.Add(ep, rank, medium, hashes)
}

func (g *gatedSink) gate(open chan struct{}) {
	g.mu.Lock()
	g.open = open
	g.mu.Unlock()
}

func (g *gatedSink) ExpectStored(ep, n int) {
	g.mu.Lock()
	g.seen = append(g.seen, n)
	g.mu.Unlock()
	g.Index.ExpectStored(ep, n)
}

// TestBurstReservesAndWithdraws publishes a burst over real ZeroMQ sockets on
// two ranks of one endpoint while the inventory holds the first batch back,
// so the burst waits in the queues: the ranks announce the queued hashes
// (both ranks' together), the inventory ends exact, and the reservation is
// withdrawn once the queues are empty.
func TestBurstReservesAndWithdraws(t *testing.T) {
	opened := make(chan struct{})
	close(opened)
	g := &gatedSink{open: opened}
	h := newHarness(t, harnessConfig{ranks: 2, sink: func(ix *inventory.Index) Sink { g.Index = ix; return g }})
	h.sync(0)
	h.sync(1)
	held := make(chan struct{})
	g.gate(held)
	const batches, perBatch = 300, 512
	var last [2]uint64
	for i := range batches {
		for r, p := range h.pubs {
			last[r] = p.publish(false, stored(hashRange(uint64(1_000_000*(r+1)+perBatch*i), perBatch)...))
		}
	}
	// Give the sockets time to carry the burst into the queues while the
	// first batch is held (the bounds below hold even if only part of it
	// arrived by then).
	time.Sleep(300 * time.Millisecond)
	close(held)
	h.waitSeq(0, last[0])
	h.waitSeq(1, last[1])
	h.wantInventory(append(h.pubs[0].cached(), h.pubs[1].cached()...))
	waitFor(t, "the reservation to be withdrawn", func() bool { return h.ix.Stats().Reserved == 0 })
	g.mu.Lock()
	defer g.mu.Unlock()
	peak := slices.Max(append(g.seen, 0))
	// Each rank's estimate comes from the bytes per stored hash it has
	// applied; the two queues hold at most the whole burst.
	if lo, hi := minBacklogReserve, 2*batches*perBatch; peak < lo || peak > hi {
		t.Fatalf("peak reservation %d (calls %v), want between %d and %d", peak, g.seen, lo, hi)
	}
	if g.seen[len(g.seen)-1] != 0 {
		t.Fatalf("last reservation %d, want 0 (withdrawn)", g.seen[len(g.seen)-1])
	}
}
