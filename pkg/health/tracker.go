package health

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Event is the kind of a state transition.
type Event uint8

const (
	EventProbeDown Event = iota + 1
	EventProbeUp
	EventBreakerOpen
	EventBreakerHalfOpen
	EventBreakerClosed
	EventAdminDown
	EventAdminUp
)

var eventNames = map[Event]string{EventProbeDown: "probe_down", EventProbeUp: "probe_up", EventBreakerOpen: "breaker_open",
	EventBreakerHalfOpen: "breaker_half_open", EventBreakerClosed: "breaker_closed", EventAdminDown: "admin_down", EventAdminUp: "admin_up"}

func (e Event) String() string {
	if n, ok := eventNames[e]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", e)
}

// Transition is one endpoint changing state.
type Transition struct {
	ServiceID uint32
	Ep        int
	Event     Event
}

// Drops reports whether the endpoint should lose its sessions and trie
// entries (it went probe-down, breaker-open or admin-down): wire it to
// selector.Selector.DropEndpoint.
func (t Transition) Drops() bool {
	return t.Event == EventProbeDown || t.Event == EventBreakerOpen || t.Event == EventAdminDown
}

// Observer receives health counters; the daemon wires it to pkg/metrics.
type Observer interface {
	// BreakerFlip: loxilb_pd_cb_flips_total, and the per-endpoint breaker
	// state gauge set to `to`.
	BreakerFlip(serviceID uint32, ep int, to BreakerState)
	// ProbeTransition: an endpoint's probe state changed (up or down).
	ProbeTransition(serviceID uint32, ep int, up bool)
	// ScrapeFailed: the engine /metrics scrape of ep failed.
	ScrapeFailed(serviceID uint32, ep int)
	// EngineFigures: a scrape of ep read num_gpu_blocks and the waiting
	// queue (-1: that family was missing), for kvgate_endpoint_capacity_blocks
	// and kvgate_endpoint_engine_waiting.
	EngineFigures(serviceID uint32, ep int, gpuBlocks, waiting int64)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) BreakerFlip(uint32, int, BreakerState)   {}
func (NopObserver) ProbeTransition(uint32, int, bool)       {}
func (NopObserver) ScrapeFailed(uint32, int)                {}
func (NopObserver) EngineFigures(uint32, int, int64, int64) {}

// probeState is the probe state machine of one endpoint.
type probeState struct {
	down  bool
	fails int
}

// record applies one probe result; it returns whether the endpoint changed
// between up and down. retries consecutive failures mark it down; one
// success marks it up.
func (p *probeState) record(ok bool, retries int) bool {
	if ok {
		p.fails = 0
		if p.down {
			p.down = false
			return true
		}
		return false
	}
	p.fails++
	if !p.down && p.fails >= retries {
		p.down = true
		return true
	}
	return false
}

// engineFigures are the scraped values of one endpoint, read lock-free on
// the selection path. -1 means unknown.
type engineFigures struct {
	gpuBlocks atomic.Int64
	waiting   atomic.Int64
	waitingAt atomic.Int64 // unix nanoseconds
	// load is running + waiting at loadAt (-1 unknown): the engine's own
	// count of requests, from every gateway replica (SetEngineLoad).
	load   atomic.Int64
	loadAt atomic.Int64
}

// Tracker holds the health of one rule's endpoints. It satisfies
// selector.StateSource and selector.EngineSource. Safe for concurrent use.
type Tracker struct {
	serviceID    uint32
	breakerCfg   BreakerConfig
	probeRetries int
	clock        Clock
	obs          Observer
	log          *slog.Logger

	mu       sync.Mutex
	probes   [epset.Max]probeState
	breakers [epset.Max]breaker
	members  epset.Set
	subs     []func(Transition)

	snap      atomic.Pointer[selector.States] // Saturated is filled from admission at read time
	nextDue   atomic.Int64                    // unix ns of the earliest open breaker's half-open time
	admission atomic.Pointer[Shaper]

	figures      [epset.Max]engineFigures
	onEngineLoad func(ep int)
	// probeErr is each endpoint's last probe failure ("" after a pass), so
	// the status page can say why an endpoint is down.
	probeErr [epset.Max]atomic.Pointer[string]
}

// setProbeError records ep's last probe failure; "" clears it.
func (t *Tracker) setProbeError(ep int, msg string) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	if msg == "" {
		t.probeErr[ep].Store(nil)
		return
	}
	t.probeErr[ep].Store(&msg)
}

// ProbeError is why ep's last probe failed ("" when it passed or none ran),
// e.g. "http probe 10.0.0.2:8000/v1/models: status 401: engine requires a
// token (backendTokenFile)".
func (t *Tracker) ProbeError(ep int) string {
	if ep < 0 || ep >= epset.Max {
		return ""
	}
	if s := t.probeErr[ep].Load(); s != nil {
		return *s
	}
	return ""
}

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	ServiceID uint32
	// Endpoints are the rule's ep_idx values.
	Endpoints []int
	Breaker   BreakerConfig
	// ProbeRetries consecutive failures mark an endpoint down (default 2).
	ProbeRetries int
	Clock        Clock
	Observer     Observer
	Logger       *slog.Logger
	// OnEngineLoad, when set, is called with an endpoint each time a scrape
	// is about to store its engine load, so the caller can take a snapshot
	// of its own in-flight count at that instant (docs/replicas.md).
	OnEngineLoad func(ep int)
}

// NewTracker builds the health state of one rule. Every endpoint starts
// healthy, with a closed breaker and unknown engine figures.
func NewTracker(cfg TrackerConfig) (*Tracker, error) {
	t := &Tracker{serviceID: cfg.ServiceID, breakerCfg: cfg.Breaker.withDefaults(), probeRetries: cfg.ProbeRetries,
		clock: cfg.Clock, obs: cfg.Observer, log: cfg.Logger, onEngineLoad: cfg.OnEngineLoad}
	if t.probeRetries <= 0 {
		t.probeRetries = 2
	}
	if t.clock == nil {
		t.clock = RealClock{}
	}
	if t.obs == nil {
		t.obs = NopObserver{}
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	for _, ep := range cfg.Endpoints {
		if ep < 0 || ep >= epset.Max {
			return nil, fmt.Errorf("health: service %d: ep_idx %d out of range", cfg.ServiceID, ep)
		}
		t.members.Add(ep)
	}
	for i := range t.figures {
		t.figures[i].gpuBlocks.Store(-1)
		t.figures[i].waiting.Store(-1)
		t.figures[i].load.Store(-1)
	}
	t.nextDue.Store(math.MaxInt64)
	t.snap.Store(&selector.States{})
	return t, nil
}

// Subscribe registers f for every transition. f runs synchronously, after
// the state has changed and outside the Tracker's lock; it must not block.
func (t *Tracker) Subscribe(f func(Transition)) {
	t.mu.Lock()
	t.subs = append(t.subs, f)
	t.mu.Unlock()
}

// Shaper is the P/D load shaping a Tracker consults: pkg/pd/admission's
// Controller. It lives there, not here, because it is request admission,
// not endpoint health; the Tracker only reports its saturated set and
// drains it when an endpoint drops.
type Shaper interface {
	// Saturated is the set of endpoints at their in-flight cap.
	Saturated() epset.Set
	// Drain wakes every request parked on ep so it selects again.
	Drain(ep int)
}

// AttachAdmission makes States report a's saturated endpoints, and drains
// a's parked requests of an endpoint that goes down. A nil a detaches.
func (t *Tracker) AttachAdmission(a Shaper) {
	if a == nil {
		t.admission.Store(nil)
		return
	}
	t.admission.Store(&a)
}

// publish rebuilds the snapshot; call with t.mu held.
func (t *Tracker) publishLocked(adminDown epset.Set) {
	var st selector.States
	st.AdminDown = adminDown
	next := int64(math.MaxInt64)
	for ep := t.members.Next(0); ep >= 0; ep = t.members.Next(ep + 1) {
		if t.probes[ep].down {
			st.ProbeDown.Add(ep)
		}
		b := &t.breakers[ep]
		if b.blocks(t.breakerCfg) {
			st.BreakerOpen.Add(ep)
		}
		if b.state == BreakerOpen {
			next = min(next, b.openedAt.Add(t.breakerCfg.OpenFor).UnixNano())
		}
		if d := b.renewDue(t.breakerCfg); !d.IsZero() {
			next = min(next, d.UnixNano())
		}
	}
	t.snap.Store(&st)
	t.nextDue.Store(next)
}

func (t *Tracker) notify(trs []Transition) {
	if len(trs) == 0 {
		return
	}
	t.mu.Lock()
	subs := t.subs
	t.mu.Unlock()
	for _, tr := range trs {
		switch tr.Event {
		case EventProbeDown, EventProbeUp:
			t.obs.ProbeTransition(t.serviceID, tr.Ep, tr.Event == EventProbeUp)
			t.log.Info("endpoint probe transition", "service", t.serviceID, "ep_idx", tr.Ep, "event", tr.Event.String())
		case EventBreakerOpen:
			t.obs.BreakerFlip(t.serviceID, tr.Ep, BreakerOpen)
			t.log.Warn("circuit breaker opened", "service", t.serviceID, "ep_idx", tr.Ep)
		case EventBreakerHalfOpen:
			t.obs.BreakerFlip(t.serviceID, tr.Ep, BreakerHalfOpen)
		case EventBreakerClosed:
			t.obs.BreakerFlip(t.serviceID, tr.Ep, BreakerClosed)
			t.log.Info("circuit breaker closed", "service", t.serviceID, "ep_idx", tr.Ep)
		}
		for _, f := range subs {
			f(tr)
		}
	}
	if a := t.admission.Load(); a != nil {
		for _, tr := range trs {
			if tr.Drops() {
				(*a).Drain(tr.Ep)
			}
		}
	}
}

// advanceLocked moves due breakers to half-open; call with t.mu held.
func (t *Tracker) advanceLocked(now time.Time) []Transition {
	var trs []Transition
	changed := false
	for ep := t.members.Next(0); ep >= 0; ep = t.members.Next(ep + 1) {
		b := &t.breakers[ep]
		if b.tick(t.breakerCfg, now) {
			trs = append(trs, Transition{t.serviceID, ep, EventBreakerHalfOpen})
			changed = true
		} else if b.renew(t.breakerCfg, now) {
			changed = true
		}
	}
	if changed {
		t.publishLocked(t.snap.Load().AdminDown)
	}
	return trs
}

// States is the current exclusion state (selector.StateSource).
func (t *Tracker) States() selector.States {
	now := t.clock.Now()
	if now.UnixNano() >= t.nextDue.Load() {
		t.mu.Lock()
		trs := t.advanceLocked(now)
		t.mu.Unlock()
		t.notify(trs)
	}
	st := *t.snap.Load()
	if a := t.admission.Load(); a != nil {
		st.Saturated = (*a).Saturated()
	}
	return st
}

// ProbeResult applies one active-probe result for ep.
func (t *Tracker) ProbeResult(ep int, ok bool) {
	if !t.members.Has(ep) {
		return
	}
	t.mu.Lock()
	changed := t.probes[ep].record(ok, t.probeRetries)
	down := t.probes[ep].down
	if changed {
		t.publishLocked(t.snap.Load().AdminDown)
	}
	t.mu.Unlock()
	if changed {
		ev := EventProbeUp
		if down {
			ev = EventProbeDown
		}
		t.notify([]Transition{{t.serviceID, ep, ev}})
	}
}

// SetAdmin sets ep administratively down or up. A down endpoint keeps its
// inventory and subscriber but is never selected.
func (t *Tracker) SetAdmin(ep int, down bool) {
	if !t.members.Has(ep) {
		return
	}
	t.mu.Lock()
	admin := t.snap.Load().AdminDown
	if admin.Has(ep) == down {
		t.mu.Unlock()
		return
	}
	if down {
		admin.Add(ep)
	} else {
		admin.Remove(ep)
	}
	t.publishLocked(admin)
	t.mu.Unlock()
	ev := EventAdminUp
	if down {
		ev = EventAdminDown
	}
	t.notify([]Transition{{t.serviceID, ep, ev}})
}

// Allow asks ep's breaker to admit one request: always when closed, at most
// HalfOpenTrials while half-open, never while open. The proxy calls it
// before connecting and treats false like a connect failure.
func (t *Tracker) Allow(ep int) bool {
	if !t.members.Has(ep) {
		return false
	}
	now := t.clock.Now()
	t.mu.Lock()
	trs := t.advanceLocked(now)
	b := &t.breakers[ep]
	ok := b.allow(t.breakerCfg, now)
	if b.blocks(t.breakerCfg) != t.snap.Load().BreakerOpen.Has(ep) {
		t.publishLocked(t.snap.Load().AdminDown)
	}
	t.mu.Unlock()
	t.notify(trs)
	return ok
}

// Success records a request that reached ep and got a non-5xx answer.
func (t *Tracker) Success(ep int) {
	t.record(ep, func(b *breaker, now time.Time) (Event, bool) {
		if b.success() {
			return EventBreakerClosed, true
		}
		return 0, false
	})
}

// ConnectFailure records a failed connection to ep.
func (t *Tracker) ConnectFailure(ep int) {
	t.record(ep, func(b *breaker, now time.Time) (Event, bool) {
		if b.failure(t.breakerCfg, now, false) {
			return EventBreakerOpen, true
		}
		return 0, false
	})
}

// OriginError records a 5xx answer from ep.
func (t *Tracker) OriginError(ep int) {
	t.record(ep, func(b *breaker, now time.Time) (Event, bool) {
		if b.failure(t.breakerCfg, now, true) {
			return EventBreakerOpen, true
		}
		return 0, false
	})
}

func (t *Tracker) record(ep int, f func(*breaker, time.Time) (Event, bool)) {
	if !t.members.Has(ep) || t.breakerCfg.Off {
		return
	}
	now := t.clock.Now()
	t.mu.Lock()
	trs := t.advanceLocked(now)
	ev, changed := f(&t.breakers[ep], now)
	if changed {
		t.publishLocked(t.snap.Load().AdminDown)
		trs = append(trs, Transition{t.serviceID, ep, ev})
	}
	t.mu.Unlock()
	t.notify(trs)
}

// Breaker returns ep's breaker state now.
func (t *Tracker) Breaker(ep int) BreakerState {
	now := t.clock.Now()
	t.mu.Lock()
	trs := t.advanceLocked(now)
	s := t.breakers[ep].state
	t.mu.Unlock()
	t.notify(trs)
	return s
}

// SetEngineFigures stores a scrape result for ep. blocks < 0 or waiting < 0
// means that family was missing: the value becomes unknown.
func (t *Tracker) SetEngineFigures(ep int, gpuBlocks int64, waiting int64, at time.Time) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	f := &t.figures[ep]
	f.gpuBlocks.Store(max(gpuBlocks, -1))
	f.waitingAt.Store(at.UnixNano())
	f.waiting.Store(max(waiting, -1))
}

// GPUBlocks is num_gpu_blocks (selector.EngineSource).
func (t *Tracker) GPUBlocks(ep int) (int64, bool) {
	if ep < 0 || ep >= epset.Max {
		return 0, false
	}
	b := t.figures[ep].gpuBlocks.Load()
	return b, b >= 0
}

// Waiting is vllm:num_requests_waiting and its scrape time (selector.EngineSource).
func (t *Tracker) Waiting(ep int) (int, time.Time, bool) {
	if ep < 0 || ep >= epset.Max {
		return 0, time.Time{}, false
	}
	f := &t.figures[ep]
	w := f.waiting.Load()
	if w < 0 {
		return 0, time.Time{}, false
	}
	return int(min(w, math.MaxInt32)), time.Unix(0, f.waitingAt.Load()), true
}

// SetEngineLoad stores ep's engine load, vllm:num_requests_running plus
// vllm:num_requests_waiting (a missing waiting family counts 0; a missing
// running family makes the load unknown). The OnEngineLoad hook runs first.
func (t *Tracker) SetEngineLoad(ep int, running, waiting int64, at time.Time) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	if t.onEngineLoad != nil {
		t.onEngineLoad(ep)
	}
	f := &t.figures[ep]
	load := int64(-1)
	if running >= 0 {
		load = min(running+max(waiting, 0), math.MaxInt32)
	}
	f.loadAt.Store(at.UnixNano())
	f.load.Store(load)
}

// EngineLoad is ep's last scraped engine load (running + waiting) and its
// scrape time; known is false until a scrape found the running family.
func (t *Tracker) EngineLoad(ep int) (load int, at time.Time, known bool) {
	if ep < 0 || ep >= epset.Max {
		return 0, time.Time{}, false
	}
	f := &t.figures[ep]
	l := f.load.Load()
	if l < 0 {
		return 0, time.Time{}, false
	}
	return int(l), time.Unix(0, f.loadAt.Load()), true
}

var (
	_ selector.StateSource  = (*Tracker)(nil)
	_ selector.EngineSource = (*Tracker)(nil)
)
