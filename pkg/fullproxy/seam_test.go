package fullproxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/health"
)

func TestEndingOutcome(t *testing.T) {
	for _, tt := range []struct {
		ending    datapath.Ending
		truncated bool
		want      Outcome
		label     string
	}{
		{datapath.BackendEOF, false, OutcomeOK, "ok"},
		{datapath.BackendEOF, true, OutcomeBackendError, "backend_error"},
		{datapath.ClientGone, false, OutcomeClientGone, "client_gone"},
		{datapath.ClientGone, true, OutcomeClientGone, "client_gone"},
		{datapath.Silence, false, OutcomeSilence, "silence"},
		{datapath.Cancelled, false, OutcomeCancelled, "cancelled"},
		{datapath.BackendError, false, OutcomeBackendError, "backend_error"},
		{datapath.BackendBroken, false, OutcomeBackendBroken, "backend_broken"},
	} {
		got := EndingOutcome(tt.ending, tt.truncated)
		if got != tt.want || got.String() != tt.label {
			t.Errorf("EndingOutcome(%v, truncated=%v) = %v (%q), want %v (%q)", tt.ending, tt.truncated, got, got.String(), tt.want, tt.label)
		}
	}
}

func TestOutcomeLabel(t *testing.T) {
	for _, tt := range []struct {
		rec  Record
		want string
	}{
		{Record{Outcome: OutcomeOK}, "ok"},
		{Record{Outcome: OutcomeAnswered, Code: "no_healthy_backend"}, "no_healthy_backend"},
		// An outcome set before Fail wins over the answered code.
		{Record{Outcome: OutcomeBackendError, Code: "pd_decode_stream_timeout"}, "backend_error"},
		{Record{Outcome: OutcomeClientError, Code: "bad_request"}, "client_error"},
		{Record{}, ""},
	} {
		if got := tt.rec.OutcomeLabel(); got != tt.want {
			t.Errorf("%+v: label %q, want %q", tt.rec, got, tt.want)
		}
	}
}

// recordingObserver keeps every finished record.
type recordingObserver struct {
	NopObserver
	mu   sync.Mutex
	recs []Record
}

func (o *recordingObserver) Done(r *Record) {
	o.mu.Lock()
	o.recs = append(o.recs, *r)
	o.mu.Unlock()
}

func (o *recordingObserver) all() []Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Record(nil), o.recs...)
}

// TestHandlerSeam: a handler that is not the forward gets each request
// with its body, answers through the exchange, and decides keep-alive; the
// server reports a record per request whatever the handler did.
func TestHandlerSeam(t *testing.T) {
	obs := &recordingObserver{}
	h := HandlerFunc(func(_ context.Context, x *Exchange) bool {
		switch x.Req.Path() {
		case "/echo":
			return x.Respond(200, []HeaderField{{Name: "Content-Type", Value: "text/plain"}, {Name: "Connection", Value: "x-drop"},
				{Name: "X-Drop", Value: "1"}}, x.Req.Body, "tier=test")
		case "/fail":
			return x.Fail(429, "test_busy", "come back later", HeaderField{Name: "Retry-After", Value: "1"})
		}
		return false // close without an answer
	})
	s := startProxy(t, Config{Handler: h, Observer: obs, DecisionHeader: true})
	c := dialProxy(t, s)
	br := bufio.NewReader(c)

	for i, tt := range []struct {
		raw, wantBody, wantHeader, wantValue string
		status                               int
	}{
		{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", "hello", "x-kvgate-decision", "tier=test", 200},
		{"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n", `{"error":"test_busy","detail":"come back later"}`, "Retry-After", "1", 429},
		{"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "abc", "Content-Type", "text/plain", 200},
	} {
		if _, err := io.WriteString(c, tt.raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the kept connection: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || string(b) != tt.wantBody || resp.Header.Get(tt.wantHeader) != tt.wantValue {
			t.Fatalf("request %d: %d %q %s=%q", i, resp.StatusCode, b, tt.wantHeader, resp.Header.Get(tt.wantHeader))
		}
		if resp.Header.Get("X-Drop") != "" {
			t.Fatalf("request %d: a header named by Connection was relayed", i)
		}
	}
	// The handler declines keep-alive: the server closes the connection.
	io.WriteString(c, "GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after a handler returned false: read %d, %v; want EOF", n, err)
	}

	waitRecords(t, obs, 4)
	want := []struct {
		status int
		label  string
	}{{200, "ok"}, {429, "test_busy"}, {200, "ok"}, {0, ""}}
	for i, r := range obs.all() {
		if r.Status != want[i].status || r.OutcomeLabel() != want[i].label {
			t.Errorf("record %d: status %d outcome %q, want %d %q", i, r.Status, r.OutcomeLabel(), want[i].status, want[i].label)
		}
	}
}

func waitRecords(t *testing.T, o *recordingObserver, n int) {
	t.Helper()
	for range 300 {
		if len(o.all()) >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d records, want %d", len(o.all()), n)
}

// TestForwardFeedsTheBreaker: the plain forward asks the rule's breaker
// before each try and tells it how the endpoint answered. A refused
// endpoint is skipped and the try counts in Attempts, as a connect failure
// does.
func TestForwardFeedsTheBreaker(t *testing.T) {
	failing := startBackend(t, "ep0", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })
	healthy := startBackend(t, "ep1", nil)
	tr, err := health.NewTracker(health.TrackerConfig{ServiceID: 1, Endpoints: []int{0, 1},
		Breaker: health.BreakerConfig{FailureThreshold: 5, OriginErrThreshold: 2}})
	if err != nil {
		t.Fatal(err)
	}
	obs := &recordingObserver{}
	// staticRouter ignores health (it always tries ep0 first), so only the
	// forward's breaker check keeps requests off ep0.
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{failing.addr, healthy.addr}}, tr), Observer: obs})
	for i, want := range []struct {
		engine   string
		status   int
		attempts int
	}{
		{"ep0", 503, 1}, // origin error 1
		{"ep0", 503, 1}, // origin error 2: the breaker opens
		{"ep1", 200, 2}, // ep0 refused (a spent try), ep1 answers
	} {
		resp, _ := rawExchange(t, s.Addr().String(), "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != want.status || resp.Header.Get("x-engine-id") != want.engine {
			t.Fatalf("request %d: %d from %q, want %d from %q", i, resp.StatusCode, resp.Header.Get("x-engine-id"), want.status, want.engine)
		}
		waitRecords(t, obs, i+1)
		if r := obs.all()[i]; r.Attempts != want.attempts || r.Decision.Endpoint != int(want.engine[2]-'0') {
			t.Fatalf("request %d: attempts %d ep %d, want %d on %s", i, r.Attempts, r.Decision.Endpoint, want.attempts, want.engine)
		}
	}
	if !tr.States().BreakerOpen.Has(0) {
		t.Fatal("two 503s did not open ep0's breaker")
	}
}

// TestForwardBreakerRefusalsAreBounded: when every try is refused the
// forward stops at MaxAttempts and answers 503 no_healthy_backend without
// dialing.
func TestForwardBreakerRefusalsAreBounded(t *testing.T) {
	tr, err := health.NewTracker(health.TrackerConfig{ServiceID: 1, Endpoints: []int{0, 1, 2, 3},
		Breaker: health.BreakerConfig{FailureThreshold: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for ep := range 4 {
		tr.ConnectFailure(ep) // threshold 1: open
		addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.Port(t, "127.0.0.1"))))
	}
	obs := &recordingObserver{}
	router := &staticRouter{addrs: addrs}
	s := startProxy(t, Config{Handler: NewForward(router, tr), Observer: obs, Limits: Limits{MaxAttempts: 3}})
	resp, body := rawExchange(t, s.Addr().String(), "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 503 || !strings.Contains(body, "no_healthy_backend") {
		t.Fatalf("%d %s, want 503 no_healthy_backend", resp.StatusCode, body)
	}
	waitRecords(t, obs, 1)
	if r := obs.all()[0]; r.Attempts != 3 || r.Routed || len(r.ConnectErr) != 0 {
		t.Fatalf("attempts %d routed %v connect errors %v, want 3 refused tries and no dial", r.Attempts, r.Routed, r.ConnectErr)
	}
	router.mu.Lock()
	defer router.mu.Unlock()
	if len(router.seen) != 3 || len(router.finished) != 0 {
		t.Fatalf("router asked %d times, finished %v; want 3 decisions and no Finish", len(router.seen), router.finished)
	}
}
