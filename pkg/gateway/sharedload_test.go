package gateway

import (
	"testing"
	"time"
)

type fixedLocal map[int]int

func (f fixedLocal) InFlight(ep int) int { return f[ep] }

type fixedEngine struct {
	load  int
	at    time.Time
	known bool
}

func (f *fixedEngine) EngineLoad(int) (int, time.Time, bool) { return f.load, f.at, f.known }

// TestSharedLoads: the other replicas' load comes from the engine's count at
// the last scrape, this replica's own is live, and a stale or missing scrape
// leaves the local count.
func TestSharedLoads(t *testing.T) {
	now := time.Unix(1000, 0)
	cases := []struct {
		name            string
		atScrape, local int
		engine          fixedEngine
		want            int
	}{
		{"no scrape yet", 2, 3, fixedEngine{}, 3},
		{"alone: engine counts only us", 3, 3, fixedEngine{3, now, true}, 3},
		{"another replica loads the endpoint", 1, 1, fixedEngine{9, now, true}, 9},
		{"ours grew since the scrape", 1, 4, fixedEngine{9, now, true}, 12},
		{"ours finished since the scrape", 3, 0, fixedEngine{5, now, true}, 2},
		{"engine behind our count", 5, 5, fixedEngine{2, now, true}, 5},
		{"stale scrape", 1, 1, fixedEngine{9, now.Add(-13 * time.Second), true}, 1},
		{"scrape just fresh", 1, 1, fixedEngine{9, now.Add(-12 * time.Second), true}, 9},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			local := fixedLocal{4: c.atScrape}
			eng := c.engine
			s := newSharedLoads(local, &eng, sharedStaleAfter(5*time.Second, 2*time.Second))
			s.now = func() time.Time { return now }
			s.scraped(4)
			local[4] = c.local
			if got := s.InFlight(4); got != c.want {
				t.Fatalf("L = %d, want %d", got, c.want)
			}
		})
	}
	s := newSharedLoads(fixedLocal{}, &fixedEngine{}, time.Second)
	s.scraped(-1)
	s.scraped(1 << 20)
	if s.InFlight(1<<20) != 0 || s.InFlight(-1) != 0 {
		t.Fatal("out-of-range endpoints")
	}
}

// TestSharedLoadsDecay: with a half-life, the other replicas' part of the
// view halves every half-life after its scrape; this replica's own part
// stays live, and without a half-life the part stays frozen.
func TestSharedLoadsDecay(t *testing.T) {
	scrapedAt := time.Unix(1000, 0)
	for _, c := range []struct {
		name     string
		halfLife time.Duration
		age      time.Duration
		local    int
		want     int
	}{
		{"at the scrape", 500 * time.Millisecond, 0, 1, 9},
		{"one half-life", 500 * time.Millisecond, 500 * time.Millisecond, 1, 5},
		{"two half-lives", 500 * time.Millisecond, time.Second, 3, 5},
		{"long after", 500 * time.Millisecond, 5 * time.Second, 2, 2},
		{"off: frozen", 0, time.Second, 1, 9},
	} {
		t.Run(c.name, func(t *testing.T) {
			local := fixedLocal{4: 1}
			s := newSharedLoads(local, &fixedEngine{9, scrapedAt, true}, sharedStaleAfter(5*time.Second, 2*time.Second))
			s.halfLife = c.halfLife
			s.now = func() time.Time { return scrapedAt.Add(c.age) }
			s.scraped(4) // others = 9 − 1 = 8
			local[4] = c.local
			if got := s.InFlight(4); got != c.want {
				t.Fatalf("L = %d, want %d", got, c.want)
			}
		})
	}
}
