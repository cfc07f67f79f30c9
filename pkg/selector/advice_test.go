package selector

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
)

func setOf(eps ...int) epset.Set {
	var s epset.Set
	for _, e := range eps {
		s.Add(e)
	}
	return s
}

func TestAdviceCapacity(t *testing.T) {
	e := newEnv(t, poolRule(3, 0), noSeed())
	for ep := range 3 {
		e.engine.blocks[ep] = 1000
	}
	cases := []struct {
		name string
		adv  *Advice
		want [3]int64
	}{
		{"static", nil, [3]int64{1000, 1000, 1000}},
		{"weights multiply; 0 floors to 1; absent is static", &Advice{Weight: map[int]int{0: 50, 1: 0}}, [3]int64{500, 1, 1000}},
		{"out of range is clamped", &Advice{Weight: map[int]int{0: 250, 1: -3, 9: 10}}, [3]int64{1000, 1, 1000}},
		{"dropped", nil, [3]int64{1000, 1000, 1000}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.sel.SetAdvice(c.adv)
			cc := e.sel.rule.Load()
			for ep, want := range c.want {
				if got := e.sel.capacity(cc, ep); got != want {
					t.Fatalf("capacity(%d) = %d want %d", ep, got, want)
				}
			}
		})
	}
	// A rule update keeps the advice in force.
	e.sel.SetAdvice(&Advice{Weight: map[int]int{2: 10}})
	if err := e.sel.SetRule(poolRule(3, 1)); err != nil {
		t.Fatal(err)
	}
	if got := e.sel.capacity(e.sel.rule.Load(), 2); got != 100 {
		t.Fatalf("after SetRule capacity %d want 100", got)
	}
}

func TestAdviceStates(t *testing.T) {
	cases := []struct {
		name      string
		rule      Rule
		down      epset.Set
		adv       *Advice
		session   bool // route an established session
		wantNot   int  // the endpoint new traffic must avoid, -1 none
		wantExact int  // the endpoint every decision must pick, -1 any
	}{
		{"pool draining", poolRule(2, 0), epset.Set{}, &Advice{Draining: setOf(0)}, false, 0, 1},
		{"pool disabled", poolRule(2, 0), epset.Set{}, &Advice{Disabled: setOf(1)}, false, 1, 0},
		{"pool all draining still serves", poolRule(2, 0), epset.Set{}, &Advice{Draining: setOf(0, 1)}, false, -1, -1},
		{"local health wins", poolRule(2, 0), setOf(1), &Advice{Draining: setOf(0), Weight: map[int]int{1: 100}}, false, 1, 0},
		{"pd draining keeps sessions", pdRule([]int{0, 1}, []int{2}), epset.Set{}, &Advice{Draining: setOf(0)}, true, -1, 0},
		{"pd draining moves new sessions", pdRule([]int{0, 1}, []int{2}), epset.Set{}, &Advice{Draining: setOf(0)}, false, 0, 1},
		{"pd disabled breaks sessions", pdRule([]int{0, 1}, []int{2}), epset.Set{}, &Advice{Disabled: setOf(0)}, true, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.rule, noSeed())
			if c.session {
				// Pin a session on endpoint 0 before the advice: ep 1 is busier.
				e.loads.l[1] = 5
				_, o := e.route(&Request{SessionKey: "s", Model: "m"})
				if o.Endpoint != 0 {
					t.Fatalf("session pinned on %d", o.Endpoint)
				}
				e.loads.l[1] = 0
			}
			e.states.st.ProbeDown = c.down
			e.sel.SetAdvice(c.adv)
			for i := range 8 {
				req := &Request{Model: "m"}
				if c.session {
					req.SessionKey = "s"
				}
				d, _ := e.route(req)
				if d.Endpoint < 0 || d.Endpoint == c.wantNot || (c.wantExact >= 0 && d.Endpoint != c.wantExact) {
					t.Fatalf("decision %d: endpoint %d (tier %v), want %d and not %d", i, d.Endpoint, d.Tier, c.wantExact, c.wantNot)
				}
			}
			e.sel.SetAdvice(nil)
			e.states.st.ProbeDown = epset.Set{}
			seen := map[int]bool{}
			for range 8 {
				d, _ := e.route(&Request{Model: "m"})
				seen[d.Endpoint] = true
			}
			if len(c.rule.Endpoints) > 0 && c.rule.PD == false && len(seen) < 2 {
				t.Fatalf("after the advice is dropped only %v serve", seen)
			}
		})
	}
}

// Decisions race with advice and rule swaps; run under -race.
func TestAdviceConcurrent(t *testing.T) {
	e := newEnv(t, poolRule(4, 0), noSeed())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 500 {
			if i%2 == 0 {
				e.sel.SetAdvice(&Advice{Weight: map[int]int{0: i % 101}, Draining: setOf(i % 4)})
			} else {
				e.sel.SetAdvice(nil)
			}
			if i%50 == 0 {
				_ = e.sel.SetRule(poolRule(4, 0))
			}
		}
	}()
	for range 2000 {
		a := e.sel.Begin(&Request{Model: "m"})
		if d := a.Decide(); d.Endpoint < 0 {
			t.Fatalf("no endpoint: %+v", d)
		}
	}
	<-done
}

// TestAdviceBlend: the weight moves tier-1.5 decisions through ĉ in the
// hard arm (single pool, relief and seeding off). Overlaps {0: 5, 1: 3},
// loads {3, 1} (L = 4), 1000 blocks each.
func TestAdviceBlend(t *testing.T) {
	cases := []struct {
		name    string
		adv     *Advice
		want    int
		spilled bool
	}{
		// Σĉ = 2000: cap0 = ceil(175·4·1000/200000) = 4 > 3 → the argmax keeps it.
		{"static", nil, 0, false},
		// ĉ0 = 500, Σĉ = 1500: cap0 = ceil(2.33) = 3, load 3 is not under; cap1 = 5 → ep1.
		{"weight 50 spills", &Advice{Weight: map[int]int{0: 50}}, 1, true},
		// ĉ0 floors to 1: cap0 = 1 → ep1.
		{"weight 0 floors capacity to 1", &Advice{Weight: map[int]int{0: 0}}, 1, true},
		{"weight 100 is static", &Advice{Weight: map[int]int{0: 100, 1: 100}}, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := noSeed()
			opts.LBMode, opts.SpillRelief = LBHard, ReliefOff
			opts.CapFullGain = 0 // the spec's cap, which these values check
			e := newEnv(t, poolRule(2, 0), opts)
			prompt := seq(0, 8)
			e.inv.add(0, prompt[:5]...)
			e.inv.add(1, prompt[:3]...)
			e.loads.l[0], e.loads.l[1] = 3, 1
			e.engine.blocks[0], e.engine.blocks[1] = 1000, 1000
			e.sel.SetAdvice(c.adv)
			d := e.decide(kvReq(prompt))
			if d.Tier != TierKV || d.Endpoint != c.want || d.Spilled != c.spilled {
				t.Fatalf("got ep %d spilled %v (%+v), want ep %d spilled %v", d.Endpoint, d.Spilled, d, c.want, c.spilled)
			}
		})
	}
}

// A parked request is never granted a draining endpoint.
func TestAdviceParkable(t *testing.T) {
	e := newEnv(t, pdRule([]int{0, 1}, []int{2}), noSeed())
	e.sel.SetAdvice(&Advice{Draining: setOf(0)})
	a := e.sel.Begin(&Request{Model: "m"})
	a.Decide()
	if p := a.Parkable(); p.Has(0) || !p.Has(1) {
		t.Fatalf("parkable %v", p)
	}
	e.sel.SetAdvice(&Advice{Draining: setOf(0, 1)})
	a = e.sel.Begin(&Request{Model: "m"})
	a.Decide()
	if p := a.Parkable(); !p.Has(0) || !p.Has(1) {
		t.Fatalf("every prefill draining: parkable %v, want both", p)
	}
}
