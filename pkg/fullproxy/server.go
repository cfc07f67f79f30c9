// Package fullproxy is kvgate's data plane for one load-balancer rule: an
// HTTP/1.1 connection server on the rule's externalIP:port. It reads each
// client request under limits and hands it, as an Exchange, to the rule's
// Handler; the exchange is the one seam between the connection and the
// request flow: it dials backends, writes request and response heads, runs
// the body leg, answers errors, and accounts loads and connect failures.
//
// Files by job: server.go (listener, connection lifecycle, reading
// requests, shutdown), exchange.go (the Handler seam and what a handler can
// do), forward.go (the plain single-leg forward, a Handler built on the
// exchange), record.go (the per-request Record, the typed Outcome, the
// access log), loads.go (in-flight accounting), config.go (limits and
// configuration). The HTTP/1.1 wire code lives in internal/http1; retries
// follow package attempt.
//
// Request path, as a chain of small stages:
//
//	read head    (limits: MaxHeaderBytes → 431, HeaderTimeout/IdleTimeout)
//	read body    (Content-Length or chunked; MaxBodyBytes → 413; BodyTimeout;
//	              bodies above InspectBytes stream to the backend unread)
//	handle       (Handler.Serve; the plain forward routes with Router,
//	              retrying through an attempt.Loop of at most MaxAttempts)
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
// 503, backend_unreachable 502, backend_bad_response 502, backend_timeout 504,
// endpoint_down 503 (the probe marked the endpoint down before it answered;
// headwait.go).
//
// Knobs: see Limits. Observability: see Observer (the daemon wires it to
// pkg/metrics) and the access log (Config.AccessLog).
package fullproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/fullproxy/internal/http1"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

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

	// waits are the backend waits without a response byte, per endpoint
	// (headwait.go).
	waits headWaits
	// pool keeps idle backend connections (nil: none; pool.go), and poolObs
	// hears how each request got its connection (nil: nobody).
	pool    *backendPool
	poolObs PoolObserver
}

// Listen binds the rule's address (with IP_FREEBIND) and returns a Server;
// call Serve to accept.
func Listen(cfg Config) (*Server, error) {
	if cfg.Handler == nil {
		return nil, errors.New("fullproxy: config has no Handler")
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
	if cfg.Pool != nil {
		s.pool = newBackendPool(*cfg.Pool)
		s.poolObs, _ = s.obs.(PoolObserver)
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
		c := s.newClientConn(nc)
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
	// Idle engine connections close now; those of requests still running
	// close when their requests end (the pool is closed to them).
	s.closeIdleBackends()

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
	// tls is the connection's TLS side on a TLS rule (nc is then tls), nil
	// on a plain one.
	tls *tls.Conn
}

// newClientConn wraps an accepted connection; on a TLS rule the client's
// bytes are read and written through TLS from here on.
func (s *Server) newClientConn(nc net.Conn) *clientConn {
	c := &clientConn{nc: nc}
	if s.cfg.TLS != nil {
		c.tls = s.cfg.TLS.Wrap(nc)
		c.nc = c.tls
	}
	c.br = bufio.NewReaderSize(c.nc, 16<<10)
	return c
}

func (s *Server) serveConn(c *clientConn) {
	defer s.untrack(c)
	defer c.nc.Close()
	if c.tls != nil {
		if err := s.cfg.TLS.Handshake(s.ctx, c.tls); err != nil {
			answerPlainHTTP(err)
			return
		}
	}
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
		if !s.serveRequest(c, req) {
			return
		}
	}
}

// refuse answers a request the proxy could not read, then the connection closes.
func (s *Server) refuse(c *clientConn, err error) {
	var he *http1.Error
	switch {
	case errors.As(err, &he):
	case errors.Is(err, os.ErrDeadlineExceeded):
		he = &http1.Error{Status: 408, Code: "request_timeout", Detail: "request not received in time"}
	default:
		return // the client went away mid-request: nobody to answer
	}
	s.log.Debug("refused request", "remote", c.nc.RemoteAddr().String(), "status", he.Status, "detail", he.Detail)
	_ = s.writeError(c.nc, he.Status, he.Code, he.Detail, false)
	rec := &Record{Service: s.cfg.Service, Remote: c.nc.RemoteAddr().String(), Status: he.Status, Outcome: OutcomeClientError, Code: he.Code}
	s.obs.Done(rec)
	s.accessLog(rec)
}

// readRequest reads the head and, unless it is above the inspection limit,
// the whole body.
func (s *Server) readRequest(c *clientConn) (*Request, error) {
	head, err := http1.ReadHead(c.br, s.lim.MaxHeaderBytes)
	if err != nil {
		return nil, err
	}
	h, err := http1.ParseRequestHead(head)
	if err != nil {
		return nil, err
	}
	req := newRequest(h, c.nc.RemoteAddr())
	if req.ContentLength > s.lim.MaxBodyBytes {
		return nil, http1.ErrBodyTooLarge
	}
	if req.ExpectContinue && (req.Chunked || req.ContentLength > 0) {
		_ = c.nc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
		if _, err := io.WriteString(c.nc, http1.Continue); err != nil {
			return nil, err
		}
		_ = c.nc.SetWriteDeadline(time.Time{})
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(s.lim.BodyTimeout))

	var body io.Reader
	switch {
	case req.Chunked:
		body = &http1.LimitedBody{R: http1.NewChunkedReader(c.br), N: s.lim.MaxBodyBytes}
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

// serveRequest hands one request to the handler and reports whether the
// client connection may carry another. The record is reported whatever the
// handler did.
func (s *Server) serveRequest(c *clientConn, req *Request) bool {
	start := time.Now()
	rec := &Record{Service: s.cfg.Service, Method: req.Method, Path: req.Path(), Remote: c.nc.RemoteAddr().String(),
		Inspected: req.BodyInspected, ReqBytes: int64(len(req.Body)), TraceID: traceID(req.Get("traceparent"))}
	defer func() {
		rec.Duration = time.Since(start)
		s.obs.Done(rec)
		s.accessLog(rec)
	}()
	return s.cfg.Handler.Serve(s.ctx, &Exchange{Req: req, Record: rec, s: s, c: c})
}

// writeError writes kvgate's error shape to the client within the write
// timeout.
func (s *Server) writeError(w net.Conn, status int, code, detail string, keep bool, extra ...HeaderField) error {
	head, body := http1.ErrorResponse(status, code, detail, keep, extra...)
	_ = w.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
	defer w.SetWriteDeadline(time.Time{})
	bufs := net.Buffers{head, body}
	_, err := bufs.WriteTo(w)
	return err
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

// answerPlainHTTP answers a client that spoke plain HTTP to a TLS port with
// a 400 in kvgate's error shape, as Go's own HTTPS server does, on the raw
// connection the failed handshake reports (docs/security.md, threat model:
// other clients of a TLS rule); any other handshake error gets no answer.
func answerPlainHTTP(err error) {
	var re tls.RecordHeaderError
	if !errors.Is(err, tlsterm.ErrPlainHTTP) || !errors.As(err, &re) || re.Conn == nil {
		return
	}
	head, body := http1.ErrorResponse(400, "bad_request", "this port speaks HTTPS; the client sent a plain HTTP request", false)
	_ = re.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = re.Conn.Write(append(head, body...))
}
