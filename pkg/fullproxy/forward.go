package fullproxy

// The plain single-leg forward: route, connect (retrying through an
// attempt.Loop), send the request, relay the answer. It is a Handler built
// only on Exchange calls, the same ones package pd's two-leg flow uses.

import (
	"context"
	"errors"
	"fmt"
	"net"
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
// Ended when the request is over, whatever its outcome.
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
	req, rec := x.Req, x.Record
	lim := x.Limits()
	plan := f.router.Plan(ctx, req)
	loop := x.Attempts(lim.MaxAttempts, f.breaker)
	var (
		d       Decision
		routed  bool // an endpoint was tried
		dialErr error
	)
	for loop.Next() {
		rec.Attempts = loop.Tries()
		nd, err := plan.Route(ctx, loop.Excluded())
		if err != nil {
			if routed {
				plan.Finish(d, false)
				return x.Failf(502, "backend_unreachable", "no endpoint accepted a connection (tried %v)", rec.ConnectErr)
			}
			x.s.log.Debug("no backend", "err", err)
			return x.Fail(503, "no_healthy_backend", "no eligible endpoint for this request")
		}
		if !loop.Admit(nd.Endpoint) {
			continue // the breaker refuses: another endpoint, this try spent
		}
		d, routed = nd, true
		rec.Decision, rec.Routed = d, true
		x.IncLoad(d.Endpoint)
		bc, err := x.Dial(ctx, d.Addr)
		if err == nil {
			plan.Finish(d, true)
			if bt, ok := plan.(BodyTracker); ok {
				x.firstBody = bt.FirstBody
				defer bt.Ended()
			}
			defer x.DecLoad(d.Endpoint)
			defer bc.Close()
			stop := CloseOnCancel(ctx, bc)
			defer stop()
			return f.exchange(ctx, x, loop, d, bc)
		}
		x.DecLoad(d.Endpoint)
		x.s.log.Warn("backend connect failed; re-routing without it", "ep", d.Endpoint, "addr", d.Addr, "err", err)
		loop.ConnectFailed(d.Endpoint)
		dialErr = err
		if ctx.Err() != nil {
			break
		}
	}
	if !routed {
		return x.Fail(503, "no_healthy_backend", "no eligible endpoint for this request")
	}
	plan.Finish(d, false)
	x.s.log.Info("no endpoint accepted a connection", "ep", d.Endpoint, "addr", d.Addr, "err", dialErr)
	return x.Failf(502, "backend_unreachable", "connect to endpoint %d failed", d.Endpoint)
}

// sentAnswerWait bounds the wait for a backend's answer after sending the
// request to it failed: an engine that refused the body has answered already.
const sentAnswerWait = 2 * time.Second

// exchange sends the request on the connected bc and relays the answer.
// The endpoint's breaker hears the status of every answer that arrived,
// malformed heads and broken bodies included (origin errors), once the
// request ends. Error
// details name the endpoint by index; addresses go to the log only.
func (f *forward) exchange(ctx context.Context, x *Exchange, loop *attempt.Loop, d Decision, bc net.Conn) bool {
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
	sent := time.Now()
	headWait := lim.ResponseHeaderTimeout
	sendErr := x.Forward(bc)
	if sendErr != nil {
		var re *RequestError
		switch {
		case errors.As(sendErr, &re): // the client's body broke its framing or limit
			_ = bc.Close() // the backend must not take the partial body for a request
			return x.Fail(re.Status(), re.Code(), re.Detail())
		case x.ClientGone(sendErr):
			rec.Outcome = OutcomeClientGone
			return false
		}
		// An engine that refuses a streamed body (413) answers and closes
		// before reading it: its answer is already on the socket, so relay it
		// rather than the broken pipe. The client's body is not fully read,
		// so the connection closes after it.
		log.Debug("sending the request failed; looking for the backend's answer", "ep", d.Endpoint, "addr", d.Addr, "err", sendErr)
		headWait = min(headWait, sentAnswerWait)
	}
	resp, err := x.ReadResponse(bc, time.Now().Add(headWait))
	if err != nil {
		var bad *BadResponseError
		switch {
		case errors.As(err, &bad):
			rec.TTFB = bad.FirstByte.Sub(sent)
			x.TTFB(d.Endpoint, rec.TTFB)
			log.Info("backend sent a malformed response head", "ep", d.Endpoint, "addr", d.Addr, "err", bad.Err)
			return x.Failf(502, "backend_bad_response", "endpoint %d sent a malformed response head: %v", d.Endpoint, bad.Err)
		case sendErr != nil:
			log.Info("sending the request to the backend failed", "ep", d.Endpoint, "addr", d.Addr, "err", sendErr)
			return x.Failf(502, "backend_error", "sending the request to endpoint %d failed", d.Endpoint)
		case IsTimeout(err):
			return x.Failf(504, "backend_timeout", "endpoint %d sent no response within %s", d.Endpoint, lim.ResponseHeaderTimeout)
		}
		log.Info("backend closed without a response", "ep", d.Endpoint, "addr", d.Addr, "err", err)
		return x.Failf(502, "backend_error", "endpoint %d closed without a response", d.Endpoint)
	}
	rec.TTFB = resp.FirstByte.Sub(sent)
	x.TTFB(d.Endpoint, rec.TTFB)
	decision := ""
	if x.DecisionHeader() {
		decision = DecisionHeaderValue(d)
	}
	_, keep := x.Relay(ctx, resp, decision, lim.StreamSilence)
	return keep
}
