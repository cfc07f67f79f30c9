package fullproxy

// The handler seam. The connection server (server.go) reads a request and
// hands it to the rule's Handler as an Exchange; every handler (the plain
// forward in forward.go, or any flow built outside) drives its backends
// through the same calls, so a request is framed, bounded, accounted and
// observed the same way whichever flow serves it (docs/dataplane.md).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/attempt"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/fullproxy/internal/http1"
)

// Handler serves the requests of one rule.
type Handler interface {
	// Serve answers x.Req completely and reports whether the client
	// connection may carry another request. ctx ends when the server is
	// cancelled (shutdown grace spent).
	Serve(ctx context.Context, x *Exchange) (keepAlive bool)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, x *Exchange) bool

// Serve implements Handler.
func (f HandlerFunc) Serve(ctx context.Context, x *Exchange) bool { return f(ctx, x) }

// Exchange is one request's access to the proxy: the request, its record,
// and the calls a handler makes to serve it.
type Exchange struct {
	Req    *Request
	Record *Record
	s      *Server
	c      *clientConn
	// watch is the backend wait registered for its endpoint going down
	// (WatchEndpoint); ReadResponse ends it at the first byte.
	watch *EndpointWatch
	head  *HeadWatch // the client and endpoint watch of the current backend wait
	// pooled is the pool-managed backend connection of DialBackend, on
	// which Forward keeps the connection open; pooledGen is its endpoint's
	// pool generation then (pool.go).
	pooled    net.Conn
	pooledGen uint64
	// firstBody is the routing plan's BodyTracker.FirstBody (nil: none),
	// handed to the body leg.
	firstBody func()
}

// Limits are the proxy's limits.
func (x *Exchange) Limits() Limits { return x.s.lim }

// DecisionHeader reports whether responses carry x-kvgate-decision, so a
// handler renders the value only when it is sent.
func (x *Exchange) DecisionHeader() bool { return x.s.cfg.DecisionHeader }

// IncLoad and DecLoad move ep's in-flight count (kvgate_endpoint_inflight);
// every IncLoad must be matched by one DecLoad.
func (x *Exchange) IncLoad(ep int) { x.s.incLoad(ep) }

// DecLoad: see IncLoad.
func (x *Exchange) DecLoad(ep int) { x.s.decLoad(ep) }

// TTFB reports a backend's time to first byte.
func (x *Exchange) TTFB(ep int, d time.Duration) { x.s.obs.TTFB(x.s.cfg.Service, ep, d) }

// Attempts starts a leg's retry loop of at most tries tries under breaker
// (nil: none). Its connect failures are accounted once each: the
// connect-failure counter (Observer.ConnectFailed) and the record's
// ConnectErr.
func (x *Exchange) Attempts(tries int, breaker attempt.Breaker) *attempt.Loop {
	return attempt.New(tries, breaker, func(ep int) {
		x.s.obs.ConnectFailed(x.s.cfg.Service, ep)
		x.Record.ConnectErr = append(x.Record.ConnectErr, ep)
	})
}

// Dial connects to a backend, bounded by ConnectTimeout and ctx.
func (x *Exchange) Dial(ctx context.Context, addr string) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, x.s.lim.ConnectTimeout)
	defer cancel()
	return x.s.dial(dctx, addr)
}

// Forward sends the client's request, with its own body, to a backend: the
// client's headers minus hop-by-hop ones, framing rewritten (Content-Length,
// or chunked for a streamed body), "Connection: close" (left out on a
// pooled connection from DialBackend). A body that breaks
// its framing or limit gives an error matching *RequestError; a client
// that went away mid-body one for which ClientGone reports true.
func (x *Exchange) Forward(bc net.Conn) error {
	req := x.Req
	x.armWrite(bc, time.Now().Add(x.s.lim.WriteTimeout))
	defer bc.SetWriteDeadline(time.Time{})
	o := x.outgoing(bc, nil, nil)
	o.KeepAlive = x.pooled != nil && x.pooled == bc
	if req.BodyInspected {
		o.ContentLength = int64(len(req.Body))
		bufs := net.Buffers{http1.EncodeRequestHead(o), req.Body}
		_, err := bufs.WriteTo(bc)
		return err
	}
	// Uninspected: stream with the client's length, or chunked.
	o.Chunked, o.ContentLength = req.Chunked, req.ContentLength
	if _, err := bc.Write(http1.EncodeRequestHead(o)); err != nil {
		return err
	}
	return x.streamBody(bc)
}

// WriteRequest sends the client's request to a backend with body in place of
// the client's: the client's headers minus hop-by-hop ones and those named
// in drop (lower case), then set, Content-Length, "Connection: close".
func (x *Exchange) WriteRequest(bc net.Conn, body []byte, set []HeaderField, drop ...string) error {
	x.armWrite(bc, time.Now().Add(x.s.lim.WriteTimeout))
	defer bc.SetWriteDeadline(time.Time{})
	skip := map[string]bool{}
	for _, d := range drop {
		skip[strings.ToLower(d)] = true
	}
	for _, h := range set {
		skip[strings.ToLower(h.Name)] = true
	}
	o := x.outgoing(bc, skip, set)
	o.ContentLength = int64(len(body))
	bufs := net.Buffers{http1.EncodeRequestHead(o), body}
	_, err := bufs.WriteTo(bc)
	return err
}

func (x *Exchange) outgoing(bc net.Conn, drop map[string]bool, set []HeaderField) http1.Outgoing {
	req := x.Req
	if x.c != nil && x.c.tls != nil {
		// The engine learns the client spoke TLS; a client's own value is
		// replaced, never trusted (docs/security.md).
		drop, set = forwardedProto(drop, set)
	}
	o := http1.Outgoing{Method: req.Method, Target: req.Target, Header: req.Header, HostFallback: bc.RemoteAddr().String(),
		Drop: drop, Set: set}
	if req.RemoteAddr != nil {
		o.ClientAddr = req.RemoteAddr.String()
	}
	return o
}

// streamBody forwards an uninspected body without buffering it.
func (x *Exchange) streamBody(bc net.Conn) error {
	req := x.Req
	buf := make([]byte, 32<<10)
	writeChunk := func(p []byte) error {
		x.armWrite(bc, time.Now().Add(x.s.lim.WriteTimeout))
		if req.Chunked {
			return http1.WriteChunk(bc, p)
		}
		_, err := bc.Write(p)
		return err
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
			var he *http1.Error
			if errors.As(rerr, &he) {
				return &RequestError{he}
			}
			return &clientReadError{rerr}
		}
	}
	if !req.Chunked && total < req.ContentLength {
		return &clientReadError{io.ErrUnexpectedEOF}
	}
	req.bodyDone = true
	if req.Chunked {
		_, err := io.WriteString(bc, http1.LastChunk)
		return err
	}
	return nil
}

// RequestError is a client body that broke its framing or limit while it
// was forwarded: the answer kvgate owes the client.
type RequestError struct{ e *http1.Error }

func (e *RequestError) Error() string { return e.e.Error() }

// Status, Code and Detail are the error answer (400 bad_request, 413
// request_body_too_large, …).
func (e *RequestError) Status() int    { return e.e.Status }
func (e *RequestError) Code() string   { return e.e.Code }
func (e *RequestError) Detail() string { return e.e.Detail }

type clientReadError struct{ err error }

func (e *clientReadError) Error() string { return "reading the client body: " + e.err.Error() }
func (e *clientReadError) Unwrap() error { return e.err }

// ClientGone reports whether err from Forward means the client went away
// before its body was complete (nobody is left to answer).
func (x *Exchange) ClientGone(err error) bool {
	var ce *clientReadError
	return !x.Req.bodyDone && errors.As(err, &ce)
}

// ErrNoResponse is returned by ReadResponse when the backend closed the
// connection before sending any byte.
var ErrNoResponse = errors.New("backend closed before sending a byte")

// BadResponseError is a response head ReadResponse could not parse; its
// first byte did arrive, at FirstByte.
type BadResponseError struct {
	FirstByte time.Time
	Err       error
}

func (e *BadResponseError) Error() string { return "malformed response head: " + e.Err.Error() }
func (e *BadResponseError) Unwrap() error { return e.Err }

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
	head *http1.ResponseHead
	// reusable: Relay moved the whole response and the connection can carry
	// another request (Reusable).
	reusable bool
}

// Reusable reports whether the connection the response came on can carry
// another request: Relay moved the response complete by its own framing
// (or it had no body), with no byte past its end, and the backend did not
// ask to close (Connection: close, HTTP/1.0).
func (r *BackendResponse) Reusable() bool { return r.reusable }

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
// reads the response head (within WriteTimeout of the first byte). A
// deadline passing before the first byte gives an error matching
// os.ErrDeadlineExceeded; a close before it gives ErrNoResponse; a head
// that does not parse gives a *BadResponseError. The first byte ends bc's
// WatchEndpoint registration, so an endpoint going down after it leaves
// the response alone.
func (x *Exchange) ReadResponse(bc net.Conn, deadline time.Time) (*BackendResponse, error) {
	br := bufio.NewReaderSize(bc, 16<<10)
	x.armRead(bc, deadline)
	if _, err := br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, ErrNoResponse
		}
		return nil, err
	}
	first := time.Now()
	x.answered(bc)
	x.armRead(bc, earliest(deadline, first.Add(x.s.lim.WriteTimeout)))
	rh, err := http1.ReadResponseHead(br, x.s.lim.MaxHeaderBytes)
	if err != nil {
		return nil, &BadResponseError{FirstByte: first, Err: err}
	}
	_ = bc.SetReadDeadline(time.Time{})
	return &BackendResponse{Status: rh.Status, Header: rh.Header, ContentLength: rh.ContentLength, Chunked: rh.Chunked,
		EventStream: rh.EventStream, FirstByte: first, conn: bc, br: br, head: rh}, nil
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
	if r.head.Bodyless("POST") {
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, ErrBodyTooLarge
	}
	var src io.Reader = r.br
	switch {
	case r.Chunked:
		src = http1.NewChunkedReader(r.br)
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

// keep reports whether the client connection may carry another request
// after a response: the client asked, its body was read, no shutdown.
func (x *Exchange) keep() bool {
	return x.Req.KeepAlive && x.Req.bodyDone && !x.s.isDraining()
}

// Relay writes the response head to the client (with x-kvgate-decision
// when enabled: decision is its value) and hands the body to the body leg,
// bounded by silence. It records the status, the bytes moved, the leg and
// the outcome (EndingOutcome), and reports the leg's result and whether the
// client connection may carry another request.
func (x *Exchange) Relay(ctx context.Context, r *BackendResponse, decision string, silence time.Duration) (datapath.Result, bool) {
	req, rec := x.Req, x.Record
	keep := x.keep() && r.head.SelfDelimited(req.Method)
	if !x.s.cfg.DecisionHeader {
		decision = ""
	}
	rec.Status = r.Status
	if err := x.s.writeHead(x.c.nc, http1.RelayedHead(r.head, req.Minor, decision, keep)); err != nil {
		rec.Outcome = OutcomeClientGone
		return datapath.Result{Ending: datapath.ClientGone, Err: err, Path: x.s.leg.Path()}, false
	}
	if r.head.Bodyless(req.Method) {
		rec.Outcome = OutcomeOK
		r.reusable = !r.head.Close && r.br.Buffered() == 0
		return datapath.Result{Ending: datapath.BackendEOF, Path: x.s.leg.Path()}, keep
	}
	end := &overrunWatch{BodyEnd: http1.NewBodyFraming(r.head.Chunked, r.head.ContentLength, r.head.EventStream)}
	res := x.relayBody(ctx, r, silence, end)
	rec.BodyBytes, rec.Datapath = res.Bytes, res.Path
	rec.Outcome = EndingOutcome(res.Ending, r.head.Truncated(res.Bytes))
	if rec.Outcome != OutcomeOK {
		keep = false
	}
	st := end.State()
	r.reusable = rec.Outcome == OutcomeOK && res.Ending == datapath.BackendEOF && st.Complete && st.Delimited &&
		!end.over && res.KernelBytes == 0 && !r.head.Close &&
		(r.head.ContentLength < 0 || int64(r.br.Buffered()) <= r.head.ContentLength)
	return res, keep
}

// overrunWatch notes bytes the backend sent past the body's end: a
// connection that did is not handed back to the pool, whose next request
// would read them as its response.
type overrunWatch struct {
	datapath.BodyEnd
	over bool
}

func (w *overrunWatch) Feed(p []byte) int {
	n := w.BodyEnd.Feed(p)
	if n < len(p) {
		w.over = true
	}
	return n
}

// relayBody hands the response body to the body leg: what the response's
// reader has already buffered first (at most the declared length), then the
// rest from the connection, each read within silence.
func (x *Exchange) relayBody(ctx context.Context, r *BackendResponse, silence time.Duration, end datapath.BodyEnd) datapath.Result {
	prefix, _ := r.br.Peek(r.br.Buffered())
	if r.head.ContentLength >= 0 && int64(len(prefix)) > r.head.ContentLength {
		prefix = prefix[:r.head.ContentLength]
	}
	opts := datapath.Options{
		Silence:       silence,
		Streamed:      r.head.Chunked || r.head.EventStream,
		TokenStream:   r.head.EventStream || r.head.NDJSON,
		ContentLength: r.head.ContentLength,
		End:           end,
		FirstBody:     x.firstBody,
	}
	tap := x.bodyTap(r)
	if tap != nil {
		opts.Tap = http1.NewPayload(r.head.Chunked, r.head.ContentLength, tap.Write).Write
	}
	res := x.s.leg.Run(ctx, x.c.nc, r.conn, prefix, opts)
	if tap != nil {
		tap.Done(res)
	}
	return res
}

// Respond writes a complete response with a Content-Length body: status and
// headers as given minus framing and hop-by-hop ones. It reports whether the
// client connection may carry another request.
func (x *Exchange) Respond(status int, header []HeaderField, body []byte, decision string) bool {
	keep := x.keep()
	if !x.s.cfg.DecisionHeader {
		decision = ""
	}
	head := http1.CompleteHead(status, header, len(body), decision, x.Req.Minor, keep)
	x.Record.Status = status
	x.Record.BodyBytes = int64(len(body))
	_ = x.c.nc.SetWriteDeadline(time.Now().Add(x.s.lim.WriteTimeout))
	defer x.c.nc.SetWriteDeadline(time.Time{})
	bufs := net.Buffers{head, body}
	if _, err := bufs.WriteTo(x.c.nc); err != nil {
		x.Record.Outcome = OutcomeClientGone
		return false
	}
	if x.Record.Outcome == OutcomeNone {
		x.Record.Outcome = OutcomeOK
	}
	return keep
}

// Fail answers the client with kvgate's error shape
// {"error":code,"detail":detail} plus extra headers (Retry-After), and
// records code as the outcome unless one is set. Backend addresses in
// detail are replaced (they stay in the log). The connection stays open
// only when the request body was fully read.
func (x *Exchange) Fail(status int, code, detail string, extra ...HeaderField) bool {
	keep := x.keep()
	rec := x.Record
	rec.Status, rec.Code = status, code
	if rec.Outcome == OutcomeNone {
		rec.Outcome = OutcomeAnswered
	}
	if safe := redactAddrs(detail); safe != detail {
		x.s.log.Info("request failed", "status", status, "code", code, "detail", detail)
		detail = safe
	}
	if err := x.s.writeError(x.c.nc, status, code, detail, keep, extra...); err != nil {
		return false
	}
	return keep
}

// Failf is Fail with a formatted detail.
func (x *Exchange) Failf(status int, code, format string, args ...any) bool {
	return x.Fail(status, code, fmt.Sprintf(format, args...))
}

// IsTimeout reports whether err is a deadline passing.
func IsTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// clientWatchDelay is how long a wait runs before WatchClient starts
// peeking at the client: most answers come sooner, and a peek costs a
// goroutine and three deadline changes per request. It bounds how late a
// departure is noticed (with the wake-up), well inside the 100 ms goal of
// docs/dataplane.md ("Hung engines and departed clients").
const clientWatchDelay = 5 * time.Millisecond

// WatchClient returns a context that also ends when the client closes its
// connection while the proxy waits on something else (another backend, an
// admission park, a response head), so a departed client's request stops
// holding an admission slot or an engine. Call stop before the client
// connection is used again; a pipelined next request that arrives
// meanwhile stays buffered for it. With a request body still streaming,
// the client is not watched. The peek starts after clientWatchDelay.
func (x *Exchange) WatchClient(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	if !x.Req.bodyDone {
		return ctx, cancel
	}
	var (
		mu      sync.Mutex
		started bool
		stopped bool
		done    = make(chan struct{})
	)
	timer := time.AfterFunc(clientWatchDelay, func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		started = true
		// Under mu: stop's expired deadline, set under mu too, must win.
		_ = x.c.nc.SetReadDeadline(time.Time{})
		mu.Unlock()
		defer close(done)
		if _, err := x.c.br.Peek(1); err != nil && !IsTimeout(err) {
			cancel() // EOF or reset: the client is gone
		}
	})
	return ctx, func() {
		timer.Stop()
		mu.Lock()
		stopped = true
		peeking := started
		if peeking {
			_ = x.c.nc.SetReadDeadline(time.Unix(1, 0))
		}
		mu.Unlock()
		if peeking {
			<-done
			_ = x.c.nc.SetReadDeadline(time.Time{})
		}
		cancel()
	}
}

// CloseOnCancel makes every wait on bc end when ctx does (a cancelled
// server unblocks its backends); call the returned stop when bc is done.
func CloseOnCancel(ctx context.Context, bc net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = bc.SetDeadline(time.Unix(1, 0)) })
}
