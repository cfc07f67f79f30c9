package selector

import (
	"errors"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// hashOrder is the rendezvous order of key over eps, highest weight first:
// what cold placement walks past endpoints at the cap.
func hashOrder(key uint64, eps []int) []int {
	out := append([]int(nil), eps...)
	sort.Slice(out, func(i, j int) bool { return rendezvousWeight(key, out[i]) > rendezvousWeight(key, out[j]) })
	return out
}

func coldOpts(p ColdPlacement) Options {
	o := noSeed()
	o.ColdPlacement = p
	return o
}

// coldPrompt is a prompt of 4 blocks that no inventory holds.
func coldPrompt(i int) *Request { return kvReq(seq(uint64(i)<<20, 4)) }

// TestColdPlacementAcrossReplicas: with LLB_KV_COLD_PLACEMENT=hash, two
// replicas whose round-robin cursors start apart place every new prefix on
// the same endpoint, as no_worker misses of tier 3; the keys spread over the
// fleet. With the default (sel) they disagree, which is what split prefix
// groups across engines in the routing benchmark.
func TestColdPlacementAcrossReplicas(t *testing.T) {
	rule := poolRule(6, SelRR)
	for _, c := range []struct {
		name      string
		placement ColdPlacement
		agree     bool
	}{
		{"hash", ColdPlacementHash, true},
		{"sel", ColdPlacementSel, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			oa, ob := coldOpts(c.placement), coldOpts(c.placement)
			oa.CursorStart, ob.CursorStart = 0, 3
			a, b := newEnv(t, rule, oa), newEnv(t, rule, ob)
			perEP := map[int]int{}
			agreed := 0
			for i := range 120 {
				da, _ := a.route(coldPrompt(i))
				db, _ := b.route(coldPrompt(i))
				if da.Tier != TierSelector || da.Reason != ReasonNoWorker || da.ColdPlaced != c.agree {
					t.Fatalf("prompt %d: %+v", i, da)
				}
				if da.Endpoint == db.Endpoint {
					agreed++
				}
				perEP[da.Endpoint]++
			}
			if c.agree && agreed != 120 || !c.agree && agreed > 60 {
				t.Fatalf("replicas agreed on %d of 120 prompts", agreed)
			}
			for ep := range 6 {
				if perEP[ep] < 8 {
					t.Fatalf("placements %v: endpoint %d has too few", perEP, ep)
				}
			}
		})
	}
}

// TestColdPlacementStability: when an endpoint leaves (probe-down, or
// removed from the rule), only the prompts placed on it move, each to the
// next endpoint of its own rendezvous order; the others keep their endpoint.
func TestColdPlacementStability(t *testing.T) {
	for _, c := range []struct {
		name  string
		leave func(e *env, ep int)
	}{
		{"probe-down", func(e *env, ep int) { e.states.st.ProbeDown.Add(ep) }},
		{"admin-down", func(e *env, ep int) { e.states.st.AdminDown.Add(ep) }},
		{"removed from the rule", func(e *env, ep int) {
			r := poolRule(6, SelRR)
			r.Endpoints = append(r.Endpoints[:ep], r.Endpoints[ep+1:]...)
			if err := e.sel.SetRule(r); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, poolRule(6, SelRR), coldOpts(ColdPlacementHash))
			home := map[int]int{}
			for i := range 200 {
				home[i] = e.decide(coldPrompt(i)).Endpoint
			}
			const gone = 2
			c.leave(e, gone)
			moved := 0
			for i := range 200 {
				got := e.decide(coldPrompt(i)).Endpoint
				switch {
				case home[i] != gone && got != home[i]:
					t.Fatalf("prompt %d moved from healthy %d to %d", i, home[i], got)
				case home[i] == gone:
					moved++
					order := hashOrder(coldKey(coldPrompt(i).Hashes, 1), []int{0, 1, 2, 3, 4, 5})
					if order[0] != gone || got != order[1] {
						t.Fatalf("prompt %d: order %v, moved to %d, want %d", i, order, got, order[1])
					}
				}
			}
			if moved == 0 {
				t.Fatal("no prompt was placed on the endpoint that left")
			}
		})
	}
}

// TestColdPlacementCap: a cold prompt goes to the first endpoint of its
// rendezvous order whose load is at most the least load plus one; an
// endpoint further above is passed over for the next in the order.
func TestColdPlacementCap(t *testing.T) {
	req := coldPrompt(7)
	order := hashOrder(coldKey(req.Hashes, 1), []int{0, 1, 2, 3})
	for _, c := range []struct {
		name  string
		loads map[int]int // by rank in the order
		want  int         // rank in the order
	}{
		{"idle", nil, 0},
		{"first one above the least", map[int]int{0: 1}, 0},
		{"all loaded alike", map[int]int{0: 5, 1: 5, 2: 5, 3: 5}, 0},
		{"first two above the least", map[int]int{0: 2, 1: 3}, 2},
		{"first past the slack", map[int]int{0: 6, 1: 5, 2: 5, 3: 4}, 1},
		{"only the last is light enough", map[int]int{0: 3, 1: 3, 2: 3, 3: 1}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, poolRule(4, SelRR), coldOpts(ColdPlacementHash))
			for rank, l := range c.loads {
				e.loads.l[order[rank]] = l
			}
			if d := e.decide(req); d.Endpoint != order[c.want] || !d.ColdPlaced {
				t.Fatalf("order %v loads %v: got %+v, want ep %d", order, c.loads, d, order[c.want])
			}
		})
	}
}

// TestColdPlacementKey: the key is the block at the shallow threshold, so
// prompts that share that many leading blocks are placed together; a prompt
// shorter than one block has no key and takes the rule's sel.
func TestColdPlacementKey(t *testing.T) {
	e := newEnv(t, poolRule(6, SelRR), coldOpts(ColdPlacementHash))
	shared := seq(1<<30, 2)
	home := e.decide(kvReq(append(append([]uint64(nil), shared...), 77))).Endpoint
	for i := range 20 {
		tail := seq(uint64(i+1)<<40, 3)
		if d := e.decide(kvReq(append(append([]uint64(nil), shared[:1]...), tail...))); d.Endpoint != home {
			t.Fatalf("a prompt sharing the first block went to %d, not %d", d.Endpoint, home)
		}
	}
	if d := e.decide(kvReq(nil)); d.ColdPlaced || d.Tier != TierSelector {
		t.Fatalf("a prompt without a full block: %+v", d)
	}
	if got, want := coldKeyBlocks(3, 2), 2; got != want {
		t.Fatalf("coldKeyBlocks(3, 2) = %d, want %d", got, want)
	}
	if got, want := coldKeyBlocks(0, 5), 1; got != want {
		t.Fatalf("coldKeyBlocks(0, 5) = %d, want %d", got, want)
	}
}

// TestColdPlacementProvisional: a hit whose only holders are this
// replica's provisional predictions is placed as a cold prompt (so a
// replica that spilled it agrees with one that did not), while a holder an
// engine confirmed keeps the load blend.
func TestColdPlacementProvisional(t *testing.T) {
	req := coldPrompt(3)
	order := hashOrder(coldKey(req.Hashes, 1), []int{0, 1, 2, 3})
	for _, c := range []struct {
		name       string
		predicted  int // endpoint holding the prompt only provisionally (-1: none)
		confirmed  int // endpoint holding it confirmed (-1: none)
		placement  ColdPlacement
		want       int
		coldPlaced bool
	}{
		{"predicted off its home goes home", order[2], -1, ColdPlacementHash, order[0], true},
		{"predicted on its home stays", order[0], -1, ColdPlacementHash, order[0], true},
		{"confirmed keeps the blend", -1, order[3], ColdPlacementHash, order[3], false},
		{"predicted with sel placement keeps the blend", order[2], -1, ColdPlacementSel, order[2], false},
	} {
		t.Run(c.name, func(t *testing.T) {
			scored, confirmed := newInv(), newInv()
			for _, ep := range []int{c.predicted, c.confirmed} {
				if ep >= 0 {
					scored.add(ep, req.Hashes...)
				}
			}
			if c.confirmed >= 0 {
				confirmed.add(c.confirmed, req.Hashes...)
			}
			sel, err := New(poolRule(4, SelRR), coldOpts(c.placement), Deps{Scorer: scored, Confirmed: confirmed,
				Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return time.Unix(0, 0) }})
			if err != nil {
				t.Fatal(err)
			}
			a := sel.Begin(req)
			d := a.Decide()
			if d.Endpoint != c.want || d.ColdPlaced != c.coldPlaced || d.Reason != ReasonHit || d.Tier != TierKV {
				t.Fatalf("got %+v, want ep %d cold-placed %v", d, c.want, c.coldPlaced)
			}
		})
	}
}

// TestColdPlacementPD: in P/D, a prefix nobody holds takes the same prefill
// endpoint on every replica (tier 2), and the decode endpoint by load.
func TestColdPlacementPD(t *testing.T) {
	rule := pdRule([]int{0, 1, 2, 3}, []int{8, 9})
	oa, ob := coldOpts(ColdPlacementHash), coldOpts(ColdPlacementHash)
	ob.CursorStart = 2
	a, b := newEnv(t, rule, oa), newEnv(t, rule, ob)
	prefills := epset.Set{}
	for i := range 40 {
		da, _ := a.route(coldPrompt(i))
		db, _ := b.route(coldPrompt(i))
		if da.Tier != TierLoad || !da.ColdPlaced || da.Endpoint != db.Endpoint || da.Decode < 8 {
			t.Fatalf("prompt %d: A %+v, B %+v", i, da, db)
		}
		prefills.Add(da.Endpoint)
	}
	if prefills.Len() != 4 {
		t.Fatalf("prefill endpoints used: %v", prefills)
	}
}

// FuzzParseColdPlacement: any input parses to a known value whose String
// parses back to itself, or is refused with a ParseError; never a panic.
func FuzzParseColdPlacement(f *testing.F) {
	for _, s := range []string{"", "sel", "hash", " HASH ", "cost", "rr"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseColdPlacement(s)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("%q: error %v is not a ParseError", s, err)
			}
			return
		}
		if back, err := ParseColdPlacement(p.String()); err != nil || back != p {
			t.Fatalf("%q: %v does not round-trip (%v, %v)", s, p, back, err)
		}
	})
}
