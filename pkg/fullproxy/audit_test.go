package fullproxy

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// tapAuditor taps every body and keeps what each tap saw.
type tapAuditor struct {
	mu   sync.Mutex
	taps []*recordingTap
}

type recordingTap struct {
	mu   sync.Mutex // the leg writes while the test reads
	buf  bytes.Buffer
	done bool
	res  datapath.Result
}

func (t *recordingTap) Write(p []byte) { t.mu.Lock(); t.buf.Write(p); t.mu.Unlock() }
func (t *recordingTap) Done(res datapath.Result) {
	t.mu.Lock()
	t.done, t.res = true, res
	t.mu.Unlock()
}

func (a *tapAuditor) Tap(*Record, *BackendResponse, string) BodyTap {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := &recordingTap{}
	a.taps = append(a.taps, t)
	return t
}

// TestBodyAuditorSeesTheRelayedBody: the auditor's tap gets exactly the
// payload the client got (the backend streams it chunked; the tap sees it
// without the framing) and is told once when the leg ended; a handler that set Record.UsageAudited
// (package pd, after auditing the prefill) relays untapped.
func TestBodyAuditorSeesTheRelayedBody(t *testing.T) {
	const body = "data: {\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n"
	be := startBackend(t, "ep0", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(body))
		w.(http.Flusher).Flush()
	})
	for _, tc := range []struct {
		name    string
		audited bool
		taps    int
	}{{"tapped", false, 1}, {"audited elsewhere", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			a := &tapAuditor{}
			fwd := NewForward(&staticRouter{addrs: []string{be.addr}}, nil)
			h := HandlerFunc(func(ctx context.Context, x *Exchange) bool {
				x.Record.UsageAudited = tc.audited
				return fwd.Serve(ctx, x)
			})
			s := startProxy(t, Config{Handler: h, BodyAuditor: a})
			resp, got := rawExchange(t, s.Addr().String(), "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			if resp.StatusCode != 200 || got != body {
				t.Fatalf("%d %q", resp.StatusCode, got)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if len(a.taps) != tc.taps {
				t.Fatalf("%d taps, want %d", len(a.taps), tc.taps)
			}
			if tc.taps == 0 {
				return
			}
			tap := a.taps[0]
			// The leg taps after its write to the client and is done after
			// the client's last byte.
			waitFor(t, "the tap done", func() bool { tap.mu.Lock(); defer tap.mu.Unlock(); return tap.done })
			tap.mu.Lock()
			defer tap.mu.Unlock()
			if !tap.done || tap.res.Ending != datapath.BackendEOF || tap.buf.String() != body {
				t.Fatalf("tap done %v ending %s saw %q", tap.done, tap.res.Ending, tap.buf.String())
			}
		})
	}
}
