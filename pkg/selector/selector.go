package selector

import (
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// Deps are the selector's inputs. Every field may be nil: a nil Scorer
// scores nothing, a nil LoadSource reports no load, a nil EngineSource
// reports nothing scraped, a nil StateSource reports every endpoint up, a
// nil Observer counts nothing, a nil Logger discards, a nil Now is time.Now.
type Deps struct {
	Scorer Scorer
	// Confirmed is the event-fed inventory under Scorer when Scorer also
	// credits provisional blocks (the overlay); nil when every block Scorer
	// counts was reported by an engine. Only cold placement reads it.
	Confirmed Scorer
	Loads     LoadSource
	Engine    EngineSource
	States    StateSource
	// Cost feeds LOXILB_KV_LB_MODE=cost; nil reports no pending work and
	// no learned prefill speed (the cold-start default for every endpoint).
	Cost     CostSource
	Observer Observer
	Logger   *slog.Logger
	Now      func() time.Time
}

// compiled is a validated Rule with its masks precomputed. Immutable.
type compiled struct {
	rule             Rule
	all              epset.Set
	prefill, decode  epset.Set
	normal           epset.Set
	weight           [epset.Max]int32
	capWeight        [epset.Max]int64
	draining         epset.Set // controller advice (advice.go)
	disabled         epset.Set
	blockSize        int
	ttl              time.Duration
	cacheThreshold   int
	balanceThreshold int
	relief           bool
}

// Largest in-flight count considered per endpoint; keeps the cap arithmetic
// exact in 128 bits.
const maxLoad = 1 << 24

// Capacity clamp of ĉ_i.
const maxCapacity = 8_000_000

func compile(r Rule, o Options) (*compiled, error) {
	c := &compiled{rule: r}
	if r.KVExactMode < 0 || r.KVExactMode > 3 {
		return nil, fmt.Errorf("selector: service %d: kvExactMode %d: want 0..3", r.ServiceID, r.KVExactMode)
	}
	if r.KVExactMode == 1 && !r.PD {
		return nil, fmt.Errorf("selector: service %d: kvExactMode 1 requires pd_disagg_mode", r.ServiceID)
	}
	if r.KVExactMode == 3 && r.PD {
		return nil, fmt.Errorf("selector: service %d: kvExactMode 3 is incompatible with pd_disagg_mode", r.ServiceID)
	}
	if r.Sel < SelRR || r.Sel > SelMax {
		return nil, fmt.Errorf("selector: service %d: sel %d: want %d..%d", r.ServiceID, int(r.Sel), int(SelRR), int(SelMax))
	}
	if r.BlockSize < 0 || r.CacheThreshold < 0 || r.CacheThreshold > 100 || r.BalanceThreshold < 0 || r.SessionTTL < 0 || r.KVWarmupSec < 0 {
		return nil, fmt.Errorf("selector: service %d: negative or out-of-range rule field", r.ServiceID)
	}
	for _, e := range r.Endpoints {
		if e.Idx < 0 || e.Idx >= epset.Max {
			return nil, fmt.Errorf("selector: service %d: ep_idx %d out of range [0,%d)", r.ServiceID, e.Idx, epset.Max)
		}
		if c.all.Has(e.Idx) {
			return nil, fmt.Errorf("selector: service %d: duplicate ep_idx %d", r.ServiceID, e.Idx)
		}
		if e.Role > RoleDecode {
			return nil, fmt.Errorf("selector: service %d: ep_idx %d: ep_role %d: want 0..2", r.ServiceID, e.Idx, e.Role)
		}
		c.all.Add(e.Idx)
		switch e.Role {
		case RolePrefill:
			c.prefill.Add(e.Idx)
		case RoleDecode:
			c.decode.Add(e.Idx)
		default:
			c.normal.Add(e.Idx)
		}
		c.weight[e.Idx] = int32(e.Weight)
		w := int64(e.CapacityWeight)
		if w <= 0 || w > 100 {
			w = 100
		}
		c.capWeight[e.Idx] = w
	}
	c.blockSize = r.BlockSize
	if c.blockSize == 0 {
		c.blockSize = 16
	}
	c.ttl = r.SessionTTL
	if c.ttl == 0 {
		c.ttl = DefaultSessionTTL
	}
	c.cacheThreshold = r.CacheThreshold
	if c.cacheThreshold == 0 {
		c.cacheThreshold = 20
	}
	c.balanceThreshold = r.BalanceThreshold
	if c.balanceThreshold == 0 {
		c.balanceThreshold = 3
	}
	switch o.SpillRelief {
	case ReliefOn:
		c.relief = true
	case ReliefAuto:
		c.relief = !r.PD
	}
	return c, nil
}

// Selector makes the decisions of one rule. It is safe for concurrent use.
type Selector struct {
	opts      Options
	scorer    Scorer
	confirmed Scorer // nil: no provisional overlay
	loads     LoadSource
	engine    EngineSource
	states    StateSource
	cost      CostSource
	obs       Observer
	log       *slog.Logger
	now       func() time.Time
	base      time.Time

	rule atomic.Pointer[compiled]

	adviceMu sync.Mutex // orders SetRule and SetAdvice
	advice   *Advice

	mu       sync.Mutex // guards sessions, persist, trie
	sessions *lru[string]
	persist  *lru[netip.Addr]
	trie     *trie

	rrLoad, rrDecode, rrSel, rrNormal atomic.Uint64
	rrCold                            atomic.Uint64 // ties of the cold placement by cost
	coldTick                          atomic.Uint64
	zeroStreak                        atomic.Int64

	pool sync.Pool // *scratch
}

// scratch is the per-decision working memory, pooled so a decision does
// not allocate.
type scratch struct {
	counts    [epset.Max]uint32
	confirmed [epset.Max]uint32 // confirmed leading runs (coldplace.go)
	load      [epset.Max]int64
	capc      [epset.Max]int64
	cost      [epset.Max]float64 // predicted TTFT in ns (cost mode)
	cands     [epset.Max]int16
	tied      [epset.Max]int16
	elig      [epset.Max]int16 // members of the tier-1.5 eligible set
	memb      [epset.Max]int16 // members of a set, for the other loops
}

// list writes the members of set into buf in ascending order and returns
// them; much cheaper than repeated Set.Next on the hot path.
func list(set epset.Set, buf *[epset.Max]int16) []int16 {
	n := 0
	for w, v := range set {
		for ; v != 0; v &= v - 1 {
			buf[n] = int16(w<<6 | bits.TrailingZeros64(v))
			n++
		}
	}
	return buf[:n]
}

type nopScorer struct{}

func (nopScorer) Score([]uint64, epset.Set, bool, *[epset.Max]uint32) {}
func (nopScorer) Blocks(int) int                                      { return 0 }

type nopLoads struct{}

func (nopLoads) InFlight(int) int { return 0 }

type nopEngine struct{}

func (nopEngine) GPUBlocks(int) (int64, bool)        { return 0, false }
func (nopEngine) Waiting(int) (int, time.Time, bool) { return 0, time.Time{}, false }

type nopCost struct{}

func (nopCost) PendingTokens(int) int64                   { return 0 }
func (nopCost) PrefillPerToken(int) (time.Duration, bool) { return 0, false }

type nopStates struct{}

func (nopStates) States() States { return States{} }

// New builds the selector of one rule. opts must pass Validate.
func New(rule Rule, opts Options, deps Deps) (*Selector, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c, err := compile(rule, opts)
	if err != nil {
		return nil, err
	}
	s := &Selector{
		opts: opts, scorer: deps.Scorer, confirmed: deps.Confirmed, loads: deps.Loads, engine: deps.Engine, states: deps.States, cost: deps.Cost,
		obs: deps.Observer, log: deps.Logger, now: deps.Now,
		sessions: newLRU[string](opts.MaxSessions),
		persist:  newLRU[netip.Addr](opts.MaxSessions),
		trie:     newTrie(opts.TrieMaxNodes),
	}
	for _, c := range []*atomic.Uint64{&s.rrLoad, &s.rrDecode, &s.rrSel, &s.rrNormal} {
		c.Store(opts.CursorStart)
	}
	if s.scorer == nil {
		s.scorer = nopScorer{}
	}
	if s.loads == nil {
		s.loads = nopLoads{}
	}
	if s.engine == nil {
		s.engine = nopEngine{}
	}
	if s.states == nil {
		s.states = nopStates{}
	}
	if s.cost == nil {
		s.cost = nopCost{}
	}
	if s.obs == nil {
		s.obs = NopObserver{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.base = s.now()
	s.pool.New = func() any { return new(scratch) }
	s.rule.Store(c)
	return s, nil
}

// Options returns the options the selector runs with.
func (s *Selector) Options() Options { return s.opts }

// Rule returns the rule the selector runs with.
func (s *Selector) Rule() Rule { return s.rule.Load().rule }

// SetRule replaces the rule (an update of the same service). Sessions, trie
// entries and persist entries of endpoints that left the rule are dropped.
func (s *Selector) SetRule(rule Rule) error {
	c, err := compile(rule, s.opts)
	if err != nil {
		return err
	}
	s.adviceMu.Lock()
	defer s.adviceMu.Unlock()
	c.advise(s.advice)
	old := s.rule.Swap(c)
	gone := old.all.AndNot(c.all)
	for ep := gone.Next(0); ep >= 0; ep = gone.Next(ep + 1) {
		s.DropEndpoint(ep)
	}
	return nil
}

// DropEndpoint forgets ep's sessions, trie entries and persist entries. The
// health prober calls it when an endpoint goes down or its breaker opens.
func (s *Selector) DropEndpoint(ep int) {
	s.mu.Lock()
	s.sessions.dropIf(func(p, d int) bool { return p == ep || d == ep })
	s.persist.dropIf(func(p, _ int) bool { return p == ep })
	s.trie.removeEndpoint(ep)
	n := s.sessions.len()
	s.mu.Unlock()
	s.obs.Sessions(s.rule.Load().rule.ServiceID, n)
}

// SessionCount is the number of live session entries.
func (s *Selector) SessionCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions.len()
}

// TrieNodes is the number of trie nodes.
func (s *Selector) TrieNodes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trie.nodes
}

func (s *Selector) elapsed() time.Duration { return s.now().Sub(s.base) }

// sessionPair looks up a conversation's pinned (prefill, decode) pair. A pin
// whose prefill endpoint is no longer eligible is dropped, so the
// conversation re-pins where it lands next.
func (s *Selector) sessionPair(key string, now, ttl time.Duration, prefE epset.Set) (p, dec int, ok bool) {
	if key == "" {
		return 0, 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, dec, ok = s.sessions.get(key, now, ttl)
	if ok && !prefE.Has(p) {
		s.sessions.remove(key)
		return 0, 0, false
	}
	return p, dec, ok
}

// Attempt routes one request, across connect-failure retries. Use it from
// one goroutine.
type Attempt struct {
	s              *Selector
	req            *Request
	excluded       epset.Set
	excludedDecode epset.Set
	tick           uint64 // cold-seed tick taken by this request; 0 before its first tier-1.5 hit
	parkable       epset.Set
	last           Decision
	decided        bool
}

// Begin starts routing req. req must stay unchanged until Commit.
func (s *Selector) Begin(req *Request) Attempt {
	return Attempt{s: s, req: req}
}

// Exclude marks a prefill (or single-pool) endpoint as failed for this
// request; the next Decide re-enters the ladder without it, so the
// second-best overlap wins.
func (a *Attempt) Exclude(ep int) { a.excluded.Add(ep) }

// ExcludeDecode marks a decode endpoint as failed for this request.
func (a *Attempt) ExcludeDecode(ep int) { a.excludedDecode.Add(ep) }

// Excluded is the set of endpoints this request has excluded so far.
func (a *Attempt) Excluded() epset.Set { return a.excluded }

// Decide runs the ladder once.
func (a *Attempt) Decide() Decision {
	s := a.s
	c := s.rule.Load()
	sc := s.pool.Get().(*scratch)
	var d Decision
	if c.rule.PD {
		d = s.decidePD(a, c, sc)
	} else {
		d = s.decidePool(a, c, sc)
	}
	s.pool.Put(sc)
	a.last, a.decided = d, true
	return d
}

// Parkable is, after a P/D Decide, the healthy prefill endpoints not
// excluded by this request, saturated or not: the candidates to park on
// when the decision is Saturated.
func (a *Attempt) Parkable() epset.Set { return a.parkable }

// Assign makes a P/D decision for a prefill endpoint chosen outside the
// ladder (admission granted a parked request a slot on it): tier 2, with
// the decode endpoint chosen as usual. Commit it like any decision.
func (a *Attempt) Assign(prefill int) Decision {
	s := a.s
	c := s.rule.Load()
	d := Decision{Endpoint: -1, Decode: -1, Argmax: -1}
	if !c.rule.PD || !c.prefill.Has(prefill) {
		a.last, a.decided = d, true
		return d
	}
	st := s.states.States()
	decE := undrained(c.decode.AndNot(st.Unavailable().Or(a.excludedDecode).Or(c.disabled)), c.draining)
	sc := s.pool.Get().(*scratch)
	s.fillLoads(decE, sc)
	d.Endpoint, d.Tier = prefill, TierLoad
	d.Decode = s.minLoad(decE, sc, &s.rrDecode)
	s.pool.Put(sc)
	a.last, a.decided = d, true
	return d
}

// Commit records that the last decision was routed (its connection is
// up): it pins the session, feeds the trie or the persist table, and
// reports the counters to bump. Call it once per request.
func (a *Attempt) Commit() Outcome {
	s := a.s
	d := a.last
	o := Outcome{Endpoint: d.Endpoint, Decode: d.Decode, Tier: d.Tier}
	if !a.decided || d.Endpoint < 0 {
		return o
	}
	o.Hit = d.Tier == TierKV
	o.Spilled = o.Hit && d.Spilled
	o.ColdSeed = o.Hit && d.ColdSeed
	c := s.rule.Load()
	now := s.elapsed()
	sessions := -1
	s.mu.Lock()
	if c.rule.PD && d.Decode >= 0 && d.Tier != TierNormal && a.req.SessionKey != "" {
		s.sessions.put(a.req.SessionKey, d.Endpoint, d.Decode, now)
		sessions = s.sessions.len()
	}
	if c.rule.PD && c.rule.CacheAware && (d.Tier == TierLoad || d.Tier == TierTrie) && a.req.TrieText != "" {
		s.trie.insert(a.req.TrieText, d.Endpoint)
	}
	if !c.rule.PD && c.rule.Sel == SelPersist && d.Tier == TierSelector && a.req.Client.IsValid() {
		s.persist.put(a.req.Client, d.Endpoint, 0, now)
	}
	s.mu.Unlock()
	id := c.rule.ServiceID
	switch d.Tier {
	case TierSession:
		s.obs.SessionHit(id)
	case TierTrie:
		s.obs.TrieHit(id)
	}
	if sessions >= 0 {
		s.obs.Sessions(id, sessions)
	}
	return o
}

// fillLoads reads L_i for every endpoint of set into sc.load, clamped.
func (s *Selector) fillLoads(set epset.Set, sc *scratch) {
	for _, m := range list(set, &sc.memb) {
		ep := int(m)
		l := int64(s.loads.InFlight(ep))
		if l < 0 {
			l = 0
		} else if l > maxLoad {
			l = maxLoad
		}
		sc.load[ep] = l
	}
}

// spread is max − min of the loads over set (0 for an empty set).
func spread(set epset.Set, sc *scratch) int64 {
	lo, hi := int64(-1), int64(0)
	for _, m := range list(set, &sc.memb) {
		l := sc.load[m]
		if lo < 0 || l < lo {
			lo = l
		}
		if l > hi {
			hi = l
		}
	}
	if lo < 0 {
		return 0
	}
	return hi - lo
}

// decidePD is the mode-1 (P/D) flow: tier 1 session, tier 1 trie,
// tier 1.5, tier 2; decode chosen alongside.
func (s *Selector) decidePD(a *Attempt, c *compiled, sc *scratch) Decision {
	d := Decision{Endpoint: -1, Decode: -1, Argmax: -1}
	st := s.states.States()
	down := st.Unavailable().Or(a.excluded).Or(c.disabled)
	prefE := c.prefill.AndNot(down)
	a.parkable = undrained(prefE, c.draining) // a parked request waits for an endpoint that takes new work
	saturated := prefE.And(st.Saturated)
	prefE = prefE.AndNot(st.Saturated)
	decE := c.decode.AndNot(st.Unavailable().Or(a.excludedDecode).Or(c.disabled))
	s.fillLoads(prefE.Or(decE), sc)

	if prefE.Empty() {
		if !saturated.Empty() {
			d.Saturated = true
			return d
		}
		// No prefill endpoint at all: a role-0 endpoint may serve in plain mode.
		if ep := rrPick(c.normal.AndNot(down), &s.rrNormal); ep >= 0 {
			d.Endpoint, d.Tier = ep, TierNormal
		}
		return d
	}

	now := s.elapsed()
	// Tier 1, conversation affinity.
	if p, dec, ok := s.sessionPair(a.req.SessionKey, now, c.ttl, prefE); ok {
		d.Endpoint, d.Tier = p, TierSession
		if decE.Has(dec) {
			d.Decode = dec
		} else {
			d.Decode = s.minLoad(decE, sc, &s.rrDecode)
		}
		return d
	}

	// Draining endpoints kept their sessions above; nothing new goes there.
	prefE, decE = undrained(prefE, c.draining), undrained(decE, c.draining)
	if s.opts.SessionHash && a.req.SessionKey != "" {
		if p, dec := s.sessionHome(a.req.SessionKey, prefE, decE, sc); p >= 0 {
			d.Endpoint, d.Decode, d.Tier = p, dec, TierSession
			return d
		}
	}
	balanced := spread(prefE, sc) <= int64(c.balanceThreshold)
	// Tier 1, trie affinity.
	if c.rule.CacheAware && balanced && a.req.TrieText != "" {
		text := trieKey(a.req.TrieText)
		s.mu.Lock()
		ep, matched := s.trie.match(text)
		s.mu.Unlock()
		if ep >= 0 && matched > 0 && prefE.Has(ep) && matched*100 >= c.cacheThreshold*len(text) {
			d.Endpoint, d.Tier = ep, TierTrie
			d.Decode = s.minLoad(decE, sc, &s.rrDecode)
			return d
		}
	}

	// Tier 1.5, unless LLB_KV_LOADGUARD sees the prefill pool unbalanced.
	switch {
	case s.opts.LoadGuard && !balanced:
		d.LoadGuard, d.Fallthrough = true, true
	case s.tier15(a, c, prefE, sc, &d):
		d.Decode = s.minLoad(decE, sc, &s.rrDecode)
		return d
	default:
		d.Fallthrough = true
	}

	// Tier 2: min in-flight + queued, round-robin on ties only; or, for a
	// prefix nobody holds, the cold placement every replica derives alike.
	if ep := s.coldPlace(a.req, prefE, sc, &d, true); ep >= 0 {
		d.Endpoint, d.Tier, d.ColdPlaced = ep, TierLoad, true
		d.Decode = s.minLoad(decE, sc, &s.rrDecode)
		return d
	}
	d.Endpoint, d.Tier = s.minLoad(prefE, sc, &s.rrLoad), TierLoad
	d.Decode = s.minLoad(decE, sc, &s.rrDecode)
	return d
}

// decidePool is the single-pool flow: tier 1.5, then the rule's selector.
func (s *Selector) decidePool(a *Attempt, c *compiled, sc *scratch) Decision {
	d := Decision{Endpoint: -1, Decode: -1, Argmax: -1}
	st := s.states.States()
	elig := undrained(c.all.AndNot(st.Unavailable().Or(a.excluded).Or(c.disabled)), c.draining)
	if elig.Empty() {
		// Still report the tier-1.5 reason for the counters.
		s.tier15(a, c, elig, sc, &d)
		d.Endpoint, d.Tier, d.Spilled, d.ColdSeed = -1, TierNone, false, false
		if d.Reason == ReasonHit {
			d.Reason = ReasonExcluded
		}
		return d
	}
	s.fillLoads(elig, sc)
	if s.tier15(a, c, elig, sc, &d) {
		return d
	}
	if ep := s.coldPlace(a.req, elig, sc, &d, false); ep >= 0 {
		d.Endpoint, d.Tier, d.ColdPlaced = ep, TierSelector, true
		return d
	}
	d.Endpoint, d.Tier = s.selectBySel(a, c, elig, sc), TierSelector
	return d
}
