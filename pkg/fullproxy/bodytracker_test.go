package fullproxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// trackingRouter is staticRouter whose plans implement BodyTracker and
// record when they were told about the first body byte and the end.
type trackingRouter struct {
	staticRouter
	mu     sync.Mutex
	events []string
	// firstAt is when FirstBody was called.
	firstAt time.Time
}

func (r *trackingRouter) Plan(ctx context.Context, req *Request) RoutePlan {
	return &trackingPlan{staticPlan: staticPlan{r: &r.staticRouter, req: req}, tr: r}
}

type trackingPlan struct {
	staticPlan
	tr *trackingRouter
}

func (p *trackingPlan) FirstBody() {
	p.tr.mu.Lock()
	p.tr.events = append(p.tr.events, "first-body")
	p.tr.firstAt = time.Now()
	p.tr.mu.Unlock()
}

func (p *trackingPlan) Ended() {
	p.tr.mu.Lock()
	p.tr.events = append(p.tr.events, "ended")
	p.tr.mu.Unlock()
}

func (r *trackingRouter) seen() ([]string, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...), r.firstAt
}

// TestBodyTrackerHearsFirstBodyByteAndEnd: a plan that implements
// BodyTracker hears the first body byte (not the head, which a streaming
// engine sends at once) and the end, each once; a bodyless answer, and a
// request whose endpoint never connected, end without a first body byte.
func TestBodyTrackerHearsFirstBodyByteAndEnd(t *testing.T) {
	const headToBody = 150 * time.Millisecond
	streamed := startBackend(t, "sse", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(headToBody)
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	})
	bodyless := startBackend(t, "204", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	for _, tc := range []struct {
		name      string
		addrs     []string
		want      []string
		wantFirst bool
	}{
		{"streamed body", []string{streamed.addr}, []string{"first-body", "ended"}, true},
		{"bodyless answer", []string{bodyless.addr}, []string{"ended"}, false},
		{"no endpoint connects", []string{"127.0.0.1:1"}, []string{"ended"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &trackingRouter{staticRouter: staticRouter{addrs: tc.addrs}}
			s := startProxy(t, Config{Handler: NewForward(rt, nil)})
			c := dialProxy(t, s)
			sent := time.Now()
			io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			waitZero(t, s.Loads())
			var got []string
			var firstAt time.Time
			for deadline := time.Now().Add(3 * time.Second); ; {
				if got, firstAt = rt.seen(); len(got) == len(tc.want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("events %v, want %v", got, tc.want)
				}
			}
			if tc.wantFirst && firstAt.Sub(sent) < headToBody {
				t.Errorf("FirstBody came %v after sending, before the body (%v after the head)", firstAt.Sub(sent), headToBody)
			}
		})
	}
}
