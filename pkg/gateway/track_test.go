package gateway

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/selector"
)

// TestPlanTracksRoutedRequest checks what a routed request holds between
// its decision and its end: its prompt's blocks are provisional on its
// endpoint until it ends, and its uncached tokens are pending prefill work
// there until its first body byte (or its end, when none came).
func TestPlanTracksRoutedRequest(t *testing.T) {
	hashes := make([]uint64, 40) // 640 tokens at block size 16
	for i := range hashes {
		hashes[i] = uint64(i)*7919 + 3
	}
	for _, tc := range []struct {
		name        string
		score       int // blocks credited to the chosen endpoint
		firstBody   bool
		wantPending int64 // while in flight
		wantSample  bool
	}{
		{"a cold prompt: all its tokens are pending, the first byte teaches", 0, true, 640, true},
		{"a warm prompt: only its uncached tokens are pending", 30, true, 160, false},
		{"no first byte: the work is given back untaught", 0, false, 640, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ov, err := inventory.NewOverlay(ix, inventory.ProvisionalOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r := &router{overlay: ov, costs: &selector.Costs{}}
			sc := &plan{r: r, tokens: 640, blockTokens: 16}
			sc.selReq.Hashes = hashes
			const ep = 2
			sc.reserve(ep, tc.score)
			if got := ov.Provisional(ep); got != len(hashes) {
				t.Fatalf("provisional blocks in flight = %d, want %d", got, len(hashes))
			}
			if got := r.costs.PendingTokens(ep); got != tc.wantPending {
				t.Fatalf("pending tokens in flight = %d, want %d", got, tc.wantPending)
			}
			if tc.firstBody {
				time.Sleep(time.Millisecond)
				sc.FirstBody()
				if got := r.costs.PendingTokens(ep); got != 0 {
					t.Fatalf("pending tokens after the first body byte = %d, want 0", got)
				}
			}
			sc.Ended()
			if got := ov.Provisional(ep); got != 0 {
				t.Errorf("provisional blocks after the end = %d, want 0", got)
			}
			if got := r.costs.PendingTokens(ep); got != 0 {
				t.Errorf("pending tokens after the end = %d, want 0", got)
			}
			if _, known := r.costs.PrefillPerToken(ep); known != tc.wantSample {
				t.Errorf("learned a per-token time: %v, want %v", known, tc.wantSample)
			}
		})
	}
}

// TestPlanWithoutHashesTracksNothing: a request that was not hashed (a
// guard miss) reserves nothing and adds no pending work.
func TestPlanWithoutHashesTracksNothing(t *testing.T) {
	ix, _ := inventory.New(inventory.Options{})
	ov, _ := inventory.NewOverlay(ix, inventory.ProvisionalOptions{})
	r := &router{overlay: ov, costs: &selector.Costs{}}
	sc := &plan{r: r}
	sc.reserve(1, 0)
	sc.FirstBody()
	sc.Ended()
	if ov.Provisional(1) != 0 || r.costs.PendingTokens(1) != 0 {
		t.Fatal("an unhashed request was tracked")
	}
}

// TestPlanReRouteMovesReservation: a request re-routed after a failed
// connect holds its blocks and pending work on the new endpoint only.
func TestPlanReRouteMovesReservation(t *testing.T) {
	ix, _ := inventory.New(inventory.Options{})
	ov, _ := inventory.NewOverlay(ix, inventory.ProvisionalOptions{})
	r := &router{overlay: ov, costs: &selector.Costs{}}
	sc := &plan{r: r, tokens: 160, blockTokens: 16}
	sc.selReq.Hashes = []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	sc.reserve(2, 0)
	sc.reserve(1, 0)
	for _, c := range []struct {
		ep          int
		blocks      int
		pendingToks int64
	}{{2, 0, 0}, {1, 10, 160}} {
		if got := ov.Provisional(c.ep); got != c.blocks {
			t.Errorf("ep %d: provisional blocks = %d, want %d", c.ep, got, c.blocks)
		}
		if got := r.costs.PendingTokens(c.ep); got != c.pendingToks {
			t.Errorf("ep %d: pending tokens = %d, want %d", c.ep, got, c.pendingToks)
		}
	}
	sc.Ended()
	if ov.Provisional(1) != 0 || r.costs.PendingTokens(1) != 0 {
		t.Error("the re-routed request's reservation outlived it")
	}
}
