package selector

import (
	"fmt"
	"github.com/kvgate/kvgate/pkg/epset"
	"math/rand/v2"
	"testing"
)

// refCaps recomputes, independently of the selector, each positive-overlap
// candidate's overlap and hard-mode cap.
func refCaps(e *env, n int, prompt []uint64, excluded map[int]bool) (overlap, caps map[int]int64) {
	var counts [256]uint32
	var all epset.Set
	for i := 0; i < n; i++ {
		if !excluded[i] {
			all.Add(i)
		}
	}
	e.inv.Score(prompt, all, true, &counts)
	overlap, caps = map[int]int64{}, map[int]int64{}
	var total, sum int64
	capOf := func(ep int) int64 {
		b, ok := e.engine.blocks[ep]
		if !ok || b <= 0 {
			return 1
		}
		return min(b, 8_000_000)
	}
	for i := 0; i < n; i++ {
		if counts[i] > 0 && !excluded[i] {
			overlap[i] = int64(counts[i])
			total += int64(e.loads.l[i])
			sum += capOf(i)
		}
	}
	for ep := range overlap {
		num := 175 * total * capOf(ep)
		den := 100 * sum
		c := (num + den - 1) / den
		caps[ep] = max(1, c)
	}
	return overlap, caps
}

// checkHard asserts the hard-mode guarantees for one decision.
func checkHard(t *testing.T, d Decision, overlap, caps map[int]int64, loads *testLoads) {
	t.Helper()
	if len(overlap) == 0 {
		return
	}
	var bestUnder int64 = -1
	for ep, o := range overlap {
		if int64(loads.l[ep]) < caps[ep] && o > bestUnder {
			bestUnder = o
		}
	}
	if bestUnder < 0 {
		return // everyone at cap (unreachable with mlf ≥ 100, but not an error)
	}
	w := d.Endpoint
	if int64(loads.l[w]) >= caps[w] {
		t.Fatalf("winner ep%d load %d ≥ cap %d while some candidate is under cap (caps %v, overlap %v)", w, loads.l[w], caps[w], caps, overlap)
	}
	if overlap[w] != bestUnder {
		t.Fatalf("winner ep%d overlap %d, best under cap is %d", w, overlap[w], bestUnder)
	}
	// Ties: least loaded, then lowest ep_idx.
	for ep, o := range overlap {
		if o == bestUnder && int64(loads.l[ep]) < caps[ep] {
			if loads.l[ep] < loads.l[w] || (loads.l[ep] == loads.l[w] && ep < w) {
				t.Fatalf("tie broken wrongly: ep%d (load %d) over ep%d (load %d)", w, loads.l[w], ep, loads.l[ep])
			}
		}
	}
}

// TestPropertyHardRandomTraffic drives random arrivals and departures over
// random inventories and capacities. In hard mode, whenever some candidate
// is under its cap the winner is under its cap with the best overlap among
// those, and a twin selector fed the same sequence decides identically.
func TestPropertyHardRandomTraffic(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			n := 2 + rng.IntN(15)
			opts := noSeed()
			opts.SpillRelief = ReliefOff
			e := newEnv(t, poolRule(n, 0), opts)
			twin := newEnv(t, poolRule(n, 0), opts)
			for i := 0; i < n; i++ {
				if rng.IntN(3) > 0 {
					b := int64(1 + rng.IntN(20000))
					e.engine.blocks[i], twin.engine.blocks[i] = b, b
				}
			}
			families := make([][]uint64, 6)
			for f := range families {
				families[f] = seq(uint64(f)*1000, 12)
			}
			var inflight []int
			for step := 0; step < 1500; step++ {
				if len(inflight) > 0 && rng.IntN(100) < 45 {
					k := rng.IntN(len(inflight))
					ep := inflight[k]
					inflight = append(inflight[:k], inflight[k+1:]...)
					e.loads.l[ep]--
					twin.loads.l[ep]--
					continue
				}
				f := families[rng.IntN(len(families))]
				prompt := append(append([]uint64{}, f[:4+rng.IntN(8)]...), uint64(1_000_000+step))
				overlap, caps := refCaps(e, n, prompt, nil)
				d1, _ := e.route(kvReq(prompt))
				d2, _ := twin.route(kvReq(prompt))
				if d1 != d2 {
					t.Fatalf("step %d: twins differ: %+v vs %+v", step, d1, d2)
				}
				if d1.Tier == TierKV {
					checkHard(t, d1, overlap, caps, e.loads)
				} else if len(overlap) > 0 {
					t.Fatalf("step %d: overlap %v but tier %v reason %v", step, overlap, d1.Tier, d1.Reason)
				}
				ep := d1.Endpoint
				e.loads.l[ep]++
				twin.loads.l[ep]++
				inflight = append(inflight, ep)
				// The engine caches what it served (a random part of it).
				learned := prompt[:1+rng.IntN(len(prompt))]
				e.inv.add(ep, learned...)
				twin.inv.add(ep, learned...)
			}
		})
	}
}

// herd runs one hot prefix through n endpoints at sustained concurrency and
// returns the worst max/mean in-flight ratio over the second half, the
// number of requests that did not take the best overlap although a
// best-overlap candidate was under cap, and the hit share.
func herd(t *testing.T, rule Rule, opts Options, n, conc, steps int) (worst float64, overlapLost, hits int) {
	e := newEnv(t, rule, opts)
	rng := rand.New(rand.NewPCG(7, 7))
	hot := seq(0, 8)
	topics := [][]uint64{seq(5000, 4), seq(6000, 4), seq(7000, 4)}
	var inflight []int
	for step := 0; step < steps; step++ {
		for len(inflight) >= conc { // the oldest or a random request finishes
			k := rng.IntN(len(inflight))
			e.loads.l[inflight[k]]--
			inflight = append(inflight[:k], inflight[k+1:]...)
		}
		prompt := append(append(append([]uint64{}, hot...), topics[rng.IntN(3)]...), uint64(1_000_000+step))
		overlap, caps := refCaps(e, n, prompt, nil)
		d, o := e.route(kvReq(prompt))
		if o.Hit {
			hits++
			if rule.KVExactMode == 3 || !rule.PD {
				// best overlap among under-cap candidates must win unless relief or seeding moved it
				if !d.Spilled && !d.ColdSeed && opts.LBMode == LBHard {
					checkHard(t, d, overlap, caps, e.loads)
				}
			}
			var bestUnder int64 = -1
			for ep, ov := range overlap {
				if int64(e.loads.l[ep]) < caps[ep] && ov > bestUnder {
					bestUnder = ov
				}
			}
			if bestUnder > 0 && overlap[d.Endpoint] < bestUnder && !d.ColdSeed && !d.Spilled {
				overlapLost++
			}
		}
		ep := d.Endpoint
		if ep < 0 {
			t.Fatalf("step %d: no endpoint: %+v", step, d)
		}
		e.loads.l[ep]++
		inflight = append(inflight, ep)
		e.inv.add(ep, prompt...)
		if step > steps/2 {
			var maxL, tot int
			for i := 0; i < n; i++ {
				tot += e.loads.l[i]
				maxL = max(maxL, e.loads.l[i])
			}
			if r := float64(maxL) / (float64(tot) / float64(n)); r > worst {
				worst = r
			}
		}
	}
	return worst, overlapLost, hits
}

// TestHerding: one hot prefix, 8 endpoints, concurrency 32. With the blend
// the busiest endpoint stays within the cap factor of the mean; pure argmax
// herds everything onto one endpoint. Every endpoint soon holds the hot
// prefix, so the gain-scaled cap (LOXILB_KV_CAP_FULL_GAIN=100) balances
// them to the mean (max ≤ ceil(31/8) = 4 against a mean of 4 at the worst
// step → 1.25), where the spec's cap (the default, CapFullGain 0) allows
// ceil(1.75·31/8) = 7 → 1.75.
func TestHerding(t *testing.T) {
	const n, conc, steps = 8, 32, 4000
	gain := DefaultOptions()
	gain.CapFullGain = 100
	tests := []struct {
		name  string
		opts  Options
		bound float64
	}{
		{"spec cap (default)", DefaultOptions(), 1.75},
		{"gain-scaled cap", gain, 1.25},
	}
	for _, tc := range tests {
		worst, lost, hits := herd(t, poolRule(n, 0), tc.opts, n, conc, steps)
		t.Logf("%s, single pool, hard: worst max/mean %.2f, overlap lost %d, hits %d/%d", tc.name, worst, lost, hits, steps)
		if worst > tc.bound || lost != 0 || hits < steps*9/10 {
			t.Fatalf("%s, single pool hard: worst %.2f (bound %.2f), lost %d, hits %d", tc.name, worst, tc.bound, lost, hits)
		}

		pd := pdRule([]int{0, 1, 2, 3, 4, 5, 6, 7}, []int{8, 9})
		worst, lost, hits = herd(t, pd, tc.opts, n, conc, steps)
		t.Logf("%s, P/D, hard + cold seeding: worst max/mean %.2f, overlap lost %d, hits %d/%d", tc.name, worst, lost, hits, steps)
		if worst > tc.bound || lost != 0 || hits < steps*9/10 {
			t.Fatalf("%s, P/D hard: worst %.2f (bound %.2f), lost %d, hits %d", tc.name, worst, tc.bound, lost, hits)
		}
	}

	off := DefaultOptions()
	off.LBMode, off.ColdStartSeedN = LBOff, 0
	worst, _, _ := herd(t, poolRule(n, 0), off, n, conc, steps)
	t.Logf("single pool, off (pure argmax): worst max/mean %.2f", worst)
	if worst < 7.9 {
		t.Fatalf("pure argmax should herd onto one endpoint; worst %.2f", worst)
	}
}
