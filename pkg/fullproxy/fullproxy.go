// Package fullproxy is kvgate's data plane for one load-balancer rule: an
// HTTP/1.1 listener on the rule's externalIP:port that reads each client
// request under limits, asks a Router for the endpoint, forwards the request
// on a fresh backend connection, and hands the response to the body leg.
//
// Request path, as a chain of small stages:
//
//	read head    (limits: MaxHeaderBytes → 431, HeaderTimeout/IdleTimeout)
//	read body    (Content-Length or chunked; MaxBodyBytes → 413; BodyTimeout;
//	              bodies above InspectBytes stream to the backend unread)
//	route        (Router.Route; retried with the failed endpoint excluded on
//	              a connect failure, at most MaxAttempts times)
//	forward      (one backend connection per request, "Connection: close";
//	              framing rewritten by the proxy: Content-Length, or chunked
//	              for streamed bodies)
//	response     (userspace reads the status line and headers, records the
//	              time to first byte and the status, writes them to the client)
//	body leg     (datapath.BodyLeg: userspace copy, or the kernel splice)
//
// Load accounting: Loads counts in-flight requests per endpoint from the
// decision to the end of the body leg. The count falls on every exit path
// (client gone, backend error, timeout, shutdown); tests assert it reads 0 at
// rest.
//
// Errors kvgate answers itself share one body shape,
// {"error":"<code>","detail":"…"}: bad_request 400, request_header_too_large
// 431, request_body_too_large 413, request_timeout 408, no_healthy_backend
// 503, backend_unreachable 502, backend_bad_response 502, backend_timeout 504.
//
// Knobs: see Limits. Observability: see Observer (the daemon wires it to
// pkg/metrics) and the access log (Config.AccessLog).
package fullproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/epset"
)

// Limits bound every size and every wait of the proxy. Zero fields take the
// defaults of DefaultLimits.
type Limits struct {
	MaxHeaderBytes int   // request head, else 431 (64 KiB)
	MaxBodyBytes   int64 // request body, else 413 (64 MiB)
	InspectBytes   int64 // bodies above this are forwarded uninspected (16 MiB)

	IdleTimeout   time.Duration // keep-alive wait for the next request (120 s)
	HeaderTimeout time.Duration // reading one request head (10 s)
	BodyTimeout   time.Duration // reading one request body (120 s)

	ConnectTimeout        time.Duration // backend dial (3 s)
	MaxAttempts           int           // routing attempts per request, connect failures included (3)
	ResponseHeaderTimeout time.Duration // backend time to first response byte (600 s: a long prefill)
	StreamSilence         time.Duration // body leg ends after this long without a byte (300 s)
	WriteTimeout          time.Duration // writing a request to the backend or a head to the client (60 s)

	MaxConns int // concurrent client connections; beyond it new ones are closed (10000)
}

// DefaultLimits are the limits used for zero fields.
var DefaultLimits = Limits{
	MaxHeaderBytes:        64 << 10,
	MaxBodyBytes:          64 << 20,
	InspectBytes:          16 << 20,
	IdleTimeout:           120 * time.Second,
	HeaderTimeout:         10 * time.Second,
	BodyTimeout:           120 * time.Second,
	ConnectTimeout:        3 * time.Second,
	MaxAttempts:           3,
	ResponseHeaderTimeout: 600 * time.Second,
	StreamSilence:         300 * time.Second,
	WriteTimeout:          60 * time.Second,
	MaxConns:              10000,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxHeaderBytes > 0 {
		d.MaxHeaderBytes = l.MaxHeaderBytes
	}
	if l.MaxBodyBytes > 0 {
		d.MaxBodyBytes = l.MaxBodyBytes
	}
	if l.InspectBytes > 0 {
		d.InspectBytes = l.InspectBytes
	}
	if d.InspectBytes > d.MaxBodyBytes {
		d.InspectBytes = d.MaxBodyBytes
	}
	for _, p := range []struct{ dst, src *time.Duration }{
		{&d.IdleTimeout, &l.IdleTimeout}, {&d.HeaderTimeout, &l.HeaderTimeout}, {&d.BodyTimeout, &l.BodyTimeout},
		{&d.ConnectTimeout, &l.ConnectTimeout}, {&d.ResponseHeaderTimeout, &l.ResponseHeaderTimeout},
		{&d.StreamSilence, &l.StreamSilence}, {&d.WriteTimeout, &l.WriteTimeout},
	} {
		if *p.src > 0 {
			*p.dst = *p.src
		}
	}
	if l.MaxAttempts > 0 {
		d.MaxAttempts = l.MaxAttempts
	}
	if l.MaxConns > 0 {
		d.MaxConns = l.MaxConns
	}
	return d
}

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
	// Decode is the decode endpoint a P/D (mode 1) decision pairs with the
	// prefill Endpoint, -1 otherwise; DecodeAddr is its dial address. The
	// two-leg P/D exchange (docs/pd.md) reads them; the single-leg forward
	// ignores them.
	Decode     int
	DecodeAddr string
	Tier       string // "1", "1.5", "2" or "sel" (mode-3 rule selector)
	Reason     string // "hit", or the guard miss reason that sent it to the fallback
	Score      int    // matched blocks
	Model      string
	// PromptTokens and Blocks describe the hashed prompt (0 when none).
	PromptTokens int
	Blocks       int
	Stages       []Stage
}

// ErrNoBackend is returned by a Router that has no eligible endpoint left.
var ErrNoBackend = errors.New("no healthy backend")

// Router decides where requests go. It must be safe for concurrent use.
type Router interface {
	// Route picks the endpoint for req, skipping every endpoint in excluded
	// (endpoints that refused a connection for this request). It returns
	// ErrNoBackend (possibly wrapped) when none is eligible.
	Route(ctx context.Context, req *Request, excluded epset.Set) (Decision, error)
	// Finish is called exactly once for every request Route was called for,
	// with the last decision and whether the proxy connected to it. Routers
	// count hits and misses here, so a request counts once across retries.
	Finish(req *Request, d Decision, connected bool)
}

// Record describes one finished request, for metrics and the access log.
type Record struct {
	Service    string
	Method     string
	Path       string
	Remote     string
	Decision   Decision
	Routed     bool   // a decision was made
	Status     int    // status sent to the client (0 when none was sent)
	Outcome    string // ok, client_error, no_backend, backend_unreachable, backend_error, backend_timeout, client_gone, silence, cancelled
	TTFB       time.Duration
	Duration   time.Duration
	BodyBytes  int64
	Datapath   string // body leg implementation: userspace or sockmap
	Attempts   int
	Inspected  bool
	ReqBytes   int64
	ConnectErr []int // endpoints that failed to connect
}

// Observer receives what the proxy measures. The daemon implements it on top
// of pkg/metrics; every method must be cheap and safe for concurrent use.
type Observer interface {
	// ConnectFailed: a backend dial to ep failed and the request was re-routed
	// (feeds loxilb_pd_connect_failover_total).
	ConnectFailed(service string, ep int)
	// TTFB: the backend's time to first response byte (loxilb_proxy_http_ttfb_seconds).
	TTFB(service string, ep int, d time.Duration)
	// Inflight: ep's in-flight count changed to n (kvgate_endpoint_inflight).
	Inflight(service string, ep, n int)
	// Done: one request finished (request count and duration per endpoint and
	// outcome; decision stage latencies).
	Done(r *Record)
}

// NopObserver discards everything.
type NopObserver struct{}

func (NopObserver) ConnectFailed(string, int)       {}
func (NopObserver) TTFB(string, int, time.Duration) {}
func (NopObserver) Done(*Record)                    {}
func (NopObserver) Inflight(string, int, int)       {}

// Config configures one rule's proxy.
type Config struct {
	// Service names the rule in logs and metrics (its service_id).
	Service string
	// Addr is the listen address, externalIP:port. IP_FREEBIND lets it bind
	// before the VIP is configured on the host.
	Addr   string
	Router Router
	// Leg moves response bodies; nil means the userspace copy.
	Leg datapath.BodyLeg
	// Loads is the in-flight count per endpoint; nil makes a private one.
	Loads    *Loads
	Observer Observer
	Limits   Limits
	// DecisionHeader adds x-kvgate-decision to every proxied response.
	DecisionHeader bool
	// AccessLog, when set, gets one line per request.
	AccessLog *slog.Logger
	Logger    *slog.Logger
	// Dial overrides the backend dialer (tests); nil uses net.Dialer.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// DialControl, when set, is the default dialer's net.Dialer.Control: it
	// runs on each backend socket before connect(). The daemon uses it to tag
	// backend sockets for the BPF load map (splice.Datapath.TagBackend).
	DialControl func(network, address string, c syscall.RawConn) error
	// PD, for a pd_disagg_mode rule, serves requests through the two-leg
	// prefill/decode flow (pd_hook.go); nil means the plain path only.
	PD PDHandler
	// Guard recovers a panic in one connection's handling (the connection
	// closes, the proxy keeps serving); nil still recovers, uncounted.
	Guard *recovery.Guard
}

// Server is one rule's listener and its connections.
type Server struct {
	cfg    Config
	lim    Limits
	ln     net.Listener
	leg    datapath.BodyLeg
	loads  *Loads
	obs    Observer
	log    *slog.Logger
	dial   func(ctx context.Context, addr string) (net.Conn, error)
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	conns    map[*clientConn]struct{}
	draining bool
	wg       sync.WaitGroup
	served   chan struct{}
	nConns   atomic.Int64
}

// Listen binds the rule's address (with IP_FREEBIND) and returns a Server;
// call Serve to accept.
func Listen(cfg Config) (*Server, error) {
	if cfg.Router == nil {
		return nil, errors.New("fullproxy: config has no Router")
	}
	lc := net.ListenConfig{Control: freebind}
	ln, err := lc.Listen(context.Background(), "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("fullproxy: listen %s: %w", cfg.Addr, err)
	}
	return newServer(cfg, ln), nil
}

func newServer(cfg Config, ln net.Listener) *Server {
	s := &Server{cfg: cfg, lim: cfg.Limits.withDefaults(), ln: ln, leg: cfg.Leg, loads: cfg.Loads,
		obs: cfg.Observer, log: cfg.Logger, conns: map[*clientConn]struct{}{}, served: make(chan struct{})}
	if s.leg == nil {
		s.leg = datapath.NewUserspace(0)
	}
	if s.loads == nil {
		s.loads = &Loads{}
	}
	if s.obs == nil {
		s.obs = NopObserver{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("service", cfg.Service, "listen", ln.Addr().String())
	s.dial = cfg.Dial
	if s.dial == nil {
		d := &net.Dialer{Timeout: s.lim.ConnectTimeout, Control: cfg.DialControl}
		s.dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Addr is the bound listen address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Loads returns the server's in-flight counts.
func (s *Server) Loads() *Loads { return s.loads }

// Serve accepts connections until Shutdown or Close. It returns nil after a
// shutdown, or the accept error.
func (s *Server) Serve() error {
	defer close(s.served)
	backoff := 5 * time.Millisecond
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.isDraining() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				s.log.Warn("accept failed; backing off", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				backoff = min(backoff*2, time.Second)
				continue
			}
			return fmt.Errorf("fullproxy: accept: %w", err)
		}
		backoff = 5 * time.Millisecond
		if s.nConns.Load() >= int64(s.lim.MaxConns) {
			s.log.Warn("connection limit reached; closing new connection", "limit", s.lim.MaxConns)
			nc.Close()
			continue
		}
		c := &clientConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10)}
		if !s.track(c) {
			nc.Close()
			continue
		}
		s.cfg.Guard.Go(recovery.Conn, func() { s.serveConn(c) })
	}
}

func (s *Server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

func (s *Server) track(c *clientConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.nConns.Add(1)
	return true
}

func (s *Server) untrack(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.nConns.Add(-1)
	s.wg.Done()
}

// Shutdown stops accepting, closes idle keep-alive connections, lets
// requests in flight finish until ctx ends, then cancels what is left. It
// returns ctx's error when it had to cancel.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	for c := range s.conns {
		if c.idle.Load() {
			_ = c.nc.SetReadDeadline(time.Unix(1, 0))
		}
	}
	s.mu.Unlock()
	_ = s.ln.Close()

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.cancel()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// Close stops at once: in-flight requests are cancelled.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.Shutdown(ctx)
	return nil
}

type clientConn struct {
	nc   net.Conn
	br   *bufio.Reader
	idle atomic.Bool
}

func (s *Server) serveConn(c *clientConn) {
	defer s.untrack(c)
	defer c.nc.Close()
	for first := true; ; first = false {
		c.idle.Store(true)
		if s.isDraining() {
			return
		}
		wait := s.lim.IdleTimeout
		if first {
			wait = s.lim.HeaderTimeout
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		c.idle.Store(false)
		_ = c.nc.SetReadDeadline(time.Now().Add(s.lim.HeaderTimeout))
		req, err := s.readRequest(c)
		if err != nil {
			s.refuse(c, err)
			return
		}
		if !s.handle(c, req) {
			return
		}
	}
}

// refuse answers a request the proxy could not read, then the connection closes.
func (s *Server) refuse(c *clientConn, err error) {
	var he *httpError
	switch {
	case errors.As(err, &he):
	case errors.Is(err, os.ErrDeadlineExceeded):
		he = &httpError{status: 408, code: "request_timeout", detail: "request not received in time"}
	default:
		return // the client went away mid-request: nobody to answer
	}
	s.log.Debug("refused request", "remote", c.nc.RemoteAddr().String(), "status", he.status, "detail", he.detail)
	_ = writeError(c.nc, he.status, he.code, he.detail, false, s.lim.WriteTimeout)
	rec := &Record{Service: s.cfg.Service, Remote: c.nc.RemoteAddr().String(), Status: he.status, Outcome: "client_error"}
	s.obs.Done(rec)
	s.accessLog(rec)
}

// readRequest reads the head and, unless it is above the inspection limit,
// the whole body.
func (s *Server) readRequest(c *clientConn) (*Request, error) {
	head, err := readHead(c.br, s.lim.MaxHeaderBytes)
	if err != nil {
		return nil, err
	}
	req, err := parseHead(head)
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = c.nc.RemoteAddr()
	if req.ContentLength > s.lim.MaxBodyBytes {
		return nil, errBodyTooLarge
	}
	if req.ExpectContinue && (req.Chunked || req.ContentLength > 0) {
		_ = c.nc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
		if _, err := io.WriteString(c.nc, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return nil, err
		}
		_ = c.nc.SetWriteDeadline(time.Time{})
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(s.lim.BodyTimeout))

	var body io.Reader
	switch {
	case req.Chunked:
		body = &limitedBody{r: newChunkedReader(c.br), n: s.lim.MaxBodyBytes}
	case req.ContentLength > 0:
		body = io.LimitReader(c.br, req.ContentLength)
	default:
		req.Body, req.BodyInspected, req.bodyDone = []byte{}, true, true
		return req, nil
	}
	// Read up to the inspection limit; one byte more says it is above it.
	buf, err := io.ReadAll(io.LimitReader(body, s.lim.InspectBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) <= s.lim.InspectBytes {
		if !req.Chunked && int64(len(buf)) < req.ContentLength {
			return nil, io.ErrUnexpectedEOF
		}
		req.Body, req.BodyInspected, req.bodyDone = buf, true, true
		return req, nil
	}
	req.bodyPrefix, req.bodyRest = buf, body
	return req, nil
}

// sentAnswerWait bounds the wait for a backend's answer after sending the
// request to it failed: an engine that refused the body has answered already.
const sentAnswerWait = 2 * time.Second

// handle serves one request; it reports whether the client connection may
// carry another.
func (s *Server) handle(c *clientConn, req *Request) (keep bool) {
	start := time.Now()
	rec := &Record{Service: s.cfg.Service, Method: req.Method, Path: req.Path(), Remote: c.nc.RemoteAddr().String(),
		Inspected: req.BodyInspected, ReqBytes: int64(len(req.Body))}
	defer func() {
		rec.Duration = time.Since(start)
		s.obs.Done(rec)
		s.accessLog(rec)
	}()
	ctx := s.ctx
	if s.cfg.PD != nil {
		if keep, handled := s.servePD(ctx, c, req, rec); handled {
			return keep
		}
	}

	var (
		d        Decision
		bc       net.Conn
		excluded epset.Set
		routed   bool
	)
	for attempt := 1; ; attempt++ {
		rec.Attempts = attempt
		nd, err := s.cfg.Router.Route(ctx, req, excluded)
		if err != nil {
			if routed {
				s.cfg.Router.Finish(req, d, false)
				return s.fail(c, req, rec, 502, "backend_unreachable", fmt.Sprintf("no endpoint accepted a connection (tried %v)", rec.ConnectErr))
			}
			s.log.Debug("no backend", "err", err)
			return s.fail(c, req, rec, 503, "no_healthy_backend", "no eligible endpoint for this request")
		}
		d, routed = nd, true
		rec.Decision, rec.Routed = d, true
		s.incLoad(d.Endpoint)
		dctx, cancel := context.WithTimeout(ctx, s.lim.ConnectTimeout)
		bc, err = s.dial(dctx, d.Addr)
		cancel()
		if err == nil {
			break
		}
		s.decLoad(d.Endpoint)
		s.log.Warn("backend connect failed; re-routing without it", "ep", d.Endpoint, "addr", d.Addr, "err", err)
		s.obs.ConnectFailed(s.cfg.Service, d.Endpoint)
		rec.ConnectErr = append(rec.ConnectErr, d.Endpoint)
		excluded.Add(d.Endpoint)
		if attempt >= s.lim.MaxAttempts || ctx.Err() != nil {
			s.cfg.Router.Finish(req, d, false)
			return s.fail(c, req, rec, 502, "backend_unreachable", fmt.Sprintf("connect to endpoint %d failed", d.Endpoint))
		}
	}
	s.cfg.Router.Finish(req, d, true)
	defer s.decLoad(d.Endpoint)
	defer bc.Close()
	// A cancelled server (shutdown grace exhausted) unblocks every wait on the backend.
	stop := context.AfterFunc(ctx, func() { _ = bc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// Forward the request.
	sent := time.Now()
	headWait := s.lim.ResponseHeaderTimeout
	sendErr := s.forwardRequest(bc, req)
	if sendErr != nil {
		var he *httpError
		if errors.As(sendErr, &he) { // the client's body broke its framing or limit
			return s.fail(c, req, rec, he.status, he.code, he.detail)
		}
		if !req.bodyDone && clientSide(sendErr) {
			rec.Outcome = "client_gone"
			return false
		}
		// An engine that refuses a streamed body (413) answers and closes
		// before reading it: its answer is already on the socket, so relay it
		// rather than the broken pipe. The client's body is not fully read,
		// so the connection closes after it.
		s.log.Debug("sending the request failed; looking for the backend's answer", "ep", d.Endpoint, "addr", d.Addr, "err", sendErr)
		headWait = min(headWait, sentAnswerWait)
	}

	// Response head: userspace reads it, records TTFB and the status.
	bbr := bufio.NewReaderSize(bc, 16<<10)
	_ = bc.SetReadDeadline(time.Now().Add(headWait))
	if _, err := bbr.Peek(1); err != nil {
		if sendErr != nil {
			s.log.Info("sending the request to the backend failed", "ep", d.Endpoint, "addr", d.Addr, "err", sendErr)
			return s.fail(c, req, rec, 502, "backend_error", fmt.Sprintf("sending the request to endpoint %d failed", d.Endpoint))
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return s.fail(c, req, rec, 504, "backend_timeout", fmt.Sprintf("endpoint %d sent no response within %s", d.Endpoint, s.lim.ResponseHeaderTimeout))
		}
		s.log.Info("backend closed without a response", "ep", d.Endpoint, "addr", d.Addr, "err", err)
		return s.fail(c, req, rec, 502, "backend_error", fmt.Sprintf("endpoint %d closed without a response", d.Endpoint))
	}
	rec.TTFB = time.Since(sent)
	s.obs.TTFB(s.cfg.Service, d.Endpoint, rec.TTFB)
	_ = bc.SetReadDeadline(time.Now().Add(s.lim.WriteTimeout))
	rh, err := readResponseHead(bbr, s.lim.MaxHeaderBytes)
	if err != nil {
		s.log.Info("backend sent a malformed response head", "ep", d.Endpoint, "addr", d.Addr, "err", err)
		return s.fail(c, req, rec, 502, "backend_bad_response", fmt.Sprintf("endpoint %d sent a malformed response head: %v", d.Endpoint, err))
	}
	_ = bc.SetReadDeadline(time.Time{})
	rec.Status = rh.status

	keep = req.KeepAlive && req.bodyDone && rh.selfDelimited(req.Method) && !s.isDraining()
	decision := ""
	if s.cfg.DecisionHeader {
		decision = DecisionHeaderValue(d)
	}
	if err := s.writeHead(c.nc, s.responseHead(rh, req, decision, keep)); err != nil {
		rec.Outcome = "client_gone"
		return false
	}

	if rh.bodyless(req.Method) {
		rec.Outcome = "ok"
		return keep
	}
	res := s.relayBody(ctx, c.nc, bc, bbr, rh, s.lim.StreamSilence)
	rec.BodyBytes, rec.Datapath = res.Bytes, res.Path
	switch res.Ending {
	case datapath.BackendEOF:
		rec.Outcome = "ok"
		if rh.truncated(res) {
			rec.Outcome, keep = "backend_error", false // the client cannot find the end
		}
	case datapath.ClientGone:
		rec.Outcome, keep = "client_gone", false
	case datapath.BackendBroken: // cut before its framing ended (docs/body-leg.md)
		rec.Outcome, keep = "backend_broken", false
	case datapath.Silence:
		rec.Outcome, keep = "silence", false
	case datapath.Cancelled:
		rec.Outcome, keep = "cancelled", false
	default:
		rec.Outcome, keep = "backend_error", false
	}
	return keep
}

// writeHead writes a response head to the client within the write timeout.
func (s *Server) writeHead(client net.Conn, head []byte) error {
	_ = client.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
	if _, err := client.Write(head); err != nil {
		return err
	}
	_ = client.SetWriteDeadline(time.Time{})
	return nil
}

// relayBody hands the response body to the body leg: what br has already
// buffered first (at most the declared length), then the rest from bc, each
// read within silence.
func (s *Server) relayBody(ctx context.Context, client, bc net.Conn, br *bufio.Reader, rh *responseHead, silence time.Duration) datapath.Result {
	prefix, _ := br.Peek(br.Buffered())
	if rh.contentLength >= 0 && int64(len(prefix)) > rh.contentLength {
		prefix = prefix[:rh.contentLength]
	}
	return s.leg.Run(ctx, client, bc, prefix, datapath.Options{
		Silence:       silence,
		Streamed:      rh.chunked || rh.eventStream,
		TokenStream:   rh.eventStream || rh.ndjson,
		ContentLength: rh.contentLength,
		Chunked:       rh.chunked,
		EventStream:   rh.eventStream,
	})
}

// clientSide reports whether err came from reading the client's body.
func clientSide(err error) bool {
	var ce *clientReadError
	return errors.As(err, &ce)
}

type clientReadError struct{ err error }

func (e *clientReadError) Error() string { return "reading the client body: " + e.err.Error() }
func (e *clientReadError) Unwrap() error { return e.err }

// fail answers the client with kvgate's error shape plus extra headers. The
// connection stays open only when the request body was fully read.
func (s *Server) fail(c *clientConn, req *Request, rec *Record, status int, code, detail string, extra ...HeaderField) bool {
	keep := req.KeepAlive && req.bodyDone && !s.isDraining()
	rec.Status = status
	if rec.Outcome == "" {
		rec.Outcome = code
	}
	if safe := redactAddrs(detail); safe != detail {
		s.log.Info("request failed", "status", status, "code", code, "detail", detail)
		detail = safe
	}
	if err := writeError(c.nc, status, code, detail, keep, s.lim.WriteTimeout, extra...); err != nil {
		return false
	}
	return keep
}

// forwardRequest writes the request to the backend: the client's headers
// minus hop-by-hop ones, framing rewritten, "Connection: close".
func (s *Server) forwardRequest(bc net.Conn, req *Request) error {
	_ = bc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
	defer bc.SetWriteDeadline(time.Time{})
	var b strings.Builder
	b.Grow(512)
	writeRequestHead(&b, req, bc, nil)
	b.WriteString("Connection: close\r\n")
	if req.BodyInspected {
		b.WriteString("Content-Length: ")
		b.WriteString(strconv.Itoa(len(req.Body)))
		b.WriteString("\r\n\r\n")
		bufs := net.Buffers{[]byte(b.String()), req.Body}
		_, err := bufs.WriteTo(bc)
		return err
	}
	// Uninspected: stream with the client's length, or chunked.
	if req.Chunked {
		b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	} else {
		b.WriteString("Content-Length: ")
		b.WriteString(strconv.FormatInt(req.ContentLength, 10))
		b.WriteString("\r\n\r\n")
	}
	if _, err := io.WriteString(bc, b.String()); err != nil {
		return err
	}
	return s.streamBody(bc, req)
}

// writeRequestHead writes the request line and the client's headers for
// backend bc: hop-by-hop ones, those its Connection header names, framing,
// Expect, X-Forwarded-For and those in drop (lower case) left out; Host added
// when the client sent none; X-Forwarded-For extended with the client's
// address. The caller adds framing and ends the head.
func writeRequestHead(b *strings.Builder, req *Request, bc net.Conn, drop map[string]bool) {
	b.WriteString(req.Method)
	b.WriteByte(' ')
	b.WriteString(req.Target)
	b.WriteString(" HTTP/1.1\r\n")
	named := connectionNamed(req.Header)
	delete(named, "host") // Host is end-to-end: a Connection header naming it must not strip it
	hasHost := false
	for _, h := range req.Header {
		ln := strings.ToLower(h.Name)
		if hopByHop[ln] || named[ln] || drop[ln] || ln == "content-length" || ln == "transfer-encoding" || ln == "expect" || ln == "x-forwarded-for" {
			continue
		}
		if ln == "host" {
			hasHost = true
		}
		writeHeader(b, h.Name, h.Value)
	}
	if !hasHost {
		writeHeader(b, "Host", bc.RemoteAddr().String())
	}
	if host, _, err := net.SplitHostPort(req.RemoteAddr.String()); err == nil {
		if prior := req.Get("X-Forwarded-For"); prior != "" {
			host = prior + ", " + host
		}
		writeHeader(b, "X-Forwarded-For", host)
	}
}

// writeHeader writes one "Name: value" header line.
func writeHeader(b *strings.Builder, name, value string) {
	b.WriteString(name)
	b.WriteString(": ")
	b.WriteString(value)
	b.WriteString("\r\n")
}

// streamBody forwards an uninspected body without buffering it.
func (s *Server) streamBody(bc net.Conn, req *Request) error {
	buf := make([]byte, 32<<10)
	writeChunk := func(p []byte) error {
		_ = bc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
		if req.Chunked {
			if _, err := fmt.Fprintf(bc, "%x\r\n", len(p)); err != nil {
				return err
			}
		}
		if _, err := bc.Write(p); err != nil {
			return err
		}
		if req.Chunked {
			_, err := io.WriteString(bc, "\r\n")
			return err
		}
		return nil
	}
	if err := writeChunk(req.bodyPrefix); err != nil {
		return err
	}
	total := int64(len(req.bodyPrefix))
	for {
		n, rerr := req.bodyRest.Read(buf)
		if n > 0 {
			total += int64(n)
			if err := writeChunk(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			var he *httpError
			if errors.As(rerr, &he) {
				return he
			}
			return &clientReadError{rerr}
		}
	}
	if !req.Chunked && total < req.ContentLength {
		return &clientReadError{io.ErrUnexpectedEOF}
	}
	req.bodyDone = true
	if req.Chunked {
		_, err := io.WriteString(bc, "0\r\n\r\n")
		return err
	}
	return nil
}

// responseHead renders the head the client gets: the backend's status and
// headers (framing kept, since the body passes verbatim), the proxy's own
// Connection header, and x-kvgate-decision when enabled and decision (its
// value) is not empty.
func (s *Server) responseHead(rh *responseHead, req *Request, decision string, keep bool) []byte {
	var b strings.Builder
	b.Grow(512)
	b.WriteString("HTTP/1.1 ")
	b.WriteString(strconv.Itoa(rh.status))
	b.WriteByte(' ')
	b.WriteString(rh.reason)
	b.WriteString("\r\n")
	named := connectionNamed(rh.header)
	for _, h := range rh.header {
		ln := strings.ToLower(h.Name)
		if ln == "connection" || ln == "keep-alive" || ln == "proxy-connection" || ln == "upgrade" || named[ln] {
			continue
		}
		writeHeader(&b, h.Name, h.Value)
	}
	if s.cfg.DecisionHeader && decision != "" {
		writeHeader(&b, "x-kvgate-decision", decision)
	}
	endResponseHead(&b, req, keep)
	return []byte(b.String())
}

// endResponseHead writes the proxy's Connection header and the blank line:
// HTTP/1.1 clients keep the connection by default, HTTP/1.0 ones are told.
func endResponseHead(b *strings.Builder, req *Request, keep bool) {
	if keep {
		if req.Minor == 0 {
			b.WriteString("Connection: keep-alive\r\n")
		}
	} else {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("\r\n")
}

// DecisionHeaderValue renders a decision as x-kvgate-decision shows it:
// "tier=1.5; ep=0; score=12; reason=hit".
func DecisionHeaderValue(d Decision) string {
	return fmt.Sprintf("tier=%s; ep=%d; score=%d; reason=%s", d.Tier, d.Endpoint, d.Score, d.Reason)
}

// ErrorBody is the JSON shape of every error kvgate answers itself.
type ErrorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

// writeError writes {"error":code,"detail":detail} with status and extra
// headers (Retry-After).
func writeError(w net.Conn, status int, code, detail string, keep bool, timeout time.Duration, extra ...HeaderField) error {
	body, _ := json.Marshal(ErrorBody{Error: code, Detail: detail})
	var b strings.Builder
	b.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + reasonPhrase(status) + "\r\nContent-Type: application/json\r\n")
	for _, h := range extra {
		writeHeader(&b, h.Name, h.Value)
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	if keep {
		b.WriteString("Connection: keep-alive\r\n\r\n")
	} else {
		b.WriteString("Connection: close\r\n\r\n")
	}
	_ = w.SetWriteDeadline(time.Now().Add(timeout))
	defer w.SetWriteDeadline(time.Time{})
	bufs := net.Buffers{[]byte(b.String()), body}
	_, err := bufs.WriteTo(w)
	return err
}

// reasonPhrase is the reason phrase of the statuses kvgate answers itself.
func reasonPhrase(code int) string {
	switch code {
	case 200:
		return "OK"
	case 429:
		return "Too Many Requests"
	}
	if t := statusText(code); t != "Error" {
		return t
	}
	switch {
	case code >= 200 && code < 300:
		return "OK"
	case code >= 400 && code < 500:
		return "Client Error"
	}
	return "Error"
}

func statusText(code int) string {
	switch code {
	case 400:
		return "Bad Request"
	case 408:
		return "Request Timeout"
	case 413:
		return "Content Too Large"
	case 417:
		return "Expectation Failed"
	case 431:
		return "Request Header Fields Too Large"
	case 502:
		return "Bad Gateway"
	case 503:
		return "Service Unavailable"
	case 504:
		return "Gateway Timeout"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Error"
}

func (s *Server) accessLog(r *Record) {
	if s.cfg.AccessLog == nil {
		return
	}
	d := r.Decision
	s.cfg.AccessLog.Info("request",
		"service", r.Service, "remote", r.Remote, "method", r.Method, "path", r.Path,
		"model", d.Model, "prompt_tokens", d.PromptTokens, "blocks", d.Blocks,
		"tier", d.Tier, "reason", d.Reason, "score", d.Score, "ep", epLabel(r), "endpoint", d.EndpointID,
		"attempts", r.Attempts, "status", r.Status, "outcome", r.Outcome,
		"ttfb_ms", float64(r.TTFB.Microseconds())/1000, "duration_ms", float64(r.Duration.Microseconds())/1000,
		"bytes", r.BodyBytes, "datapath", r.Datapath)
}

func epLabel(r *Record) int {
	if !r.Routed {
		return -1
	}
	return r.Decision.Endpoint
}

func (s *Server) incLoad(ep int) { s.obs.Inflight(s.cfg.Service, ep, s.loads.Inc(ep)) }
func (s *Server) decLoad(ep int) { s.obs.Inflight(s.cfg.Service, ep, s.loads.Dec(ep)) }

// Loads counts in-flight requests per endpoint (ep_idx). The zero value is
// ready; it is safe for concurrent use.
type Loads struct {
	n [epset.Max]atomic.Int64
}

// Inc adds one in-flight request to ep and returns the new count.
func (l *Loads) Inc(ep int) int {
	if uint(ep) < epset.Max {
		return int(l.n[ep].Add(1))
	}
	return 0
}

// Dec removes one in-flight request from ep and returns the new count.
func (l *Loads) Dec(ep int) int {
	if uint(ep) < epset.Max {
		return int(l.n[ep].Add(-1))
	}
	return 0
}

// InFlight is Load under the name selector.LoadSource uses.
func (l *Loads) InFlight(ep int) int { return l.Load(ep) }

// Load is ep's in-flight count.
func (l *Loads) Load(ep int) int {
	if uint(ep) < epset.Max {
		return int(l.n[ep].Load())
	}
	return 0
}

// Total is the sum over all endpoints.
func (l *Loads) Total() int {
	t := int64(0)
	for i := range l.n {
		t += l.n[i].Load()
	}
	return int(t)
}
