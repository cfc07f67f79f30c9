package gateway

// Health of one rule: the health tracker (probes, engine scrape, circuit
// breaker, admin state) feeding the selector's exclusion state, and the
// admission controller of P/D rules. The breaker is driven by the request
// handlers' attempt loops (pkg/attempt); the P/D wiring is in pdflow.go.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/engineclient"
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
	// shared is the rule's shared load view (sharedload.go); nil with
	// Options.LocalLoadOnly.
	shared atomic.Pointer[sharedLoads]
	// token is the rule's backendTokenFile token, for its probes, scrapes
	// and KV subscribers.
	token *ruleToken
	// engine is the rule's engine-facing client (https on security 2),
	// shared by every prober the rule starts. Set before start.
	engine *engineclient.Client
	// endpointDown is told when the probe marks an endpoint down: the
	// rule's proxy ends the requests still waiting for that endpoint's
	// first byte (fullproxy.Server.EndpointDown; docs/dataplane.md, "Hung
	// engines and departed clients"). Set before start.
	endpointDown func(ep int)

	mu       sync.Mutex
	stop     context.CancelFunc
	probeKey string
	done     chan struct{}
}

// newRuleHealth builds the tracker (and, for a P/D rule, the admission
// controller); start begins probing once the selector exists.
func newRuleHealth(rule *config.Rule, s config.Settings, total *admission.TotalGate, m *metrics.Metrics, log *slog.Logger) (*ruleHealth, error) {
	h := &ruleHealth{service: rule.ServiceID, pdRule: rule.PDDisagg(), settings: s, m: m, log: log,
		token: &ruleToken{log: log.With("service", rule.ServiceID)}}
	h.token.follow(rule.Args.BackendTokenFile)
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
	bc.Off = !rule.CircuitBreakerEnabled()
	bc.OriginErrThreshold = h.settings.OriginErrThreshold
	t, err := health.NewTracker(health.TrackerConfig{ServiceID: uint32(rule.ServiceID), Endpoints: eps, Breaker: bc,
		ProbeRetries: rule.ProbeRetries(), Observer: healthObserver{h.m}, Logger: h.log, OnEngineLoad: h.engineLoadScraped})
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

// loads is the selector's L_i: the shared load view (sharedload.go) over
// this replica's own count, which is the admission controller's for P/D
// rules (prefill admission to the end of the decode stream; its caps stay
// on that count) and the proxy's otherwise; with localOnly, the own count.
func (h *ruleHealth) loads(rule *config.Rule, proxy *fullproxy.Loads, localOnly bool, opts sharedOptions) selector.LoadSource {
	var local, onEngine selector.LoadSource = proxy, nil
	if h.admission != nil {
		local, onEngine = h.admission, h.admission.Legs()
	}
	if localOnly {
		return local
	}
	shared := newSharedLoads(local, onEngine, h, sharedStaleAfter(rule.ProbeInterval(), rule.ProbeTimeout()))
	shared.configure(opts)
	h.shared.Store(shared)
	return shared
}

// pdLoads is the load the P/D flow's own decode pick reads: the view the
// selector was given, else the admission controller's count.
func (h *ruleHealth) pdLoads() selector.LoadSource {
	if s := h.shared.Load(); s != nil {
		return s
	}
	return h.admission
}

// engineLoadScraped is the trackers' OnEngineLoad hook.
func (h *ruleHealth) engineLoadScraped(ep int) {
	if s := h.shared.Load(); s != nil {
		s.scraped(ep)
	}
}

// EngineLoad is the current tracker's scraped engine load (sharedload.go).
func (h *ruleHealth) EngineLoad(ep int) (int, time.Time, bool) {
	return h.tracker.Load().EngineLoad(ep)
}

// States implements selector.StateSource.
func (h *ruleHealth) States() selector.States { return h.tracker.Load().States() }

// GPUBlocks implements selector.EngineSource.
func (h *ruleHealth) GPUBlocks(ep int) (int64, bool) { return h.tracker.Load().GPUBlocks(ep) }

// Waiting implements selector.EngineSource.
func (h *ruleHealth) Waiting(ep int) (int, time.Time, bool) { return h.tracker.Load().Waiting(ep) }

// Allow, Success, ConnectFailure and OriginError drive the current tracker's
// breaker (attempt.Breaker, for the plain forward and the P/D flow).
func (h *ruleHealth) Allow(ep int) bool     { return h.tracker.Load().Allow(ep) }
func (h *ruleHealth) Success(ep int)        { h.tracker.Load().Success(ep) }
func (h *ruleHealth) ConnectFailure(ep int) { h.tracker.Load().ConnectFailure(ep) }
func (h *ruleHealth) OriginError(ep int)    { h.tracker.Load().OriginError(ep) }

// start wires transitions to the selector and starts the prober.
func (h *ruleHealth) start(rule *config.Rule, sel *selector.Selector) error {
	h.sel = sel
	return h.restart(rule, h.tracker.Load())
}

// probeKey names the settings a rule's tracker is built from (probe,
// endpoints, engine token, whether it has a breaker): a change rebuilds it.
func probeKey(rule *config.Rule) string {
	k := fmt.Sprintf("%s|%d|%s|%v|%v|%d|%q|%v|", rule.ProbeType(), rule.Args.ProbePort, rule.ProbePath(), rule.ProbeTimeout(),
		rule.ProbeInterval(), rule.ProbeRetries(), rule.Args.BackendTokenFile, rule.CircuitBreakerEnabled())
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
		if tr.Event == health.EventProbeDown && h.endpointDown != nil {
			h.endpointDown(tr.Ep)
		}
	})
	var targets []health.Target
	for _, e := range rule.Endpoints {
		targets = append(targets, health.Target{Ep: e.Idx, Host: e.IP, Port: e.TargetPort})
	}
	p, err := health.NewProber(t, health.ProbeConfig{
		Type: rule.ProbeType(), Port: rule.Args.ProbePort, Path: rule.ProbePath(), Timeout: rule.ProbeTimeout(),
		Interval: rule.ProbeInterval(), Scrape: rule.KVEnabled() || rule.PDDisagg(), ScrapeInterval: h.settings.LoadScrapeInterval, Guard: h.guard,
		Token: h.token, Engine: h.engine,
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
	h.token.follow(rule.Args.BackendTokenFile)
	h.mu.Lock()
	same := h.probeKey == probeKey(rule)
	h.mu.Unlock()
	if s := h.shared.Load(); s != nil {
		s.staleAfter.Store(int64(sharedStaleAfter(rule.ProbeInterval(), rule.ProbeTimeout())))
	}
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
		// The new tracker starts every endpoint healthy and reports only
		// transitions: without this, an endpoint that was down keeps
		// kvgate_endpoint_probe_up 0 while it is selected again (after a
		// backendTokenFile or probe-setting change).
		if h.m != nil {
			for _, e := range rule.Endpoints {
				h.m.SetProbe(h.service, e.Idx, true, false)
			}
		}
		if err := h.restart(rule, t); err != nil {
			return err
		}
	}
	if h.flow != nil {
		return h.flow.SetTopology(pdTopology(rule))
	}
	return nil
}

func (h *ruleHealth) close() { h.stopProber() }

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
