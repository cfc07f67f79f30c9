package fullproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// poolEngine is a real TLS HTTP/1.1 server on loopback whose answer to the
// n-th request (from 0) on each connection is reply's. It counts the TLS
// connections it accepted and saw closed, and the request heads that asked
// it to close.
type poolEngine struct {
	addr     string
	ca       *testcerts.CA
	accepted atomic.Int64
	closed   atomic.Int64
	asked    atomic.Int64 // requests with Connection: close
	served   atomic.Int64
	// idle, when set, closes a connection that waits this long for its next
	// request (uvicorn's keep-alive timeout).
	idle atomic.Int64 // nanoseconds

	mu    sync.Mutex
	reply func(n int, req *http.Request) (raw string, keep bool)
}

func startPoolEngine(t *testing.T, reply func(n int, req *http.Request) (string, bool)) *poolEngine {
	t.Helper()
	ca, err := testcerts.NewCA("engines")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Server("engine", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	e := &poolEngine{addr: ln.Addr().String(), ca: ca, reply: reply}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer e.closed.Add(1)
				defer c.Close()
				e.serve(c)
			}()
		}
	}()
	return e
}

func (e *poolEngine) setReply(f func(n int, req *http.Request) (string, bool)) {
	e.mu.Lock()
	e.reply = f
	e.mu.Unlock()
}

func (e *poolEngine) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for n := 0; n < 1000; n++ {
		wait := 10 * time.Second
		if d := time.Duration(e.idle.Load()); d > 0 {
			wait = d
		}
		_ = c.SetDeadline(time.Now().Add(wait))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		if req.Close {
			e.asked.Add(1)
		}
		e.mu.Lock()
		reply := e.reply
		e.mu.Unlock()
		raw, keep := reply(n, req)
		if raw != "" {
			if _, err := io.WriteString(c, raw); err != nil {
				return
			}
			e.served.Add(1)
		}
		if !keep || req.Close {
			return
		}
	}
}

// dialer is a TLS dialer trusting the engine's CA, as a security-2 rule's.
func (e *poolEngine) dialer() func(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	cfg := &tls.Config{RootCAs: e.ca.Pool(), ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		return tc, nil
	}
}

// poolCounts records PoolObserver events next to the counting observer's.
type poolCounts struct {
	countingObserver
	reused, dialed, stale atomic.Int64
}

func (o *poolCounts) BackendConn(_ string, _ int, result string) {
	switch result {
	case ConnReused:
		o.reused.Add(1)
	case ConnDialed:
		o.dialed.Add(1)
	case ConnStale:
		o.stale.Add(1)
	}
}

func startPooledProxy(t *testing.T, e *poolEngine, opts PoolOptions) (*Server, *poolCounts) {
	t.Helper()
	obs := &poolCounts{}
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{e.addr}}, nil), Dial: e.dialer(),
		Pool: &opts, Observer: obs})
	return s, obs
}

// get sends one request on a new client connection and returns the status
// and body.
func get(t *testing.T, s *Server, body string) (int, string) {
	t.Helper()
	resp, got := rawExchange(t, s.Addr().String(), fmt.Sprintf(
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		len(body), body))
	return resp.StatusCode, got
}

func okReply(body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// waitFor polls cond for up to 5 s (the pool's closes are asynchronous).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitIdle waits until ep 0 holds want idle connections.
func waitIdle(t *testing.T, s *Server, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d idle pooled connections", want), func() bool { return s.IdleBackends(0) == want })
}

// TestPoolReuse: sequential requests share one TLS connection to the
// engine, whatever the framing of its complete responses, and the request
// heads on it no longer ask the engine to close.
func TestPoolReuse(t *testing.T) {
	sse := "data: {\"t\":1}\n\ndata: [DONE]\n\n"
	cases := []struct {
		name  string
		reply string
		want  string
	}{
		{"content-length", okReply(`{"ok":1}`), `{"ok":1}`},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde"},
		{"event stream", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(sse), sse), sse},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\n", ""},
		{"error answer", "HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nnope!", "nope!"},
		{"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", "ok"},
	}
	const n = 8
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := startPoolEngine(t, func(int, *http.Request) (string, bool) { return c.reply, true })
			s, obs := startPooledProxy(t, e, PoolOptions{})
			for i := range n {
				if _, body := get(t, s, `{"prompt":"hi"}`); body != c.want {
					t.Fatalf("request %d: body %q, want %q", i, body, c.want)
				}
				waitIdle(t, s, 1) // the hand-back follows the client's last byte
			}
			if got := e.accepted.Load(); got != 1 {
				t.Fatalf("the engine accepted %d TLS connections for %d requests, want 1", got, n)
			}
			if got := e.asked.Load(); got != 0 {
				t.Fatalf("%d pooled requests carried Connection: close", got)
			}
			if obs.dialed.Load() != 1 || obs.reused.Load() != n-1 || obs.stale.Load() != 0 {
				t.Fatalf("dialed %d reused %d stale %d, want 1 %d 0", obs.dialed.Load(), obs.reused.Load(), obs.stale.Load(), n-1)
			}
			if got := s.IdleBackends(0); got != 1 {
				t.Fatalf("%d idle connections at rest, want 1", got)
			}
		})
	}
}

// TestPoolNoReuseAfterIncompleteResponse: a connection whose response did
// not end cleanly by its own framing, or whose engine asked to close, is
// never handed back; the next request opens a new one and succeeds.
func TestPoolNoReuseAfterIncompleteResponse(t *testing.T) {
	cases := []struct {
		name  string
		first string // the engine's answer to the first request on a connection
		keep  bool   // the engine keeps the connection open after it
	}{
		{"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", true},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
		{"bytes past the body", okReply("ok") + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nXX", true},
		{"body cut short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", false},
		{"chunked without its last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", false},
		{"malformed chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", true},
		{"body until close", "HTTP/1.1 200 OK\r\n\r\nok", false},
		{"malformed head", "HTTP/1.1 2x0 OK\r\n\r\n", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var requests atomic.Int64
			e := startPoolEngine(t, func(int, *http.Request) (string, bool) {
				if requests.Add(1) == 1 {
					return c.first, c.keep
				}
				return okReply("second"), true
			})
			s, obs := startPooledProxy(t, e, PoolOptions{})
			get(t, s, `{}`)
			if got := s.IdleBackends(0); got != 0 {
				t.Fatalf("%d connections pooled after %s, want 0", got, c.name)
			}
			if _, body := get(t, s, `{}`); !strings.Contains(body, "second") {
				t.Fatalf("second request: body %q, want the engine's second answer on a new connection", body)
			}
			if got := e.accepted.Load(); got != 2 {
				t.Fatalf("the engine accepted %d connections, want 2 (no reuse after %s)", got, c.name)
			}
			if obs.reused.Load() != 0 {
				t.Fatalf("%d requests reused a connection", obs.reused.Load())
			}
		})
	}
}

// TestPoolStaleRetried: a pooled connection the engine closes instead of
// answering the next request (its keep-alive timeout raced kvgate's) is
// replaced by a fresh one within the same try: the client gets its answer,
// no connect failure or extra attempt is counted, and the endpoint's
// in-flight count returns to 0. An engine that sent a byte first is not
// stale: its broken answer is the client's (502), never re-sent.
func TestPoolStaleRetried(t *testing.T) {
	cases := []struct {
		name       string
		stale      string // the raw answer to the second request on the first connection, then close
		wantStatus int
		wantStale  int64
	}{
		{"closed after reading the request", "", 200, 1},
		{"closed within the response head", "HTTP/1.1 200 OK\r\nContent-", 502, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var conns atomic.Int64
			e := startPoolEngine(t, nil)
			e.setReply(func(n int, _ *http.Request) (string, bool) {
				if n == 0 {
					conns.Add(1)
				}
				if n == 1 && conns.Load() == 1 {
					return c.stale, false
				}
				return okReply("fine"), true
			})
			s, obs := startPooledProxy(t, e, PoolOptions{})
			if status, body := get(t, s, `{"prompt":"x"}`); status != 200 || body != "fine" {
				t.Fatalf("first request: %d %q, want 200 \"fine\"", status, body)
			}
			waitIdle(t, s, 1)
			if status, _ := get(t, s, `{"prompt":"x"}`); status != c.wantStatus {
				t.Fatalf("request on the stale connection: status %d, want %d", status, c.wantStatus)
			}
			if obs.stale.Load() != c.wantStale || obs.reused.Load() != 1 || obs.dialed.Load() != 1+c.wantStale {
				t.Fatalf("stale %d reused %d dialed %d, want %d 1 %d", obs.stale.Load(), obs.reused.Load(), obs.dialed.Load(), c.wantStale, 1+c.wantStale)
			}
			if obs.connectFailed.Load() != 0 {
				t.Fatalf("%d connect failures counted for a stale pooled connection", obs.connectFailed.Load())
			}
			waitFor(t, "two records", func() bool { return obs.done.Load() == 2 })
			obs.mu.Lock()
			last := obs.records[1]
			obs.mu.Unlock()
			if last.Attempts != 1 || len(last.ConnectErr) != 0 {
				t.Fatalf("record: attempts %d connect errors %v; want 1 try and none", last.Attempts, last.ConnectErr)
			}
			waitZero(t, s.Loads())
		})
	}
}

// TestPoolIdleClosedByEngine: a pooled connection the engine closed while
// it was idle is noticed before use (no stale retry needed), and kvgate's
// own idle timeout closes the rest.
func TestPoolIdleClosedByEngine(t *testing.T) {
	e := startPoolEngine(t, func(int, *http.Request) (string, bool) { return okReply("ok"), true })
	e.idle.Store(int64(100 * time.Millisecond))
	s, obs := startPooledProxy(t, e, PoolOptions{IdleTimeout: time.Minute})
	get(t, s, `{}`)
	waitIdle(t, s, 1)
	waitFor(t, "the engine closing its idle connection", func() bool { return e.closed.Load() == 1 })
	if _, body := get(t, s, `{}`); body != "ok" {
		t.Fatalf("body %q after the engine closed the idle connection", body)
	}
	if obs.stale.Load() != 0 || obs.dialed.Load() != 2 || obs.reused.Load() != 0 {
		t.Fatalf("stale %d dialed %d reused %d, want 0 2 0: the closed connection is noticed before it is used",
			obs.stale.Load(), obs.dialed.Load(), obs.reused.Load())
	}

	e2 := startPoolEngine(t, func(int, *http.Request) (string, bool) { return okReply("ok"), true })
	s2, _ := startPooledProxy(t, e2, PoolOptions{IdleTimeout: 100 * time.Millisecond})
	get(t, s2, `{}`)
	waitFor(t, "kvgate's idle timeout closing the pooled connection", func() bool {
		return s2.IdleBackends(0) == 0 && e2.closed.Load() == 1
	})
}

// TestPoolDrained: the idle connections close when the endpoint goes down,
// is dropped (removed, moved or set admin down), and at shutdown; a pool
// keeps at most MaxIdlePerEndpoint per endpoint; a streamed request body
// (not replayable) never takes a pooled connection.
func TestPoolDrained(t *testing.T) {
	cases := []struct {
		name  string
		drain func(s *Server)
	}{
		{"endpoint down", func(s *Server) { s.EndpointDown(0) }},
		{"endpoint dropped", func(s *Server) { s.DropIdleBackends(0) }},
		{"shutdown", func(s *Server) { _ = s.Close() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := startPoolEngine(t, func(int, *http.Request) (string, bool) { return okReply("ok"), true })
			s, _ := startPooledProxy(t, e, PoolOptions{})
			get(t, s, `{}`)
			waitIdle(t, s, 1)
			c.drain(s)
			if got := s.IdleBackends(0); got != 0 {
				t.Fatalf("%d idle connections after %s", got, c.name)
			}
			waitFor(t, "the engine seeing the connection closed", func() bool { return e.closed.Load() == 1 })
		})
	}
	t.Run("dropped while a request runs", func(t *testing.T) {
		release := make(chan struct{})
		arrived := make(chan struct{}, 1)
		e := startPoolEngine(t, func(int, *http.Request) (string, bool) {
			arrived <- struct{}{}
			<-release
			return okReply("ok"), true
		})
		s, _ := startPooledProxy(t, e, PoolOptions{})
		done := make(chan string, 1)
		go func() { _, body := get(t, s, `{}`); done <- body }()
		<-arrived
		s.DropIdleBackends(0) // the endpoint is removed while its request runs
		close(release)
		if body := <-done; body != "ok" {
			t.Fatalf("the running request got %q", body)
		}
		waitFor(t, "its connection closed, not pooled, at the request's end", func() bool { return e.closed.Load() == 1 })
		if got := s.IdleBackends(0); got != 0 {
			t.Fatalf("%d idle connections after the drop", got)
		}
	})
	t.Run("bounded per endpoint", func(t *testing.T) {
		release := make(chan struct{})
		var arrived atomic.Int64
		e := startPoolEngine(t, func(int, *http.Request) (string, bool) {
			arrived.Add(1)
			<-release
			return okReply("ok"), true
		})
		s, _ := startPooledProxy(t, e, PoolOptions{MaxIdlePerEndpoint: 2})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() { defer wg.Done(); get(t, s, `{}`) }()
		}
		waitFor(t, "four requests at the engine", func() bool { return arrived.Load() == 4 })
		close(release)
		wg.Wait()
		waitIdle(t, s, 2)
		waitFor(t, "the two beyond the bound closed", func() bool { return e.closed.Load() == 2 })
	})
	t.Run("streamed body takes a fresh connection", func(t *testing.T) {
		e := startPoolEngine(t, func(int, *http.Request) (string, bool) { return okReply("ok"), true })
		obs := &poolCounts{}
		// Bodies above 2 bytes stream to the engine uninspected.
		s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{e.addr}}, nil), Dial: e.dialer(),
			Pool: &PoolOptions{}, Observer: obs, Limits: Limits{InspectBytes: 2}})
		get(t, s, `{}`)
		waitIdle(t, s, 1)
		resp, body := rawExchange(t, s.Addr().String(),
			"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n7\r\n{\"a\":1}\r\n0\r\n\r\n")
		if resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("streamed body: %d %q", resp.StatusCode, body)
		}
		if obs.reused.Load() != 0 || e.accepted.Load() != 2 {
			t.Fatalf("reused %d, engine connections %d; want 0 and 2", obs.reused.Load(), e.accepted.Load())
		}
	})
}

// TestRequestHeadKeepAlive: only a pool-managed connection's request head
// leaves out Connection: close.
func TestRequestHeadKeepAlive(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		t.Run(fmt.Sprint("pooled=", pooled), func(t *testing.T) {
			e := startPoolEngine(t, func(int, *http.Request) (string, bool) { return okReply("ok"), true })
			cfg := Config{Handler: NewForward(&staticRouter{addrs: []string{e.addr}}, nil), Dial: e.dialer()}
			if pooled {
				cfg.Pool = &PoolOptions{}
			}
			s := startProxy(t, cfg)
			get(t, s, `{}`)
			if want := int64(map[bool]int{false: 1, true: 0}[pooled]); e.asked.Load() != want {
				t.Fatalf("%d requests asked the engine to close, want %d", e.asked.Load(), want)
			}
		})
	}
}
