package gateway

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/pd/admission"
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
			s := newSharedLoads(local, nil, &eng, sharedStaleAfter(5*time.Second, 2*time.Second))
			s.now = func() time.Time { return now }
			s.scraped(4)
			local[4] = c.local
			if got := s.InFlight(4); got != c.want {
				t.Fatalf("L = %d, want %d", got, c.want)
			}
		})
	}
	s := newSharedLoads(fixedLocal{}, nil, &fixedEngine{}, time.Second)
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
			s := newSharedLoads(local, nil, &fixedEngine{9, scrapedAt, true}, sharedStaleAfter(5*time.Second, 2*time.Second))
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

// setAdmission moves the admission controller's counts on ep to admitted
// in flight, inLeg of them on the engine (prefill: capped admissions;
// decode: tracked).
func setAdmission(t *testing.T, a *admission.Controller, ep int, prefill bool, admitted, inLeg int) {
	t.Helper()
	for a.InFlight(ep) < admitted {
		if !prefill {
			a.Track(ep)
		} else if err := a.AcquirePrefill(ep); err != nil {
			t.Fatal(err)
		}
	}
	for a.InFlight(ep) > admitted {
		if prefill {
			a.ReleasePrefill(ep)
		} else {
			a.Untrack(ep)
		}
	}
	for a.OnEngine(ep) < inLeg {
		a.LegStarted(ep)
	}
	for a.OnEngine(ep) > inLeg {
		a.LegEnded(ep)
	}
}

// TestSharedLoadsPD: on a P/D rule the view subtracts, at each scrape, the
// requests of this replica the engine was running (its prefill or decode
// leg), not the admission count, which holds a prefill endpoint's request
// through its decode and a decode endpoint's from the prefill's admission.
// The caps stay on the admission count. Stale or missing engine samples
// leave the admission count.
func TestSharedLoadsPD(t *testing.T) {
	now := time.Unix(1000, 0)
	type at struct{ admitted, inLeg int }
	cases := []struct {
		name            string
		prefill         bool
		atScrape, local at
		engine          fixedEngine
		want            int
	}{
		// Subtracting the admission count (2) would give 3 and hide one of
		// the other replicas' prefills.
		{"prefill: ours decoding, three others prefilling", true, at{2, 0}, at{2, 0}, fixedEngine{3, now, true}, 5},
		{"prefill: ours prefilling at the scrape", true, at{2, 2}, at{2, 2}, fixedEngine{5, now, true}, 5},
		{"prefill: ours answered since, still decoding", true, at{2, 2}, at{2, 0}, fixedEngine{5, now, true}, 5},
		{"prefill: ours finished since", true, at{2, 2}, at{0, 0}, fixedEngine{5, now, true}, 3},
		{"prefill: alone", true, at{1, 1}, at{1, 1}, fixedEngine{1, now, true}, 1},
		// The decode unit is held from the prefill's admission: those two
		// are not on the decode engine yet.
		{"decode: ours still prefilling, four others decoding", false, at{2, 0}, at{2, 0}, fixedEngine{4, now, true}, 6},
		{"decode: ours decoding", false, at{2, 2}, at{2, 2}, fixedEngine{6, now, true}, 6},
		{"decode: engine behind our count", false, at{3, 3}, at{3, 3}, fixedEngine{1, now, true}, 3},
		{"stale sample", true, at{1, 0}, at{1, 0}, fixedEngine{9, now.Add(-13 * time.Second), true}, 1},
		{"engine without the metric", false, at{2, 1}, at{2, 1}, fixedEngine{9, now, false}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			adm, err := admission.New(admission.Config{ServiceID: 9, MaxInflightPerEP: 3})
			if err != nil {
				t.Fatal(err)
			}
			eng := c.engine
			s := newSharedLoads(adm, adm.Legs(), &eng, sharedStaleAfter(5*time.Second, 2*time.Second))
			s.now = func() time.Time { return now }
			setAdmission(t, adm, 4, c.prefill, c.atScrape.admitted, c.atScrape.inLeg)
			s.scraped(4)
			setAdmission(t, adm, 4, c.prefill, c.local.admitted, c.local.inLeg)
			if got := s.InFlight(4); got != c.want {
				t.Fatalf("L = %d, want %d", got, c.want)
			}
			// The cap counts this replica's admissions only.
			if sat := adm.Saturated().Has(4); sat != (c.prefill && c.local.admitted >= 3) {
				t.Fatalf("saturated %v with %d admitted", sat, c.local.admitted)
			}
		})
	}
}
