package fullproxy

// The P/D hook: a rule in pd_disagg_mode hands each request to a PDHandler
// (package pd implements it) before the plain routing path. The handler
// drives both legs through an Exchange, which gives it the proxy's framing,
// limits, load accounting, error shape and body leg, so a P/D request is
// bounded and observed exactly like a plain one.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// PDHandler serves the mode-1 (prefill/decode) flow of a rule.
type PDHandler interface {
	// ServePD serves x.Req completely (both legs and the client's answer)
	// and reports whether the client connection may carry another request.
	// handled false hands the request back to the plain path untouched
	// (bodyless or non-JSON requests, several prompts, n > 1).
	ServePD(ctx context.Context, x *Exchange) (keep, handled bool)
}

// Exchange is one P/D request's access to the proxy.
type Exchange struct {
	Req    *Request
	Record *Record
	s      *Server
	c      *clientConn
}

// servePD runs the P/D handler; handled false continues on the plain path.
func (s *Server) servePD(ctx context.Context, c *clientConn, req *Request, rec *Record) (keep, handled bool) {
	return s.cfg.PD.ServePD(ctx, &Exchange{Req: req, Record: rec, s: s, c: c})
}

// Limits are the proxy's limits.
func (x *Exchange) Limits() Limits { return x.s.lim }

// Service is the rule's service name.
func (x *Exchange) Service() string { return x.s.cfg.Service }

// Draining reports a shutdown in progress.
func (x *Exchange) Draining() bool { return x.s.isDraining() }

// IncLoad and DecLoad move ep's in-flight count (kvgate_endpoint_inflight);
// every IncLoad must be matched by one DecLoad.
func (x *Exchange) IncLoad(ep int) { x.s.incLoad(ep) }

// DecLoad: see IncLoad.
func (x *Exchange) DecLoad(ep int) { x.s.decLoad(ep) }

// ConnectFailed reports a failed backend dial (feeds the connect-failure
// and loxilb_pd_connect_failover_total counters).
func (x *Exchange) ConnectFailed(ep int) {
	x.s.obs.ConnectFailed(x.s.cfg.Service, ep)
	x.Record.ConnectErr = append(x.Record.ConnectErr, ep)
}

// TTFB reports a backend's time to first byte.
func (x *Exchange) TTFB(ep int, d time.Duration) { x.s.obs.TTFB(x.s.cfg.Service, ep, d) }

// Dial connects to a backend, bounded by ConnectTimeout and ctx. The
// connection is closed when the server is cancelled (shutdown grace spent).
func (x *Exchange) Dial(ctx context.Context, addr string) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, x.s.lim.ConnectTimeout)
	defer cancel()
	return x.s.dial(dctx, addr)
}

// WriteRequest sends the client's request to a backend with body in place of
// the client's: the client's headers minus hop-by-hop ones and those named
// in drop (lower case), then set, Content-Length, "Connection: close".
func (x *Exchange) WriteRequest(bc net.Conn, body []byte, set []HeaderField, drop ...string) error {
	req := x.Req
	_ = bc.SetWriteDeadline(time.Now().Add(x.s.lim.WriteTimeout))
	defer bc.SetWriteDeadline(time.Time{})
	skip := map[string]bool{}
	for _, d := range drop {
		skip[strings.ToLower(d)] = true
	}
	for _, h := range set {
		skip[strings.ToLower(h.Name)] = true
	}
	var b strings.Builder
	b.Grow(512 + 64*len(req.Header))
	writeRequestHead(&b, req, bc, skip)
	for _, h := range set {
		writeHeader(&b, h.Name, h.Value)
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n")
	bufs := net.Buffers{[]byte(b.String()), body}
	_, err := bufs.WriteTo(bc)
	return err
}

// ErrNoResponse is returned by ReadResponse when the backend closed the
// connection before sending any byte.
var ErrNoResponse = errors.New("backend closed before sending a byte")

// BackendResponse is a backend's response head, with its body still on the
// connection.
type BackendResponse struct {
	Status        int
	Header        []HeaderField
	ContentLength int64 // -1 when not declared
	Chunked       bool
	EventStream   bool
	// FirstByte is when the first response byte arrived.
	FirstByte time.Time

	conn net.Conn
	br   *bufio.Reader
	head *responseHead
}

// Get returns the first value of the named response header, or "".
func (r *BackendResponse) Get(name string) string {
	for _, h := range r.Header {
		if strings.EqualFold(h.Name, name) {
			return h.Value
		}
	}
	return ""
}

// ReadResponse waits until deadline for the backend's first byte, then
// reads the response head. A deadline passing before the first byte gives
// an error matching os.ErrDeadlineExceeded; a close before it gives
// ErrNoResponse.
func (x *Exchange) ReadResponse(bc net.Conn, deadline time.Time) (*BackendResponse, error) {
	br := bufio.NewReaderSize(bc, 16<<10)
	_ = bc.SetReadDeadline(deadline)
	if _, err := br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, ErrNoResponse
		}
		return nil, err
	}
	first := time.Now()
	_ = bc.SetReadDeadline(earliest(deadline, first.Add(x.s.lim.WriteTimeout)))
	rh, err := readResponseHead(br, x.s.lim.MaxHeaderBytes)
	if err != nil {
		return nil, fmt.Errorf("malformed response head: %w", err)
	}
	_ = bc.SetReadDeadline(time.Time{})
	return &BackendResponse{Status: rh.status, Header: rh.header, ContentLength: rh.contentLength, Chunked: rh.chunked,
		EventStream: rh.eventStream, FirstByte: first, conn: bc, br: br, head: rh}, nil
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// ErrBodyTooLarge is returned by ReadBody for a body above its bound.
var ErrBodyTooLarge = errors.New("response body exceeds the limit")

// ReadBody reads the whole body (de-chunked) of at most max bytes. Each read
// must make progress within silence (0: no bound) and the whole read ends
// at deadline (zero: none).
func (r *BackendResponse) ReadBody(max int64, silence time.Duration, deadline time.Time) ([]byte, error) {
	if r.head.bodyless("POST") {
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, ErrBodyTooLarge
	}
	var src io.Reader = r.br
	switch {
	case r.Chunked:
		src = newChunkedReader(r.br)
	case r.ContentLength >= 0:
		src = io.LimitReader(r.br, r.ContentLength)
	}
	dr := &deadlineReader{r: src, conn: r.conn, silence: silence, deadline: deadline}
	b, err := io.ReadAll(io.LimitReader(dr, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, ErrBodyTooLarge
	}
	if r.ContentLength >= 0 && int64(len(b)) < r.ContentLength {
		return nil, io.ErrUnexpectedEOF
	}
	return b, nil
}

// deadlineReader re-arms the connection's read deadline before every read.
type deadlineReader struct {
	r        io.Reader
	conn     net.Conn
	silence  time.Duration
	deadline time.Time
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	var dl time.Time
	if d.silence > 0 {
		dl = time.Now().Add(d.silence)
	}
	_ = d.conn.SetReadDeadline(earliest(d.deadline, dl))
	return d.r.Read(p)
}

// Relay writes the response head to the client (with x-kvgate-decision
// when enabled: decision is its value) and hands the body to the body leg,
// bounded by silence. It reports the leg's result and whether the client
// connection may carry another request.
func (x *Exchange) Relay(ctx context.Context, r *BackendResponse, decision string, silence time.Duration) (datapath.Result, bool) {
	req := x.Req
	keep := req.KeepAlive && req.bodyDone && r.head.selfDelimited(req.Method) && !x.s.isDraining()
	if err := x.s.writeHead(x.c.nc, x.s.responseHead(r.head, req, decision, keep)); err != nil {
		return datapath.Result{Ending: datapath.ClientGone, Err: err, Path: x.s.leg.Path()}, false
	}
	x.Record.Status = r.Status
	if r.head.bodyless(req.Method) {
		return datapath.Result{Ending: datapath.BackendEOF, Path: x.s.leg.Path()}, keep
	}
	res := x.s.relayBody(ctx, x.c.nc, r.conn, r.br, r.head, silence)
	if res.Ending != datapath.BackendEOF || r.head.truncated(res) {
		keep = false
	}
	return res, keep
}

// Respond writes a complete response with a Content-Length body: status and
// headers as given minus framing and hop-by-hop ones. It reports whether the
// client connection may carry another request.
func (x *Exchange) Respond(status int, header []HeaderField, body []byte, decision string) bool {
	req := x.Req
	keep := req.KeepAlive && req.bodyDone && !x.s.isDraining()
	var b strings.Builder
	b.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + reasonPhrase(status) + "\r\n")
	named := connectionNamed(header)
	for _, h := range header {
		ln := strings.ToLower(h.Name)
		if hopByHop[ln] || named[ln] || ln == "content-length" || ln == "transfer-encoding" {
			continue
		}
		writeHeader(&b, h.Name, h.Value)
	}
	if x.s.cfg.DecisionHeader && decision != "" {
		writeHeader(&b, "x-kvgate-decision", decision)
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	endResponseHead(&b, req, keep)
	x.Record.Status = status
	x.Record.BodyBytes = int64(len(body))
	_ = x.c.nc.SetWriteDeadline(time.Now().Add(x.s.lim.WriteTimeout))
	defer x.c.nc.SetWriteDeadline(time.Time{})
	bufs := net.Buffers{[]byte(b.String()), body}
	if _, err := bufs.WriteTo(x.c.nc); err != nil {
		return false
	}
	return keep
}

// Fail answers the client with kvgate's error shape
// {"error":code,"detail":detail} plus extra headers (Retry-After). The
// connection stays open only when the request body was fully read.
func (x *Exchange) Fail(status int, code, detail string, extra ...HeaderField) bool {
	return x.s.fail(x.c, x.Req, x.Record, status, code, detail, extra...)
}

// IsTimeout reports whether err is a deadline passing.
func IsTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// WatchClient returns a context that also ends when the client closes its
// connection while the proxy waits on something else (a prefill, an
// admission park), so a departed client's request stops holding an
// admission slot. Call stop before the client connection is used again; a
// pipelined next request that arrives meanwhile stays buffered for it. With
// a request body still streaming, the client is not watched.
func (x *Exchange) WatchClient(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	if !x.Req.bodyDone {
		return ctx, cancel
	}
	_ = x.c.nc.SetReadDeadline(time.Time{}) // before the goroutine: stop's deadline must win
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := x.c.br.Peek(1); err != nil && !IsTimeout(err) {
			cancel() // EOF or reset: the client is gone
		}
	}()
	return ctx, func() {
		_ = x.c.nc.SetReadDeadline(time.Unix(1, 0))
		<-done
		_ = x.c.nc.SetReadDeadline(time.Time{})
		cancel()
	}
}
