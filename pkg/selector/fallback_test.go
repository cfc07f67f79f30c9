package selector

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTier2MinLoad: min(in-flight + queued), stale or unknown queue depth
// replaced by the fresh mean, round-robin only among ties.
func TestTier2MinLoad(t *testing.T) {
	e := newEnv(t, pdRule([]int{0, 1, 2}, []int{3, 4}), noSeed())
	now := e.clock.Now()
	e.loads.l = [256]int{0: 2, 1: 1, 2: 1}
	e.engine.waiting = map[int]int{0: 0, 1: 3, 2: 0}
	e.engine.at = map[int]time.Time{0: now, 1: now, 2: now}
	// scores {2, 4, 1} → ep2.
	if d := e.decide(&Request{}); d.Endpoint != 2 || d.Tier != TierLoad || d.Reason != ReasonTextEmpty {
		t.Fatalf("decision %+v, want ep2 tier 2", d)
	}
	// ep1's sample is 31 s old → replaced by the mean of the fresh {0, 0} = 0: scores {2, 1, 1} → tie.
	e.engine.at[1] = now.Add(-31 * time.Second)
	var got []int
	for i := 0; i < 4; i++ {
		got = append(got, e.decide(&Request{}).Endpoint)
	}
	if want := []int{1, 2, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("tie round-robin %v, want %v", got, want)
	}
	// A non-tie does not advance the cursor.
	e.loads.l[1] = 0
	if d := e.decide(&Request{}); d.Endpoint != 1 {
		t.Fatalf("want ep1, got %+v", d)
	}
	e.loads.l[1] = 1
	if d := e.decide(&Request{}); d.Endpoint != 1 {
		t.Fatalf("cursor moved on a non-tie: %+v", d)
	}
	// Unknown queue depth counts as the mean: fresh {0: 6, 2: 2} → mean 4; ep1 = 1 + 4 = 5 vs ep0 2+6, ep2 1+2.
	e.engine.waiting = map[int]int{0: 6, 2: 2}
	if d := e.decide(&Request{}); d.Endpoint != 2 {
		t.Fatalf("want ep2, got %+v", d)
	}
}

// TestDecodeNeverPrefill: in mode 1 a decode endpoint is never the prefill
// target, whatever its overlap or load.
func TestDecodeNeverPrefill(t *testing.T) {
	e := newEnv(t, pdRule([]int{0, 1}, []int{2, 3}), noSeed())
	prompt := seq(0, 4)
	e.inv.add(2, prompt...)
	e.inv.add(3, prompt...)
	e.loads.l = [256]int{0: 50, 1: 40, 3: 7}
	d := e.decide(kvReq(prompt))
	if d.Endpoint != 1 || d.Tier != TierLoad || d.Reason != ReasonNoWorker || d.Decode != 2 {
		t.Fatalf("decision %+v: want prefill 1 via tier 2, decode 2", d)
	}
	// Every prefill down: a role-0 endpoint may serve plainly, never a decode one.
	e.states.st.ProbeDown = epsOf(0, 1)
	if d := e.decide(kvReq(prompt)); d.Endpoint != -1 || d.Tier != TierNone {
		t.Fatalf("decision %+v: want none", d)
	}
	r := pdRule([]int{0, 1}, []int{2, 3})
	r.Endpoints = append(r.Endpoints, Endpoint{Idx: 4})
	e = newEnv(t, r, noSeed())
	e.states.st.AdminDown = epsOf(0)
	e.states.st.BreakerOpen = epsOf(1)
	if d := e.decide(kvReq(prompt)); d.Endpoint != 4 || d.Tier != TierNormal || d.Decode != -1 {
		t.Fatalf("decision %+v: want role-0 ep4 in plain mode", d)
	}
	// Saturated prefill pool: shed or park, not plain mode.
	e.states.st = States{Saturated: epsOf(0, 1)}
	if d := e.decide(kvReq(prompt)); !d.Saturated || d.Endpoint != -1 {
		t.Fatalf("decision %+v: want saturated", d)
	}
}

// TestSessionAffinity: sliding TTL (0 → 300 s), healthy and under cap only,
// bounded table with the oldest evicted.
func TestSessionAffinity(t *testing.T) {
	opts := noSeed()
	opts.MaxSessions = 2
	e := newEnv(t, pdRule([]int{0, 1, 2}, []int{3, 4}), opts)
	req := &Request{SessionKey: "conv-1"}
	e.loads.l = [256]int{0: 1, 1: 1, 2: 0, 3: 0, 4: 1}
	d, _ := e.route(req)
	if d.Tier != TierLoad || d.Endpoint != 2 || d.Decode != 3 {
		t.Fatalf("first decision %+v", d)
	}
	e.loads.l = [256]int{2: 9, 3: 9} // the pair is now the busiest; affinity still holds
	for i := 0; i < 3; i++ {
		e.clock.advance(299 * time.Second) // sliding: each hit refreshes
		d, _ = e.route(req)
		if d.Tier != TierSession || d.Endpoint != 2 || d.Decode != 3 || d.Reason != ReasonNone {
			t.Fatalf("hit %d: %+v", i, d)
		}
	}
	if e.obs.sessionHits != 3 {
		t.Fatalf("session hits %d", e.obs.sessionHits)
	}
	e.clock.advance(301 * time.Second)
	if d = e.decide(req); d.Tier == TierSession {
		t.Fatalf("expired session used: %+v", d)
	}
	// Re-pin, then make the prefill unhealthy: falls through and the entry goes.
	e.loads.l = [256]int{}
	d, _ = e.route(req)
	p := d.Endpoint
	e.states.st.ProbeDown = epsOf(p)
	if d = e.decide(req); d.Tier == TierSession || d.Endpoint == p {
		t.Fatalf("unhealthy session endpoint used: %+v", d)
	}
	e.states.st = States{}
	if d = e.decide(req); d.Tier == TierSession {
		t.Fatalf("session not evicted after an unhealthy lookup: %+v", d)
	}
	// At its admission cap, the pair is not used.
	d, _ = e.route(req)
	e.states.st.Saturated = epsOf(d.Endpoint)
	if d2 := e.decide(req); d2.Tier == TierSession {
		t.Fatalf("saturated session endpoint used: %+v", d2)
	}
	e.states.st = States{}
	// Unhealthy decode: prefill kept, decode re-chosen.
	d, _ = e.route(req)
	e.states.st.BreakerOpen = epsOf(d.Decode)
	if d2 := e.decide(req); d2.Tier != TierSession || d2.Decode == d.Decode || d2.Decode < 3 {
		t.Fatalf("decode not re-chosen: %+v", d2)
	}
	e.states.st = States{}
	// Bounded: a third key evicts the least recently used.
	e.route(&Request{SessionKey: "a"})
	e.clock.advance(time.Second)
	e.route(&Request{SessionKey: "b"})
	e.clock.advance(time.Second)
	e.route(&Request{SessionKey: "c"})
	if n := e.sel.SessionCount(); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
	if d := e.decide(&Request{SessionKey: "a"}); d.Tier == TierSession {
		t.Fatal("oldest session not evicted")
	}
	if d := e.decide(&Request{SessionKey: "c"}); d.Tier != TierSession {
		t.Fatal("newest session evicted")
	}
}

func TestSessionTTLRule(t *testing.T) {
	r := pdRule([]int{0}, []int{1})
	r.SessionTTL = 10 * time.Second
	e := newEnv(t, r, noSeed())
	req := &Request{SessionKey: "k"}
	e.route(req)
	e.clock.advance(10 * time.Second)
	if d := e.decide(req); d.Tier != TierSession {
		t.Fatalf("at the TTL: %+v", d)
	}
	e.clock.advance(10*time.Second + time.Nanosecond)
	if d := e.decide(req); d.Tier == TierSession {
		t.Fatalf("past the TTL: %+v", d)
	}
}

func TestSessionKey(t *testing.T) {
	o := DefaultOptions()
	h := map[string]string{"X-Session-ID": "s", "X-Conversation-ID": "c"}
	get := func(n string) string { return h[n] }
	if k := o.SessionKey(get, "u"); k != "c" {
		t.Fatalf("key %q, want the conversation id first", k)
	}
	delete(h, "X-Conversation-ID")
	if k := o.SessionKey(get, "u"); k != "s" {
		t.Fatalf("key %q", k)
	}
	delete(h, "X-Session-ID")
	if k := o.SessionKey(get, "u"); k != "u" {
		t.Fatalf("key %q, want body user", k)
	}
	h["X-Session-ID"] = strings.Repeat("x", SessionKeyMax+1)
	if k := o.SessionKey(get, ""); k != "" {
		t.Fatalf("over-long key accepted")
	}
	o.SessionHeaders = []string{"X-Trace-ID"}
	h["X-Trace-ID"] = "t"
	if k := o.SessionKey(get, "u"); k != "t" {
		t.Fatalf("configured header not used: %q", k)
	}
}

// TestTrieAffinity: fed from tier 2, used at ≥ threshold match when the
// prefill spread is within pd_balance_abs_threshold.
func TestTrieAffinity(t *testing.T) {
	r := pdRule([]int{0, 1, 2}, []int{3})
	r.CacheAware = true
	e := newEnv(t, r, noSeed())
	sys := "You are a helpful assistant for ACME. Answer briefly. "
	e.loads.l = [256]int{0: 1, 1: 1, 2: 0}
	d, _ := e.route(&Request{TrieText: sys + "question one"})
	if d.Tier != TierLoad || d.Endpoint != 2 {
		t.Fatalf("first: %+v", d)
	}
	e.loads.l = [256]int{0: 0, 1: 0, 2: 2}
	d, _ = e.route(&Request{TrieText: sys + "question two, different"})
	if d.Tier != TierTrie || d.Endpoint != 2 {
		t.Fatalf("second: %+v", d)
	}
	if e.obs.trieHits != 1 {
		t.Fatalf("trie hits %d", e.obs.trieHits)
	}
	// Below pd_cache_threshold (20%): a short shared prefix of a long text.
	if d = e.decide(&Request{TrieText: "You " + strings.Repeat("z", 100)}); d.Tier == TierTrie {
		t.Fatalf("low match rate used: %+v", d)
	}
	// Unbalanced prefill pool (spread 4 > 3): trie skipped.
	e.loads.l = [256]int{0: 0, 1: 0, 2: 4}
	if d = e.decide(&Request{TrieText: sys + "q3"}); d.Tier == TierTrie {
		t.Fatalf("unbalanced pool used the trie: %+v", d)
	}
	// Endpoint down: its trie entries are dropped by DropEndpoint.
	e.loads.l = [256]int{}
	e.sel.DropEndpoint(2)
	if d = e.decide(&Request{TrieText: sys + "q4"}); d.Tier == TierTrie {
		t.Fatalf("dropped endpoint still in the trie: %+v", d)
	}
	// Off without pd_cache_aware_mode.
	r.CacheAware = false
	e = newEnv(t, r, noSeed())
	e.route(&Request{TrieText: sys})
	if d = e.decide(&Request{TrieText: sys}); d.Tier == TierTrie {
		t.Fatal("trie used without pd_cache_aware_mode")
	}
}

func TestTrieBounded(t *testing.T) {
	tr := newTrie(64)
	for i := 0; i < 1000; i++ {
		tr.insert(strings.Repeat(string(rune('a'+i%26)), 1+i%7)+string(rune('A'+i%13))+strings.Repeat("q", i%50), i%5)
		if tr.nodes > 64 {
			t.Fatalf("trie grew to %d nodes", tr.nodes)
		}
	}
	if got := tr.count(&tr.root) - 1; got != tr.nodes {
		t.Fatalf("node count %d, actual %d", tr.nodes, got)
	}
	tr.removeEndpoint(3)
	if got := tr.count(&tr.root) - 1; got != tr.nodes {
		t.Fatalf("after removal node count %d, actual %d", tr.nodes, got)
	}
	tr.walk(&tr.root, func(n *trieNode) {
		if n.ep == 3 {
			t.Fatal("endpoint 3 survived removal")
		}
	})
	ep, m := tr.match("")
	if ep != -1 || m != 0 {
		t.Fatal("empty match")
	}
}

// TestLoadGuard: with LLB_KV_LOADGUARD, an unbalanced prefill pool skips
// tier 1.5 (fallthrough, no miss reason).
func TestLoadGuard(t *testing.T) {
	opts := noSeed()
	opts.LoadGuard = true
	e := newEnv(t, pdRule([]int{0, 1}, []int{2}), opts)
	prompt := seq(0, 4)
	e.inv.add(0, prompt...)
	e.loads.l = [256]int{0: 4, 1: 0}
	d := e.decide(kvReq(prompt))
	if !d.LoadGuard || !d.Fallthrough || d.Reason != ReasonNone || d.Tier != TierLoad || d.Endpoint != 1 {
		t.Fatalf("decision %+v", d)
	}
	e.loads.l = [256]int{0: 3, 1: 0}
	if d = e.decide(kvReq(prompt)); d.LoadGuard || d.Tier != TierKV {
		t.Fatalf("spread 3 ≤ 3 should use tier 1.5: %+v", d)
	}
}

// TestSel: the single-pool fallbacks.
func TestSel(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.1")
	b := netip.MustParseAddr("10.0.0.2")
	t.Run("0 round-robin", func(t *testing.T) {
		e := newEnv(t, poolRule(3, 0), noSeed())
		var got []int
		for i := 0; i < 4; i++ {
			d := e.decide(&Request{Client: a})
			got = append(got, d.Endpoint)
			if d.Tier != TierSelector || d.Fallthrough || d.Reason != ReasonTextEmpty {
				t.Fatalf("decision %+v", d)
			}
		}
		if !slices.Equal(got, []int{0, 1, 2, 0}) {
			t.Fatalf("%v", got)
		}
	})
	t.Run("1 hash of client address", func(t *testing.T) {
		e := newEnv(t, poolRule(8, 1), noSeed())
		seen := map[int]bool{}
		for i := 0; i < 64; i++ {
			c := netip.AddrFrom4([4]byte{10, 1, byte(i), 7})
			d1 := e.decide(&Request{Client: c})
			d2 := e.decide(&Request{Client: c})
			if d1.Endpoint != d2.Endpoint {
				t.Fatal("hash not stable")
			}
			seen[d1.Endpoint] = true
			// Removing another endpoint does not move this client.
			other := (d1.Endpoint + 1) % 8
			e.states.st.ProbeDown = epsOf(other)
			if d3 := e.decide(&Request{Client: c}); d3.Endpoint != d1.Endpoint {
				t.Fatal("rendezvous hash moved a client of a healthy endpoint")
			}
			e.states.st = States{}
		}
		if len(seen) < 6 {
			t.Fatalf("64 clients spread over only %d of 8 endpoints", len(seen))
		}
	})
	t.Run("2 priority", func(t *testing.T) {
		r := poolRule(3, 2)
		r.Endpoints[1].Weight, r.Endpoints[2].Weight = 5, 5
		e := newEnv(t, r, noSeed())
		if d := e.decide(&Request{}); d.Endpoint != 1 {
			t.Fatalf("%+v", d)
		}
		e.states.st.AdminDown = epsOf(1)
		if d := e.decide(&Request{}); d.Endpoint != 2 {
			t.Fatalf("%+v", d)
		}
	})
	t.Run("3 persist", func(t *testing.T) {
		e := newEnv(t, poolRule(3, 3), noSeed())
		da, _ := e.route(&Request{Client: a})
		db, _ := e.route(&Request{Client: b})
		if da.Endpoint == db.Endpoint {
			t.Fatal("new clients should round-robin")
		}
		for i := 0; i < 3; i++ {
			if d, _ := e.route(&Request{Client: a}); d.Endpoint != da.Endpoint {
				t.Fatal("client a moved")
			}
		}
		e.clock.advance(301 * time.Second)
		e.decide(&Request{Client: b}) // expired; any endpoint is fine
	})
	t.Run("4 least connections", func(t *testing.T) {
		e := newEnv(t, poolRule(3, 4), noSeed())
		e.loads.l = [256]int{0: 3, 1: 1, 2: 1}
		var got []int
		for i := 0; i < 3; i++ {
			got = append(got, e.decide(&Request{}).Endpoint)
		}
		if !slices.Equal(got, []int{1, 2, 1}) {
			t.Fatalf("%v", got)
		}
	})
	t.Run("8 capacity-normalised least load", func(t *testing.T) {
		e := newEnv(t, poolRule(2, 8), noSeed())
		e.loads.l = [256]int{0: 2, 1: 3}
		e.engine.blocks = map[int]int64{0: 100, 1: 1000}
		if d := e.decide(&Request{}); d.Endpoint != 1 {
			t.Fatalf("%+v", d)
		}
	})
	t.Run("no endpoint", func(t *testing.T) {
		e := newEnv(t, poolRule(2, 0), noSeed())
		e.states.st.ProbeDown = epsOf(0, 1)
		if d := e.decide(kvReq(seq(0, 2))); d.Endpoint != -1 || d.Tier != TierNone {
			t.Fatalf("%+v", d)
		}
	})
}

// TestRetrySecondBest: a connect failure re-enters with the winner excluded
// and the second-best overlap wins; the request counts one hit.
func TestRetrySecondBest(t *testing.T) {
	for _, pd := range []bool{true, false} {
		opts := noSeed()
		rule := poolRule(4, 0)
		if pd {
			rule = pdRule([]int{0, 1, 2, 4}, []int{3})
		}
		e := newEnv(t, rule, opts)
		prompt := seq(0, 8)
		e.inv.add(0, prompt[:6]...)
		e.inv.add(1, prompt[:4]...)
		e.inv.add(2, prompt[:2]...)
		a := e.sel.Begin(kvReq(prompt))
		var got []int
		for i := 0; i < 3; i++ {
			d := a.Decide()
			if d.Tier != TierKV {
				t.Fatalf("pd=%v attempt %d: %+v", pd, i, d)
			}
			got = append(got, d.Endpoint)
			a.Exclude(d.Endpoint)
		}
		if !slices.Equal(got, []int{0, 1, 2}) {
			t.Fatalf("pd=%v retry order %v, want by overlap", pd, got)
		}
		d := a.Decide() // all overlap endpoints failed: fallback, not a hit
		if d.Tier == TierKV || d.Reason != ReasonNoWorker {
			t.Fatalf("pd=%v: %+v", pd, d)
		}
		if o := a.Commit(); o.Hit {
			t.Fatal("fallback counted as a hit")
		}
		a = e.sel.Begin(kvReq(prompt))
		a.Decide()
		a.Exclude(0)
		a.Decide()
		if o := a.Commit(); !o.Hit || o.Endpoint != 1 {
			t.Fatalf("pd=%v: outcome %+v", pd, o)
		}
	}
}

// TestDropEndpointSessions: going down drops the endpoint's sessions.
func TestDropEndpointSessions(t *testing.T) {
	e := newEnv(t, pdRule([]int{0, 1}, []int{2}), noSeed())
	d, _ := e.route(&Request{SessionKey: "x"})
	e.route(&Request{SessionKey: "y"})
	e.sel.DropEndpoint(d.Endpoint)
	if e.sel.SessionCount() != 1 || e.obs.sessions != 1 {
		t.Fatalf("sessions %d (observer %d)", e.sel.SessionCount(), e.obs.sessions)
	}
	e.sel.DropEndpoint(2) // the shared decode endpoint
	if e.sel.SessionCount() != 0 {
		t.Fatal("decode drop kept sessions")
	}
}

func TestSetRule(t *testing.T) {
	e := newEnv(t, pdRule([]int{0, 1}, []int{2}), noSeed())
	e.loads.l = [256]int{0: 5}
	e.route(&Request{SessionKey: "x"}) // pinned to ep1
	if err := e.sel.SetRule(pdRule([]int{0}, []int{2})); err != nil {
		t.Fatal(err)
	}
	if e.sel.SessionCount() != 0 {
		t.Fatal("session of a removed endpoint kept")
	}
	if err := e.sel.SetRule(Rule{KVExactMode: 1}); err == nil {
		t.Fatal("mode 1 without pd accepted")
	}
}

// TestParkAndAssign: a saturated pool exposes its park candidates; a slot
// granted later is assigned with a decode endpoint and pins the session.
func TestParkAndAssign(t *testing.T) {
	e := newEnv(t, pdRule([]int{0, 1, 2}, []int{3, 4}), noSeed())
	e.states.st = States{Saturated: epsOf(0, 1), ProbeDown: epsOf(2)}
	e.loads.l = [256]int{3: 2, 4: 1}
	req := &Request{SessionKey: "s"}
	a := e.sel.Begin(req)
	if d := a.Decide(); !d.Saturated {
		t.Fatalf("%+v", d)
	}
	if p := a.Parkable(); p != epsOf(0, 1) {
		t.Fatalf("parkable %v", p)
	}
	d := a.Assign(1)
	if d.Endpoint != 1 || d.Decode != 4 || d.Tier != TierLoad {
		t.Fatalf("assign %+v", d)
	}
	a.Commit()
	e.states.st = States{}
	if d := e.decide(req); d.Tier != TierSession || d.Endpoint != 1 {
		t.Fatalf("session not pinned by the assigned decision: %+v", d)
	}
	if d := a.Assign(3); d.Endpoint != -1 {
		t.Fatal("decode endpoint assigned as prefill")
	}
}
