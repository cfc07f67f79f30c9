// Package gateway composes kvgate's packages into the running daemon: the
// management API (pkg/api) owns the rule table and tells the gateway about
// every change; for each rule the gateway runs an inventory (pkg/inventory),
// a selector (pkg/selector), a hash contract (pkg/kvhash) and a fullproxy
// listener (pkg/fullproxy) whose Router tokenizes (pkg/tokenizer), hashes and
// decides; one ingest.Manager follows every KV endpoint's event stream; and
// every observer is wired to pkg/metrics. cmd/kvgate only parses flags and
// calls Run.
package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/pd/admission"
	"github.com/kvgate/kvgate/pkg/rulesfile"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/kvgate/kvgate/pkg/splice"
	"github.com/kvgate/kvgate/pkg/state"
	"github.com/kvgate/kvgate/pkg/status"
	"github.com/kvgate/kvgate/pkg/tlsterm"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// Options configure a Gateway.
type Options struct {
	// Settings are the process environment, parsed once (config.SettingsFromOS).
	Settings config.Settings
	// TokenizerDir is the staging directory (<dir>/<model slug>/tokenizer.json).
	TokenizerDir string
	// StateDir persists rules; "" keeps them in memory only (tests, the demo).
	StateDir string
	// Datapath is auto, sockmap or userspace (datapath.New decides; auto
	// follows datapath.AutoPrefersKernel, the benchmark's verdict, and
	// splices streamed bodies only: splice.OpenerFor).
	Datapath string
	// BPFPinDir and BPFInstance place the sockmap path's pins
	// (<dir>/<instance>); see package splice. BPFInstance must be stable per
	// instance and unique among instances running at once (cmd/kvgate
	// derives it from --api), so a restart recovers its own stale pins.
	BPFPinDir, BPFInstance string
	// DecisionHeader adds x-kvgate-decision to proxied responses.
	DecisionHeader bool
	// AccessLog, when non-nil, receives one structured line per request.
	AccessLog io.Writer
	// ShutdownGrace bounds how long in-flight streams may finish at shutdown.
	ShutdownGrace time.Duration
	// Limits bound the proxies (zero fields: fullproxy.DefaultLimits).
	Limits fullproxy.Limits
	// Version labels kvgate_build_info.
	Version, Revision string
	Logger            *slog.Logger
	// SubscriberOptions tune the KV-event subscribers (zero: defaults).
	SubscriberOptions ingest.Options
	// EndpointCIDRs restricts rule endpoints to these ranges (--endpoint-cidrs;
	// empty: any address).
	EndpointCIDRs []netip.Prefix
	// BackendTokenDir confines rules' backendTokenFile to one directory
	// (--backend-token-dir; empty: any path).
	BackendTokenDir string
	// APIMiddleware wraps the management API (authentication and audit,
	// package apiauth); nil serves it bare.
	APIMiddleware func(http.Handler) http.Handler
	// VIPs, when set, puts each rule's VIP on a device while the rule exists
	// (--vip-dev, package vip); nil leaves addresses to the operator.
	VIPs VIPPlumber
	// RulesFile is the declarative rule source every replica loads
	// (--rules-file, package rulesfile); "" means REST only.
	RulesFile string
	// RulesFileInterval is how often RulesFile is checked (0: 2 s).
	RulesFileInterval time.Duration
	// LocalLoadOnly turns the shared load view off (sharedload.go): the
	// selector counts this process's in-flight requests only (the
	// admission count on P/D rules). Code only,
	// for the routing benchmark's comparison.
	LocalLoadOnly bool
	// SharedLoadHalfLife, when positive, decays the other replicas' part of
	// the shared load view between scrapes with this half-life
	// (sharedload.go); 0, the default, keeps it frozen until the next scrape.
	SharedLoadHalfLife time.Duration
	// CursorStart is where every rule's round-robin cursors start; replicas
	// of one fleet pass different values (cmd/kvgate: random with
	// --rules-file) so their round-robin picks are not in step.
	CursorStart uint64
	// TLSCertDir holds TLS rules' certificates, <dir>/<vip>_<port>/tls.crt
	// and tls.key (--tls-cert-dir; docs/security.md). TLSReloadInterval and
	// TLSHandshakeTimeout: zero takes package tlsterm's defaults.
	TLSCertDir          string
	TLSReloadInterval   time.Duration
	TLSHandshakeTimeout time.Duration
	// BackendPool bounds the idle engine connections a security-2 rule keeps
	// (zero fields: fullproxy.DefaultPoolOptions; docs/security.md, "Engine
	// connection pool").
	BackendPool fullproxy.PoolOptions
}

// Gateway is the running daemon minus its flags.
type Gateway struct {
	opts Options
	// reconnects carries the KV subscribers' socket rebuilds to model
	// discovery (followReconnects): a restarted engine may serve another model.
	reconnects chan reconnect
	log        *slog.Logger
	Metrics    *metrics.Metrics
	API        *api.Server
	pool       *tokenizer.Pool
	ready      *preloader
	subs       *ingest.Manager
	leg        *datapath.Selected
	// slots keeps the BPF load map's endpoint registrations; nil when the
	// body leg has no load map (userspace path).
	slots   *loadSlots
	selOpts selector.Options
	access  *slog.Logger
	store   *state.Store
	status  *status.Collector

	// auditLog rate-limits the usage audit's mismatch warnings (usageaudit.go).
	auditLog *slog.Logger
	// guard recovers, logs and counts (kvgate_panics_total) a panic in any
	// goroutine the daemon starts, so one bad input cannot end the process.
	guard *recovery.Guard
	// inspect bounds the request bodies tokenized at once (inspect.go).
	inspect *inspectGate
	// rulesFile reconciles the table with --rules-file (rulesfile.go); nil without one.
	rulesFile *rulesfile.Watcher

	mu    sync.Mutex
	rules map[int]*ruleRuntime
	// pdTotal is LLB_PD_MAX_TOTAL_INFLIGHT, shared by every P/D rule (health.go).
	pdTotal *admission.TotalGate
}

type ruleRuntime struct {
	rule  *config.Rule
	index *inventory.Index
	// overlay holds the blocks routed but not yet reported (nil when
	// LOXILB_KV_PROVISIONAL_WEIGHT is 0); the subscribers write through it.
	overlay *inventory.Overlay
	sel     *selector.Selector
	router  *router
	server  *fullproxy.Server
	loads   *fullproxy.Loads
	health  *ruleHealth
	served  chan struct{}
	// stopTLS stops following a TLS rule's certificate files.
	stopTLS func()
	// models is the rule's model discovery (models.go); nil when off or
	// not a KV rule. Guarded by Gateway.mu; the router reads it through
	// its ruleState.
	models *ruleModels
	// term is a TLS rule's terminator (nil on plain rules): preflight's
	// probe requests verify the VIP against the certificate it serves.
	term *tlsterm.Terminator
	// engine is the client of kvgate's own calls to the rule's engines
	// (probes, scrapes, subscribers, discovery, preflight): https on security 2.
	engine *engineclient.Client
	// audit is the rule's per-request usage audit (usageaudit.go).
	audit *usageAuditor
}

// New builds a gateway: metrics, tokenizer pool, subscribers, body leg and
// the management API (with persisted rules restored when StateDir is set).
func New(opts Options) (*Gateway, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 30 * time.Second
	}
	g := &Gateway{opts: opts, log: opts.Logger, rules: map[int]*ruleRuntime{}}
	selOpts, err := selectorOptions(opts.Settings)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	selOpts.CursorStart = opts.CursorStart
	g.selOpts = selOpts
	mode, err := datapath.ParseMode(opts.Datapath)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.leg, err = datapath.New(datapath.Config{Mode: mode, Logger: g.log, OpenKernel: splice.OpenerFor(mode, splice.Config{
		PinDir: opts.BPFPinDir, Instance: opts.BPFInstance, Logger: g.log,
	})})
	if err != nil {
		return nil, fmt.Errorf("gateway: data path: %w", err)
	}
	if lm, ok := g.leg.BodyLeg.(bpfLoadMap); ok {
		g.slots = newLoadSlots(lm, g.log)
	}
	built := false
	defer func() {
		if !built { // a later step failed: release the pins and programs now
			_ = g.leg.Close()
		}
	}()
	g.Metrics = metrics.New(metrics.Options{Version: opts.Version, Revision: opts.Revision})
	g.Metrics.SetDatapath(g.leg.Path())
	g.guard = recovery.New(g.log, g.Metrics)
	g.inspect = newInspectGate(inspectBudgetBytes, inspectFreeBytes, g.guard)
	for _, path := range []string{"userspace", "sockmap"} {
		if _, ok := g.leg.Stats().Moved[path]; ok || path == g.leg.Path() {
			g.Metrics.SetSplicedBytesSource(path, func() uint64 { return g.leg.Stats().Moved[path] })
		}
	}
	if opts.AccessLog != nil {
		g.access = slog.New(slog.NewJSONHandler(opts.AccessLog, nil))
	}
	// Tokenizer warnings are rate-limited: each unknown model in a request
	// would otherwise log two WARN lines.
	tokLog := slog.New(newRateLimitedHandler(g.log.Handler(), warnInterval))
	g.auditLog = slog.New(newRateLimitedHandler(g.log.Handler(), warnInterval))
	g.pool = tokenizer.NewPool(opts.TokenizerDir, tokenizer.WithLogger(tokLog), tokenizer.WithObserver(poolObserver{tokLog}),
		tokenizer.WithTokenizerOptions(tokenizer.WithConversationObserver(g.Metrics.ConversationLookup)))
	g.Metrics.SetConversationCacheSource(func() int { return g.pool.PrefixStats().Bytes })
	g.Metrics.SetMessageCacheSource(g.messageCacheBytes)
	so := opts.SubscriberOptions
	if so.Releaser == nil && so.ReleaseAfter >= 0 {
		so.Releaser = ingest.NewMemReleaser(g.guard)
	}
	g.ready = newPreloader(g.pool, opts.TokenizerDir, tokLog, g.Metrics.SetReady, so.Releaser.Request, g.guard)
	defer func() {
		if !built {
			g.ready.close()
		}
	}()
	g.ready.scan()
	so.ReplayPortOffset = opts.Settings.ReplayPortOffset
	so.MaxFrameBytes = opts.Settings.MaxFrameBytes
	so.PollMin, so.PollMax = opts.Settings.TRTLLMPollMin, opts.Settings.TRTLLMPollMax
	so.Logger = g.log
	g.reconnects = make(chan reconnect, reconnectQueue)
	so.Observer = subscriberObserver{m: g.Metrics, reconnects: g.reconnects}
	so.Guard = g.guard
	g.subs = ingest.NewManager(so)

	g.status = g.newStatus()
	apiOpts := api.Options{Settings: opts.Settings, Sink: g, Inventory: g, Health: g, Gatherer: g.Metrics.Registry, Status: g.status, Readiness: g.ready, Preflight: g, Middleware: opts.APIMiddleware, EndpointCIDRs: opts.EndpointCIDRs, Log: g.log,
		Guard: g.guard, BackendTokenDir: opts.BackendTokenDir}
	if opts.StateDir != "" {
		st, err := state.Open(opts.StateDir, g.log)
		if err != nil {
			return nil, fmt.Errorf("gateway: state dir: %w", err)
		}
		g.store = st
		apiOpts.Store = st
	}
	g.API = api.New(apiOpts)
	if g.store != nil {
		rules, err := g.store.Load()
		if err != nil {
			return nil, fmt.Errorf("gateway: restore rules: %w", err)
		}
		if err := g.API.Restore(rules); err != nil {
			return nil, fmt.Errorf("gateway: restore rules: %w", err)
		}
	}
	if err := g.openRulesFile(); err != nil {
		return nil, err
	}
	built = true
	return g, nil
}

// Run serves the management API on apiLn until ctx ends, then drains: the
// proxies stop accepting, in-flight streams get ShutdownGrace to finish, and
// the subscribers stop. Rules are already persisted.
func (g *Gateway) Run(ctx context.Context, apiLn net.Listener) error {
	apiErr := make(chan error, 1)
	g.guard.Go(recovery.API, func() { apiErr <- g.API.Serve(ctx, apiLn) })
	g.guard.Go(recovery.Poller, func() { g.status.Run(ctx) })
	g.guard.Go(recovery.Poller, func() { g.followReconnects(ctx) })
	if g.rulesFile != nil {
		g.guard.Go(recovery.Poller, func() { g.rulesFile.Run(ctx) })
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-apiErr:
		if err != nil {
			err = fmt.Errorf("gateway: management API: %w", err)
		}
	}
	g.Shutdown()
	return err
}

// Shutdown drains every proxy within ShutdownGrace and stops the subscribers.
func (g *Gateway) Shutdown() {
	g.mu.Lock()
	rts := make([]*ruleRuntime, 0, len(g.rules))
	for _, rt := range g.rules {
		rts = append(rts, rt)
	}
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.ShutdownGrace)
	defer cancel()
	var wg sync.WaitGroup
	for _, rt := range rts {
		wg.Add(1)
		g.guard.Go(recovery.Conn, func() {
			defer wg.Done()
			if err := rt.server.Shutdown(ctx); err != nil {
				g.log.Warn("shutdown grace exhausted; streams cut", "service", rt.rule.ServiceID, "grace", g.opts.ShutdownGrace)
			}
			rt.health.close()
			rt.stopTLS()
			rt.models.close()
		})
	}
	wg.Wait()
	g.ready.close()
	g.subs.Close()
	if err := g.leg.Close(); err != nil {
		g.log.Warn("closing the data path", "err", err)
	}
}

// Loads returns the in-flight counts of a rule's endpoints (tests assert
// they return to 0 at rest).
func (g *Gateway) Loads(serviceID int) (*fullproxy.Loads, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rt, ok := g.rules[serviceID]
	if !ok {
		return nil, false
	}
	return rt.loads, true
}

// ProxyAddr is the bound address of a rule's listener.
func (g *Gateway) ProxyAddr(serviceID int) (net.Addr, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rt, ok := g.rules[serviceID]
	if !ok {
		return nil, false
	}
	return rt.server.Addr(), true
}

// Subscribers reports the KV-event subscribers' state.
func (g *Gateway) Subscribers() []ingest.EndpointStatus { return g.subs.Status() }

// Snapshot implements api.InventorySource.
func (g *Gateway) Snapshot(serviceID, epIdx int) (string, []uint64, bool) {
	g.mu.Lock()
	rt, ok := g.rules[serviceID]
	g.mu.Unlock()
	if !ok {
		return "", nil, false
	}
	for _, e := range rt.rule.KVEndpoints() {
		if e.Idx == epIdx {
			// The index holds model-keyed hashes; the API shows the engine's.
			hashes := rt.index.Snapshot(epIdx)
			rt.router.state.Load().models.current().endpointSalt(epIdx).Unkey(hashes)
			return rt.rule.EffectiveHashAlgo(), hashes, true
		}
	}
	return "", nil, false
}

// RuleChanged implements api.RuleSink.
func (g *Gateway) RuleChanged(old, updated *config.Rule) error {
	switch {
	case old == nil && updated != nil:
		return g.create(updated)
	case old != nil && updated != nil:
		return g.update(old, updated)
	case old != nil:
		g.remove(old)
	}
	return nil
}

// messageCacheBytes sums what the rules' decoded-message caches hold now.
func (g *Gateway) messageCacheBytes() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n int64
	for _, rt := range g.rules {
		if st := rt.router.state.Load(); st != nil {
			n += st.facts.Messages.Stats().Bytes
		}
	}
	return n
}

func (g *Gateway) create(rule *config.Rule) (err error) {
	id := rule.ServiceID
	st, err := newRuleState(rule, g.opts.Settings, g.log)
	if err != nil {
		return err
	}
	st.facts.Messages.Observe(g.Metrics.MessageLookup)
	term, stopTLS, err := g.ruleTLS(rule)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			stopTLS()
		}
	}()
	engineTLS, err := ruleEngineTLS(rule)
	if err != nil {
		return err
	}
	backendDial := g.backendTLSDial(engineTLS)
	engine := engineclient.New(engineTLS)
	var clientTLS fullproxy.TLSTerminator
	if term != nil {
		clientTLS = term
	}
	idx, err := inventory.New(inventory.Options{MaxBlocks: g.opts.Settings.MaxBlocks, TierWeights: g.opts.Settings.TierWeights,
		Observer: ingest.InventoryObserver(subscriberObserver{m: g.Metrics}, uint32(id))})
	if err != nil {
		return fmt.Errorf("service %d: inventory: %w", id, err)
	}
	loads := &fullproxy.Loads{}
	rh, err := g.ruleHealth(rule)
	if err != nil {
		return err
	}
	rh.engine = engine
	overlay, err := g.newOverlay(idx)
	if err != nil {
		return fmt.Errorf("service %d: %w", id, err)
	}
	var scorer, confirmed selector.Scorer = idx, nil
	if overlay != nil {
		scorer, confirmed = overlay, idx
	}
	scores := newTimedScorer(scorer)
	costs := &selector.Costs{}
	sel, err := selector.New(selectorRule(rule), g.selOpts, selector.Deps{
		Scorer: scores, Confirmed: confirmed, Loads: rh.loads(rule, loads, g.opts.LocalLoadOnly, sharedOptions{halfLife: g.opts.SharedLoadHalfLife, mirror: g.opts.Settings.LoadMirror}), Engine: rh, States: rh, Cost: costs, Observer: selectorObserver{g.Metrics}, Logger: g.log,
	})
	if err != nil {
		return fmt.Errorf("service %d: %w", id, err)
	}
	rt := &ruleRuntime{rule: rule, index: idx, overlay: overlay, sel: sel, loads: loads, health: rh, served: make(chan struct{}), stopTLS: stopTLS,
		term: term, engine: engine}
	rt.router = &router{service: id, sel: sel, scores: scores, overlay: overlay, costs: costs, opts: g.selOpts, pool: g.pool, m: g.Metrics, log: g.log.With("service", id),
		maxTokens: g.opts.Settings.MaxPromptTokens, gate: g.inspect}
	st.parity = g.newParity(rule, st)
	rt.models = g.newRuleModels(rule, engine, rh.token, g.reconcile)
	defer func() {
		if err != nil {
			rt.models.close()
		}
	}()
	st.models = rt.models
	rt.router.state.Store(st)
	audit := newUsageAuditor(id, rt.router, g.Metrics, g.auditLog, g.opts.Settings.AuditSample)
	rt.audit = audit
	handler, err := rh.handler(rule, rt.router, audit)
	if err != nil {
		return err
	}
	handler = rt.router.modelGate(handler)

	addr := net.JoinHostPort(rule.Args.ExternalIP, strconv.Itoa(rule.Args.Port))
	srv, err := fullproxy.Listen(fullproxy.Config{
		Service: strconv.Itoa(id), Addr: addr, Handler: handler, Leg: g.leg, Loads: loads,
		Observer: &proxyObserver{m: g.Metrics, service: id, pd: rule.PDDisagg()}, Limits: g.opts.Limits,
		DecisionHeader: g.opts.DecisionHeader, AccessLog: g.access, Logger: g.log, DialControl: g.dialControl(),
		Guard: g.guard, TLS: clientTLS, Dial: backendDial, Pool: g.backendPool(rule), BodyAuditor: audit,
	})
	if err != nil {
		return &config.ConflictError{Msg: fmt.Sprintf("service %d: cannot listen on %s: %v", id, addr, err)}
	}
	rt.server = srv
	rh.endpointDown = func(ep int) { srv.EndpointDown(ep) }
	rh.probeUp = kickModels(rh.probeUp, rt.router)
	g.watchModelBlocks(rt)
	if err := rh.start(rule, sel); err != nil {
		_ = srv.Close()
		return err
	}
	if err := g.claimVIP(rule); err != nil {
		rh.close()
		_ = srv.Close()
		return err
	}
	g.guard.Go(recovery.Conn, func() {
		defer close(rt.served)
		if err := srv.Serve(); err != nil {
			g.log.Error("proxy stopped", "service", id, "err", err)
		}
	})

	g.mu.Lock()
	g.rules[id] = rt
	g.mu.Unlock()
	g.Metrics.InitRule(id)
	g.logRuleLeg(rule)
	for _, e := range rule.Endpoints {
		g.Metrics.SetAdminDown(id, e.Idx, e.AdminDown)
	}
	g.registerEndpoints(rule)
	g.reconcile()
	g.ready.ruleCreated(rule)
	g.log.Info("rule started", "service", id, "listen", srv.Addr().String(), "kvExactMode", rule.Args.KVExactMode,
		"endpoints", len(rule.Endpoints), "kv_endpoints", len(rule.KVEndpoints()))
	return nil
}

// newOverlay puts the provisional overlay over a rule's index, or returns
// nil when LOXILB_KV_PROVISIONAL_WEIGHT is 0 (docs/selection.md,
// "Provisional blocks").
func (g *Gateway) newOverlay(idx *inventory.Index) (*inventory.Overlay, error) {
	st := g.opts.Settings
	if st.ProvisionalWeight <= 0 {
		return nil, nil
	}
	ov, err := inventory.NewOverlay(idx, inventory.ProvisionalOptions{Weight: st.ProvisionalWeight, TTL: st.ProvisionalTTL})
	if err != nil {
		return nil, fmt.Errorf("provisional blocks: %w", err)
	}
	return ov, nil
}

// sink is where the rule's KV events land: the overlay (which confirms its
// predictions and passes every event to the index), else the index.
func (rt *ruleRuntime) sink() ingest.Sink {
	if rt.overlay != nil {
		return rt.overlay
	}
	return rt.index
}

func (g *Gateway) update(old, updated *config.Rule) error {
	g.mu.Lock()
	rt, ok := g.rules[updated.ServiceID]
	g.mu.Unlock()
	if !ok {
		return g.create(updated)
	}
	st, err := newRuleState(updated, g.opts.Settings, g.log)
	if err != nil {
		return err
	}
	st.facts.Messages.Observe(g.Metrics.MessageLookup)
	if err := rt.sel.SetRule(selectorRule(updated)); err != nil {
		return fmt.Errorf("service %d: %w", updated.ServiceID, err)
	}
	if err := rt.health.update(updated); err != nil {
		return fmt.Errorf("service %d: health: %w", updated.ServiceID, err)
	}
	oldState := rt.router.state.Load()
	if oldState.gran != nil && st.gran != nil && oldState.gran.HashBlockSize() == st.gran.HashBlockSize() {
		st.gran = oldState.gran // what the engines publish is unchanged, and the subscribers keep running
	}
	if oldState.parity != nil && st.hasher != nil && oldState.hasher != nil && oldState.hasher.Contract() == st.hasher.Contract() {
		st.parity = oldState.parity // same contract: the verdicts still hold, and the subscribers keep running
	} else {
		st.parity = g.newParity(updated, st)
	}
	st.models = g.updateRuleModels(rt, updated)
	rt.router.state.Store(st)
	// A different hash contract makes the mirrored hashes meaningless.
	if oldState.hasher != nil && st.hasher != nil && oldState.hasher.Contract() != st.hasher.Contract() {
		for _, e := range old.Endpoints {
			_ = rt.sink().ClearEndpoint(e.Idx)
		}
	}
	for _, e := range old.Endpoints {
		if _, stays := updated.EndpointByKey(e.Key()); !stays {
			rt.server.DropIdleBackends(e.Idx) // an index kept with a new address must not reuse the old one's connections
			rt.sel.DropEndpoint(e.Idx)
			_ = rt.sink().ClearEndpoint(e.Idx)
			g.Metrics.DeleteEndpoint(updated.ServiceID, e.Idx)
		}
		if _, kept := updated.Endpoint(e.Idx); !kept && g.slots != nil {
			g.slots.remove(updated.ServiceID, e.Idx) // an index kept with a new address moves in registerEndpoints
		}
	}
	g.registerEndpoints(updated)
	for _, e := range updated.Endpoints {
		g.Metrics.SetAdminDown(updated.ServiceID, e.Idx, e.AdminDown)
		if e.AdminDown {
			rt.server.DropIdleBackends(e.Idx)
		}
	}
	g.mu.Lock()
	rt.rule = updated
	g.mu.Unlock()
	g.reconcile()
	g.ready.ruleCreated(updated) // new LoRA base models, newly staged tokenizers
	return nil
}

func (g *Gateway) remove(rule *config.Rule) {
	g.mu.Lock()
	rt, ok := g.rules[rule.ServiceID]
	delete(g.rules, rule.ServiceID)
	g.mu.Unlock()
	if !ok {
		return
	}
	g.unregisterEndpoints(rule)
	g.reconcile()
	g.releaseVIP(rule)
	g.guard.Go(recovery.Conn, func() {
		ctx, cancel := context.WithTimeout(context.Background(), g.opts.ShutdownGrace)
		defer cancel()
		_ = rt.server.Shutdown(ctx)
		rt.health.close()
		rt.stopTLS()
		rt.models.close()
		rt.engine.CloseIdle()
	})
	g.Metrics.DeleteRule(rule.ServiceID)
	g.Metrics.DeleteModelSeries(rule.ServiceID, -1)
	g.log.Info("rule removed", "service", rule.ServiceID)
}

// newParity builds the rule's live parity self-check (docs/parity.md), nil
// when the rule has no usable hash contract.
func (g *Gateway) newParity(rule *config.Rule, st *ruleState) *ingest.Parity {
	if st.hasher == nil {
		return nil
	}
	switch st.hasher.Contract().Algo {
	case kvhash.SHA256CBOR, kvhash.XXHashCBOR, kvhash.SHA256, kvhash.XXHash:
	default:
		return nil // the check and its diagnosis know vLLM's chains only (docs/parity.md)
	}
	src := "LLB_KV_NONE_HASH_SEED"
	if rule.Args.KVHashSeed != nil {
		src = "kvHashSeed"
	}
	return ingest.NewParity(ingest.ParityOptions{Service: uint32(rule.ServiceID), Hasher: st.hasher, SeedSource: src,
		Logger: g.log, Observer: parityObserver{g.Metrics}})
}

// Parity returns the live parity self-check of a rule (nil: no KV rule or no
// usable contract), for the preflight.
func (g *Gateway) Parity(service int) *ingest.Parity {
	g.mu.Lock()
	rt, ok := g.rules[service]
	g.mu.Unlock()
	if !ok {
		return nil
	}
	return rt.router.state.Load().parity
}

// reconcile points the subscriber manager at every KV endpoint of every rule.
func (g *Gateway) reconcile() {
	g.mu.Lock()
	var targets []ingest.Target
	for _, rt := range g.rules {
		r := rt.rule
		engine, err := ingest.ParseEngine(r.EffectiveEngine())
		if err != nil {
			g.log.Error("KV subscribers: rule not followed", "service", r.ServiceID, "err", err)
			continue
		}
		view := rt.models.current()
		for _, e := range r.KVEndpoints() {
			if !rt.models.Tried(e.Idx) {
				continue // subscribed once its model is known, so its blocks are keyed by it from the first event
			}
			t := ingest.Target{
				Service: uint32(r.ServiceID), EPIdx: e.Idx, IP: e.IP, Port: r.ZmqPort(), Ranks: r.DpRankCount(), Engine: engine,
				ReplayPort: r.Args.KVReplayPort, Inventory: inventory.ModelSink{Inner: rt.sink(), Salt: view.endpointSalt(e.Idx)},
				Granularity: rt.router.state.Load().gran,
				Parity:      rt.router.state.Load().parity, Token: rt.health.token, HTTP: rt.engine,
			}
			switch engine {
			case ingest.EngineTRTLLM:
				t.Port, t.Ranks, t.ReplayPort = e.TargetPort, 1, 0 // the drain on the endpoint itself
			case ingest.EngineSGLang:
				t.HTTPPort = e.TargetPort // /get_server_info: the page size
			}
			targets = append(targets, t)
		}
	}
	g.mu.Unlock()
	if err := g.subs.Reconcile(targets); err != nil {
		g.log.Error("KV subscribers: reconcile failed", "err", err)
	}
}

// ConnectedSubscribers counts the endpoints of a rule whose KV-event
// subscriptions are up on every rank.
func (g *Gateway) ConnectedSubscribers(serviceID int) int {
	up := 0
	for _, s := range g.Subscribers() {
		if int(s.Service) != serviceID {
			continue
		}
		ok := len(s.Ranks) > 0
		for _, r := range s.Ranks {
			ok = ok && r.Connected
		}
		if ok {
			up++
		}
	}
	return up
}
