package fullproxy

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
)

// panicRouter panics on any path containing "boom", as a router bug on one
// hostile body would; other requests route to addr.
type panicRouter struct{ staticRouter }

func (r *panicRouter) Plan(ctx context.Context, req *Request) RoutePlan {
	if strings.Contains(req.Path(), "boom") {
		var none []int
		_ = none[len(req.Path())] // index out of range
	}
	return r.staticRouter.Plan(ctx, req)
}

type panicCount struct {
	mu     sync.Mutex
	n      map[string]int
	notify chan struct{}
}

// Panicked counts, then signals: the connection closes (its own defer)
// before the guard counts, so the test waits for the signal.
func (c *panicCount) Panicked(where string) {
	c.mu.Lock()
	c.n[where]++
	c.mu.Unlock()
	c.notify <- struct{}{}
}

func (c *panicCount) get(where string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[where]
}

// TestConnPanicIsRecovered: a panic while handling one connection closes
// that connection, is counted under where=conn, and the proxy keeps serving
// with nothing leaked (connections untracked, loads at zero, Shutdown
// returns).
func TestConnPanicIsRecovered(t *testing.T) {
	be := startBackend(t, "e0", nil)
	count := &panicCount{n: map[string]int{}, notify: make(chan struct{}, 8)}
	guard := recovery.New(slog.New(slog.NewTextHandler(io.Discard, nil)), count)
	s := startProxy(t, Config{Handler: NewForward(&panicRouter{staticRouter{addrs: []string{be.addr}}}, nil), Guard: guard})

	for i, path := range []string{"/v1/boom", "/v1/completions/boom", "/v1/boom"} {
		c := dialProxy(t, s)
		if _, err := io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			t.Fatal(err)
		}
		if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
			t.Fatalf("request %d: read %q, %v: want the connection closed without an answer", i, b, err)
		}
		<-count.notify
		if got := count.get(recovery.Conn); got != i+1 {
			t.Fatalf("after %d panics: kvgate_panics_total{where=conn} = %d", i+1, got)
		}
	}
	resp, body := rawExchange(t, s.Addr().String(), "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != 200 || !strings.Contains(body, `"engine":"e0"`) {
		t.Fatalf("after the panics: %d %q", resp.StatusCode, body)
	}
	waitZero(t, s.Loads())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown after recovered panics: %v (a connection stayed tracked)", err)
	}
}
