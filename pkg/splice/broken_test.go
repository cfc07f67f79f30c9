//go:build linux

package splice

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// TestBrokenResponses: a backend that closes before its body's end — a
// chunked body without its last chunk, a Content-Length body short — is a
// broken response on both legs: the leg reports BackendBroken, the proxy
// closes the client connection at once (the client sees EOF, not a wait for
// an idle timeout), no terminator is invented, and an event stream cut at
// an event boundary gets a final error event. Before the fix both legs took
// the backend's EOF as the end and kept the client connection.
func TestBrokenResponses(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	legs := []struct {
		name string
		leg  datapath.BodyLeg
	}{{"userspace", datapath.NewUserspace(0)}, {"sockmap", d}}
	cases := []struct {
		name, target string
		ending       datapath.Ending
		errorEvent   bool
		kernel       bool // the sockmap leg redirects part of the body
	}{
		{"chunked cut at an event boundary, spliced", "/cut?chunks=30&gap=3000", datapath.BackendBroken, true, true},
		{"chunked cut mid-chunk, spliced", "/cut?chunks=30&gap=3000&mid=1", datapath.BackendBroken, false, true},
		{"chunked cut within the drain", "/cut?chunks=3", datapath.BackendBroken, true, false},
		{"content-length short", "/short?n=1000000&send=300000", datapath.BackendBroken, false, false},
		{"content-length short, spliced", "/short?n=1000000&send=300000&delay=20000", datapath.BackendBroken, false, true},
		{"complete stream", "/sse?chunks=30&gap=3000", datapath.BackendEOF, false, true},
		{"complete stream with a trailer longer than the kept tail", "/sse?chunks=30&gap=3000&trailer=1", datapath.BackendEOF, false, true},
	}
	for _, lg := range legs {
		p := startProxy(t, lg.leg, func(string) string { return be.addr() })
		for _, tc := range cases {
			t.Run(lg.name+"/"+tc.name, func(t *testing.T) {
				cl := dialClient(t, p.ln.Addr().String())
				cl.c.SetReadDeadline(time.Now().Add(legBound))
				fmt.Fprintf(cl.c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", tc.target)
				for { // the head; the raw body is read below
					line, err := cl.br.ReadString('\n')
					if err != nil {
						t.Fatal(err)
					}
					if line == "\r\n" {
						break
					}
				}
				var raw []byte
				var err error
				if tc.ending == datapath.BackendEOF {
					if _, err := readChunked(cl.br); err != nil {
						t.Fatalf("complete body: %v", err)
					}
					if _, _, err := cl.get("/small?n=10"); err != nil { // the connection stays usable
						t.Fatalf("keep-alive after a complete body: %v", err)
					}
				} else {
					// The proxy must close the connection: EOF, not the deadline.
					raw, err = io.ReadAll(cl.br)
					if err != nil {
						t.Fatalf("reading to the close: %v (after %d bytes)", err, len(raw))
					}
				}
				r := nextResult(t, p)
				if r.res.Ending != tc.ending || r.res.ErrorEvent != tc.errorEvent {
					t.Fatalf("ending %v (%v) error event %v, want %v, %v", r.res.Ending, r.res.Err, r.res.ErrorEvent, tc.ending, tc.errorEvent)
				}
				if lg.name == "sockmap" && tc.kernel && r.res.KernelBytes == 0 {
					t.Fatalf("nothing went through the kernel")
				}
				if tc.ending == datapath.BackendEOF {
					nextResult(t, p)
					return
				}
				if bytes.HasSuffix(raw, []byte("0\r\n\r\n")) {
					t.Fatalf("a broken body got a terminator: %q", tail(raw))
				}
				hasEvent := bytes.HasSuffix(raw, []byte("\"code\":\"backend_broken\"}}\n\n\r\n"))
				if hasEvent != tc.errorEvent {
					t.Fatalf("error event at the end %v, want %v: %q", hasEvent, tc.errorEvent, tail(raw))
				}
				if tc.errorEvent {
					// The events before the error event are intact.
					f := datapath.NewFraming(true, -1)
					if n := f.Feed(raw); n != len(raw) || f.Err() != nil || !f.AtEventBoundary() {
						t.Fatalf("the body with the error event is not well-formed chunks: %v", f.Err())
					}
				}
				assertNoEntries(t, d)
			})
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 80 {
		return b[len(b)-80:]
	}
	return b
}

// readChunked reads one chunked body to its end.
func readChunked(br *bufio.Reader) ([]byte, error) {
	f := datapath.NewFraming(true, -1)
	var out []byte
	for !f.Complete() {
		b, err := br.Peek(max(1, min(br.Buffered(), 4096)))
		if err != nil {
			return out, err
		}
		n := f.Feed(b)
		out = append(out, b[:n]...)
		br.Discard(n)
		if f.Err() != nil {
			return out, f.Err()
		}
	}
	return out, nil
}
