// Package status builds the fleet view that the management API serves at
// GET /netlox/v1/status, that its status page (GET /) renders and that
// `kvctl status` prints: per rule its mode, contract, parity state, hits,
// misses by reason over the last minutes and the data path; per endpoint its
// role, health, breaker, admin state, in-flight requests, inventory,
// subscriber state, a hit-rate history and what model discovery read from
// its /v1/models; and the problems an operator should look at first.
//
// The collector reads what the daemon already exports: the rule table, the
// subscribers' state and kvgate's own Prometheus registry, which it samples
// every Interval to turn counters into rates over a sliding window. It adds
// no hooks to the request path.
//
// Knobs: Options.Interval (5 s) and Options.Window (60 samples: 5 minutes).
// Metrics: none.
package status

import (
	"context"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/models"
)

// Options configure a Collector. Rules, Subscribers and Gatherer are required.
type Options struct {
	Rules       func() []*config.Rule
	Subscribers func() []ingest.EndpointStatus
	Gatherer    prometheus.Gatherer
	// Datapath names the response body path in use (sockmap or userspace).
	Datapath func() string
	// SeedSet says whether a rule's NONE_HASH seed is set (config.Rule.HashSeed).
	SeedSet func(*config.Rule) bool
	// Health reports an endpoint's probe state; known false means no verdict
	// yet (then kvgate_endpoint_probe_up decides, if set). May be nil.
	Health func(service, ep int) (up, known bool)
	// ProbeError is why an endpoint's last probe failed ("" none), shown in
	// its endpoint_down problem. May be nil.
	ProbeError func(service, ep int) string
	// Models is what model discovery knows of an endpoint (false: the rule
	// runs no discovery). May be nil.
	Models func(service, ep int) (models.EndpointState, bool)
	// PromptMismatches is a rule's running count of responses whose
	// prompt_tokens differed from kvgate's own count (the per-request usage
	// audit, docs/parity.md); nil: no audit.
	PromptMismatches func(service int) uint64
	// Interval between samples; 0 means 5 s.
	Interval time.Duration
	// Window is how many samples the rates and histories span; 0 means 60.
	Window int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Collector samples the daemon's state and answers Snapshot.
type Collector struct {
	opts Options

	mu      sync.Mutex
	samples []sample // oldest first, at most Window+1
	// lastSeqChange remembers, per subscriber rank, the last sequence number
	// seen and when it was first seen, for the last-event age.
	lastSeq map[string]seqSeen
}

type seqSeen struct {
	seq uint64
	at  time.Time
}

// sample is one reading of the counters the rates come from.
type sample struct {
	at     time.Time
	hits   map[epKey]float64   // loxilb_pd_kv_tier15_hits_total
	misses map[missKey]float64 // loxilb_pd_kv_tier15_miss_reason_total
	reqs   map[epKey]float64   // kvgate_requests_total, every outcome
	gauges map[string]map[epKey]float64
	// mismatches: Options.PromptMismatches per rule.
	mismatches map[int]float64
}

type epKey struct{ service, ep int }

type missKey struct {
	service int
	reason  string
}

// New returns a collector; call Run to sample.
func New(opts Options) *Collector {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.Window <= 0 {
		opts.Window = 60
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Datapath == nil {
		opts.Datapath = func() string { return "" }
	}
	return &Collector{opts: opts, lastSeq: map[string]seqSeen{}}
}

// Run samples every Interval until ctx ends.
func (c *Collector) Run(ctx context.Context) {
	c.Sample()
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Sample()
		}
	}
}

// The gauges the snapshot reads, by metric name.
const (
	mProbeUp   = "kvgate_endpoint_probe_up"
	mBreaker   = "kvgate_circuit_breaker_state"
	mAdminDown = "kvgate_endpoint_admin_down"
	mInflight  = "kvgate_endpoint_inflight"
	mBlocks    = "loxilb_pd_kv_blocks"
	mParity    = "kvgate_kv_parity_state"
	mHits      = "loxilb_pd_kv_tier15_hits_total"
	mMisses    = "loxilb_pd_kv_tier15_miss_reason_total"
	mRequests  = "kvgate_requests_total"
)

func gaugeNames() []string {
	return []string{mProbeUp, mBreaker, mAdminDown, mInflight, mBlocks, mParity}
}

// Sample records one reading of the counters and the subscribers' sequence
// numbers; the rates and histories come from these readings.
func (c *Collector) Sample() {
	now := c.opts.Now()
	s := c.read(now)
	subs := c.opts.Subscribers()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[string]bool, len(subs))
	for _, es := range subs {
		for _, r := range es.Ranks {
			k := es.Key + "#" + strconv.Itoa(r.Rank)
			seen[k] = true
			if !r.HasSeq {
				continue
			}
			if old, ok := c.lastSeq[k]; !ok || old.seq != r.LastSeq {
				c.lastSeq[k] = seqSeen{seq: r.LastSeq, at: now}
			}
		}
	}
	for k := range c.lastSeq {
		if !seen[k] {
			delete(c.lastSeq, k)
		}
	}
	c.samples = append(c.samples, s)
	if len(c.samples) > c.opts.Window+1 {
		c.samples = append(c.samples[:0], c.samples[len(c.samples)-c.opts.Window-1:]...)
	}
}

// read gathers the registry once.
func (c *Collector) read(now time.Time) sample {
	s := sample{at: now, hits: map[epKey]float64{}, misses: map[missKey]float64{}, reqs: map[epKey]float64{},
		gauges: map[string]map[epKey]float64{}, mismatches: map[int]float64{}}
	if c.opts.PromptMismatches != nil {
		for _, r := range c.opts.Rules() {
			s.mismatches[r.ServiceID] = float64(c.opts.PromptMismatches(r.ServiceID))
		}
	}
	for _, n := range gaugeNames() {
		s.gauges[n] = map[epKey]float64{}
	}
	mfs, err := c.opts.Gatherer.Gather()
	if err != nil {
		return s
	}
	for _, mf := range mfs {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			l := labels(m)
			svc, _ := strconv.Atoi(l["service"])
			ep, epErr := strconv.Atoi(l["ep_idx"])
			switch {
			case name == mHits && epErr == nil:
				s.hits[epKey{svc, ep}] += m.GetCounter().GetValue()
			case name == mMisses:
				s.misses[missKey{svc, l["reason"]}] += m.GetCounter().GetValue()
			case name == mRequests && epErr == nil:
				s.reqs[epKey{svc, ep}] += m.GetCounter().GetValue()
			case s.gauges[name] != nil && epErr == nil:
				s.gauges[name][epKey{svc, ep}] = m.GetGauge().GetValue()
			}
		}
	}
	return s
}

func labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// Status is the whole view, as GET /netlox/v1/status answers it.
type Status struct {
	GeneratedAt   time.Time `json:"generated_at"`
	WindowSeconds float64   `json:"window_seconds"`
	Datapath      string    `json:"datapath"`
	Rules         []Rule    `json:"rules"`
	Problems      []Problem `json:"problems"`
}

// Rule is one load-balancer rule's view.
type Rule struct {
	ServiceID int    `json:"service_id"`
	Name      string `json:"name,omitempty"`
	VIP       string `json:"vip"`
	// Mode is "kv-pd" (kvExactMode 1), "kv-pool" (3) or "plain" (0).
	Mode     string   `json:"mode"`
	Contract Contract `json:"contract"`
	// Parity is the live parity self-check's state: "ok", "broken" or
	// "unknown" (no verdict yet, or no self-check on this gateway).
	Parity       string             `json:"parity"`
	HitsTotal    float64            `json:"hits_total"`
	HitsWindow   float64            `json:"hits_window"`
	MissesWindow map[string]float64 `json:"misses_window"`
	Datapath     string             `json:"datapath"`
	Endpoints    []Endpoint         `json:"endpoints"`
}

// Contract is what a rule's block hashes depend on.
type Contract struct {
	Engine    string `json:"engine,omitempty"`
	HashAlgo  string `json:"hash_algo,omitempty"`
	BlockSize int    `json:"block_size,omitempty"`
	// SeedSet says whether a NONE_HASH seed is set (on the rule or through
	// LLB_KV_NONE_HASH_SEED); the seed itself is not shown.
	SeedSet bool `json:"seed_set"`
}

// Endpoint is one endpoint's view.
type Endpoint struct {
	EPIdx int    `json:"ep_idx"`
	Addr  string `json:"addr"`
	Role  string `json:"role"`
	// Health is "up", "down" or "unknown" (no probe result yet).
	Health string `json:"health"`
	// ProbeError is why the last probe failed, while it fails.
	ProbeError string `json:"probe_error,omitempty"`
	// Breaker is "closed", "open" or "half-open".
	Breaker    string      `json:"breaker"`
	Admin      string      `json:"admin"`
	Inflight   float64     `json:"inflight"`
	Blocks     float64     `json:"blocks"`
	Subscriber *Subscriber `json:"subscriber,omitempty"`
	HitsTotal  float64     `json:"hits_total"`
	HitsWindow float64     `json:"hits_window"`
	// HitRate is hits per second in each interval of the window, oldest
	// first: the spark line.
	HitRate []float64 `json:"hit_rate"`
	// Models is what the endpoint's GET /v1/models listed; absent when the
	// rule runs no model discovery.
	Models *EndpointModels `json:"models,omitempty"`
}

// EndpointModels is an endpoint's model discovery state.
type EndpointModels struct {
	// Served are the base model names the endpoint lists, the first being
	// the one its blocks are keyed by; empty until a read succeeded (the
	// endpoint is then a candidate for every model).
	Served   []string         `json:"served"`
	Adapters []models.Adapter `json:"adapters"`
	// CheckedAgeSeconds is how long ago the last read ended; -1 while the
	// first read is in flight.
	CheckedAgeSeconds float64 `json:"checked_age_seconds"`
	// CheckedAt is when the last read ended (absent before the first).
	CheckedAt *time.Time `json:"checked_at,omitempty"`
	// Error is why the last read failed; Served is then the read before's.
	Error string `json:"error,omitempty"`
}

// Subscriber is an endpoint's KV-event subscriber state.
type Subscriber struct {
	Connected bool `json:"connected"`
	Ranks     int  `json:"ranks"`
	// LastEventAgeSeconds is how long ago the newest sequence number was
	// first seen, to the sampling interval; -1 when no event arrived yet.
	LastEventAgeSeconds float64 `json:"last_event_age_seconds"`
}

// Problem is something an operator should look at.
type Problem struct {
	ServiceID int    `json:"service_id"`
	EPIdx     *int   `json:"ep_idx,omitempty"`
	Kind      string `json:"kind"` // parity_broken, prompt_tokens_mismatch, subscriber_down, blocks_no_hits, endpoint_down, breaker_open, model_discovery_failed
	Detail    string `json:"detail"`
}

// Snapshot builds the view: gauges and totals as they are now, counts over
// the window since the oldest sample, and histories from the samples.
func (c *Collector) Snapshot() Status {
	now := c.opts.Now()
	rules := c.opts.Rules()
	subs := c.opts.Subscribers()
	cur := c.read(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{GeneratedAt: now.UTC(), Datapath: c.opts.Datapath(), Rules: []Rule{}, Problems: []Problem{}}
	first, last := &cur, &cur
	if len(c.samples) > 0 {
		first = &c.samples[0]
		st.WindowSeconds = now.Sub(first.at).Seconds()
	}
	subByEP := map[epKey]ingest.EndpointStatus{}
	for _, s := range subs {
		subByEP[epKey{int(s.Service), s.EPIdx}] = s
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].ServiceID < rules[j].ServiceID })
	for _, r := range rules {
		st.Rules = append(st.Rules, c.rule(r, first, last, subByEP, now, &st.Problems))
	}
	return st
}

func (c *Collector) rule(r *config.Rule, first, last *sample, subByEP map[epKey]ingest.EndpointStatus,
	now time.Time, problems *[]Problem) Rule {
	id := r.ServiceID
	out := Rule{ServiceID: id, Name: r.Args.Name, VIP: net.JoinHostPort(r.Args.ExternalIP, strconv.Itoa(r.Args.Port)),
		Mode: "plain", MissesWindow: map[string]float64{}, Datapath: c.opts.Datapath(), Parity: "unknown", Endpoints: []Endpoint{}}
	switch r.Args.KVExactMode {
	case config.KVModePD:
		out.Mode = "kv-pd"
	case config.KVModeSinglePool:
		out.Mode = "kv-pool"
	}
	if r.KVEnabled() {
		out.Contract = Contract{Engine: r.EffectiveEngine(), HashAlgo: r.EffectiveHashAlgo(), BlockSize: r.BlockSize()}
		if c.opts.SeedSet != nil {
			out.Contract.SeedSet = c.opts.SeedSet(r)
		}
	}
	kvEP := map[int]bool{}
	for _, e := range r.KVEndpoints() {
		kvEP[e.Idx] = true
	}
	parityBroken, parityOK := false, false
	var ruleHitsWindow float64
	for _, e := range r.Endpoints {
		k := epKey{id, e.Idx}
		ep := Endpoint{EPIdx: e.Idx, Addr: e.Addr(), Role: roleName(e.Role), Admin: e.Admin(), Health: "unknown", Breaker: "closed",
			HitRate: []float64{}}
		if last != nil {
			switch c.fillEndpoint(&ep, k, first, last) {
			case -1:
				parityBroken = true
			case 1:
				parityOK = true
			}
		}
		out.HitsTotal += ep.HitsTotal
		ruleHitsWindow += ep.HitsWindow
		if kvEP[e.Idx] {
			ep.Subscriber = c.subscriber(subByEP[k], now)
		}
		ep.Models = c.endpointModels(k, now)
		endpointProblems(id, e.AdminDown, &ep, problems)
		out.Endpoints = append(out.Endpoints, ep)
	}
	out.HitsWindow = ruleHitsWindow
	if last != nil {
		missesProblems(&out, first, last, problems)
	}
	switch {
	case parityBroken:
		out.Parity = "broken"
		*problems = append(*problems, Problem{ServiceID: id, Kind: "parity_broken",
			Detail: "kvgate's block hashes disagree with the engine's: routing is KV-blind until the contract is fixed"})
	case parityOK:
		out.Parity = "ok"
	}
	if d := last.mismatches[id] - first.mismatches[id]; d > 0 {
		*problems = append(*problems, Problem{ServiceID: id, Kind: "prompt_tokens_mismatch",
			Detail: strconv.FormatFloat(d, 'f', 0, 64) + " responses counted a different number of prompt tokens than kvgate: " +
				"the tokenizer or chat template staged for kvgate differs from the engine's (kvgate_kv_prompt_tokens_mismatch_total; kvctl preflight)"})
	}
	return out
}

// fillEndpoint sets ep's health, breaker, load, block and hit figures from
// the samples (last non-nil) and returns the sign of its parity gauge: -1
// broken, 1 ok, 0 unknown. The caller holds c.mu.
func (c *Collector) fillEndpoint(ep *Endpoint, k epKey, first, last *sample) int {
	if v, ok := last.gauges[mProbeUp][k]; ok {
		ep.Health = map[bool]string{true: "up", false: "down"}[v == 1]
	}
	if c.opts.Health != nil {
		if up, known := c.opts.Health(k.service, k.ep); known {
			ep.Health = map[bool]string{true: "up", false: "down"}[up]
		}
	}
	if c.opts.ProbeError != nil {
		ep.ProbeError = c.opts.ProbeError(k.service, k.ep)
	}
	switch last.gauges[mBreaker][k] {
	case 1:
		ep.Breaker = "open"
	case 2:
		ep.Breaker = "half-open"
	}
	ep.Inflight = last.gauges[mInflight][k]
	ep.Blocks = last.gauges[mBlocks][k]
	ep.HitsTotal = last.hits[k]
	ep.HitsWindow = last.hits[k] - first.hits[k]
	ep.HitRate = c.hitRate(k)
	parity := 0
	if v, ok := last.gauges[mParity][k]; ok {
		switch {
		case v < 0:
			parity = -1
		case v > 0:
			parity = 1
		}
	}
	return parity
}

// endpointProblems reports what is wrong with one endpoint of rule id: down
// or excluded by its breaker (unless an admin took it out), or without its
// KV-event subscription.
func endpointProblems(id int, adminDown bool, ep *Endpoint, problems *[]Problem) {
	ei := ep.EPIdx
	add := func(kind, detail string) {
		*problems = append(*problems, Problem{ServiceID: id, EPIdx: &ei, Kind: kind, Detail: detail})
	}
	switch {
	case adminDown:
	case ep.Health == "down":
		detail := "the health probe fails for " + ep.Addr
		if ep.ProbeError != "" {
			detail += ": " + ep.ProbeError
		}
		add("endpoint_down", detail)
	case ep.Breaker == "open":
		add("breaker_open", "the circuit breaker excludes "+ep.Addr)
	}
	if ep.Subscriber != nil && !ep.Subscriber.Connected {
		add("subscriber_down", "no KV-event subscription to "+ep.Addr+": its blocks cannot be followed")
	}
	if m := ep.Models; m != nil && m.Error != "" && !adminDown {
		detail := "GET /v1/models failed: " + m.Error
		if len(m.Served) > 0 {
			detail += "; routing keeps the models it listed before"
		} else {
			detail += "; until a read succeeds the endpoint is a candidate for every model"
		}
		add("model_discovery_failed", detail)
	}
}

// endpointModels is k's discovery state, nil when its rule runs none.
func (c *Collector) endpointModels(k epKey, now time.Time) *EndpointModels {
	if c.opts.Models == nil {
		return nil
	}
	st, ok := c.opts.Models(k.service, k.ep)
	if !ok {
		return nil
	}
	out := &EndpointModels{Served: append([]string{}, st.Served.Bases...), Adapters: st.Served.AdapterList(),
		CheckedAgeSeconds: -1, Error: st.Err}
	if !st.CheckedAt.IsZero() {
		at := st.CheckedAt.UTC()
		out.CheckedAt = &at
		out.CheckedAgeSeconds = max(0, now.Sub(st.CheckedAt).Seconds())
	}
	return out
}

// missesProblems fills out.MissesWindow from the samples and reports the
// endpoints that hold blocks yet scored no hit while the rule missed.
func missesProblems(out *Rule, first, last *sample, problems *[]Problem) {
	id := out.ServiceID
	var missesWindow float64
	for mk, v := range last.misses {
		if mk.service != id {
			continue
		}
		if d := v - first.misses[mk]; d > 0 {
			out.MissesWindow[mk.reason] = d
			missesWindow += d
		}
	}
	// An endpoint that holds blocks but never wins while the rule's
	// requests miss is the silent failure: a contract mismatch scores 0.
	if missesWindow == 0 {
		return
	}
	for _, ep := range out.Endpoints {
		if ep.Blocks > 0 && ep.HitsWindow == 0 {
			ei := ep.EPIdx
			*problems = append(*problems, Problem{ServiceID: id, EPIdx: &ei, Kind: "blocks_no_hits",
				Detail: "holds " + strconv.FormatFloat(ep.Blocks, 'f', 0, 64) + " blocks but scored no hit while requests missed: check the contract (kvctl preflight)"})
		}
	}
}

// hitRate is hits per second between consecutive samples; the caller holds c.mu.
func (c *Collector) hitRate(k epKey) []float64 {
	out := make([]float64, 0, len(c.samples))
	for i := 1; i < len(c.samples); i++ {
		a, b := &c.samples[i-1], &c.samples[i]
		dt := b.at.Sub(a.at).Seconds()
		v := 0.0
		if dt > 0 {
			if d := b.hits[k] - a.hits[k]; d > 0 {
				v = d / dt
			}
		}
		out = append(out, v)
	}
	return out
}

// subscriber reads one endpoint's subscriber; the caller holds c.mu.
func (c *Collector) subscriber(es ingest.EndpointStatus, now time.Time) *Subscriber {
	s := &Subscriber{Ranks: len(es.Ranks), Connected: len(es.Ranks) > 0, LastEventAgeSeconds: -1}
	var newest time.Time
	for _, r := range es.Ranks {
		if !r.Connected {
			s.Connected = false
		}
		if seen, ok := c.lastSeq[es.Key+"#"+strconv.Itoa(r.Rank)]; ok && seen.at.After(newest) {
			newest = seen.at
		}
	}
	if !newest.IsZero() {
		s.LastEventAgeSeconds = now.Sub(newest).Seconds()
	}
	return s
}

func roleName(r config.Role) string {
	switch r {
	case config.RolePrefill:
		return "prefill"
	case config.RoleDecode:
		return "decode"
	}
	return "any"
}
