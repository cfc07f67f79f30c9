package gateway

// Model discovery and per-model routing of one KV rule (docs/selection.md,
// "Many models behind one rule"): each endpoint's GET /v1/models is read at
// start, every LLB_KV_MODEL_DISCOVERY_SEC and when its probe comes up; the
// result is an immutable modelView the router reads per request, so a
// request routes only among the endpoints serving its model, with that
// model's tokenizer, and its block hashes are keyed by the model
// (inventory.ModelSalt) so no other model's blocks can score for it.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/models"
)

const (
	// discoveryParallel bounds the /v1/models reads in flight per rule, so
	// a rule of 256 hung endpoints costs at most 32 probe timeouts a round.
	discoveryParallel = 8
	// maxModelLabels bounds the distinct model label values per rule; the
	// rest read "other" (docs/api.md, "Metrics").
	maxModelLabels = 64
	// labelUnlisted is the model label of a request whose model no
	// endpoint lists (routed only because some endpoint is undiscovered).
	labelUnlisted = "unlisted"
	labelOther    = "other"
)

// modelEntry is one model name as the rule's endpoints serve it.
type modelEntry struct {
	eps epset.Set // endpoints that list it (as a base model or an adapter)
	// salt keys its blocks: the salt of the base model most of eps run
	// (an adapter's blocks live under its parent's key, with the adapter's
	// name in the hash's extra keys, as vLLM hashes them).
	salt inventory.ModelSalt
	// parent is the base model of an adapter ("" for a base model): its
	// staged tokenizer encodes the adapter's prompts, as vLLM does.
	parent string
	label  string // the metric label
}

// modelView is what the rule's endpoints serve, immutable once published.
type modelView struct {
	known   epset.Set // endpoints whose /v1/models has been read
	byModel map[string]*modelEntry
	salt    [epset.Max]inventory.ModelSalt // each endpoint's key: its base model's salt
	base    [epset.Max]string
}

// modelRoute is one request's model resolution.
type modelRoute struct {
	eligible epset.Set // the endpoints that may serve it
	restrict bool      // eligible is a strict subset of the rule's endpoints
	notFound bool      // every endpoint is known and none serves it
	salt     inventory.ModelSalt
	parent   string // discovered base model of an adapter
	label    string
}

// resolve decides where a request for model may go among all. An endpoint
// not read yet (discovery off, unreachable, not vLLM's API) is a candidate
// for every model, as before discovery, so a fleet without /v1/models
// routes as it always did.
func (v *modelView) resolve(model string, all epset.Set) modelRoute {
	if v == nil || v.known.And(all).Empty() {
		return modelRoute{eligible: all, label: labelUnlisted}
	}
	unknown := all.AndNot(v.known)
	e, ok := v.byModel[model]
	if !ok {
		return modelRoute{eligible: unknown, restrict: true, notFound: unknown.Empty(), label: labelUnlisted}
	}
	elig := e.eps.And(all).Or(unknown)
	return modelRoute{eligible: elig, restrict: elig != all, notFound: elig.Empty(), salt: e.salt, parent: e.parent, label: e.label}
}

// modelLabel is model's per-model metric label: its discovered name (or
// other), unlisted when no endpoint lists it, "" when the rule has no
// discovery. A client's string never becomes a label.
func (r *router) modelLabel(model string) string {
	rm := r.state.Load().models
	if rm == nil {
		return ""
	}
	if e, ok := rm.current().lookup(model); ok {
		return e.label
	}
	return labelUnlisted
}

func (v *modelView) lookup(model string) (*modelEntry, bool) {
	if v == nil {
		return nil, false
	}
	e, ok := v.byModel[model]
	return e, ok
}

// endpointSalt is the key ep's blocks are stored under.
func (v *modelView) endpointSalt(ep int) inventory.ModelSalt {
	if v == nil || ep < 0 || ep >= epset.Max {
		return 0
	}
	return v.salt[ep]
}

// buildView compiles the endpoints' listings.
func buildView(served map[int]models.Served) *modelView {
	v := &modelView{byModel: map[string]*modelEntry{}}
	isBase := map[string]bool{}
	for ep, s := range served {
		v.known.Add(ep)
		v.base[ep] = s.Base()
		v.salt[ep] = inventory.SaltFor(s.Base())
		for _, b := range s.Bases {
			v.entry(b).eps.Add(ep)
			isBase[b] = true
		}
		for a, parent := range s.Adapters {
			e := v.entry(a)
			e.eps.Add(ep)
			if e.parent == "" || parent < e.parent {
				e.parent = parent // deterministic when endpoints disagree
			}
		}
	}
	names := make([]string, 0, len(v.byModel))
	for name, e := range v.byModel {
		names = append(names, name)
		e.salt = v.majoritySalt(e.eps)
		if isBase[name] {
			e.parent = "" // a base model somewhere: its own tokenizer
		}
	}
	slices.Sort(names)
	for i, name := range names {
		e := v.byModel[name]
		e.label = labelOther
		if i < maxModelLabels {
			e.label = metricLabel(name)
		}
	}
	return v
}

func (v *modelView) entry(name string) *modelEntry {
	e, ok := v.byModel[name]
	if !ok {
		e = &modelEntry{}
		v.byModel[name] = e
	}
	return e
}

// majoritySalt is the key most of eps store under (ties: the lowest base
// name), so a request scores against the endpoints that run its model the
// way most of them name it.
func (v *modelView) majoritySalt(eps epset.Set) inventory.ModelSalt {
	count := map[string]int{}
	best := ""
	for ep := eps.Next(0); ep >= 0; ep = eps.Next(ep + 1) {
		b := v.base[ep]
		count[b]++
		if n := count[b]; n > count[best] || n == count[best] && b < best || best == "" {
			best = b
		}
	}
	return inventory.SaltFor(best)
}

// metricLabel keeps a discovered name within Prometheus-friendly bytes:
// [a-zA-Z0-9._-/:], at most 128 bytes.
func metricLabel(name string) string {
	b := []byte(name)
	if len(b) > 128 {
		b = b[:128]
	}
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/' || c == ':'
		if !ok {
			b[i] = '_'
		}
	}
	return string(b)
}

// ruleModels runs one KV rule's discovery.
type ruleModels struct {
	service  int
	interval time.Duration
	// retry is how soon a failed read is tried again, in nanoseconds: the
	// rule's probeInterval (at most interval), so an engine that was
	// restarting when it was read is listed once it serves. A rule update
	// sets it.
	retry  atomic.Int64
	client *http.Client
	scheme string // "https" on security-2 rules
	m      *metrics.Metrics
	log    *slog.Logger
	guard  *recovery.Guard
	// changed is told when an endpoint's key changed (its subscriber must
	// restart under the new key) or an endpoint was read the first time.
	changed func()
	// token is the rule's backendTokenFile token (nil: none).
	token interface{ Token() (string, error) }

	view atomic.Pointer[modelView]

	mu     sync.Mutex
	addrs  map[int]string // ep_idx → "ip:port"
	served map[int]models.Served
	tried  epset.Set // endpoints read at least once (answer or error)
	// checked and readErr are when each endpoint's last read ended and
	// why it failed ("" it did not): what status and preflight show.
	checked map[int]time.Time
	readErr map[int]string
	kicks   epset.Set // endpoints to read now
	wake    chan struct{}
	stop    context.CancelFunc
	done    chan struct{}
}

// newRuleModels starts discovery for a KV rule; nil when discovery is off
// or the rule is not a KV rule. engine is the rule's client for kvgate's own
// engine calls (https on security-2 rules); nil gives a plain-HTTP one.
func (g *Gateway) newRuleModels(rule *config.Rule, engine *engineclient.Client, token interface{ Token() (string, error) }, changed func()) *ruleModels {
	iv := g.opts.Settings.ModelDiscoveryInterval
	if iv <= 0 || !rule.KVEnabled() {
		return nil
	}
	timeout := rule.ProbeTimeout()
	rm := &ruleModels{service: rule.ServiceID, interval: iv, m: g.Metrics, log: g.log.With("service", rule.ServiceID),
		guard: g.guard, changed: changed, token: token, served: map[int]models.Served{},
		checked: map[int]time.Time{}, readErr: map[int]string{}, wake: make(chan struct{}, 1),
	}
	if engine == nil {
		engine = engineclient.New(nil)
	}
	rm.client, rm.scheme = engine.HTTP(timeout), engine.Scheme()
	rm.setEndpoints(rule)
	ctx, cancel := context.WithCancel(context.Background())
	rm.stop, rm.done = cancel, make(chan struct{})
	g.guard.Go(recovery.Poller, func() {
		defer close(rm.done)
		rm.run(ctx)
	})
	return rm
}

// setEndpoints follows a rule update: departed or moved endpoints forget
// what they served, new ones are read at once.
func (rm *ruleModels) setEndpoints(rule *config.Rule) {
	rm.retry.Store(int64(min(rm.interval, rule.ProbeInterval())))
	rm.mu.Lock()
	old := rm.addrs
	rm.addrs = make(map[int]string, len(rule.Endpoints))
	dropped := false
	for _, e := range rule.Endpoints {
		a := net.JoinHostPort(e.IP, strconv.Itoa(e.TargetPort))
		rm.addrs[e.Idx] = a
		if old[e.Idx] != a {
			if _, had := rm.served[e.Idx]; had {
				delete(rm.served, e.Idx)
				dropped = true
			}
			rm.forgetRead(e.Idx)
			rm.kicks.Add(e.Idx)
		}
	}
	for ep := range old {
		if _, stays := rm.addrs[ep]; !stays {
			delete(rm.served, ep)
			rm.forgetRead(ep)
			rm.m.DeleteModelSeries(rm.service, ep)
			dropped = true
		}
	}
	if dropped {
		rm.view.Store(buildView(rm.served))
	}
	rm.mu.Unlock()
	rm.signal()
}

// forgetRead drops what ep's reads left behind; the caller holds rm.mu.
func (rm *ruleModels) forgetRead(ep int) {
	rm.tried.Remove(ep)
	delete(rm.checked, ep)
	delete(rm.readErr, ep)
}

// State is what discovery knows of ep (false: not one of the rule's
// endpoints).
func (rm *ruleModels) State(ep int) (models.EndpointState, bool) {
	if rm == nil {
		return models.EndpointState{}, false
	}
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if _, ok := rm.addrs[ep]; !ok {
		return models.EndpointState{}, false
	}
	return models.EndpointState{Served: rm.served[ep], CheckedAt: rm.checked[ep], Err: rm.readErr[ep]}, true
}

// kick reads ep's /v1/models now (its probe came up: it may be a new
// engine, with another model).
func (rm *ruleModels) kick(ep int) {
	if rm == nil {
		return
	}
	rm.mu.Lock()
	rm.kicks.Add(ep)
	rm.mu.Unlock()
	rm.signal()
}

func (rm *ruleModels) signal() {
	select {
	case rm.wake <- struct{}{}:
	default:
	}
}

// Tried reports whether ep has been read at least once: its subscriber
// waits for that, so its blocks are keyed by its model from the first event.
func (rm *ruleModels) Tried(ep int) bool {
	if rm == nil {
		return true
	}
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.tried.Has(ep)
}

func (rm *ruleModels) close() {
	if rm == nil {
		return
	}
	rm.stop()
	<-rm.done
}

func (rm *ruleModels) current() *modelView {
	if rm == nil {
		return nil
	}
	return rm.view.Load()
}

func (rm *ruleModels) run(ctx context.Context) {
	t := time.NewTicker(rm.interval)
	defer t.Stop()
	retry := time.NewTimer(time.Duration(rm.retry.Load()))
	defer retry.Stop()
	for {
		var due epset.Set
		rm.mu.Lock()
		due, rm.kicks = rm.kicks, epset.Set{}
		rm.mu.Unlock()
		if !due.Empty() {
			rm.round(ctx, due)
		}
		retry.Reset(time.Duration(rm.retry.Load()))
		select {
		case <-ctx.Done():
			return
		case <-rm.wake:
		case <-retry.C:
			rm.mu.Lock()
			for ep, e := range rm.readErr {
				if e != "" {
					rm.kicks.Add(ep)
				}
			}
			rm.mu.Unlock()
		case <-t.C:
			rm.mu.Lock()
			for ep := range rm.addrs {
				rm.kicks.Add(ep)
			}
			rm.mu.Unlock()
		}
	}
}

// round reads every endpoint in due, discoveryParallel at a time, and
// publishes the new view once.
func (rm *ruleModels) round(ctx context.Context, due epset.Set) {
	rm.mu.Lock()
	var work []fetched
	for ep := due.Next(0); ep >= 0; ep = due.Next(ep + 1) {
		if a, ok := rm.addrs[ep]; ok {
			work = append(work, fetched{ep: ep, addr: a})
		}
	}
	rm.mu.Unlock()
	sem := make(chan struct{}, discoveryParallel)
	var wg sync.WaitGroup
	for i := range work {
		wg.Add(1)
		sem <- struct{}{}
		rm.guard.Go(recovery.Poller, func() {
			defer func() { <-sem; wg.Done() }()
			work[i].s, work[i].err = rm.fetch(ctx, work[i].addr)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	rm.apply(work)
}

// fetched is one endpoint's answer in a round.
type fetched struct {
	ep   int
	addr string
	s    models.Served
	err  error
}

// fetch is discovery's only call to an engine.
func (rm *ruleModels) fetch(ctx context.Context, addr string) (models.Served, error) {
	tok := ""
	if rm.token != nil {
		tok, _ = rm.token.Token() // a token file that fails to load: the call goes without, as the probes do
	}
	return models.Fetch(ctx, rm.client, rm.scheme+"://"+addr, tok)
}

// apply records a round's answers. A failed read keeps what the endpoint
// last listed (a restarting engine is excluded by its probe meanwhile);
// an endpoint never read stays a candidate for every model.
func (rm *ruleModels) apply(res []fetched) {
	now := time.Now()
	rm.mu.Lock()
	rekeyed, first := false, false
	for _, r := range res {
		if rm.addrs[r.ep] != r.addr {
			continue // the endpoint moved while it was read
		}
		if !rm.tried.Has(r.ep) {
			rm.tried.Add(r.ep)
			first = true
		}
		rm.checked[r.ep] = now
		rm.readErr[r.ep] = ""
		if r.err != nil {
			rm.readErr[r.ep] = r.err.Error()
			rm.m.ModelDiscoveryError(rm.service)
			rm.log.Debug("model discovery: /v1/models not read; keeping what the endpoint listed before", "ep", r.ep, "err", r.err)
			continue
		}
		old, had := rm.served[r.ep]
		if had && old.Equal(r.s) {
			continue
		}
		if !had || old.Base() != r.s.Base() {
			rekeyed = true
		}
		rm.served[r.ep] = r.s
		rm.m.SetEndpointModels(rm.service, r.ep, len(r.s.Bases)+len(r.s.Adapters))
		rm.log.Info("model discovery: endpoint serves", "ep", r.ep, "base", r.s.Base(), "models", len(r.s.Bases), "adapters", len(r.s.Adapters))
	}
	rm.view.Store(buildView(rm.served))
	rm.mu.Unlock()
	if (rekeyed || first) && rm.changed != nil {
		rm.changed()
	}
}

// modelGate answers 404 model_not_found before the rule's handler runs when
// no endpoint serves the request's model, and hands the plan it prepared
// to the handler otherwise (so the request is extracted and tokenized once).
type modelGate struct {
	r    *router
	next fullproxy.Handler
}

func (r *router) modelGate(next fullproxy.Handler) fullproxy.Handler {
	return &modelGate{r: r, next: next}
}

// maxDetailModel bounds how much of a client's model string the 404 echoes.
const maxDetailModel = 128

func (g *modelGate) Serve(ctx context.Context, x *fullproxy.Exchange) bool {
	st := g.r.state.Load()
	if st.models == nil {
		return g.next.Serve(ctx, x) // discovery off: every endpoint serves every model
	}
	sc := g.r.prepare(st, x.Req)
	if sc.model.notFound {
		g.r.m.ModelNotFound(g.r.service)
		model := sc.facts.Model
		if len(model) > maxDetailModel {
			model = model[:maxDetailModel] + "…"
		}
		return x.Fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("no endpoint of this rule serves model %q (GET /v1/models on each endpoint lists what it serves)", model))
	}
	g.r.pending.Store(x.Req, sc)
	defer g.r.pending.Delete(x.Req)
	return g.next.Serve(ctx, x)
}

// kickModels chains a re-read of ep's /v1/models onto a probe-up hook; it
// reads the rule's current discovery, which a rule update may start or stop.
func kickModels(prev func(ep int), r *router) func(ep int) {
	return func(ep int) {
		if prev != nil {
			prev(ep)
		}
		r.state.Load().models.kick(ep)
	}
}

// reconnect is one KV subscriber's rebuilt socket.
type reconnect struct{ service, ep int }

// reconnectQueue bounds the rebuilds waiting for followReconnects; more are
// dropped (a fleet-wide blip), and the interval re-reads those endpoints.
const reconnectQueue = 256

// followReconnects re-reads an endpoint's /v1/models when its KV-event
// subscription was rebuilt. An engine restarted faster than probeRetries
// probes never goes probe-down, so no probe-up kick follows; its event
// socket still drops and reconnects, and the new engine may serve another
// model. A reconnect without a restart costs one GET.
func (g *Gateway) followReconnects(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case rc := <-g.reconnects:
			g.mu.Lock()
			rt, ok := g.rules[rc.service]
			var rm *ruleModels
			if ok {
				rm = rt.models
			}
			g.mu.Unlock()
			rm.kick(rc.ep)
		}
	}
}

// watchModelBlocks serves kvgate_kv_model_blocks for a rule: at scrape
// time, each discovered base model's GPU blocks over the endpoints keyed
// by it.
func (g *Gateway) watchModelBlocks(rt *ruleRuntime) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.watchModelBlocksLocked(rt)
}

func (g *Gateway) watchModelBlocksLocked(rt *ruleRuntime) {
	if rt.models == nil {
		return
	}
	idx, rm := rt.index, rt.models
	g.Metrics.SetModelBlocksSource(rt.rule.ServiceID, func(yield func(string, int)) {
		v := rm.current()
		if v == nil {
			return
		}
		sums := map[string]int{}
		for ep := v.known.Next(0); ep >= 0; ep = v.known.Next(ep + 1) {
			sums[v.base[ep]] += idx.Blocks(ep)
		}
		for base, n := range sums {
			label := labelOther
			if e, ok := v.byModel[base]; ok {
				label = e.label
			}
			yield(label, n)
		}
	})
}

// updateRuleModels follows a rule update: discovery starts, stops or
// re-reads the endpoints that moved.
func (g *Gateway) updateRuleModels(rt *ruleRuntime, updated *config.Rule) *ruleModels {
	g.mu.Lock()
	defer g.mu.Unlock()
	want := g.opts.Settings.ModelDiscoveryInterval > 0 && updated.KVEnabled()
	switch {
	case want && rt.models == nil:
		rt.models = g.newRuleModels(updated, rt.engine, rt.health.token, g.reconcile)
		g.watchModelBlocksLocked(rt)
	case !want && rt.models != nil:
		old := rt.models
		rt.models = nil
		g.guard.Go(recovery.Poller, old.close)
		g.Metrics.SetModelBlocksSource(updated.ServiceID, nil)
	case want:
		rt.models.setEndpoints(updated)
	}
	return rt.models
}
