package gateway

// Health and P/D wiring of one rule: the health tracker (probes, engine
// scrape, circuit breaker, admin state) feeding the selector's exclusion
// state, the admission controller of P/D rules, and the mode-1 flow
// (pkg/pd) the rule's proxy hands P/D requests to.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/pd"
	"github.com/kvgate/kvgate/pkg/pd/admission"
	"github.com/kvgate/kvgate/pkg/selector"
)

// ruleHealth is one rule's health state. The tracker is replaced when the
// rule's endpoints or probe settings change (a tracker's membership is fixed);
// the admission controller and the P/D flow live as long as the rule.
type ruleHealth struct {
	service  int
	pdRule   bool
	settings config.Settings
	m        *metrics.Metrics
	log      *slog.Logger
	guard    *recovery.Guard // the daemon's panic guard, for the probe goroutines

	tracker   atomic.Pointer[health.Tracker]
	admission *admission.Controller // P/D rules only
	flow      *pd.Flow              // P/D rules only
	sel       *selector.Selector
	// probeUp is told when an endpoint's probe comes back, so the KV
	// subscriber can check for an engine restart (docs/ingest.md).
	probeUp func(ep int)

	mu       sync.Mutex
	stop     context.CancelFunc
	probeKey string
	done     chan struct{}
}

// newRuleHealth builds the tracker (and, for a P/D rule, the admission
// controller); start begins probing once the selector exists.
func newRuleHealth(rule *config.Rule, s config.Settings, total *admission.TotalGate, m *metrics.Metrics, log *slog.Logger) (*ruleHealth, error) {
	h := &ruleHealth{service: rule.ServiceID, pdRule: rule.PDDisagg(), settings: s, m: m, log: log}
	if h.pdRule {
		a, err := admission.New(admission.Config{
			ServiceID: uint32(rule.ServiceID), MaxInflightPerEP: s.MaxInflightPerEP, QueueDepthPerEP: s.QueueDepthPerEP,
			MaxPark: s.MaxPark, PrefillTimeout: s.PrefillTimeout, Total: total, Observer: healthObserver{m},
		})
		if err != nil {
			return nil, fmt.Errorf("service %d: %w", rule.ServiceID, err)
		}
		h.admission = a
	}
	t, err := h.newTracker(rule)
	if err != nil {
		return nil, err
	}
	h.tracker.Store(t)
	return h, nil
}

func (h *ruleHealth) newTracker(rule *config.Rule) (*health.Tracker, error) {
	var eps []int
	for _, e := range rule.Endpoints {
		eps = append(eps, e.Idx)
	}
	bc := health.DefaultBreakerConfig(rule.PDDisagg())
	bc.FailureThreshold = rule.CircuitBreakerThreshold()
	bc.OriginErrThreshold = h.settings.OriginErrThreshold
	t, err := health.NewTracker(health.TrackerConfig{ServiceID: uint32(rule.ServiceID), Endpoints: eps, Breaker: bc,
		ProbeRetries: rule.ProbeRetries(), Observer: healthObserver{h.m}, Logger: h.log})
	if err != nil {
		return nil, err
	}
	for _, e := range rule.Endpoints {
		t.SetAdmin(e.Idx, e.AdminDown)
	}
	if h.admission != nil {
		t.AttachAdmission(h.admission)
	}
	return t, nil
}

// loads is the selector's L_i: the admission controller's count for P/D
// rules (prefill admission to the end of the decode stream), else the
// proxy's.
func (h *ruleHealth) loads(proxy *fullproxy.Loads) selector.LoadSource {
	if h.admission != nil {
		return h.admission
	}
	return proxy
}

// States implements selector.StateSource.
func (h *ruleHealth) States() selector.States { return h.tracker.Load().States() }

// GPUBlocks implements selector.EngineSource.
func (h *ruleHealth) GPUBlocks(ep int) (int64, bool) { return h.tracker.Load().GPUBlocks(ep) }

// Waiting implements selector.EngineSource.
func (h *ruleHealth) Waiting(ep int) (int, time.Time, bool) { return h.tracker.Load().Waiting(ep) }

// Allow, Success, ConnectFailure and OriginError drive the current tracker's
// breaker (pd.Health).
func (h *ruleHealth) Allow(ep int) bool     { return h.tracker.Load().Allow(ep) }
func (h *ruleHealth) Success(ep int)        { h.tracker.Load().Success(ep) }
func (h *ruleHealth) ConnectFailure(ep int) { h.tracker.Load().ConnectFailure(ep) }
func (h *ruleHealth) OriginError(ep int)    { h.tracker.Load().OriginError(ep) }

// start wires transitions to the selector and starts the prober.
func (h *ruleHealth) start(rule *config.Rule, sel *selector.Selector) error {
	h.sel = sel
	return h.restart(rule, h.tracker.Load())
}

func probeKey(rule *config.Rule) string {
	k := fmt.Sprintf("%s|%d|%s|%v|%v|%d|", rule.ProbeType(), rule.Args.ProbePort, rule.ProbePath(), rule.ProbeTimeout(),
		rule.ProbeInterval(), rule.ProbeRetries())
	for _, e := range rule.Endpoints {
		k += fmt.Sprintf("%d=%s:%d,", e.Idx, e.IP, e.TargetPort)
	}
	return k
}

// restart subscribes the selector to t and (re)starts the prober on t.
func (h *ruleHealth) restart(rule *config.Rule, t *health.Tracker) error {
	t.Subscribe(func(tr health.Transition) {
		if tr.Drops() && h.sel != nil {
			h.sel.DropEndpoint(tr.Ep)
		}
		if tr.Event == health.EventProbeUp && h.probeUp != nil {
			h.probeUp(tr.Ep)
		}
	})
	var targets []health.Target
	for _, e := range rule.Endpoints {
		targets = append(targets, health.Target{Ep: e.Idx, Host: e.IP, Port: e.TargetPort})
	}
	p, err := health.NewProber(t, health.ProbeConfig{
		Type: rule.ProbeType(), Port: rule.Args.ProbePort, Path: rule.ProbePath(), Timeout: rule.ProbeTimeout(),
		Interval: rule.ProbeInterval(), Scrape: rule.KVEnabled() || rule.PDDisagg(), Guard: h.guard,
	}, targets, h.log)
	if err != nil {
		return fmt.Errorf("service %d: %w", rule.ServiceID, err)
	}
	h.stopProber()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	h.mu.Lock()
	h.stop, h.done, h.probeKey = cancel, done, probeKey(rule)
	h.mu.Unlock()
	h.guard.Go(recovery.Probe, func() {
		defer close(done)
		p.Run(ctx)
	})
	return nil
}

func (h *ruleHealth) stopProber() {
	h.mu.Lock()
	stop, done := h.stop, h.done
	h.stop, h.done = nil, nil
	h.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// update applies a rule update: a new tracker when the endpoints or probe
// settings changed, else the admin states; the P/D flow's topology.
func (h *ruleHealth) update(rule *config.Rule) error {
	h.mu.Lock()
	same := h.probeKey == probeKey(rule)
	h.mu.Unlock()
	if same {
		t := h.tracker.Load()
		for _, e := range rule.Endpoints {
			t.SetAdmin(e.Idx, e.AdminDown)
		}
	} else {
		t, err := h.newTracker(rule)
		if err != nil {
			return err
		}
		h.tracker.Store(t)
		if err := h.restart(rule, t); err != nil {
			return err
		}
	}
	if h.flow != nil {
		return h.flow.SetTopology(pdTopology(rule))
	}
	return nil
}

// newFlow builds the P/D flow of the rule (nil for other rules).
func (h *ruleHealth) newFlow(rule *config.Rule, r *router) (*pd.Flow, error) {
	if !h.pdRule {
		return nil, nil
	}
	f, err := pd.New(pd.Config{
		ServiceID: rule.ServiceID, Begin: r.pdPlan, Health: h, Admission: h.admission,
		PrefillTimeout: h.settings.PrefillTimeout, DecodeSilence: h.settings.DecodeSilence,
		DecodeOnlyFallback: h.settings.DecodeOnlyFallback,
		Observer:           &pdObserver{m: h.m, service: rule.ServiceID}, Logger: h.log,
	}, pdTopology(rule))
	if err != nil {
		return nil, fmt.Errorf("service %d: %w", rule.ServiceID, err)
	}
	h.flow = f
	return f, nil
}

// pdHandler is the proxy's P/D hook; a nil interface for other rules.
func (h *ruleHealth) pdHandler() fullproxy.PDHandler {
	if h.flow == nil {
		return nil
	}
	return h.flow
}

// observer wraps the proxy observer: for single-pool rules the plain
// path's connect failures and answers drive the breaker (the P/D flow
// drives it itself).
func (h *ruleHealth) observer(inner fullproxy.Observer) fullproxy.Observer {
	if h.pdRule {
		return inner
	}
	return &breakerFeed{Observer: inner, h: h}
}

// router wraps the rule's router for single-pool rules: a decision whose
// breaker refuses (open, or half-open with its trials used) is re-routed with
// that endpoint excluded, as the P/D flow does. The proxy's attempt limit
// does not count these, so the loop is bounded by the rule's endpoints.
func (h *ruleHealth) router(inner *router) fullproxy.Router {
	if h.pdRule {
		return inner
	}
	return &breakerRouter{router: inner, h: h}
}

type breakerRouter struct {
	*router
	h *ruleHealth
}

func (b *breakerRouter) Route(ctx context.Context, req *fullproxy.Request, excluded epset.Set) (fullproxy.Decision, error) {
	for i := 0; i < epset.Max; i++ {
		d, err := b.router.Route(ctx, req, excluded)
		if err != nil || b.h.Allow(d.Endpoint) {
			return d, err
		}
		excluded.Add(d.Endpoint)
	}
	return fullproxy.Decision{Endpoint: -1}, fullproxy.ErrNoBackend
}

type breakerFeed struct {
	fullproxy.Observer
	h *ruleHealth
}

func (b *breakerFeed) ConnectFailed(service string, ep int) {
	b.Observer.ConnectFailed(service, ep)
	b.h.ConnectFailure(ep)
}

func (b *breakerFeed) Done(r *fullproxy.Record) {
	b.Observer.Done(r)
	if r.Routed && r.TTFB > 0 { // a backend answered: its status counts
		// A body the backend cut short is an origin failure whatever its
		// status (docs/body-leg.md, "Broken responses").
		if r.Status >= 500 || r.Outcome == "backend_broken" {
			b.h.OriginError(r.Decision.Endpoint)
		} else {
			b.h.Success(r.Decision.Endpoint)
		}
	}
}

func (h *ruleHealth) close() { h.stopProber() }

func pdTopology(rule *config.Rule) pd.Topology {
	t := pd.Topology{RequestIDReceipt: rule.Args.PDRequestIDReceipt}
	for _, e := range rule.Endpoints {
		t.Endpoints = append(t.Endpoints, pd.Endpoint{Idx: e.Idx, Role: selector.Role(e.Role), IP: e.IP, Port: e.TargetPort, NixlPort: e.NixlPort})
	}
	return t
}

// pdPlan prepares a request for the P/D flow exactly as Route does, and
// keeps the preparation in req.Scratch so a plain-path fallback reuses it.
func (r *router) pdPlan(req *fullproxy.Request) pd.Plan {
	sc, _ := req.Scratch.(*scratch)
	if sc == nil {
		sc = r.prepare(r.state.Load(), req)
		req.Scratch = sc
	}
	return pd.Plan{Attempt: &sc.attempt, Model: sc.facts.Model, PromptTokens: sc.tokens, Blocks: len(sc.selReq.Hashes), Stages: sc.stages}
}

// healthObserver feeds pkg/health's counters to pkg/metrics.
type healthObserver struct{ m *metrics.Metrics }

func (o healthObserver) BreakerFlip(id uint32, ep int, to health.BreakerState) {
	o.m.SetCircuitBreaker(int(id), ep, int(to), true)
}
func (o healthObserver) ProbeTransition(id uint32, ep int, up bool) {
	o.m.SetProbe(int(id), ep, up, true)
}
func (o healthObserver) AdmissionShed(id uint32)        { o.m.PDInc(o.m.PDAdmissionShed, int(id)) }
func (o healthObserver) AdmissionQueued(id uint32)      { o.m.PDInc(o.m.PDAdmissionQueued, int(id)) }
func (o healthObserver) AdmissionParkTimeout(id uint32) { o.m.PDInc(o.m.PDParkTimeouts, int(id)) }
func (o healthObserver) ScrapeFailed(uint32, int)       {}

// pdObserver feeds the P/D flow's measurements to pkg/metrics.
type pdObserver struct {
	m       *metrics.Metrics
	service int
}

func (o *pdObserver) Decided(d selector.Decision) {
	if d.Reason.Miss() {
		o.m.Tier15Miss(o.service, d.Reason.String())
	}
	if d.Fallthrough {
		o.m.Tier15FallthroughInc(o.service)
	}
}

func (o *pdObserver) Committed(out selector.Outcome, model string, stages []fullproxy.Stage) {
	if out.Tier == selector.TierSession && model != "" {
		o.m.AIPDSessionHits.WithLabelValues(o.m.ModelLabel(model)).Inc()
	}
	observeStages(o.m, o.service, stages)
	recordOutcome(o.m, o.service, out)
}

func (o *pdObserver) Leg(leg, model string, d time.Duration) {
	o.m.ObservePDLeg(o.service, leg, model, d)
}
func (o *pdObserver) Timeout(kind string) { o.m.PDTimeout(o.service, kind) }
func (o *pdObserver) Retry(leg string) {
	o.m.PDRetries.WithLabelValues(strconv.Itoa(o.service), leg).Inc()
}
func (o *pdObserver) Failover() { o.m.PDInc(o.m.PDConnectFailover, o.service) }
func (o *pdObserver) EndpointDied(leg string) {
	if leg == "prefill" {
		o.m.PDInc(o.m.PDPrefillEPDied, o.service)
	} else {
		o.m.PDInc(o.m.PDDecodeEPDied, o.service)
	}
}
func (o *pdObserver) DecodeZeroByte() { o.m.PDInc(o.m.PDDecodeZeroByte, o.service) }
func (o *pdObserver) DecodeOnly()     { o.m.PDInc(o.m.PDFallbackToNormal, o.service) }
func (o *pdObserver) KVParams(model string, found bool) {
	if found {
		o.m.AIPDKVParamsFound.WithLabelValues(o.m.ModelLabel(model)).Inc()
	} else {
		o.m.AIPDKVParamsMiss.WithLabelValues(o.m.ModelLabel(model)).Inc()
	}
}
func (o *pdObserver) Request(model, phase, status string) { o.m.AIPDRequest(model, phase, status) }

// ruleHealth builds a rule's health state; the process-wide total in-flight
// gate is created with the first P/D rule.
func (g *Gateway) ruleHealth(rule *config.Rule) (*ruleHealth, error) {
	g.mu.Lock()
	if g.pdTotal == nil {
		t, err := admission.NewTotalGate(g.opts.Settings.MaxTotalInflight)
		if err != nil {
			g.mu.Unlock()
			return nil, fmt.Errorf("gateway: %w", err)
		}
		g.pdTotal = t
	}
	total := g.pdTotal
	g.mu.Unlock()
	h, err := newRuleHealth(rule, g.opts.Settings, total, g.Metrics, g.log)
	if err != nil {
		return nil, err
	}
	h.guard = g.guard
	service := uint32(rule.ServiceID)
	h.probeUp = func(ep int) { g.subs.Verify(service, ep) }
	return h, nil
}
