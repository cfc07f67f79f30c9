package inventory

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// fakeClock is a settable clock for the overlay's TTL.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func chain(start, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = uint64(start+i)*0x9e3779b97f4a7c15 + 1
	}
	return h
}

func allEPs(n int) epset.Set {
	var s epset.Set
	for i := range n {
		s.Add(i)
	}
	return s
}

// overlayStep is one action of a provisional-overlay scenario.
type overlayStep struct {
	do      string // reserve, release, store, clear, advance
	ep      int
	hashes  []uint64
	res     int // reservation slot for reserve/release
	advance time.Duration
}

func TestOverlayScenarios(t *testing.T) {
	prompt := chain(0, 8)
	other := chain(100, 8)
	for _, tc := range []struct {
		name    string
		opts    ProvisionalOptions
		steps   []overlayStep
		score   []uint64
		leading bool
		want    map[int]uint32 // ep → score
		live    map[int]int    // ep → predictions held
	}{
		{
			name:  "a reservation credits its endpoint only",
			opts:  ProvisionalOptions{Weight: 100},
			steps: []overlayStep{{do: "reserve", ep: 1, hashes: prompt}},
			score: prompt, leading: true,
			want: map[int]uint32{0: 0, 1: 8, 2: 0},
			live: map[int]int{1: 8},
		},
		{
			name:  "the weight discounts predicted blocks",
			opts:  ProvisionalOptions{Weight: 90},
			steps: []overlayStep{{do: "reserve", ep: 1, hashes: prompt}},
			score: prompt, leading: true,
			want: map[int]uint32{1: 7}, // 8 × 0.9 rounded down
		},
		{
			name: "stored blocks count in full and predictions extend the run",
			opts: ProvisionalOptions{Weight: 50},
			steps: []overlayStep{
				{do: "store", ep: 1, hashes: prompt[:4]},
				{do: "reserve", ep: 1, hashes: prompt},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 4 + 2}, // 4 stored + 4 predicted at 50 %
			live: map[int]int{1: 8},        // reserved after the store: all eight are held until confirmed
		},
		{
			name: "BlockStored confirms and replaces the prediction",
			opts: ProvisionalOptions{Weight: 50},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt},
				{do: "store", ep: 1, hashes: prompt},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 8},
			live: map[int]int{1: 0},
		},
		{
			name: "a BlockStored on another endpoint confirms nothing here",
			opts: ProvisionalOptions{Weight: 100},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt},
				{do: "store", ep: 2, hashes: prompt},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 8, 2: 8},
			live: map[int]int{1: 8},
		},
		{
			name: "release drops what was not confirmed",
			opts: ProvisionalOptions{Weight: 100},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt, res: 0},
				{do: "store", ep: 1, hashes: prompt[:3]},
				{do: "release", res: 0},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 3},
			live: map[int]int{1: 0},
		},
		{
			name: "a shared prediction lives until its last request ends",
			opts: ProvisionalOptions{Weight: 100},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt, res: 0},
				{do: "reserve", ep: 1, hashes: prompt, res: 1},
				{do: "release", res: 0},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 8},
			live: map[int]int{1: 8},
		},
		{
			name: "predictions expire after the TTL",
			opts: ProvisionalOptions{Weight: 100, TTL: time.Second},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt},
				{do: "advance", advance: 1500 * time.Millisecond},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 0},
		},
		{
			name: "an expired prediction is swept by the next reservation",
			opts: ProvisionalOptions{Weight: 100, TTL: time.Second},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt},
				{do: "advance", advance: 1500 * time.Millisecond},
				{do: "reserve", ep: 1, hashes: other},
			},
			score: other, leading: true,
			want: map[int]uint32{1: 8},
			live: map[int]int{1: 8},
		},
		{
			name: "the cap evicts the oldest predictions",
			opts: ProvisionalOptions{Weight: 100, MaxPerEndpoint: 10},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt},
				{do: "reserve", ep: 1, hashes: other},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 0}, // prompt[0] and [1] went first: the leading run is broken
			live: map[int]int{1: 10},
		},
		{
			name:  "a prompt longer than the cap predicts its first blocks",
			opts:  ProvisionalOptions{Weight: 100, MaxPerEndpoint: 5},
			steps: []overlayStep{{do: "reserve", ep: 1, hashes: prompt}},
			score: prompt, leading: true,
			want: map[int]uint32{1: 5},
			live: map[int]int{1: 5},
		},
		{
			name: "clearing the endpoint drops its predictions",
			opts: ProvisionalOptions{Weight: 100},
			steps: []overlayStep{
				{do: "reserve", ep: 1, hashes: prompt},
				{do: "reserve", ep: 2, hashes: prompt},
				{do: "clear", ep: 1},
			},
			score: prompt, leading: true,
			want: map[int]uint32{1: 0, 2: 8},
			live: map[int]int{1: 0, 2: 8},
		},
		{
			name:  "the overlap score takes the larger of stored and predicted",
			opts:  ProvisionalOptions{Weight: 100},
			steps: []overlayStep{{do: "store", ep: 1, hashes: prompt[:2]}, {do: "reserve", ep: 1, hashes: prompt[4:]}},
			score: prompt, leading: false,
			want: map[int]uint32{1: 4},
		},
		{
			name:  "a negative weight keeps predictions but credits none",
			opts:  ProvisionalOptions{Weight: -1},
			steps: []overlayStep{{do: "reserve", ep: 1, hashes: prompt}},
			score: prompt, leading: true,
			want: map[int]uint32{1: 0},
			live: map[int]int{1: 8},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1000, 0)}
			tc.opts.Now = clk.now
			ov, err := NewOverlay(newIndex(t, MinMaxBlocks), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			res := map[int]Reservation{}
			for _, s := range tc.steps {
				switch s.do {
				case "reserve":
					res[s.res] = ov.Reserve(s.ep, s.hashes)
				case "release":
					ov.Release(res[s.res])
				case "store":
					if err := ov.Add(s.ep, 0, "GPU", s.hashes); err != nil {
						t.Fatal(err)
					}
				case "clear":
					if err := ov.ClearRank(s.ep, 0); err != nil {
						t.Fatal(err)
					}
				case "advance":
					clk.advance(s.advance)
				}
			}
			var counts [epset.Max]uint32
			ov.Score(tc.score, allEPs(4), tc.leading, &counts)
			for ep, want := range tc.want {
				if counts[ep] != want {
					t.Errorf("score of ep %d = %d, want %d", ep, counts[ep], want)
				}
			}
			for ep, want := range tc.live {
				if got := ov.Provisional(ep); got != want {
					t.Errorf("predictions on ep %d = %d, want %d", ep, got, want)
				}
			}
			if got := ov.Blocks(1); got != ov.Index().Blocks(1) {
				t.Errorf("Blocks counts predictions: %d vs the index's %d", got, ov.Index().Blocks(1))
			}
		})
	}
}

func TestOverlayOptions(t *testing.T) {
	ix := newIndex(t, MinMaxBlocks)
	for _, tc := range []struct {
		opts ProvisionalOptions
		bad  bool
	}{
		{ProvisionalOptions{}, false},
		{ProvisionalOptions{MaxPerEndpoint: MaxProvisionalMaxPerEndpoint + 1}, true},
		{ProvisionalOptions{MaxPerEndpoint: -1}, true},
		{ProvisionalOptions{TTL: -time.Second}, true},
		{ProvisionalOptions{TTL: MaxProvisionalTTL + time.Second}, true},
		{ProvisionalOptions{Weight: 101}, true},
		{ProvisionalOptions{Weight: 100, TTL: time.Minute, MaxPerEndpoint: 1}, false},
	} {
		_, err := NewOverlay(ix, tc.opts)
		if (err != nil) != tc.bad {
			t.Errorf("NewOverlay(%+v) error = %v, want error %v", tc.opts, err, tc.bad)
		}
	}
	if _, err := NewOverlay(nil, ProvisionalOptions{}); err == nil {
		t.Error("NewOverlay(nil): want an error")
	}
}

// TestOverlayMemoryIsBounded reserves and releases far more prompts than
// the cap, some never released, and checks that an endpoint's bookkeeping
// stays within a small multiple of the cap.
func TestOverlayMemoryIsBounded(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	const limit = 256
	ov, err := NewOverlay(newIndex(t, MinMaxBlocks), ProvisionalOptions{MaxPerEndpoint: limit, Now: clk.now, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	shared := chain(0, 40)
	for i := range 5000 {
		r := ov.Reserve(0, chain(i*64, 40))
		ov.Reserve(0, shared) // never released: only the cap and the TTL bound it
		if i%3 != 0 {
			ov.Release(r)
		}
		if i%7 == 0 {
			_ = ov.Add(0, 0, "", chain(i*64, 20))
		}
		clk.advance(time.Millisecond)
		ov.mu.RLock()
		pe := ov.eps[0]
		n, o := len(pe.entries), len(pe.order)-pe.head
		ov.mu.RUnlock()
		if n > limit || len(pe.order) > 4*limit+2*64+40 {
			t.Fatalf("after %d prompts: %d predictions (cap %d), %d stamps (%d live)", i, n, limit, len(pe.order), o)
		}
	}
	if got := ov.live.Load(); got != int64(ov.Provisional(0)) {
		t.Fatalf("live counter %d, predictions held %d", got, ov.Provisional(0))
	}
}

func TestOverlayIgnoresBadEndpoints(t *testing.T) {
	ov, err := NewOverlay(newIndex(t, MinMaxBlocks), ProvisionalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range []int{-1, epset.Max, epset.Max + 5} {
		r := ov.Reserve(ep, chain(0, 4))
		ov.Release(r)
		if ov.Provisional(ep) != 0 {
			t.Errorf("ep %d: predictions kept", ep)
		}
	}
	ov.Release(Reservation{})
	if err := ov.Add(epset.Max, 0, "", chain(0, 1)); err == nil {
		t.Error("Add to an out-of-range endpoint: want the index's error")
	}
}
