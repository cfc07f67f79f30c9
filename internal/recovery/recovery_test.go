package recovery

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

type counter struct {
	mu     sync.Mutex
	n      map[string]int
	notify chan string // when non-nil, receives each where counted
}

func (c *counter) Panicked(where string) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[where]++
	c.mu.Unlock()
	if c.notify != nil {
		c.notify <- where
	}
}

func (c *counter) get(where string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[where]
}

type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestGoRecoversLogsAndCounts(t *testing.T) {
	tests := []struct {
		name  string
		where string
		fn    func()
		want  string
	}{
		{"index", Conn, func() { var s []int; _ = s[0] }, "index out of range"},
		//lint:ignore SA5000 the nil-map panic is this case's input
		{"nil map", Subscriber, func() { var m map[string]int; m["x"] = 1 }, "nil map"},
		{"error value", Probe, func() { panic(errors.New("boom")) }, "boom"},
		{"string", Replay, func() { panic("plain") }, "plain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out syncWriter
			c := &counter{notify: make(chan string, 1)}
			g := New(slog.New(slog.NewJSONHandler(&out, nil)), c)
			cleaned := make(chan struct{})
			g.Go(tc.where, func() {
				defer close(cleaned) // the goroutine's own clean-up runs before the Guard's
				tc.fn()
			})
			<-cleaned
			if got := <-c.notify; got != tc.where || c.get(tc.where) != 1 {
				t.Fatalf("count %d, want 1", c.get(tc.where))
			}
			log := out.String()
			for _, want := range []string{tc.want, `"where":"` + tc.where + `"`, "recovery_test.go"} {
				if !strings.Contains(log, want) {
					t.Fatalf("log %q lacks %q", log, want)
				}
			}
		})
	}
}

func TestRunAndNilGuard(t *testing.T) {
	var g *Guard // nil: still recovers, logs to slog.Default, counts nothing
	if !g.Run(Poller, func() { panic("x") }) {
		t.Fatal("Run did not report the panic")
	}
	if g.Run(Poller, func() {}) {
		t.Fatal("Run reported a panic that did not happen")
	}
}

// TestHandlerPanicIsRecovered: a panicking management-API handler is counted,
// its connection closed, and the server keeps answering the next request.
func TestHandlerPanicIsRecovered(t *testing.T) {
	c := &counter{}
	g := New(slog.New(slog.NewTextHandler(io.Discard, nil)), c)
	mux := http.NewServeMux()
	mux.HandleFunc("/boom", func(http.ResponseWriter, *http.Request) { var p *struct{ x int }; _ = p.x })
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.Handler(API, mux), ErrorLog: nil}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	if resp, err := http.Get(base + "/boom"); err == nil {
		resp.Body.Close()
		t.Fatalf("panicking handler answered %d; want the connection closed", resp.StatusCode)
	}
	resp, err := http.Get(base + "/ok")
	if err != nil {
		t.Fatalf("server stopped serving after a handler panic: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" || c.get(API) != 1 {
		t.Fatalf("after the panic: body %q, count %d (want ok, 1)", b, c.get(API))
	}
}
