package fullproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/epset"
)

// backend is a real HTTP server on loopback that records what it received.
type backend struct {
	addr string
	srv  *http.Server
	mu   sync.Mutex
	got  []received
}

type received struct {
	method, path string
	header       http.Header
	body         []byte
	chunked      bool
}

func startBackend(t *testing.T, id string, h http.HandlerFunc) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: ln.Addr().String()}
	b.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.got = append(b.got, received{r.Method, r.URL.Path, r.Header.Clone(), body, len(r.TransferEncoding) > 0})
		b.mu.Unlock()
		w.Header().Set("x-engine-id", id)
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"engine":%q,"len":%d}`, id, len(body))
	})}
	go b.srv.Serve(ln)
	t.Cleanup(func() { b.srv.Close() })
	return b
}

func (b *backend) last(t *testing.T) received {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.got) == 0 {
		t.Fatal("backend received nothing")
	}
	return b.got[len(b.got)-1]
}

// staticRouter routes to the first endpoint not excluded, in order.
type staticRouter struct {
	addrs    []string
	noRoute  bool
	mu       sync.Mutex
	seen     []*Request
	finished []bool
}

// Plan implements Router: each request gets its own plan over r.
func (r *staticRouter) Plan(_ context.Context, req *Request) RoutePlan {
	return &staticPlan{r: r, req: req}
}

type staticPlan struct {
	r   *staticRouter
	req *Request
}

func (p *staticPlan) Route(_ context.Context, excluded epset.Set) (Decision, error) {
	return p.r.route(p.req, excluded)
}
func (p *staticPlan) Finish(_ Decision, connected bool) { p.r.finish(connected) }

func (r *staticRouter) route(req *Request, excluded epset.Set) (Decision, error) {
	r.mu.Lock()
	r.seen = append(r.seen, req)
	r.mu.Unlock()
	if r.noRoute {
		return Decision{}, ErrNoBackend
	}
	for i, a := range r.addrs {
		if !excluded.Has(i) {
			return Decision{Endpoint: i, Addr: a, Tier: "1.5", Reason: "hit", Score: 2}, nil
		}
	}
	return Decision{}, fmt.Errorf("all excluded: %w", ErrNoBackend)
}

func (r *staticRouter) finish(connected bool) {
	r.mu.Lock()
	r.finished = append(r.finished, connected)
	r.mu.Unlock()
}

type countingObserver struct {
	NopObserver
	connectFailed atomic.Int64
	done          atomic.Int64
	mu            sync.Mutex
	records       []Record
}

func (o *countingObserver) ConnectFailed(string, int) { o.connectFailed.Add(1) }
func (o *countingObserver) Done(r *Record) {
	o.done.Add(1)
	o.mu.Lock()
	o.records = append(o.records, *r)
	o.mu.Unlock()
}

func startProxy(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() {
		s.Close()
		waitZero(t, s.Loads())
	})
	return s
}

// dialProxy connects a client to s; the connection has a 10 s deadline and
// is closed when the test ends.
func dialProxy(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// waitZero asserts the in-flight counts return to 0 at rest.
func waitZero(t *testing.T, l *Loads) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for l.Total() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("in-flight count %d at rest, want 0", l.Total())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawExchange sends raw bytes and returns the parsed response.
func rawExchange(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode == 100 {
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func TestProxyKeepAliveAndLoads(t *testing.T) {
	be := startBackend(t, "ep0", nil)
	obs := &countingObserver{}
	s := startProxy(t, Config{Service: "1", Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil), Observer: obs, DecisionHeader: true})

	c := dialProxy(t, s)
	br := bufio.NewReader(c)
	for i := 0; i < 3; i++ {
		body := fmt.Sprintf(`{"model":"m","prompt":"hello %d"}`, i)
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nKeep-Alive: timeout=5\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("x-engine-id") != "ep0" || resp.Close {
			t.Fatalf("request %d: status %d engine %q close %v", i, resp.StatusCode, resp.Header.Get("x-engine-id"), resp.Close)
		}
		if want := fmt.Sprintf(`"len":%d`, len(body)); !strings.Contains(string(got), want) {
			t.Fatalf("request %d: body %s lacks %s", i, got, want)
		}
		if h := resp.Header.Get("x-kvgate-decision"); h != "tier=1.5; ep=0; score=2; reason=hit" {
			t.Fatalf("decision header %q", h)
		}
		r := be.last(t)
		if r.header.Get("Connection") != "" && !strings.EqualFold(r.header.Get("Connection"), "close") {
			t.Fatalf("backend saw Connection %q", r.header.Get("Connection"))
		}
		if r.header.Get("Keep-Alive") != "" || r.header.Get("X-Forwarded-For") != "127.0.0.1" {
			t.Fatalf("backend headers %v", r.header)
		}
	}
	waitZero(t, s.Loads())
}

func TestRequestFraming(t *testing.T) {
	be := startBackend(t, "ep0", nil)
	router := &staticRouter{addrs: []string{be.addr}}
	s := startProxy(t, Config{Handler: NewForward(router, nil), Limits: Limits{MaxHeaderBytes: 1024, MaxBodyBytes: 4096, InspectBytes: 2048}})
	big := strings.Repeat("x", 5000)
	tests := []struct {
		name   string
		raw    string
		status int
		code   string
		body   string // what the backend must receive
	}{
		{name: "content-length", raw: "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", status: 200, body: "hello"},
		{name: "chunked", raw: "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer-A: 1\r\n\r\n", status: 200, body: "hello world"},
		{name: "identical duplicate CL", raw: "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", status: 200, body: "ok"},
		{name: "CL and TE", raw: "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 400, code: "bad_request"},
		{name: "conflicting CL", raw: "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", status: 400, code: "bad_request"},
		{name: "CL with sign", raw: "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello", status: 400, code: "bad_request"},
		{name: "CL list", raw: "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello", status: 400, code: "bad_request"},
		{name: "TE gzip", raw: "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", status: 400, code: "bad_request"},
		{name: "TE in HTTP/1.0", raw: "POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 400, code: "bad_request"},
		{name: "obs-fold", raw: "GET /a HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n", status: 400, code: "bad_request"},
		{name: "space before colon", raw: "GET /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n", status: 400, code: "bad_request"},
		{name: "no host", raw: "GET /a HTTP/1.1\r\n\r\n", status: 400, code: "bad_request"},
		{name: "two hosts", raw: "GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", status: 400, code: "bad_request"},
		{name: "bad chunk size", raw: "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", status: 400, code: "bad_request"},
		{name: "chunk longer than size", raw: "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n", status: 400, code: "bad_request"},
		{name: "bad version", raw: "GET /a HTTP/2.0\r\nHost: x\r\n\r\n", status: 505, code: "http_version_not_supported"},
		{name: "head too large", raw: "GET /a HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2000) + "\r\n\r\n", status: 431, code: "request_header_too_large"},
		{name: "body too large CL", raw: fmt.Sprintf("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 5000), status: 413, code: "request_body_too_large"},
		{name: "body too large chunked", raw: fmt.Sprintf("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(big), big), status: 413, code: "request_body_too_large"},
		{name: "expect 100", raw: "POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi", status: 200, body: "hi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawExchange(t, s.Addr().String(), tc.raw)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
			if tc.code != "" {
				var eb ErrorBody
				if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error != tc.code || eb.Detail == "" {
					t.Fatalf("error body %q, want code %q", body, tc.code)
				}
				return
			}
			// A refused streamed body of an earlier case may reach the
			// backend's log after this answer: wait for this request.
			r := be.last(t)
			for deadline := time.Now().Add(3 * time.Second); string(r.body) != tc.body && time.Now().Before(deadline); r = be.last(t) {
				time.Sleep(5 * time.Millisecond)
			}
			if string(r.body) != tc.body || r.chunked {
				t.Fatalf("backend got %q (chunked %v), want %q", r.body, r.chunked, tc.body)
			}
		})
	}
}

func TestUninspectedBodyIsForwarded(t *testing.T) {
	be := startBackend(t, "ep0", nil)
	router := &staticRouter{addrs: []string{be.addr}}
	s := startProxy(t, Config{Handler: NewForward(router, nil), Limits: Limits{MaxBodyBytes: 1 << 20, InspectBytes: 1024}})
	payload := strings.Repeat("0123456789", 10000) // 100 kB > inspect limit
	for _, chunked := range []bool{false, true} {
		var raw string
		if chunked {
			var b strings.Builder
			for i := 0; i < len(payload); i += 7000 {
				p := payload[i:min(i+7000, len(payload))]
				fmt.Fprintf(&b, "%x\r\n%s\r\n", len(p), p)
			}
			raw = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b.String() + "0\r\n\r\n"
		} else {
			raw = fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(payload), payload)
		}
		resp, _ := rawExchange(t, s.Addr().String(), raw)
		if resp.StatusCode != 200 {
			t.Fatalf("chunked=%v: status %d", chunked, resp.StatusCode)
		}
		if got := be.last(t).body; string(got) != payload {
			t.Fatalf("chunked=%v: backend got %d bytes, want %d", chunked, len(got), len(payload))
		}
		router.mu.Lock()
		last := router.seen[len(router.seen)-1]
		router.mu.Unlock()
		if last.BodyInspected || last.Body != nil {
			t.Fatalf("chunked=%v: router saw an inspected body", chunked)
		}
	}
}

func TestConnectFailureRetriesWithExclusion(t *testing.T) {
	be := startBackend(t, "ep1", nil)
	dead := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.Port(t, "127.0.0.1")))
	obs := &countingObserver{}
	router := &staticRouter{addrs: []string{dead, be.addr}}
	s := startProxy(t, Config{Handler: NewForward(router, nil), Observer: obs})
	resp, body := rawExchange(t, s.Addr().String(), "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 || resp.Header.Get("x-engine-id") != "ep1" {
		t.Fatalf("status %d engine %q body %s", resp.StatusCode, resp.Header.Get("x-engine-id"), body)
	}
	if obs.connectFailed.Load() != 1 {
		t.Fatalf("connect failures counted %d, want 1", obs.connectFailed.Load())
	}
	router.mu.Lock()
	fin := append([]bool(nil), router.finished...)
	router.mu.Unlock()
	if len(fin) != 1 || !fin[0] {
		t.Fatalf("Finish calls %v, want exactly one connected", fin)
	}
}

func TestErrorsKvgateAnswers(t *testing.T) {
	dead := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.Port(t, "127.0.0.1")))
	tests := []struct {
		name   string
		router *staticRouter
		status int
		code   string
	}{
		{"no healthy backend", &staticRouter{noRoute: true}, 503, "no_healthy_backend"},
		{"backend unreachable", &staticRouter{addrs: []string{dead, dead}}, 502, "backend_unreachable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startProxy(t, Config{Handler: NewForward(tc.router, nil)})
			resp, body := rawExchange(t, s.Addr().String(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
			var eb ErrorBody
			if resp.StatusCode != tc.status || json.Unmarshal([]byte(body), &eb) != nil || eb.Error != tc.code || eb.Detail == "" {
				t.Fatalf("got %d %s, want %d {error:%s}", resp.StatusCode, body, tc.status, tc.code)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
		})
	}
}

func TestBackendTimeout(t *testing.T) {
	release := make(chan struct{})
	be := startBackend(t, "ep0", func(w http.ResponseWriter, r *http.Request) { <-release })
	defer close(release)
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil), Limits: Limits{ResponseHeaderTimeout: 200 * time.Millisecond}})
	resp, body := rawExchange(t, s.Addr().String(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 504 || !strings.Contains(body, "backend_timeout") {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

// sseBackend streams n events, one every gap, released by step when non-nil.
func sseBackend(t *testing.T, n int, step chan struct{}) *backend {
	return startBackend(t, "sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		w.WriteHeader(200)
		fl.Flush()
		for i := 0; i < n; i++ {
			if step != nil {
				select {
				case <-step:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			fl.Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}

func TestStreamingIsNotBuffered(t *testing.T) {
	step := make(chan struct{})
	be := sseBackend(t, 3, step)
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil)})
	c := dialProxy(t, s)
	io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for i := 0; i < 3; i++ {
		step <- struct{}{} // the backend sends event i only now: the client must see it before the next
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				break
			}
		}
		if want := fmt.Sprintf(`data: {"i":%d}`, i); sc.Text() != want {
			t.Fatalf("event %d: got %q", i, sc.Text())
		}
	}
	for sc.Scan() {
	}
	if s.Loads().Total() != 0 {
		waitZero(t, s.Loads())
	}
}

func TestClientGoneMidStreamReleasesLoad(t *testing.T) {
	step := make(chan struct{}, 100)
	be := sseBackend(t, 100, step)
	obs := &countingObserver{}
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil), Observer: obs, Limits: Limits{StreamSilence: 5 * time.Second}})
	c := dialProxy(t, s)
	io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp
	if s.Loads().Load(0) != 1 {
		t.Fatalf("in-flight %d during the stream, want 1", s.Loads().Load(0))
	}
	c.Close()
	for i := 0; i < 99; i++ {
		step <- struct{}{}
	}
	waitZero(t, s.Loads())
}

func TestShutdownLetsStreamFinish(t *testing.T) {
	step := make(chan struct{})
	be := sseBackend(t, 2, step)
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil)})
	c := dialProxy(t, s)
	io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	// An idle keep-alive connection is closed by the shutdown.
	dialProxy(t, s) // never sends a request

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := net.DialTimeout("tcp", s.Addr().String(), 200*time.Millisecond); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
	step <- struct{}{}
	step <- struct{}{}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("stream cut: %v", err)
	}
	if !strings.Contains(string(rest), `{"i":1}`) || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream incomplete: %q", rest)
	}
	// The connection is not kept for another request once draining.
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("connection still open after the drained stream: n=%d err=%v", n, err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestFreebindListen(t *testing.T) {
	// 192.0.2.0/24 (TEST-NET-1) is on no interface here; IP_FREEBIND binds it anyway.
	s, err := Listen(Config{Addr: "192.0.2.77:0", Handler: NewForward(&staticRouter{}, nil)})
	if err != nil {
		t.Fatalf("freebind listen: %v", err)
	}
	s.Close()
}

func TestDecisionHeaderValue(t *testing.T) {
	got := DecisionHeaderValue(Decision{Tier: "1.5", Endpoint: 0, Score: 12, Reason: "hit"})
	if got != "tier=1.5; ep=0; score=12; reason=hit" {
		t.Fatal(got)
	}
}

// TestPipelinedAndHTTP10: two pipelined requests on one connection are both
// answered in order; an HTTP/1.0 request without keep-alive gets its answer
// and the connection closes.
func TestPipelinedAndHTTP10(t *testing.T) {
	be := startBackend(t, "ep0", nil)
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil)})
	c := dialProxy(t, s)
	io.WriteString(c, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"+
		"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nthree")
	br := bufio.NewReader(c)
	for _, want := range []string{`"len":3`, `"len":5`} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), want) {
			t.Fatalf("pipelined answer %s, want %s", b, want)
		}
	}

	c2 := dialProxy(t, s)
	io.WriteString(c2, "GET /old HTTP/1.0\r\n\r\n")
	all, err := io.ReadAll(c2) // returns only once kvgate closes
	if err != nil || !strings.HasPrefix(string(all), "HTTP/1.1 200") || !strings.Contains(string(all), "Connection: close") {
		t.Fatalf("HTTP/1.0 exchange: %v %q", err, all)
	}
}
