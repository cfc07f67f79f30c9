package fullproxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// hungBackend is a TCP server that reads what a connection sends and never
// answers, like an engine under SIGSTOP whose kernel still accepts and
// buffers. It records when each connection saw the request's first bytes
// and when it saw EOF (the proxy closed its side). With read false it does
// not even read, so a large request fills the socket buffers.
type hungBackend struct {
	addr string
	read bool

	mu     sync.Mutex
	got    []time.Time // first bytes of each connection
	closed []time.Time // EOF of each connection
	gotCh  chan struct{}
	eofCh  chan struct{}
	hold   chan struct{} // closed: a non-reading backend starts draining
	once   sync.Once
}

func (h *hungBackend) release() { h.once.Do(func() { close(h.hold) }) }

func startHungBackend(t testing.TB, read bool) *hungBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hungBackend{addr: ln.Addr().String(), read: read, gotCh: make(chan struct{}, 16), eofCh: make(chan struct{}, 16),
		hold: make(chan struct{})}
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		h.release()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			conns = append(conns, c)
			cmu.Unlock()
			go h.serve(c)
		}
	}()
	return h
}

func (h *hungBackend) serve(c net.Conn) {
	buf := make([]byte, 64<<10)
	first := true
	if !h.read {
		// Take nothing until the test lets go, so the sender's write blocks
		// on full buffers; then drain to EOF.
		h.mark(&h.got, h.gotCh)
		first = false
		<-h.hold
	}
	for {
		_, err := c.Read(buf)
		if first && err == nil {
			h.mark(&h.got, h.gotCh)
			first = false
		}
		if err != nil {
			h.mark(&h.closed, h.eofCh)
			return
		}
	}
}

func (h *hungBackend) mark(at *[]time.Time, ch chan struct{}) {
	h.mu.Lock()
	*at = append(*at, time.Now())
	h.mu.Unlock()
	ch <- struct{}{}
}

func (h *hungBackend) lastClosed() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed[len(h.closed)-1]
}

func waitCh(t testing.TB, ch chan struct{}, what string, bound time.Duration) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(bound):
		t.Fatalf("%s: not within %s", what, bound)
	}
}

type hangResult struct {
	status int
	code   string
	engine string
	err    error
}

// postAsync sends a completion request with body through the proxy and
// returns its answer on the channel.
func postAsync(addr, body string, streamed bool) <-chan hangResult {
	out := make(chan hangResult, 1)
	go func() {
		var r io.Reader = strings.NewReader(body)
		if streamed {
			r = io.MultiReader(strings.NewReader(body)) // no length: chunked
		}
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/completions", r)
		req.Header.Set("Content-Type", "application/json")
		c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Do(req)
		if err != nil {
			out <- hangResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var eb ErrorBody
		_ = json.Unmarshal(b, &eb)
		out <- hangResult{status: resp.StatusCode, code: eb.Error, engine: resp.Header.Get("x-engine-id")}
	}()
	return out
}

// TestEndpointDownEndsHeadWaits: a request waiting on an endpoint that has
// sent no byte is re-routed once when the endpoint goes down (replayable
// body, another endpoint), else answered 503 endpoint_down; its in-flight
// count drops at once and the hung engine's connection is closed. Before
// the fix the request waited the whole ResponseHeaderTimeout.
func TestEndpointDownEndsHeadWaits(t *testing.T) {
	cases := []struct {
		name       string
		second     bool // a healthy second endpoint
		streamed   bool // the body is above the inspection limit (not replayable)
		wantStatus int
		wantCode   string
		wantEngine string
		attempts   int
	}{
		{name: "rerouted", second: true, wantStatus: 200, wantEngine: "ep1", attempts: 2},
		// The re-route's try finds no endpoint: it counts like any try.
		{name: "single_endpoint", wantStatus: 503, wantCode: "endpoint_down", attempts: 2},
		{name: "streamed_body_not_replayed", second: true, streamed: true, wantStatus: 503, wantCode: "endpoint_down", attempts: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hung := startHungBackend(t, true)
			addrs := []string{hung.addr}
			var healthy *backend
			if tc.second {
				healthy = startBackend(t, "ep1", nil)
				addrs = append(addrs, healthy.addr)
			}
			obs := &recordingObserver{}
			lim := Limits{ResponseHeaderTimeout: time.Minute}
			if tc.streamed {
				lim.InspectBytes = 8
			}
			s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: addrs}, nil), Observer: obs, Limits: lim})
			res := postAsync(s.Addr().String(), `{"model":"m","prompt":"a hung engine"}`, tc.streamed)
			waitCh(t, hung.gotCh, "the request reached the hung endpoint", 5*time.Second)
			if n := s.Loads().Load(0); n != 1 {
				t.Fatalf("in flight on the hung endpoint: %d, want 1", n)
			}
			if tc.streamed {
				// The streamed body is sent in full before the head wait.
				time.Sleep(50 * time.Millisecond)
			}
			downAt := time.Now()
			if n := s.EndpointDown(0); n != 1 {
				t.Fatalf("EndpointDown ended %d waits, want 1", n)
			}
			var r hangResult
			select {
			case r = <-res:
			case <-time.After(5 * time.Second):
				t.Fatalf("no answer within 5 s of the endpoint going down")
			}
			if r.err != nil || r.status != tc.wantStatus || r.code != tc.wantCode || r.engine != tc.wantEngine {
				t.Fatalf("answer %+v, want %d %q from %q", r, tc.wantStatus, tc.wantCode, tc.wantEngine)
			}
			waitCh(t, hung.eofCh, "the hung endpoint's connection closed", 2*time.Second)
			t.Logf("answered %s after the endpoint went down; its connection closed after %s",
				time.Since(downAt).Round(time.Microsecond), hung.lastClosed().Sub(downAt).Round(time.Microsecond))
			if n := s.Loads().Load(0); n != 0 {
				t.Fatalf("in flight on the hung endpoint after the answer: %d, want 0", n)
			}
			waitRecords(t, obs, 1)
			rec := obs.all()[0]
			if rec.Attempts != tc.attempts {
				t.Fatalf("attempts %d, want %d", rec.Attempts, tc.attempts)
			}
			if tc.streamed && len(healthy.got) != 0 {
				t.Fatalf("a streamed body was replayed to the second endpoint")
			}
		})
	}
}

// TestEndpointDownLeavesAnsweredRequests: a request that got its response
// head is not touched by its endpoint going down.
func TestEndpointDownLeavesAnsweredRequests(t *testing.T) {
	step := make(chan struct{})
	be := sseBackend(t, 2, step)
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil)})
	c := dialProxy(t, s)
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.EndpointDown(0); n != 0 {
		t.Fatalf("EndpointDown ended %d waits of an answered request", n)
	}
	close(step)
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("the answered stream did not complete: %v %q", err, body)
	}
}

// TestClientLeavingBeforeTheHeadClosesTheBackend: a client that closes its
// connection while kvgate waits for the response head, or while it sends
// an inspected body the engine does not read, makes kvgate close the
// backend connection at once (outcome client_gone). Before the fix the
// backend connection stayed open until ResponseHeaderTimeout (or
// WriteTimeout for the body).
func TestClientLeavingBeforeTheHeadClosesTheBackend(t *testing.T) {
	cases := []struct {
		name     string
		bodySize int
		reading  bool // the backend reads the request
	}{
		{name: "head_wait", bodySize: 64, reading: true},
		{name: "body_send", bodySize: 12 << 20, reading: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hung := startHungBackend(t, tc.reading)
			obs := &recordingObserver{}
			s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{hung.addr}}, nil), Observer: obs,
				Limits: Limits{ResponseHeaderTimeout: time.Minute, WriteTimeout: time.Minute}})
			c := dialProxy(t, s)
			body := `{"prompt":"` + strings.Repeat("x", tc.bodySize) + `"}`
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			waitCh(t, hung.gotCh, "the request reached the backend", 10*time.Second)
			if !tc.reading {
				waitForLoad(t, s, 0, 1)
				time.Sleep(100 * time.Millisecond) // the write is blocked on full buffers
			}
			left := time.Now()
			c.Close()
			waitRecords(t, obs, 1)
			took := time.Since(left)
			if rec := obs.all()[0]; rec.Outcome != OutcomeClientGone {
				t.Fatalf("outcome %v, want client_gone", rec.Outcome)
			}
			if took > 2*time.Second {
				t.Fatalf("the request ended %s after the client left", took)
			}
			t.Logf("request ended %s after the client left", took.Round(time.Microsecond))
			hung.release() // a non-reading backend drains what it got; the proxy's close shows as EOF
			waitCh(t, hung.eofCh, "the backend connection closed", 2*time.Second)
			if tc.reading {
				t.Logf("backend saw EOF %s after the client left", hung.lastClosed().Sub(left).Round(time.Microsecond))
			}
			if n := s.Loads().Load(0); n != 0 {
				t.Fatalf("in flight after the client left: %d", n)
			}
		})
	}
}

func waitForLoad(t *testing.T, s *Server, ep, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.Loads().Load(ep) != n {
		if time.Now().After(deadline) {
			t.Fatalf("in flight on %d: %d, want %d", ep, s.Loads().Load(ep), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
