package fullproxy

// The plain single-leg forward: route, connect (retrying through an
// attempt.Loop), send the request, relay the answer. It is a Handler built
// only on Exchange calls, the same ones every other handler uses.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/attempt"
	"github.com/kvgate/kvgate/pkg/epset"
)

// Stage is one timed step of a routing decision (extract, tokenize, hash,
// score, select).
type Stage struct {
	Name     string
	Duration time.Duration
}

// Decision is a Router's answer for one request.
type Decision struct {
	Endpoint int    // ep_idx
	Addr     string // host:port to dial
	// EndpointID names the endpoint in logs ("ip:port").
	EndpointID string
	Tier       string // "1", "1.5", "2" or "sel" (mode-3 rule selector)
	Reason     string // "hit", or the guard miss reason that sent it to the fallback
	Score      int    // matched blocks
	Model      string
	// PromptTokens and Blocks describe the hashed prompt (0 when none).
	PromptTokens int
	Blocks       int
	Stages       []Stage
}

// DecisionHeaderValue renders a decision as x-kvgate-decision shows it:
// "tier=1.5; ep=0; score=12; reason=hit".
func DecisionHeaderValue(d Decision) string {
	return fmt.Sprintf("tier=%s; ep=%d; score=%d; reason=%s", d.Tier, d.Endpoint, d.Score, d.Reason)
}

// ErrNoBackend is returned by a Router that has no eligible endpoint left.
var ErrNoBackend = errors.New("no healthy backend")

// Router decides where plain requests go. It must be safe for concurrent
// use.
type Router interface {
	// Plan prepares req for routing (facts, token ids, hashes) once; the
	// forward keeps the plan for the request's life, so a retry does not
	// redo the work.
	Plan(ctx context.Context, req *Request) RoutePlan
}

// RoutePlan is one request's routing state, owned by the handler serving
// it.
type RoutePlan interface {
	// Route picks the endpoint, skipping every endpoint in excluded (those
	// a try failed on). It returns ErrNoBackend (possibly wrapped) when none
	// is eligible.
	Route(ctx context.Context, excluded epset.Set) (Decision, error)
	// Finish is called once for a request whose endpoint was tried, with the
	// last decision and whether the proxy connected to it. Routers count
	// hits and misses here, so a request counts once across retries.
	Finish(d Decision, connected bool)
}

// BodyTracker is an optional RoutePlan extension for routers that learn
// from a request's progress after Finish(d, true): FirstBody is called once
// when the response's first body byte reaches the proxy through userspace
// (not the head: an engine sends the head before its first token), and
// Ended when the request is over, whatever its outcome (also when no
// endpoint connected).
type BodyTracker interface {
	FirstBody()
	Ended()
}

// NewForward returns the plain forward over r: at most Limits.MaxAttempts
// tries, each endpoint asked of breaker (nil: none) first and told how it
// answered.
func NewForward(r Router, breaker attempt.Breaker) Handler {
	return &forward{router: r, breaker: breaker}
}

type forward struct {
	router  Router
	breaker attempt.Breaker
}

func (f *forward) Serve(ctx context.Context, x *Exchange) bool {
	lim := x.Limits()
	t := &tries{f: f, x: x, plan: f.router.Plan(ctx, x.Req), loop: x.Attempts(lim.MaxAttempts, f.breaker), downEp: -1}
	if bt, ok := t.plan.(BodyTracker); ok {
		defer bt.Ended()
	}
	for t.loop.Next() {
		x.Record.Attempts = t.loop.Tries()
		nd, err := t.plan.Route(ctx, t.loop.Excluded())
		if err != nil {
			return t.noEndpoint(err)
		}
		if !t.loop.Admit(nd.Endpoint) {
			continue // the breaker refuses: another endpoint, this try spent
		}
		t.d, t.routed = nd, true
		x.Record.Decision, x.Record.Routed = nd, true
		keep, next := t.try(ctx)
		if !next {
			return keep
		}
		if ctx.Err() != nil {
			break
		}
	}
	return t.exhausted()
}

// tries is one request's state across the forward's tries.
type tries struct {
	f    *forward
	x    *Exchange
	plan RoutePlan
	loop *attempt.Loop

	d        Decision
	routed   bool // an endpoint was tried
	finished bool // plan.Finish was called (once per request)
	dialErr  error
	downEp   int // the endpoint that went down before it answered (-1: none)
}

// try serves the request on t.d. next reports that another try may follow:
// the connect failed, or the endpoint went down before its first response
// byte and the request is re-routed (docs/dataplane.md, "Hung engines and
// departed clients").
//
// On a rule with a connection pool the request may go on an idle pooled
// connection. One the engine had closed meanwhile (its keep-alive timeout
// raced ours, or it restarted) fails before any response byte: the request
// is then sent once more on a fresh connection within the same try, and
// neither the try loop nor the breaker hears of it, since the endpoint
// did nothing wrong and the in-flight count already covers the request
// (docs/security.md, "Engine connection pool").
func (t *tries) try(ctx context.Context) (keep, next bool) {
	x, d := t.x, t.d
	x.IncLoad(d.Endpoint)
	defer x.DecLoad(d.Endpoint)
	bc, reused, err := x.DialBackend(ctx, d.Endpoint, d.Addr, true)
	if err != nil {
		return t.connectFailed(err)
	}
	if !t.finished {
		t.plan.Finish(d, true)
		t.finished = true
		if bt, ok := t.plan.(BodyTracker); ok {
			// Once: a kernel leg that hands the body to the userspace copy
			// passes the same options on.
			var once sync.Once
			x.firstBody = func() { once.Do(bt.FirstBody) }
		}
	}
	// Released after the answer, as the in-flight count drops after it.
	var end exchangeEnd
	defer func() { x.ReleaseBackend(d.Endpoint, d.Addr, bc, end.resp, end.untouched) }()
	end = t.on(ctx, bc, reused)
	if end.stale {
		x.s.log.Debug("pooled backend connection was closed by the engine; sending the request on a fresh one", "ep", d.Endpoint, "addr", d.Addr)
		x.poolEvent(d.Endpoint, ConnStale)
		_ = bc.Close()
		if bc, _, err = x.DialBackend(ctx, d.Endpoint, d.Addr, false); err != nil {
			bc = nil
			return t.connectFailed(err)
		}
		end = t.on(ctx, bc, false)
	}
	if !end.down {
		return end.keep, false
	}
	if t.downEp < 0 {
		t.downEp = d.Endpoint
	}
	// The plan tracks the endpoint it was finished with; a first byte from
	// the next one must not teach that endpoint's prefill speed.
	x.firstBody = nil
	if x.Replayable() && t.loop.Down(d.Endpoint) {
		x.s.log.Info("endpoint went down before it answered; re-routing the request", "ep", d.Endpoint, "addr", d.Addr)
		return false, true
	}
	return t.endpointDown(), false
}

// connectFailed re-routes after a failed connect to t.d.
func (t *tries) connectFailed(err error) (keep, next bool) {
	d := t.d
	t.x.s.log.Warn("backend connect failed; re-routing without it", "ep", d.Endpoint, "addr", d.Addr, "err", err)
	t.loop.ConnectFailed(d.Endpoint)
	t.dialErr = err
	return false, true
}

// on serves the request on bc, with bc's waits ended by a cancelled
// server.
func (t *tries) on(ctx context.Context, bc net.Conn, reused bool) exchangeEnd {
	stop := CloseOnCancel(ctx, bc)
	end := t.f.exchange(ctx, t.x, t.loop, t.d, bc, reused)
	end.untouched = stop() && !end.stale // false: the cancellation expired bc's deadlines
	return end
}

// exchangeEnd is how one exchange on a backend connection ended.
type exchangeEnd struct {
	keep  bool // the client connection may carry another request
	down  bool // the endpoint went down before its first response byte
	stale bool // a reused pooled connection failed before any response byte; nothing was answered
	resp  *BackendResponse
	// untouched: no cancellation expired the connection's deadlines, so it
	// may go back to the pool.
	untouched bool
}

// endpointDown answers a request whose endpoint went down before its first
// byte and that cannot be re-routed.
func (t *tries) endpointDown() bool {
	return t.x.Failf(503, "endpoint_down", "endpoint %d went down before it answered", t.downEp)
}

// noEndpoint answers when the router has no endpoint left for the next try.
func (t *tries) noEndpoint(err error) bool {
	x := t.x
	if t.routed && !t.finished {
		t.plan.Finish(t.d, false)
		t.finished = true
	}
	switch {
	case t.downEp >= 0:
		return t.endpointDown()
	case t.routed:
		return x.Failf(502, "backend_unreachable", "no endpoint accepted a connection (tried %v)", x.Record.ConnectErr)
	}
	x.s.log.Debug("no backend", "err", err)
	return x.Fail(503, "no_healthy_backend", "no eligible endpoint for this request")
}

// exhausted answers when the bound on tries is spent.
func (t *tries) exhausted() bool {
	x, d := t.x, t.d
	if !t.routed {
		return x.Fail(503, "no_healthy_backend", "no eligible endpoint for this request")
	}
	if !t.finished {
		t.plan.Finish(d, false)
		t.finished = true
	}
	if t.downEp >= 0 {
		return t.endpointDown()
	}
	x.s.log.Info("no endpoint accepted a connection", "ep", d.Endpoint, "addr", d.Addr, "err", t.dialErr)
	return x.Failf(502, "backend_unreachable", "connect to endpoint %d failed", d.Endpoint)
}

// sentAnswerWait bounds the wait for a backend's answer after sending the
// request to it failed: an engine that refused the body has answered already.
const sentAnswerWait = 2 * time.Second

// exchange sends the request on the connected bc and relays the answer.
// The endpoint's breaker hears the status of every answer that arrived,
// malformed heads and broken bodies included (origin errors), once the
// request ends. Until the response head, a client that leaves ends the
// exchange at once (outcome client_gone), and so does the endpoint going
// down: down then reports that no byte came, for the caller to re-route or
// answer. Error details name the endpoint by index; addresses go to the log
// only.
func (f *forward) exchange(ctx context.Context, x *Exchange, loop *attempt.Loop, d Decision, bc net.Conn, reused bool) exchangeEnd {
	rec := x.Record
	lim := x.Limits()
	log := x.s.log
	defer func() {
		switch {
		case rec.TTFB <= 0:
		case rec.Outcome == OutcomeBackendBroken:
			// A body the backend cut short is an origin failure whatever its
			// status (docs/body-leg.md, "Broken responses").
			loop.OriginError(d.Endpoint)
		default:
			loop.Answered(d.Endpoint, rec.Status)
		}
	}()
	hw := x.WatchHead(ctx, d.Endpoint, bc)
	defer hw.Stop()
	sent := time.Now()
	headWait := lim.ResponseHeaderTimeout
	sendErr := x.Forward(bc)
	hw.BodySent()
	if sendErr != nil {
		var re *RequestError
		switch {
		case errors.As(sendErr, &re): // the client's body broke its framing or limit
			hw.Stop()
			_ = bc.Close() // the backend must not take the partial body for a request
			return exchangeEnd{keep: x.Fail(re.Status(), re.Code(), re.Detail())}
		case x.ClientGone(sendErr) || hw.ClientLeft():
			rec.Outcome = OutcomeClientGone
			return exchangeEnd{}
		case hw.EndpointDown():
			return exchangeEnd{down: true}
		}
		// An engine that refuses a streamed body (413) answers and closes
		// before reading it: its answer is already on the socket, so relay it
		// rather than the broken pipe. The client's body is not fully read,
		// so the connection closes after it.
		log.Debug("sending the request failed; looking for the backend's answer", "ep", d.Endpoint, "addr", d.Addr, "err", sendErr)
		headWait = min(headWait, sentAnswerWait)
	}
	resp, err := x.ReadResponse(bc, time.Now().Add(headWait))
	hw.Stop()
	if err != nil {
		if reused && staleConn(ctx, hw, err) {
			return exchangeEnd{stale: true}
		}
		return f.noHead(x, d, hw, sent, sendErr, err)
	}
	rec.TTFB = resp.FirstByte.Sub(sent)
	x.TTFB(d.Endpoint, rec.TTFB)
	decision := ""
	if x.DecisionHeader() {
		decision = DecisionHeaderValue(d)
	}
	_, keep := x.Relay(ctx, resp, decision, lim.StreamSilence)
	if sendErr != nil {
		resp.reusable = false // the engine answered before taking the whole request
	}
	return exchangeEnd{keep: keep, resp: resp}
}

// staleConn reports whether err, the failure of a reused pooled connection
// before any response byte, says the engine had closed it (EOF, reset,
// broken pipe, a TLS alert) rather than that the client left, the endpoint
// went down, the server is cancelled or the engine is slow.
func staleConn(ctx context.Context, hw *HeadWatch, err error) bool {
	var bad *BadResponseError
	return ctx.Err() == nil && !hw.ClientLeft() && !hw.EndpointDown() && !IsTimeout(err) && !errors.As(err, &bad)
}

// noHead answers a request whose backend sent no usable response head.
func (f *forward) noHead(x *Exchange, d Decision, hw *HeadWatch, sent time.Time, sendErr, err error) exchangeEnd {
	keep, down := f.noHeadAnswer(x, d, hw, sent, sendErr, err)
	return exchangeEnd{keep: keep, down: down}
}

func (f *forward) noHeadAnswer(x *Exchange, d Decision, hw *HeadWatch, sent time.Time, sendErr, err error) (keep, down bool) {
	log := x.s.log
	var bad *BadResponseError
	switch {
	case hw.ClientLeft():
		// First: a head read cut by the departure is not the backend's fault.
		log.Debug("client left before the response head; backend connection closed", "ep", d.Endpoint)
		x.Record.Outcome = OutcomeClientGone
		return false, false
	case errors.As(err, &bad):
		x.Record.TTFB = bad.FirstByte.Sub(sent)
		x.TTFB(d.Endpoint, x.Record.TTFB)
		log.Info("backend sent a malformed response head", "ep", d.Endpoint, "addr", d.Addr, "err", bad.Err)
		return x.Failf(502, "backend_bad_response", "endpoint %d sent a malformed response head: %v", d.Endpoint, bad.Err), false
	case hw.EndpointDown():
		return false, true
	case sendErr != nil:
		log.Info("sending the request to the backend failed", "ep", d.Endpoint, "addr", d.Addr, "err", sendErr)
		return x.Failf(502, "backend_error", "sending the request to endpoint %d failed", d.Endpoint), false
	case IsTimeout(err):
		return x.Failf(504, "backend_timeout", "endpoint %d sent no response within %s", d.Endpoint, x.Limits().ResponseHeaderTimeout), false
	}
	log.Info("backend closed without a response", "ep", d.Endpoint, "addr", d.Addr, "err", err)
	return x.Failf(502, "backend_error", "endpoint %d closed without a response", d.Endpoint), false
}
