package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// sseServer streams three text chunks, a usage chunk and [DONE] on "/ok";
// "/nodone" omits [DONE] and "/busy" answers 503. The replay benchmark's
// numbers come from this client side, so both replay modes and every
// stream ending are checked against a real HTTP server.
func sseServer(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			http.Error(w, "queue full", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("x-engine-id", "e1")
		w.Header().Set("x-enginesim-queue-us", "1500")
		f := w.(http.Flusher)
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
			f.Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":5}}}\n\n")
		if r.URL.Path != "/nodone" {
			fmt.Fprint(w, "data: [DONE]\n\n")
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestReplay(t *testing.T) {
	base := sseServer(t)
	// Two conversations of three turns each, interleaved with independent
	// requests; open-loop offsets put later turns first to check the wait.
	var trace []Request
	for i := range 8 {
		r := Request{Seq: i, Conv: -1, Path: "/ok", At: time.Duration(8-i) * time.Millisecond}
		if i < 6 {
			r.Conv, r.Turn = i%2, i/2
		}
		trace = append(trace, r)
	}
	for _, c := range []struct {
		name string
		conc int
	}{{"open loop", 0}, {"closed loop, one client", 1}, {"closed loop, three clients", 3}} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			recs := Replay(ctx, base, trace, c.conc, 10*time.Second)
			if len(recs) != len(trace) {
				t.Fatalf("%d records for %d requests", len(recs), len(trace))
			}
			for i, rec := range recs {
				if rec.Err != nil {
					t.Fatalf("request %d: %v", i, rec.Err)
				}
				if rec.PromptTokens != 11 || rec.OutTokens != 3 || rec.CachedTokens != 5 || len(rec.Gaps) != 2 ||
					rec.Engine != "e1" || rec.EngineQueue != 1500*time.Microsecond || rec.TTFT <= 0 || rec.E2E < rec.TTFT {
					t.Fatalf("request %d: %+v", i, rec)
				}
				if tr := trace[i]; tr.Conv >= 0 && tr.Turn > 0 {
					prev := recs[i-2] // the same conversation's previous turn
					if rec.Start.Before(prev.End) {
						t.Fatalf("conversation %d turn %d started before turn %d ended", tr.Conv, tr.Turn, tr.Turn-1)
					}
				}
			}
		})
	}
}

func TestSendErrors(t *testing.T) {
	base := sseServer(t)
	for _, c := range []struct{ path, want string }{
		{"/nodone", "stream ended without [DONE]"},
		{"/busy", "status 503: queue full"},
	} {
		t.Run(c.path, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rec := send(ctx, http.DefaultClient, base, Request{Path: c.path})
			if rec.Err == nil || !strings.Contains(rec.Err.Error(), c.want) {
				t.Fatalf("error %v, want %q", rec.Err, c.want)
			}
		})
	}
}

// TestReplayCancelled: requests a cancelled point never sent are errors,
// not zero records that would count as instant successes.
func TestReplayCancelled(t *testing.T) {
	base := sseServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	trace := []Request{{Conv: 0, Turn: 0, Path: "/ok"}, {Conv: 0, Turn: 1, Path: "/ok"}, {Conv: -1, Path: "/ok"}}
	for _, conc := range []int{0, 2} {
		for i, rec := range Replay(ctx, base, trace, conc, time.Second) {
			if rec.Err == nil || rec.Start.IsZero() {
				t.Fatalf("conc %d request %d: %+v", conc, i, rec)
			}
		}
	}
}
