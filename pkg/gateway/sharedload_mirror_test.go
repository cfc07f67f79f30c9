package gateway

import (
	"testing"
	"time"
)

// multiEngine is a per-endpoint engineLoads.
type multiEngine map[int]fixedEngine

func (m multiEngine) EngineLoad(ep int) (int, time.Time, bool) {
	e := m[ep]
	return e.load, e.at, e.known
}

// TestSharedLoadsMirror: the mirror moves the other replicas' frozen part
// by this replica's own change since the scrape, scaled by F = the others'
// share of the fleet over ours at the scrapes; alone (others 0) nothing
// changes, and without the mirror the part stays frozen.
func TestSharedLoadsMirror(t *testing.T) {
	now := time.Unix(1000, 0)
	fresh := func(load int) fixedEngine { return fixedEngine{load, now, true} }
	cases := []struct {
		name     string
		mirror   bool
		atScrape map[int]int // our count at each endpoint's scrape
		engine   multiEngine
		local    int // our count on ep 0 now
		want     int // L_0
	}{
		// ep0: ours 1 of 3 at the scrape; ep1: ours 1 of 3. F = 4/2 = 2.
		{"frozen without the mirror", false, map[int]int{0: 1, 1: 1}, multiEngine{0: fresh(3), 1: fresh(3)}, 3, 2 + 3},
		{"we sent two: the others likely four", true, map[int]int{0: 1, 1: 1}, multiEngine{0: fresh(3), 1: fresh(3)}, 3, 2 + 4 + 3},
		{"ours finished: theirs likely too", true, map[int]int{0: 1, 1: 1}, multiEngine{0: fresh(3), 1: fresh(3)}, 0, 0},
		{"unchanged since the scrape", true, map[int]int{0: 1, 1: 1}, multiEngine{0: fresh(3), 1: fresh(3)}, 1, 3},
		// Alone: the engines count only us, F = 0.
		{"alone", true, map[int]int{0: 2, 1: 1}, multiEngine{0: fresh(2), 1: fresh(1)}, 5, 5},
		// A stale sample on ep1 is left out of F: F = 2/1 = 2 from ep0.
		{"stale endpoint left out of F", true, map[int]int{0: 1, 1: 1}, multiEngine{0: fresh(3), 1: {30, now.Add(-time.Minute), true}}, 2, 2 + 2 + 2},
		// Nothing of ours at the scrapes: F = others / 1, capped at 8.
		{"ratio capped", true, map[int]int{0: 0, 1: 0}, multiEngine{0: fresh(20), 1: fresh(20)}, 1, 20 + 8 + 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			local := fixedLocal{}
			for ep, n := range c.atScrape {
				local[ep] = n
			}
			s := newSharedLoads(local, nil, c.engine, sharedStaleAfter(time.Second, time.Second))
			s.configure(sharedOptions{mirror: c.mirror})
			s.now = func() time.Time { return now }
			for ep := range c.atScrape {
				s.scraped(ep)
			}
			local[0] = c.local
			if got := s.InFlight(0); got != c.want {
				t.Fatalf("L_0 = %d, want %d", got, c.want)
			}
		})
	}
}

// TestMirrorRatioRefresh: F is reused for mirrorRefresh, then recomputed
// from the current samples.
func TestMirrorRatioRefresh(t *testing.T) {
	now := time.Unix(1000, 0)
	local := fixedLocal{0: 1}
	eng := multiEngine{0: {3, now, true}}
	s := newSharedLoads(local, nil, eng, time.Minute)
	s.configure(sharedOptions{mirror: true})
	s.now = func() time.Time { return now }
	s.scraped(0)
	if f := s.mirrorRatio(); f != 2000 {
		t.Fatalf("F = %d‰, want 2000", f)
	}
	eng[0] = fixedEngine{5, now, true} // others 4 over ours 1
	if f := s.mirrorRatio(); f != 2000 {
		t.Fatalf("F within the refresh = %d‰, want the cached 2000", f)
	}
	now = now.Add(mirrorRefresh)
	if f := s.mirrorRatio(); f != 4000 {
		t.Fatalf("F after the refresh = %d‰, want 4000", f)
	}
}
