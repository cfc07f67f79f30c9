package selector

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// testInv is a small in-memory inventory with the Scorer semantics: a set of
// block hashes per endpoint.
type testInv struct {
	sets map[int]map[uint64]struct{}
}

func newInv() *testInv { return &testInv{sets: map[int]map[uint64]struct{}{}} }

func (v *testInv) add(ep int, hashes ...uint64) {
	if v.sets[ep] == nil {
		v.sets[ep] = map[uint64]struct{}{}
	}
	for _, h := range hashes {
		v.sets[ep][h] = struct{}{}
	}
}

func (v *testInv) Score(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32) {
	for ep := eligible.Next(0); ep >= 0; ep = eligible.Next(ep + 1) {
		set := v.sets[ep]
		var n uint32
		for _, h := range hashes {
			if _, ok := set[h]; ok {
				n++
			} else if leadingRun {
				break
			}
		}
		counts[ep] = n
	}
}

func (v *testInv) Blocks(ep int) int { return len(v.sets[ep]) }

// seq returns hashes base+1 … base+n: a prompt of n blocks.
func seq(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i) + 1
	}
	return out
}

type testLoads struct{ l [epset.Max]int }

func (t *testLoads) InFlight(ep int) int { return t.l[ep] }

type testEngine struct {
	blocks  map[int]int64
	waiting map[int]int
	at      map[int]time.Time
}

func (e *testEngine) GPUBlocks(ep int) (int64, bool) {
	b, ok := e.blocks[ep]
	return b, ok
}

func (e *testEngine) Waiting(ep int) (int, time.Time, bool) {
	w, ok := e.waiting[ep]
	return w, e.at[ep], ok
}

// testStates returns st, except that reads after the first `flipAfter`
// return flipped (to simulate a transition between the mask seed and the
// post-filter).
type testStates struct {
	st        States
	flipped   *States
	flipAfter int
	reads     int
}

func (t *testStates) States() States {
	t.reads++
	if t.flipped != nil && t.reads > t.flipAfter {
		return *t.flipped
	}
	return t.st
}

type testClock struct{ t time.Time }

func (c *testClock) Now() time.Time          { return c.t }
func (c *testClock) advance(d time.Duration) { c.t = c.t.Add(d) }

type countObserver struct {
	mu                              sync.Mutex
	watchdog, sessionHits, trieHits int
	sessions                        int
}

func (o *countObserver) ZeroHitWatchdog(uint32) { o.mu.Lock(); o.watchdog++; o.mu.Unlock() }
func (o *countObserver) SessionHit(uint32)      { o.mu.Lock(); o.sessionHits++; o.mu.Unlock() }
func (o *countObserver) TrieHit(uint32)         { o.mu.Lock(); o.trieHits++; o.mu.Unlock() }
func (o *countObserver) Sessions(_ uint32, n int) {
	o.mu.Lock()
	o.sessions = n
	o.mu.Unlock()
}

// env bundles a selector with its fakes.
type env struct {
	sel    *Selector
	inv    *testInv
	loads  *testLoads
	engine *testEngine
	states *testStates
	clock  *testClock
	obs    *countObserver
	logs   *bytes.Buffer
}

func newEnv(t testing.TB, rule Rule, opts Options) *env {
	t.Helper()
	e := &env{
		inv:    newInv(),
		loads:  &testLoads{},
		engine: &testEngine{blocks: map[int]int64{}, waiting: map[int]int{}, at: map[int]time.Time{}},
		states: &testStates{},
		clock:  &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		obs:    &countObserver{},
		logs:   &bytes.Buffer{},
	}
	sel, err := New(rule, opts, Deps{
		Scorer: e.inv, Loads: e.loads, Engine: e.engine, States: e.states, Observer: e.obs,
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)), Now: e.clock.Now,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.sel = sel
	return e
}

// pdRule: prefill endpoints at the given indices, decode endpoints after.
func pdRule(prefill, decode []int) Rule {
	r := Rule{ServiceID: 7, KVExactMode: 1, PD: true, BlockSize: 16}
	for _, p := range prefill {
		r.Endpoints = append(r.Endpoints, Endpoint{Idx: p, Role: RolePrefill})
	}
	for _, d := range decode {
		r.Endpoints = append(r.Endpoints, Endpoint{Idx: d, Role: RoleDecode})
	}
	return r
}

func poolRule(n int, sel Sel) Rule {
	r := Rule{ServiceID: 9, KVExactMode: 3, Sel: sel, BlockSize: 16}
	for i := 0; i < n; i++ {
		r.Endpoints = append(r.Endpoints, Endpoint{Idx: i, Weight: 1})
	}
	return r
}

func kvReq(hashes []uint64) *Request {
	return &Request{Model: "m", HasText: true, Hashes: hashes}
}

func (e *env) decide(req *Request) Decision {
	a := e.sel.Begin(req)
	return a.Decide()
}

// route decides and commits, like a proxy whose connection succeeds.
func (e *env) route(req *Request) (Decision, Outcome) {
	a := e.sel.Begin(req)
	d := a.Decide()
	return d, a.Commit()
}

func noSeed() Options {
	o := DefaultOptions()
	o.ColdStartSeedN = 0
	return o
}
