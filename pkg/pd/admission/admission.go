package admission

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Admission errors. The proxy answers ErrOverloaded with 429
// {"error":"pd_overloaded",…} and Retry-After: 1, and ErrParkTimeout with 504
// {"error":"pd_admission_park_timeout",…}. ErrDrained means the endpoint a
// request was parked on went down: select again.
var (
	ErrOverloaded  = errors.New("pd_overloaded")
	ErrParkTimeout = errors.New("pd_admission_park_timeout")
	ErrDrained     = errors.New("endpoint went down while the request was parked")
)

// Observer receives what admission counts. The daemon wires it to
// pkg/metrics; each method names the metric it feeds. Methods must be cheap
// and safe for concurrent use.
type Observer interface {
	// AdmissionShed: loxilb_pd_admission_shed_total (429 pd_overloaded).
	AdmissionShed(serviceID uint32)
	// AdmissionQueued: loxilb_pd_admission_queued_total (a request parked).
	AdmissionQueued(serviceID uint32)
	// AdmissionParkTimeout: a parked request timed out (504 pd_admission_park_timeout).
	AdmissionParkTimeout(serviceID uint32)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) AdmissionShed(uint32)        {}
func (NopObserver) AdmissionQueued(uint32)      {}
func (NopObserver) AdmissionParkTimeout(uint32) {}

// MaxQueueDepthPerEP bounds LLB_PD_QUEUE_DEPTH_PER_EP.
const MaxQueueDepthPerEP = 4096

// Config configures admission control for one P/D rule.
type Config struct {
	ServiceID uint32
	// MaxInflightPerEP caps in-flight requests per prefill endpoint
	// (LLB_PD_MAX_INFLIGHT_PER_EP; 0 = off).
	MaxInflightPerEP int
	// QueueDepthPerEP is the parked FIFO length per endpoint
	// (LLB_PD_QUEUE_DEPTH_PER_EP; 0 = off: shed at once).
	QueueDepthPerEP int
	// MaxPark bounds a parked request's wait (LLB_PD_MAX_PARK_SEC); 0 means
	// PrefillTimeout.
	MaxPark time.Duration
	// PrefillTimeout is LLB_PD_PREFILL_TIMEOUT_SEC (default 30 s).
	PrefillTimeout time.Duration
	// MaxTotalInflight caps all in-flight prefill admissions of the rule
	// (0 = off). Ignored when Total is set.
	MaxTotalInflight int
	// Total, when set, is a gate shared by every rule of the process
	// (LLB_PD_MAX_TOTAL_INFLIGHT is process-wide).
	Total    *TotalGate
	Clock    health.Clock
	Observer Observer
}

// TotalGate caps in-flight admissions across several Controllers
// (LLB_PD_MAX_TOTAL_INFLIGHT). Safe for concurrent use.
type TotalGate struct {
	max int64
	n   atomic.Int64
}

// NewTotalGate returns a gate admitting at most max requests; max 0 means
// no cap.
func NewTotalGate(max int) (*TotalGate, error) {
	if max < 0 || max > 2_000_000_000 {
		return nil, fmt.Errorf("LLB_PD_MAX_TOTAL_INFLIGHT=%d: want 0..2000000000", max)
	}
	return &TotalGate{max: int64(max)}, nil
}

func (g *TotalGate) tryAcquire() bool {
	if g.max == 0 {
		g.n.Add(1)
		return true
	}
	for {
		n := g.n.Load()
		if n >= g.max {
			return false
		}
		if g.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (g *TotalGate) release() { g.n.Add(-1) }

// InFlight is the number of admissions the gate holds.
func (g *TotalGate) InFlight() int { return int(g.n.Load()) }

type waiter struct {
	ep   int
	ch   chan struct{}
	done bool
	err  error
	elem *list.Element
}

// Controller is the admission controller of one P/D rule, and the
// authoritative in-flight count L_i per endpoint (selector.LoadSource).
// Safe for concurrent use.
type Controller struct {
	cfg   Config
	clock health.Clock
	obs   Observer

	inflight [epset.Max]atomic.Int64
	// onEngine counts the requests in a leg the endpoint's engine is
	// running: a prefill endpoint's from admission to the prefill's
	// response head, a decode endpoint's from the decode request to the end
	// of its stream. The engine's own running + waiting counts exactly
	// these, so the shared load view subtracts them, snapshotted at each
	// scrape (docs/replicas.md, "Shared load view"); inflight, which also
	// holds a prefill endpoint's requests until their decode ends, stays
	// the count the caps are enforced on.
	onEngine [epset.Max]atomic.Int64
	satWords [4]atomic.Uint64 // the saturated set, readable without the lock

	gate *TotalGate

	mu       sync.Mutex
	admitted [epset.Max]int // capped (prefill) admissions per endpoint
	queues   [epset.Max]*list.List
}

// New validates cfg and builds the controller.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.MaxInflightPerEP < 0 || cfg.MaxInflightPerEP > 99999:
		return nil, fmt.Errorf("LLB_PD_MAX_INFLIGHT_PER_EP=%d: want 0..99999", cfg.MaxInflightPerEP)
	case cfg.QueueDepthPerEP < 0 || cfg.QueueDepthPerEP > MaxQueueDepthPerEP:
		return nil, fmt.Errorf("LLB_PD_QUEUE_DEPTH_PER_EP=%d: want 0..%d", cfg.QueueDepthPerEP, MaxQueueDepthPerEP)
	case cfg.MaxPark < 0:
		return nil, fmt.Errorf("LLB_PD_MAX_PARK_SEC=%v: want ≥ 0", cfg.MaxPark)
	case cfg.MaxTotalInflight < 0 || cfg.MaxTotalInflight > 2_000_000_000:
		return nil, fmt.Errorf("LLB_PD_MAX_TOTAL_INFLIGHT=%d: want 0..2000000000", cfg.MaxTotalInflight)
	}
	if cfg.PrefillTimeout <= 0 {
		cfg.PrefillTimeout = 30 * time.Second
	}
	if cfg.MaxPark == 0 {
		cfg.MaxPark = cfg.PrefillTimeout
	}
	a := &Controller{cfg: cfg, clock: cfg.Clock, obs: cfg.Observer, gate: cfg.Total}
	if a.gate == nil {
		a.gate = &TotalGate{max: int64(cfg.MaxTotalInflight)}
	}
	if a.clock == nil {
		a.clock = health.RealClock{}
	}
	if a.obs == nil {
		a.obs = NopObserver{}
	}
	return a, nil
}

// InFlight is L_i (selector.LoadSource).
func (a *Controller) InFlight(ep int) int {
	if ep < 0 || ep >= epset.Max {
		return 0
	}
	return int(a.inflight[ep].Load())
}

// Saturated is the set of endpoints at the per-endpoint cap.
func (a *Controller) Saturated() epset.Set {
	var s epset.Set
	for i := range s {
		s[i] = a.satWords[i].Load()
	}
	return s
}

func (a *Controller) setSaturatedLocked(ep int) {
	bit := uint64(1) << (uint(ep) & 63)
	w := &a.satWords[ep>>6]
	at := a.cfg.MaxInflightPerEP > 0 && a.admitted[ep] >= a.cfg.MaxInflightPerEP
	for {
		old := w.Load()
		nw := old &^ bit
		if at {
			nw |= bit
		}
		if old == nw || w.CompareAndSwap(old, nw) {
			return
		}
	}
}

func (a *Controller) underCapLocked(ep int) bool {
	return a.cfg.MaxInflightPerEP == 0 || a.admitted[ep] < a.cfg.MaxInflightPerEP
}

// tryAdmitLocked admits one request on ep if both its cap and the total
// gate allow.
func (a *Controller) tryAdmitLocked(ep int) bool {
	if !a.underCapLocked(ep) || !a.gate.tryAcquire() {
		return false
	}
	a.admitted[ep]++
	a.inflight[ep].Add(1)
	a.setSaturatedLocked(ep)
	return true
}

// AcquirePrefill admits one request on prefill endpoint ep, or returns
// ErrOverloaded (counted as a shed) when ep or the rule is at its cap.
// Release it with ReleasePrefill.
func (a *Controller) AcquirePrefill(ep int) error {
	if ep < 0 || ep >= epset.Max {
		return fmt.Errorf("health: ep_idx %d out of range", ep)
	}
	a.mu.Lock()
	ok := a.tryAdmitLocked(ep)
	a.mu.Unlock()
	if !ok {
		a.obs.AdmissionShed(a.cfg.ServiceID)
		return ErrOverloaded
	}
	return nil
}

// ReleasePrefill ends a request admitted on ep. If a request is parked on
// ep, it inherits the slot.
func (a *Controller) ReleasePrefill(ep int) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.admitted[ep] == 0 {
		return // unbalanced release: ignore rather than go negative
	}
	if q := a.queues[ep]; q != nil && q.Len() > 0 {
		w := q.Remove(q.Front()).(*waiter)
		w.done, w.elem = true, nil
		w.ch <- struct{}{} // the slot passes to the waiter: counts unchanged
		return
	}
	a.admitted[ep]--
	a.gate.release()
	a.inflight[ep].Add(-1)
	a.setSaturatedLocked(ep)
}

// Track counts one uncapped in-flight request on ep (a decode endpoint);
// Untrack ends it.
func (a *Controller) Track(ep int) {
	if ep >= 0 && ep < epset.Max {
		a.inflight[ep].Add(1)
	}
}

// Untrack ends a request counted by Track.
func (a *Controller) Untrack(ep int) {
	if ep >= 0 && ep < epset.Max && a.inflight[ep].Add(-1) < 0 {
		a.inflight[ep].Add(1)
	}
}

// LegStarted counts one request whose leg ep's engine is now running
// (a prefill sent, or a decode sent); LegEnded ends it. They only feed
// OnEngine, never a cap.
func (a *Controller) LegStarted(ep int) {
	if ep >= 0 && ep < epset.Max {
		a.onEngine[ep].Add(1)
	}
}

// LegEnded ends a leg counted by LegStarted.
func (a *Controller) LegEnded(ep int) {
	if ep >= 0 && ep < epset.Max && a.onEngine[ep].Add(-1) < 0 {
		a.onEngine[ep].Add(1)
	}
}

// OnEngine is the number of this controller's requests ep's engine is
// running now (LegStarted minus LegEnded).
func (a *Controller) OnEngine(ep int) int {
	if ep < 0 || ep >= epset.Max {
		return 0
	}
	return int(a.onEngine[ep].Load())
}

// Legs is OnEngine as a selector.LoadSource: the count the shared load
// view snapshots at each scrape of ep's engine.
func (a *Controller) Legs() selector.LoadSource { return legCounts{a} }

type legCounts struct{ a *Controller }

func (l legCounts) InFlight(ep int) int { return l.a.OnEngine(ep) }

// Park admits the request on one of candidates: at once if one is under
// its cap, else by waiting in the FIFO of the candidate with the shortest
// queue (ties to the lowest ep_idx) for at most MaxPark. It returns the
// endpoint admitted on (release with ReleasePrefill), or ErrOverloaded
// (queueing off or every queue full: shed), ErrParkTimeout, ErrDrained, or
// the context's error.
func (a *Controller) Park(ctx context.Context, candidates epset.Set) (int, error) {
	a.mu.Lock()
	for ep := candidates.Next(0); ep >= 0; ep = candidates.Next(ep + 1) {
		if a.tryAdmitLocked(ep) {
			a.mu.Unlock()
			return ep, nil
		}
	}
	target := -1
	if a.cfg.QueueDepthPerEP > 0 {
		for ep := candidates.Next(0); ep >= 0; ep = candidates.Next(ep + 1) {
			n := 0
			if a.queues[ep] != nil {
				n = a.queues[ep].Len()
			}
			if n < a.cfg.QueueDepthPerEP && (target < 0 || n < a.queues[target].Len()) {
				if a.queues[ep] == nil {
					a.queues[ep] = list.New()
				}
				target = ep
			}
		}
	}
	if target < 0 {
		a.mu.Unlock()
		a.obs.AdmissionShed(a.cfg.ServiceID)
		return -1, ErrOverloaded
	}
	w := &waiter{ep: target, ch: make(chan struct{}, 1)}
	w.elem = a.queues[target].PushBack(w)
	a.mu.Unlock()
	a.obs.AdmissionQueued(a.cfg.ServiceID)

	timer := a.clock.NewTimer(a.cfg.MaxPark)
	defer timer.Stop()
	var waitErr error
	select {
	case <-w.ch:
	case <-timer.C():
		waitErr = ErrParkTimeout
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	a.mu.Lock()
	if !w.done { // timed out or cancelled while still queued
		a.queues[target].Remove(w.elem)
		w.done, w.err = true, waitErr
		a.mu.Unlock()
		if errors.Is(waitErr, ErrParkTimeout) {
			a.obs.AdmissionParkTimeout(a.cfg.ServiceID)
		}
		return -1, waitErr
	}
	err := w.err
	a.mu.Unlock()
	if err != nil {
		return -1, err
	}
	if waitErr != nil && !errors.Is(waitErr, ErrParkTimeout) {
		// Granted as the context ended: hand the slot back.
		a.ReleasePrefill(target)
		return -1, waitErr
	}
	return target, nil // granted (possibly at the same instant as the timeout: the grant wins)
}

// Drain wakes every request parked on ep with ErrDrained (ep went down or
// its breaker opened).
func (a *Controller) Drain(ep int) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.queues[ep]
	if q == nil {
		return
	}
	for q.Len() > 0 {
		w := q.Remove(q.Front()).(*waiter)
		w.done, w.err, w.elem = true, ErrDrained, nil
		w.ch <- struct{}{}
	}
}

// Parked is the number of requests waiting on ep.
func (a *Controller) Parked(ep int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ep < 0 || ep >= epset.Max || a.queues[ep] == nil {
		return 0
	}
	return a.queues[ep].Len()
}

var _ selector.LoadSource = (*Controller)(nil)
