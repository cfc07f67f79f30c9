package pd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/attempt"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/pd/admission"
	"github.com/kvgate/kvgate/pkg/reqfacts"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Defaults.
const (
	DefaultPrefillTimeout     = 30 * time.Second
	DefaultDecodeSilence      = 120 * time.Second
	DefaultMaxPrefillResponse = 4 << 20
	DefaultMaxBufferedDecode  = 8 << 20
	// maxDrainRetries bounds re-selections after the endpoint a request was
	// parked on went down.
	maxDrainRetries = 3
)

// Endpoint is one endpoint of the rule as the flow sees it.
type Endpoint struct {
	Idx      int
	Role     selector.Role
	IP       string
	Port     int // targetPort
	NixlPort int // nixl_port; 0 means targetPort in the request-id receipt
}

func (e Endpoint) addr() string { return net.JoinHostPort(e.IP, strconv.Itoa(e.Port)) }

func (e Endpoint) receiptPort() int {
	if e.NixlPort != 0 {
		return e.NixlPort
	}
	return e.Port
}

// Topology is the rule version the flow serves.
type Topology struct {
	Endpoints []Endpoint
	// RequestIDReceipt is pd_request_id_receipt: X-Request-Id takes the
	// receipt form P2P-NCCL-style connectors parse.
	RequestIDReceipt bool
}

type topology struct {
	eps     [epset.Max]Endpoint
	has     epset.Set
	prefill epset.Set
	decode  epset.Set
	receipt bool
}

func compile(t Topology) (*topology, error) {
	c := &topology{receipt: t.RequestIDReceipt}
	for _, e := range t.Endpoints {
		if e.Idx < 0 || e.Idx >= epset.Max {
			return nil, fmt.Errorf("pd: ep_idx %d out of range", e.Idx)
		}
		if e.IP == "" || e.Port <= 0 || e.Port > 65535 {
			return nil, fmt.Errorf("pd: ep_idx %d: bad address %q:%d", e.Idx, e.IP, e.Port)
		}
		c.eps[e.Idx] = e
		c.has.Add(e.Idx)
		switch e.Role {
		case selector.RolePrefill:
			c.prefill.Add(e.Idx)
		case selector.RoleDecode:
			c.decode.Add(e.Idx)
		}
	}
	return c, nil
}

// Plan is a request prepared for selection: the gateway extracts the
// request's facts, tokenizes and hashes the prompt, and begins the
// selector attempt.
type Plan struct {
	Attempt      *selector.Attempt
	Model        string
	PromptTokens int
	Blocks       int
	Stages       []fullproxy.Stage
	// Reserve, when set, makes the prompt's blocks provisional on prefill
	// endpoint ep while its prefill leg runs (docs/selection.md,
	// "Provisional blocks"); the returned func releases them. A request of
	// the same prefix arriving meanwhile then scores on ep instead of
	// computing the prefix elsewhere.
	Reserve func(ep int) (release func())
}

// Health is the per-endpoint health the flow drives: the exclusion state
// and the circuit breaker, which both legs' attempt loops ask and feed.
// *health.Tracker implements it.
type Health interface {
	States() selector.States
	attempt.Breaker
}

// Config configures the flow of one P/D rule.
type Config struct {
	ServiceID int
	// Begin prepares a request for selection. Required.
	Begin func(req *fullproxy.Request) Plan
	// Plain serves the requests the two-leg flow does not take (bodyless
	// requests, n > 1, several prompts): the rule's plain forward. Required.
	Plain fullproxy.Handler
	// Health and Admission are the rule's health tracker and admission
	// controller. Required.
	Health    Health
	Admission *admission.Controller
	// Loads is what the flow's own decode pick reads (the rule's shared
	// load view, docs/replicas.md); nil means Admission's count.
	Loads selector.LoadSource
	// PrefillTimeout bounds the prefill leg (all its attempts) and the
	// decode leg's first byte (LLB_PD_PREFILL_TIMEOUT_SEC; default 30 s).
	PrefillTimeout time.Duration
	// DecodeSilence ends a decode stream silent for this long
	// (LLB_PD_DECODE_SILENCE_SEC; default 120 s).
	DecodeSilence time.Duration
	// DecodeOnlyFallback sends the plain request to a decode endpoint when
	// every prefill endpoint failed (LLB_PD_DECODE_ONLY_FALLBACK); false
	// answers 503 pd_pool_unavailable.
	DecodeOnlyFallback bool
	// MaxPrefillResponse bounds a prefill response body (default 4 MiB).
	MaxPrefillResponse int64
	// MaxBufferedDecode bounds a non-streamed decode response buffered to
	// copy the prefill's cached_tokens into its usage (default 8 MiB);
	// larger ones stream through unchanged.
	MaxBufferedDecode int64
	Observer          Observer
	Logger            *slog.Logger

	// PrefillUsage, when set, gets each two-leg request's record (its
	// decision names the prefill endpoint) and its prefill answer, for the
	// per-request usage audit (docs/parity.md): the prefill's usage is the
	// one that describes the prompt and the cache hit kvgate predicted. The
	// decode's relayed body is then not audited.
	PrefillUsage func(rec *fullproxy.Record, prefillBody []byte)
}

// Flow is the mode-1 request flow of one rule; it is the rule's
// fullproxy.Handler. Safe for concurrent use.
type Flow struct {
	cfg      Config
	topo     atomic.Pointer[topology]
	rrDecode atomic.Uint64
	obs      Observer
	log      *slog.Logger
}

// New validates cfg and builds the flow for topology t.
func New(cfg Config, t Topology) (*Flow, error) {
	switch {
	case cfg.Begin == nil:
		return nil, errors.New("pd: config has no Begin")
	case cfg.Plain == nil:
		return nil, errors.New("pd: config has no Plain handler")
	case cfg.Health == nil || cfg.Admission == nil:
		return nil, errors.New("pd: config needs Health and Admission")
	case cfg.PrefillTimeout < 0 || cfg.DecodeSilence < 0:
		return nil, errors.New("pd: negative timeout")
	}
	if cfg.Loads == nil {
		cfg.Loads = cfg.Admission
	}
	if cfg.PrefillTimeout == 0 {
		cfg.PrefillTimeout = DefaultPrefillTimeout
	}
	if cfg.DecodeSilence == 0 {
		cfg.DecodeSilence = DefaultDecodeSilence
	}
	if cfg.MaxPrefillResponse <= 0 {
		cfg.MaxPrefillResponse = DefaultMaxPrefillResponse
	}
	if cfg.MaxBufferedDecode <= 0 {
		cfg.MaxBufferedDecode = DefaultMaxBufferedDecode
	}
	f := &Flow{cfg: cfg, obs: cfg.Observer, log: cfg.Logger}
	if f.obs == nil {
		f.obs = NopObserver{}
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	f.log = f.log.With("service", cfg.ServiceID)
	if err := f.SetTopology(t); err != nil {
		return nil, err
	}
	return f, nil
}

// SetTopology replaces the rule version (an update of the same rule).
// Requests in flight keep the version they started with.
func (f *Flow) SetTopology(t Topology) error {
	c, err := compile(t)
	if err != nil {
		return err
	}
	f.topo.Store(c)
	return nil
}

var _ fullproxy.Handler = (*Flow)(nil)

// Serve implements fullproxy.Handler. A POST whose inspected body is a
// single-generation JSON object takes the two-leg flow; anything else
// (bodyless requests such as GET /v1/models, bodies above the inspection
// limit, n > 1, several prompts) goes to the plain forward, which sends it
// to the chosen prefill endpoint.
func (f *Flow) Serve(ctx context.Context, x *fullproxy.Exchange) bool {
	req := x.Req
	if req.Method != "POST" || !req.BodyInspected || !orchestrated(req.Path()) {
		return f.cfg.Plain.Serve(ctx, x)
	}
	m, err := parseBody(req.Body)
	if err != nil {
		return f.cfg.Plain.Serve(ctx, x)
	}
	plan := f.cfg.Begin(req)
	if plan.Attempt == nil {
		return f.cfg.Plain.Serve(ctx, x)
	}
	r := &run{f: f, x: x, topo: f.topo.Load(), plan: plan, a: plan.Attempt, body: m, id: newUUID(),
		prefill: -1, decode: -1, downEp: -1, clientID: req.Get("X-Request-Id")}
	defer r.releaseAll()
	return r.serve(ctx)
}

// orchestrated reports a path the two-leg flow takes. The Responses and
// Messages APIs take the plain path (docs/pd.md): the prefill rewrite speaks
// the completions and chat fields (max_tokens, stream_options), and the
// NixlConnector proxies the flow follows orchestrate only those two APIs.
func orchestrated(path string) bool {
	k := reqfacts.KindFromPath(path)
	return k != reqfacts.KindResponses && k != reqfacts.KindMessages
}

// run is one P/D request.
type run struct {
	f        *Flow
	x        *fullproxy.Exchange
	topo     *topology
	plan     Plan
	a        *selector.Attempt
	body     body
	id       [16]byte
	clientID string

	// holds: the endpoints this request counts as in flight on.
	prefill, decode int
	// inPrefillLeg, inDecodeLeg: the held endpoint's engine is running this
	// request's leg (admission.Controller.LegStarted).
	inPrefillLeg, inDecodeLeg bool

	d             selector.Decision
	prefillFailed int
	params        []byte
	cached        int
	decodeOnly    bool
	// downEp is the first endpoint that went down before it answered this
	// request (-1: none): with nothing left to re-route to, the request is
	// answered 503 endpoint_down.
	downEp int
}

func (r *run) obs() Observer { return r.f.obs }

// holdPrefill records an admission already granted on ep.
func (r *run) holdPrefill(ep int) {
	r.prefill = ep
	r.x.IncLoad(ep)
	r.f.cfg.Admission.LegStarted(ep)
	r.inPrefillLeg = true
}

// endPrefillLeg marks the prefill engine done with this request (its
// response head arrived, or the leg failed); the admission unit stays.
func (r *run) endPrefillLeg() {
	if r.inPrefillLeg {
		r.f.cfg.Admission.LegEnded(r.prefill)
		r.inPrefillLeg = false
	}
}

func (r *run) releasePrefill() {
	r.endPrefillLeg()
	if r.prefill >= 0 {
		r.f.cfg.Admission.ReleasePrefill(r.prefill)
		r.x.DecLoad(r.prefill)
		r.prefill = -1
	}
}

// holdDecode moves the request's decode unit to ep (-1: none).
func (r *run) holdDecode(ep int) {
	if r.decode == ep {
		return
	}
	r.releaseDecode()
	if ep >= 0 {
		r.f.cfg.Admission.Track(ep)
		r.x.IncLoad(ep)
		r.decode = ep
	}
}

// startDecodeLeg marks the held decode endpoint's engine as running this
// request, until the decode unit is released.
func (r *run) startDecodeLeg() {
	if r.decode >= 0 && !r.inDecodeLeg {
		r.f.cfg.Admission.LegStarted(r.decode)
		r.inDecodeLeg = true
	}
}

func (r *run) releaseDecode() {
	if r.inDecodeLeg {
		r.f.cfg.Admission.LegEnded(r.decode)
		r.inDecodeLeg = false
	}
	if r.decode >= 0 {
		r.f.cfg.Admission.Untrack(r.decode)
		r.x.DecLoad(r.decode)
		r.decode = -1
	}
}

func (r *run) releaseAll() {
	r.releasePrefill()
	r.releaseDecode()
}

// requestID is the X-Request-Id of both legs: the client's, or a generated
// UUID; with pd_request_id_receipt the receipt form naming both endpoints.
func (r *run) requestID(prefill, decode int) string {
	if r.topo.receipt && prefill >= 0 && decode >= 0 {
		return receiptID(r.topo.eps[prefill], r.topo.eps[decode], r.id)
	}
	if r.clientID != "" {
		return r.clientID
	}
	return uuidString(r.id)
}

// decisionValue renders x-kvgate-decision for a P/D request.
func (r *run) decisionValue(decode int) string {
	d := r.d
	reason := "-"
	if d.Reason != selector.ReasonNone {
		reason = d.Reason.String()
	}
	tier := d.Tier.String()
	if r.decodeOnly {
		tier = "decode_only"
	}
	return fmt.Sprintf("tier=%s; ep=%d; score=%d; reason=%s; decode=%d", tier, d.Endpoint, d.Score, reason, decode)
}

// record fills the access-log record with the decision.
func (r *run) record(ep int) {
	rec := r.x.Record
	reason := "-"
	if r.d.Reason != selector.ReasonNone {
		reason = r.d.Reason.String()
	}
	tier := r.d.Tier.String()
	if r.decodeOnly {
		tier = "decode_only"
	}
	rec.Decision = fullproxy.Decision{Endpoint: ep, Tier: tier, Reason: reason, Score: r.d.Score, Model: r.plan.Model,
		PromptTokens: r.plan.PromptTokens, Blocks: r.plan.Blocks, Stages: r.plan.Stages}
	if ep >= 0 && r.topo.has.Has(ep) {
		rec.Decision.Addr = r.topo.eps[ep].addr()
		rec.Decision.EndpointID = rec.Decision.Addr
	}
	rec.Routed = ep >= 0
}

func (r *run) serve(ctx context.Context) bool {
	r.cached = -1
	x := r.x
	cfg := &r.f.cfg
	var prefillDeadline time.Time
	drains := 0
	// Bounded: every prefill endpoint once, one more pass of the ladder, and
	// the re-selections after a drained park.
	loop := x.Attempts(r.topo.prefill.Len()+1+maxDrainRetries, cfg.Health)
	for loop.Next() {
		x.Record.Attempts = loop.Tries()
		d := r.a.Decide()
		r.obs().Decided(d)
		r.d = d
		if d.Endpoint >= 0 && d.Tier == selector.TierNormal {
			// No prefill endpoint is eligible; a role-0 endpoint serves the
			// plain request.
			return r.fallback(ctx, d.Endpoint)
		}
		if d.Endpoint < 0 && !d.Saturated {
			break // no prefill endpoint left
		}
		if d.Saturated {
			var retry, done, keep bool
			if d, retry, done, keep = r.park(ctx, &drains); done {
				return keep
			}
			if retry {
				continue
			}
		} else if err := cfg.Admission.AcquirePrefill(d.Endpoint); err != nil {
			r.record(d.Endpoint)
			return r.overloaded()
		}
		if !r.holdPair(d) {
			// No healthy decode endpoint: a prefill now would strand its blocks.
			r.obs().Request(r.plan.Model, "decode", "error")
			return x.Fail(503, "pd_pool_unavailable", "no decode endpoint is available")
		}
		p := d.Endpoint
		if !loop.Admit(p) {
			// The breaker refuses (open, or its half-open trials are used):
			// like a connect failure, without recording another one.
			r.releaseAll()
			r.a.Exclude(p)
			continue
		}
		if prefillDeadline.IsZero() {
			prefillDeadline = time.Now().Add(cfg.PrefillTimeout)
		}
		out := r.prefillLeg(ctx, p, prefillDeadline)
		switch out.kind {
		case legOK:
			loop.Answered(p, out.resp.Status)
			return r.prefilled(ctx, p, out.body)
		case legClientError:
			// A 4xx goes to the client unchanged.
			r.obs().Request(r.plan.Model, "prefill", "error")
			return x.Respond(out.resp.Status, out.resp.Header, out.body, r.decisionValue(r.decode))
		case legTimeout:
			r.obs().Timeout("pd_prefill_timeout")
			r.obs().Request(r.plan.Model, "prefill", "timeout")
			r.f.log.Warn("prefill timed out", "prefill_ep", p, "timeout", cfg.PrefillTimeout)
			return x.Fail(504, "pd_prefill_timeout", fmt.Sprintf("prefill did not complete within %s", cfg.PrefillTimeout))
		case legClientGone:
			// The prefill was abandoned: its connection closed, so the
			// engine aborts it.
			r.f.log.Debug("client gone during the prefill", "prefill_ep", p)
			x.Record.Outcome = fullproxy.OutcomeClientGone
			return false
		case legCancelled:
			return x.Fail(503, "pd_pool_unavailable", "request cancelled (shutting down)")
		case legDown:
			if !r.noteDown(loop, p) {
				return r.endpointDown()
			}
		case legConnectFailed:
			loop.ConnectFailed(p)
		case legOriginError:
			loop.OriginError(p)
			r.obs().Failover()
		case legDied:
			loop.Died(p)
			r.obs().Failover()
		}
		// Retry the next prefill endpoint with this one excluded.
		r.f.log.Warn("prefill endpoint failed; retrying without it", "prefill_ep", p, "cause", out.kind.String(), "err", out.err)
		r.obs().EndpointDied("prefill")
		r.obs().Retry("prefill")
		r.prefillFailed++
		r.releaseAll()
		r.a.Exclude(p)
		if time.Now().After(prefillDeadline) {
			r.obs().Timeout("pd_prefill_timeout")
			r.obs().Request(r.plan.Model, "prefill", "timeout")
			return x.Fail(504, "pd_prefill_timeout", fmt.Sprintf("prefill did not complete within %s", cfg.PrefillTimeout))
		}
	}
	return r.fallback(ctx, -1)
}

// noteDown records that ep went down before its first byte and reports
// whether the leg may re-route (once per leg, through its attempt loop).
func (r *run) noteDown(loop *attempt.Loop, ep int) bool {
	if r.downEp < 0 {
		r.downEp = ep
	}
	return loop.Down(ep)
}

// endpointDown answers a request whose endpoint went down before it
// answered, with nothing left to re-route to.
func (r *run) endpointDown() bool {
	phase := "decode"
	if r.topo.prefill.Has(r.downEp) {
		phase = "prefill"
	}
	r.obs().Request(r.plan.Model, phase, "error")
	return r.x.Fail(503, "endpoint_down", fmt.Sprintf("endpoint %d went down before it answered", r.downEp))
}

// holdPair holds the admitted prefill endpoint of d and a decode endpoint
// (d's, else the least loaded), recording the pair; false when no decode
// endpoint is available.
func (r *run) holdPair(d selector.Decision) bool {
	r.holdPrefill(d.Endpoint)
	dec := d.Decode
	if dec < 0 {
		dec = r.pickDecode(epset.Set{})
	}
	if dec >= 0 {
		r.holdDecode(dec)
	}
	r.record(d.Endpoint)
	return dec >= 0
}

// prefilled commits the decision after prefill endpoint p answered body
// and runs the decode leg. The prefill is finished, but its admission unit
// stays held until the decode stream ends (L_i counts the whole request).
func (r *run) prefilled(ctx context.Context, p int, body []byte) bool {
	o := r.a.Commit()
	r.obs().Committed(o, r.plan.Model, r.plan.Stages)
	pr := parsePrefill(body)
	r.params, r.cached = pr.params, pr.cached
	if audit := r.f.cfg.PrefillUsage; audit != nil {
		r.x.Record.UsageAudited = true
		audit(r.x.Record, body)
	}
	r.obs().KVParams(r.plan.Model, pr.params != nil)
	if pr.params == nil {
		r.f.log.Warn("prefill response without kv_transfer_params; decode computes the prompt", "prefill_ep", p)
	}
	return r.decodeLeg(ctx, r.decode)
}

// park waits for a prefill admission slot on a saturated pool. It returns
// the decision on the granted endpoint; retry after a park the endpoint's
// drain ended (at most maxDrainRetries, counted in drains); done with the
// keep-alive answer when the request ended (park timeout, overload, client
// gone, shutdown, or the granted endpoint left the rule).
func (r *run) park(ctx context.Context, drains *int) (d selector.Decision, retry, done, keep bool) {
	x, adm := r.x, r.f.cfg.Admission
	wctx, stopWatch := x.WatchClient(ctx)
	ep, err := adm.Park(wctx, r.a.Parkable())
	stopWatch()
	switch {
	case err == nil:
		d = r.a.Assign(ep)
		r.d = d
		if d.Endpoint != ep {
			adm.ReleasePrefill(ep)
			return d, false, true, x.Fail(503, "pd_pool_unavailable", "the endpoint granted by admission left the rule")
		}
		return d, false, false, false
	case errors.Is(err, admission.ErrDrained) && *drains < maxDrainRetries:
		*drains++
		return d, true, false, false
	}
	r.record(-1)
	switch {
	case errors.Is(err, admission.ErrParkTimeout):
		return d, false, true, x.Fail(504, "pd_admission_park_timeout", "no prefill endpoint had room within the park time")
	case errors.Is(err, admission.ErrOverloaded):
		return d, false, true, r.overloaded()
	case ctx.Err() == nil:
		x.Record.Outcome = fullproxy.OutcomeClientGone
		return d, false, true, false
	}
	return d, false, true, x.Fail(503, "pd_pool_unavailable", "request cancelled while waiting for admission: "+err.Error())
}

// overloaded answers 429 pd_overloaded (the shed is counted by Admission).
func (r *run) overloaded() bool {
	return r.x.Fail(429, "pd_overloaded", "all prefill endpoints at in-flight capacity",
		fullproxy.HeaderField{Name: "Retry-After", Value: "1"})
}

// fallback serves the plain request without a prefill: on target (a role-0
// endpoint the selector chose) or a decode endpoint, when
// LLB_PD_DECODE_ONLY_FALLBACK allows.
func (r *run) fallback(ctx context.Context, target int) bool {
	r.releasePrefill()
	detail := "no prefill endpoint is available"
	if r.prefillFailed > 0 {
		detail = "all prefill endpoints unreachable"
	}
	if !r.f.cfg.DecodeOnlyFallback {
		r.record(-1)
		if r.downEp >= 0 {
			return r.endpointDown()
		}
		return r.x.Fail(503, "pd_pool_unavailable", detail)
	}
	r.decodeOnly = true
	r.params, r.cached = nil, -1
	r.obs().DecodeOnly()
	r.f.log.Warn("P/D decode-only fallback: the plain request goes to a decode endpoint", "reason", detail, "target", target)
	if target >= 0 {
		return r.decodeLegTo(ctx, target)
	}
	return r.decodeLeg(ctx, -1)
}

type legKind uint8

const (
	legOK legKind = iota
	legClientError
	legOriginError
	legConnectFailed
	legDied
	legTimeout
	legCancelled
	legClientGone // the client went away before the leg's answer
	legDown       // the endpoint went down before its first byte
)

func (k legKind) String() string {
	return [...]string{"ok", "client_error", "origin_5xx", "connect_failed", "died", "timeout", "cancelled", "client_gone", "endpoint_down"}[k]
}

type legOutcome struct {
	kind legKind
	resp *fullproxy.BackendResponse
	body []byte
	err  error
}

// prefillLeg sends the rewritten request to prefill endpoint p and reads
// its whole (bounded) response before deadline.
func (r *run) prefillLeg(ctx context.Context, p int, deadline time.Time) legOutcome {
	x := r.x
	pb, err := r.body.prefillBody()
	if err != nil {
		return legOutcome{kind: legDied, err: err}
	}
	start := time.Now()
	bc, out := r.dialPrefill(ctx, p, deadline)
	if bc == nil {
		return out
	}
	defer bc.Close()
	if r.plan.Reserve != nil {
		// Held until the prefill answers: by then the engine has reported
		// the blocks it scheduled, and the stored blocks replace the guess.
		defer r.plan.Reserve(p)()
	}
	stop := fullproxy.CloseOnCancel(ctx, bc)
	defer stop()
	_ = bc.SetDeadline(deadline)
	// The client leaving ends the prefill (head and body) at once; the
	// endpoint going down ends it until its first byte.
	hw := x.WatchHead(ctx, p, bc)
	defer hw.Stop()
	set := []fullproxy.HeaderField{{Name: "X-Request-Id", Value: r.requestID(p, r.decode)}}
	if err := x.WriteRequest(bc, pb, set, "accept-encoding"); err != nil {
		return legErr(ctx, hw, err)
	}
	resp, err := x.ReadResponse(bc, deadline)
	// The engine has finished the prefill by its head (or dropped it).
	r.endPrefillLeg()
	if err != nil {
		return legErr(ctx, hw, err)
	}
	x.TTFB(p, resp.FirstByte.Sub(start))
	b, err := resp.ReadBody(r.f.cfg.MaxPrefillResponse, 0, deadline)
	if err != nil {
		if errors.Is(err, fullproxy.ErrBodyTooLarge) {
			return legOutcome{kind: legOriginError, resp: resp, err: err}
		}
		return legErr(ctx, hw, err)
	}
	r.obs().Leg("prefill", r.plan.Model, time.Since(start))
	switch {
	case resp.Status >= 500:
		return legOutcome{kind: legOriginError, resp: resp, body: b, err: fmt.Errorf("prefill answered %d", resp.Status)}
	case resp.Status >= 400:
		return legOutcome{kind: legClientError, resp: resp, body: b}
	}
	return legOutcome{kind: legOK, resp: resp, body: b}
}

// dialPrefill connects to prefill endpoint p before deadline, watching the
// client meanwhile; a nil conn comes with the leg's outcome.
func (r *run) dialPrefill(ctx context.Context, p int, deadline time.Time) (net.Conn, legOutcome) {
	wctx, stopWatch := r.x.WatchClient(ctx)
	dctx, cancel := context.WithDeadline(wctx, deadline)
	defer cancel()
	bc, err := r.x.Dial(dctx, r.topo.eps[p].addr())
	// Read the contexts before stopWatch, which cancels wctx (and dctx).
	cancelled, left, late := ctx.Err() != nil, wctx.Err() != nil, dctx.Err() != nil
	stopWatch()
	switch {
	case err == nil:
		return bc, legOutcome{}
	case cancelled:
		return nil, legOutcome{kind: legCancelled, err: err}
	case left:
		return nil, legOutcome{kind: legClientGone, err: err}
	case late:
		return nil, legOutcome{kind: legTimeout, err: err}
	}
	return nil, legOutcome{kind: legConnectFailed, err: err}
}

func legErr(ctx context.Context, hw *fullproxy.HeadWatch, err error) legOutcome {
	switch {
	case hw.ClientLeft():
		return legOutcome{kind: legClientGone, err: err}
	case hw.EndpointDown():
		return legOutcome{kind: legDown, err: err}
	case ctx.Err() != nil:
		return legOutcome{kind: legCancelled, err: err}
	case fullproxy.IsTimeout(err):
		return legOutcome{kind: legTimeout, err: err}
	}
	return legOutcome{kind: legDied, err: err}
}

// pickDecode chooses a healthy decode endpoint not in excluded (those
// failed for this request): least in flight, round-robin among ties.
func (r *run) pickDecode(excluded epset.Set) int {
	st := r.f.cfg.Health.States()
	elig := r.topo.decode.AndNot(st.Unavailable().Or(excluded))
	best, bestLoad := -1, 0
	var tied []int
	for ep := elig.Next(0); ep >= 0; ep = elig.Next(ep + 1) {
		l := r.f.cfg.Loads.InFlight(ep)
		if ep == r.decode {
			l-- // this request's own unit
		}
		switch {
		case best < 0 || l < bestLoad:
			best, bestLoad, tied = ep, l, append(tied[:0], ep)
		case l == bestLoad:
			tied = append(tied, ep)
		}
	}
	if len(tied) > 1 {
		return tied[r.f.rrDecode.Add(1)%uint64(len(tied))]
	}
	return best
}

// decodeLeg runs the decode leg on dec, re-choosing it when it is gone,
// unhealthy or fails to connect.
func (r *run) decodeLeg(ctx context.Context, dec int) bool {
	x := r.x
	// Bounded: every decode endpoint once, and one more choice.
	loop := x.Attempts(r.topo.decode.Len()+1, r.f.cfg.Health)
	for loop.Next() {
		st := r.f.cfg.Health.States()
		if dec < 0 || !r.topo.decode.Has(dec) || st.Unavailable().Has(dec) || loop.Excluded().Has(dec) {
			dec = r.pickDecode(loop.Excluded())
		}
		if dec < 0 {
			break
		}
		if !loop.Admit(dec) {
			r.a.ExcludeDecode(dec)
			dec = -1
			continue
		}
		keep, retry := r.tryDecode(ctx, loop, dec)
		if !retry {
			return keep
		}
		r.obs().Retry("decode")
		r.a.ExcludeDecode(dec)
		dec = -1
	}
	r.record(r.prefill)
	if r.downEp >= 0 {
		return r.endpointDown()
	}
	r.obs().Request(r.plan.Model, "decode", "error")
	return x.Fail(503, "pd_pool_unavailable", "decode endpoint unreachable")
}

// decodeUnanswered ends a decode try that got no byte because the client
// left (outcome client_gone) or dec went down: re-chosen once (retry),
// else answered 503 endpoint_down.
func (r *run) decodeUnanswered(loop *attempt.Loop, hw *fullproxy.HeadWatch, dec int) (keep, retry bool) {
	if hw.ClientLeft() {
		r.f.log.Debug("client gone before the decode head", "decode_ep", dec)
		r.x.Record.Outcome = fullproxy.OutcomeClientGone
		return false, false
	}
	r.obs().EndpointDied("decode")
	if r.noteDown(loop, dec) {
		r.f.log.Info("decode endpoint went down before it answered; re-choosing", "decode_ep", dec)
		return false, true
	}
	return r.endpointDown(), false
}

// decodeLegTo runs the plain request on a fixed endpoint (a role-0
// endpoint the selector chose), without re-choosing.
func (r *run) decodeLegTo(ctx context.Context, ep int) bool {
	loop := r.x.Attempts(1, r.f.cfg.Health)
	if !loop.Next() || !loop.Admit(ep) {
		return r.x.Fail(503, "pd_pool_unavailable", "no endpoint available")
	}
	keep, retry := r.tryDecode(ctx, loop, ep)
	if retry && r.downEp >= 0 {
		return r.endpointDown()
	}
	if retry {
		r.obs().Request(r.plan.Model, "decode", "error")
		return r.x.Fail(503, "pd_pool_unavailable", "endpoint unreachable")
	}
	return keep
}

// tryDecode sends the decode body to dec and relays the answer; loop hears
// how dec did. retry reports a connect failure (nothing was sent to the
// client).
func (r *run) tryDecode(ctx context.Context, loop *attempt.Loop, dec int) (keep, retry bool) {
	x := r.x
	cfg := &r.f.cfg
	r.holdDecode(dec)
	if r.prefill >= 0 {
		r.record(r.prefill) // the prefill endpoint, paired with dec
	} else {
		r.record(dec) // decode-only: the request is served by dec alone
	}
	db, err := decodeBody(x.Req.Body, r.body, r.params)
	if err != nil {
		return x.Fail(502, "pd_decode_backend_died", "building the decode request failed: "+err.Error()), false
	}
	start := time.Now()
	r.startDecodeLeg()
	bc, err := x.Dial(ctx, r.topo.eps[dec].addr())
	if err != nil {
		if ctx.Err() != nil {
			return x.Fail(503, "pd_pool_unavailable", "request cancelled (shutting down)"), false
		}
		loop.ConnectFailed(dec)
		r.obs().EndpointDied("decode")
		r.f.log.Warn("decode endpoint connect failed; re-choosing", "decode_ep", dec, "err", err)
		return false, true
	}
	defer bc.Close()
	stop := fullproxy.CloseOnCancel(ctx, bc)
	defer stop()
	hw := x.WatchHead(ctx, dec, bc)
	defer hw.Stop()
	set := []fullproxy.HeaderField{{Name: "X-Request-Id", Value: r.requestID(r.prefill, dec)}}
	if err := x.WriteRequest(bc, db, set); err != nil {
		if hw.ClientLeft() || hw.EndpointDown() {
			return r.decodeUnanswered(loop, hw, dec)
		}
		loop.Died(dec)
		r.obs().EndpointDied("decode")
		return false, true
	}
	firstBy := start.Add(cfg.PrefillTimeout)
	resp, err := x.ReadResponse(bc, firstBy)
	hw.Stop()
	switch {
	case err != nil && (hw.ClientLeft() || hw.EndpointDown()):
		return r.decodeUnanswered(loop, hw, dec)
	case err != nil && fullproxy.IsTimeout(err) && ctx.Err() == nil:
		r.obs().Timeout("pd_decode_timeout")
		r.obs().Request(r.plan.Model, "decode", "timeout")
		return x.Fail(504, "pd_decode_timeout", fmt.Sprintf("decode sent no byte within %s", cfg.PrefillTimeout)), false
	case err != nil:
		loop.Died(dec)
		r.obs().DecodeZeroByte()
		r.obs().EndpointDied("decode")
		r.obs().Request(r.plan.Model, "decode", "error")
		return x.Fail(502, "pd_decode_backend_died", fmt.Sprintf("decode endpoint closed before its first byte: %v", err)), false
	}
	ttfb := resp.FirstByte.Sub(start)
	x.TTFB(dec, ttfb)
	x.Record.TTFB = ttfb
	r.obs().Leg("decode", r.plan.Model, ttfb)
	loop.Answered(dec, resp.Status)
	dv := r.decisionValue(dec)

	// Usage: a buffered JSON answer gets the prefill's cached_tokens.
	if r.params != nil && r.cached >= 0 && resp.Status < 300 && !resp.EventStream && !resp.Chunked &&
		resp.ContentLength >= 0 && resp.ContentLength <= cfg.MaxBufferedDecode {
		b, err := resp.ReadBody(cfg.MaxBufferedDecode, cfg.DecodeSilence, time.Time{})
		if err != nil {
			x.Record.Outcome = fullproxy.OutcomeBackendError
			if fullproxy.IsTimeout(err) {
				r.obs().Timeout("pd_decode_stream_timeout")
				return x.Fail(502, "pd_decode_stream_timeout", "decode response stalled"), false
			}
			r.obs().EndpointDied("decode")
			return x.Fail(502, "pd_decode_backend_died", "decode response truncated: "+err.Error()), false
		}
		if nb, ok := withCachedTokens(b, r.cached); ok {
			b = nb
		}
		x.Record.Outcome = fullproxy.OutcomeOK
		r.obs().Request(r.plan.Model, "complete", "success")
		return x.Respond(resp.Status, resp.Header, b, dv), false
	}

	// Relay records the outcome (fullproxy.EndingOutcome); the P/D
	// counters read the leg's ending.
	res, keep := x.Relay(ctx, resp, dv, cfg.DecodeSilence)
	switch res.Ending {
	case datapath.BackendEOF, datapath.ClientGone, datapath.Cancelled:
	case datapath.Silence:
		r.obs().Timeout("pd_decode_stream_timeout")
		r.f.log.Warn("decode stream silent; ended", "decode_ep", dec, "silence", cfg.DecodeSilence)
	default:
		r.obs().EndpointDied("decode")
	}
	if x.Record.Outcome == fullproxy.OutcomeOK && resp.Status < 400 {
		r.obs().Request(r.plan.Model, "complete", "success")
	} else {
		r.obs().Request(r.plan.Model, "decode", "error")
	}
	return keep, false
}
