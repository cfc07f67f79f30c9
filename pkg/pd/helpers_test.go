package pd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/attempt"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/pd/admission"
	"github.com/kvgate/kvgate/pkg/selector"
)

// seen is one request a fake engine received.
type seen struct {
	path string
	id   string
	body map[string]any
	raw  []byte
}

// engine is a scripted OpenAI-style backend on a real loopback socket.
type engine struct {
	srv  *http.Server
	ln   net.Listener
	host string
	port int

	mu     sync.Mutex
	reqs   []seen
	handle func(w http.ResponseWriter, r *http.Request, s seen)
}

func newEngine(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, s seen)) *engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{ln: ln, handle: handle}
	a := ln.Addr().(*net.TCPAddr)
	e.host, e.port = a.IP.String(), a.Port
	e.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		s := seen{path: r.URL.Path, id: r.Header.Get("X-Request-Id"), raw: raw}
		_ = json.Unmarshal(raw, &s.body)
		e.mu.Lock()
		e.reqs = append(e.reqs, s)
		h := e.handle
		e.mu.Unlock()
		h(w, r, s)
	})}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.kill() })
	return e
}

func (e *engine) kill() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = e.srv.Shutdown(ctx)
	_ = e.srv.Close()
}

func (e *engine) seen() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seen(nil), e.reqs...)
}

// prefillOK answers like a NixlConnector prefill engine.
func prefillOK(name string, cached int) func(http.ResponseWriter, *http.Request, seen) {
	return func(w http.ResponseWriter, _ *http.Request, s seen) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("x-engine-id", name)
		fmt.Fprintf(w, `{"id":"cmpl-%s","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":%q,"remote_request_id":"r-%s","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1},"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			s.id, name, s.id, cached)
	}
}

// decodeOK answers JSON, or SSE when the request asked to stream.
func decodeOK(name string) func(http.ResponseWriter, *http.Request, seen) {
	return func(w http.ResponseWriter, _ *http.Request, s seen) {
		w.Header().Set("x-engine-id", name)
		if st, _ := s.body["stream"].(bool); st {
			w.Header().Set("Content-Type", "text/event-stream")
			fl := w.(http.Flusher)
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
				fl.Flush()
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"cmpl-d","choices":[{"text":"hello"}],"usage":{"prompt_tokens":40,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}
}

// recObserver counts observer calls by name.
type recObserver struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *recObserver) inc(k string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[k]++
}

func (o *recObserver) get(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[k]
}

func (o *recObserver) Decided(d selector.Decision) { o.inc("decided") }
func (o *recObserver) Committed(out selector.Outcome, _ string, _ []fullproxy.Stage) {
	o.inc("committed")
	if out.Hit {
		o.inc("hit")
	}
}
func (o *recObserver) Leg(leg, _ string, _ time.Duration) { o.inc("leg:" + leg) }
func (o *recObserver) Timeout(kind string)                { o.inc(kind) }
func (o *recObserver) Retry(leg string)                   { o.inc("retry:" + leg) }
func (o *recObserver) Failover()                          { o.inc("failover") }
func (o *recObserver) EndpointDied(leg string)            { o.inc("died:" + leg) }
func (o *recObserver) DecodeZeroByte()                    { o.inc("zero_byte") }
func (o *recObserver) DecodeOnly()                        { o.inc("decode_only") }
func (o *recObserver) KVParams(_ string, found bool)      { o.inc("kv_params:" + strconv.FormatBool(found)) }
func (o *recObserver) Request(_, phase, status string)    { o.inc("request:" + phase + ":" + status) }

// proxyObs counts the proxy's connect failures and keeps its records.
type proxyObs struct {
	fullproxy.NopObserver
	mu       sync.Mutex
	connFail []int
	records  []fullproxy.Record
}

func (p *proxyObs) Done(r *fullproxy.Record) {
	p.mu.Lock()
	p.records = append(p.records, *r)
	p.mu.Unlock()
}

func (p *proxyObs) all() []fullproxy.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]fullproxy.Record(nil), p.records...)
}

func (p *proxyObs) ConnectFailed(_ string, ep int) {
	p.mu.Lock()
	p.connFail = append(p.connFail, ep)
	p.mu.Unlock()
}

// fixedRouter is the plain path: always the first prefill endpoint.
type fixedRouter struct{ addr string }

func (r fixedRouter) Plan(context.Context, *fullproxy.Request) fullproxy.RoutePlan { return r }
func (r fixedRouter) Route(context.Context, epset.Set) (fullproxy.Decision, error) {
	return fullproxy.Decision{Endpoint: 0, Addr: r.addr, Tier: "2"}, nil
}
func (fixedRouter) Finish(fullproxy.Decision, bool) {}

// rig is a P/D rule on loopback: EP0 and EP2 prefill, EP1 decode (docs/pd.md's worked example).
type rig struct {
	t       testing.TB
	eps     []*engine
	roles   []selector.Role
	tracker *health.Tracker
	adm     *admission.Controller
	flow    *Flow
	srv     *fullproxy.Server
	loads   *fullproxy.Loads
	obs     *recObserver
	pobs    *proxyObs
	url     string
	overlay *inventory.Overlay // with rigOptions.provisional
}

type rigOptions struct {
	admission admission.Config
	cfg       Config // timeouts and fallback
	receipt   bool
	nixlPorts map[int]int
	limits    fullproxy.Limits // zero: ConnectTimeout 1 s
	// plainBreaker puts the plain forward under the rule's breaker, as the
	// gateway wires it.
	plainBreaker bool
	// provisional scores every request as the same 4-block prompt over a
	// real provisional overlay (on an empty index) and, when reserve is
	// set, reserves the prompt on its prefill endpoint as the gateway does.
	provisional, reserve bool
	// flowLoads, when set, wraps the admission count as the flow's own
	// decode pick reads it (Config.Loads; the selector keeps admission's).
	flowLoads func(*admission.Controller) selector.LoadSource
}

func newRig(t testing.TB, handlers []func(http.ResponseWriter, *http.Request, seen), roles []selector.Role, o rigOptions) *rig {
	t.Helper()
	r := &rig{t: t, roles: roles, obs: &recObserver{}, pobs: &proxyObs{}, loads: &fullproxy.Loads{}}
	var top Topology
	top.RequestIDReceipt = o.receipt
	var rule selector.Rule
	rule.ServiceID, rule.KVExactMode, rule.PD = 7, 1, true
	var idx []int
	for i, h := range handlers {
		e := newEngine(t, h)
		r.eps = append(r.eps, e)
		top.Endpoints = append(top.Endpoints, Endpoint{Idx: i, Role: roles[i], IP: e.host, Port: e.port, NixlPort: o.nixlPorts[i]})
		rule.Endpoints = append(rule.Endpoints, selector.Endpoint{Idx: i, Role: roles[i]})
		idx = append(idx, i)
	}
	var err error
	r.tracker, err = health.NewTracker(health.TrackerConfig{ServiceID: 7, Endpoints: idx, Breaker: health.DefaultBreakerConfig(true)})
	if err != nil {
		t.Fatal(err)
	}
	ac := o.admission
	ac.ServiceID = 7
	if ac.PrefillTimeout == 0 {
		ac.PrefillTimeout = 2 * time.Second
	}
	r.adm, err = admission.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	r.tracker.AttachAdmission(r.adm)
	deps := selector.Deps{Loads: r.adm, Engine: r.tracker, States: r.tracker}
	var overlay *inventory.Overlay
	if o.provisional {
		idx, err := inventory.New(inventory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if overlay, err = inventory.NewOverlay(idx, inventory.ProvisionalOptions{}); err != nil {
			t.Fatal(err)
		}
		deps.Scorer = overlay
		r.overlay = overlay
	}
	sel, err := selector.New(rule, selector.DefaultOptions(), deps)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	cfg.ServiceID = 7
	cfg.Health, cfg.Admission, cfg.Observer = r.tracker, r.adm, r.obs
	if o.flowLoads != nil {
		cfg.Loads = o.flowLoads(r.adm)
	}
	if cfg.PrefillTimeout == 0 {
		cfg.PrefillTimeout = 2 * time.Second
	}
	cfg.Begin = func(req *fullproxy.Request) Plan {
		sr := &selector.Request{Model: "m"}
		if overlay != nil {
			sr.HasText, sr.Hashes = true, []uint64{11, 12, 13, 14}
		}
		a := sel.Begin(sr)
		p := Plan{Attempt: &a, Model: "m"}
		if overlay != nil && o.reserve {
			p.Reserve = func(ep int) func() {
				res := overlay.Reserve(ep, sr.Hashes)
				return func() { overlay.Release(res) }
			}
		}
		return p
	}
	var breaker attempt.Breaker
	if o.plainBreaker {
		breaker = r.tracker
	}
	cfg.Plain = fullproxy.NewForward(fixedRouter{addr: net.JoinHostPort(r.eps[0].host, strconv.Itoa(r.eps[0].port))}, breaker)
	r.flow, err = New(cfg, top)
	if err != nil {
		t.Fatal(err)
	}
	limits := o.limits
	if limits.ConnectTimeout == 0 {
		limits.ConnectTimeout = time.Second
	}
	r.srv, err = fullproxy.Listen(fullproxy.Config{Service: "7", Addr: "127.0.0.1:0", Handler: r.flow, Loads: r.loads,
		Observer: r.pobs, DecisionHeader: true, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	go r.srv.Serve()
	t.Cleanup(func() { r.srv.Close() })
	r.url = "http://" + r.srv.Addr().String() + "/v1/completions"
	return r
}

// atRest asserts every in-flight count returns to 0.
func (r *rig) atRest() {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		total := r.loads.Total()
		for i := range r.eps {
			total += r.adm.InFlight(i) + r.adm.OnEngine(i)
		}
		if total == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("in-flight counts not back to 0: proxy %d, admission %v, on engines %v", r.loads.Total(),
				[]int{r.adm.InFlight(0), r.adm.InFlight(1), r.adm.InFlight(2)},
				[]int{r.adm.OnEngine(0), r.adm.OnEngine(1), r.adm.OnEngine(2)})
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a answer) errCode() string {
	var eb fullproxy.ErrorBody
	_ = json.Unmarshal(a.body, &eb)
	return eb.Error
}

func (r *rig) post(body string, hdr ...string) answer {
	req, _ := http.NewRequest("POST", r.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func prefillRoles() []selector.Role {
	return []selector.Role{selector.RolePrefill, selector.RoleDecode, selector.RolePrefill}
}

// hang answers nothing until the request is cancelled (at most 10 s).
func hang(_ http.ResponseWriter, r *http.Request, _ seen) {
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
}

// prefillAfter is prefillOK("p", 0) held until release is closed or the
// request is cancelled.
func prefillAfter(release <-chan struct{}) func(http.ResponseWriter, *http.Request, seen) {
	return func(w http.ResponseWriter, r *http.Request, s seen) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		prefillOK("p", 0)(w, r, s)
	}
}
