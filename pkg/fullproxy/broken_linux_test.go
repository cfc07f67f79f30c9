//go:build linux

package fullproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/fullproxy/internal/http1"
	"github.com/kvgate/kvgate/pkg/splice"
)

// TestBrokenResponses: a backend that closes before its body's end — a
// chunked body without its last chunk, a Content-Length body short — is a
// broken response on both legs, with the proxy's real framing (BodyFraming)
// followed over the real sockmap splice: the leg reports BackendBroken, the
// proxy closes the client connection at once (the client sees EOF, not a
// wait for an idle timeout) and records backend_broken, no terminator is
// invented, and an event stream cut at an event boundary gets a final error
// event. Before the fix both legs took the backend's EOF as the end and
// kept the client connection.
func TestBrokenResponses(t *testing.T) {
	d := openSplice(t)
	be := startRawBackend(t)
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
		leg := &recordingLeg{BodyLeg: lg.leg, results: make(chan datapath.Result, 16)}
		obs := &recordingObserver{}
		s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr()}}, nil), Leg: leg, Observer: obs})
		records := 0
		for _, tc := range cases {
			t.Run(lg.name+"/"+tc.name, func(t *testing.T) {
				c, br := dialRaw(t, s)
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", tc.target)
				for { // the head; the raw body is read below
					line, err := br.ReadString('\n')
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
					if _, err := readChunked(br); err != nil {
						t.Fatalf("complete body: %v", err)
					}
					// The connection stays usable.
					fmt.Fprintf(c, "GET /small?n=10 HTTP/1.1\r\nHost: x\r\n\r\n")
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("keep-alive after a complete body: %v", err)
					}
					if b, err := io.ReadAll(resp.Body); err != nil || len(b) != 10 {
						t.Fatalf("keep-alive after a complete body: %d bytes, %v", len(b), err)
					}
				} else {
					// The proxy must close the connection: EOF, not the deadline.
					raw, err = io.ReadAll(br)
					if err != nil {
						t.Fatalf("reading to the close: %v (after %d bytes)", err, len(raw))
					}
				}
				r := leg.next(t)
				if r.Ending != tc.ending || r.ErrorEvent != tc.errorEvent {
					t.Fatalf("ending %v (%v) error event %v, want %v, %v", r.Ending, r.Err, r.ErrorEvent, tc.ending, tc.errorEvent)
				}
				if lg.name == "sockmap" && tc.kernel && r.KernelBytes == 0 {
					t.Fatalf("nothing went through the kernel")
				}
				records++
				if tc.ending == datapath.BackendEOF {
					leg.next(t) // the keep-alive request's
					waitRecords(t, obs, records+1)
					if got, next := obs.all()[records-1].OutcomeLabel(), obs.all()[records].OutcomeLabel(); got != "ok" || next != "ok" {
						t.Fatalf("outcomes %q, %q; want ok, ok", got, next)
					}
					records++
					return
				}
				waitRecords(t, obs, records)
				if got := obs.all()[records-1].OutcomeLabel(); got != "backend_broken" {
					t.Fatalf("outcome %q, want backend_broken", got)
				}
				if bytes.HasSuffix(raw, []byte("0\r\n\r\n")) {
					t.Fatalf("a broken body got a terminator: %q", lastBytes(raw))
				}
				hasEvent := bytes.HasSuffix(raw, []byte("\"code\":\"backend_broken\"}}\n\n\r\n"))
				if hasEvent != tc.errorEvent {
					t.Fatalf("error event at the end %v, want %v: %q", hasEvent, tc.errorEvent, lastBytes(raw))
				}
				if tc.errorEvent {
					// The events before the error event are intact.
					f := http1.NewBodyFraming(true, -1, true)
					if n := f.Feed(raw); n != len(raw) || f.Err() != nil || !f.AtEventBoundary() {
						t.Fatalf("the body with the error event is not well-formed chunks: %v", f.Err())
					}
				}
				assertNoSpliceEntries(t, d)
			})
		}
	}
}

// openSplice loads the kernel path for one test under its own pin instance
// (named like package splice's test instances, so a crashed run's pins are
// swept there). Without BPF it skips, unless KVGATE_REQUIRE_BPF=1 (CI),
// where it fails.
func openSplice(t *testing.T) *splice.Datapath {
	t.Helper()
	d, err := splice.Open(splice.Config{
		Instance: fmt.Sprintf("test-%d-fullproxy-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_")),
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		if os.Getenv("KVGATE_REQUIRE_BPF") == "1" || !errors.Is(err, datapath.ErrKernelUnavailable) {
			t.Fatalf("opening the sockmap data path: %v", err)
		}
		t.Skipf("no BPF here (set KVGATE_REQUIRE_BPF=1 to fail instead): %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("closing the sockmap data path: %v", err)
		}
	})
	return d
}

func assertNoSpliceEntries(t *testing.T, d *splice.Datapath) {
	t.Helper()
	b, c, p, err := d.Entries()
	if err != nil {
		t.Fatalf("counting map entries: %v", err)
	}
	if b != 0 || c != 0 || p != 0 {
		t.Fatalf("leaked map entries: backends=%d clients=%d pairs=%d", b, c, p)
	}
}

// recordingLeg passes every body leg's result on to the test.
type recordingLeg struct {
	datapath.BodyLeg
	results chan datapath.Result
}

func (l *recordingLeg) Run(ctx context.Context, client, backend net.Conn, prefix []byte, opts datapath.Options) datapath.Result {
	r := l.BodyLeg.Run(ctx, client, backend, prefix, opts)
	l.results <- r
	return r
}

func (l *recordingLeg) next(t *testing.T) datapath.Result {
	t.Helper()
	select {
	case r := <-l.results:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("the body leg did not finish within 60s")
	}
	return datapath.Result{}
}

// dialRaw connects a client to s with a 60 s deadline.
func dialRaw(t *testing.T, s *Server) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c, bufio.NewReaderSize(c, 64<<10)
}

func lastBytes(b []byte) []byte {
	if len(b) > 80 {
		return b[len(b)-80:]
	}
	return b
}

// readChunked reads one chunked body to its end.
func readChunked(br *bufio.Reader) ([]byte, error) {
	f := http1.NewBodyFraming(true, -1, false)
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

// rawBackend writes responses byte by byte as a request path says, one
// request per connection:
//
//	/sse?chunks=C&gap=D&trailer=T    C SSE events, chunked, D µs apart
//	                                 (T=1: ends with a 34-byte trailer)
//	/cut?chunks=C&gap=D&mid=M        C events, then (M=1) half a chunk, then
//	                                 close without the last chunk
//	/short?n=N&send=M&delay=D        Content-Length N, D µs, M random bytes, close
//	/small?n=N                       N bytes, Content-Length
type rawBackend struct {
	ln net.Listener
	wg sync.WaitGroup
}

func startRawBackend(t *testing.T) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				serveRaw(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); b.wg.Wait() })
	return b
}

func (b *rawBackend) addr() string { return b.ln.Addr().String() }

func serveRaw(c net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	q := req.URL.Query()
	param := func(k string) int { n, _ := strconv.Atoi(q.Get(k)); return n }
	r := rand.New(rand.NewPCG(1, 2))
	gap := time.Duration(param("gap")) * time.Microsecond
	const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	w := bufio.NewWriterSize(c, 64<<10)
	defer w.Flush()
	switch req.URL.Path {
	case "/short", "/small":
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", param("n"))
		w.Flush()
		time.Sleep(time.Duration(param("delay")) * time.Microsecond)
		send := param("send")
		if req.URL.Path == "/small" {
			send = param("n")
		}
		buf := make([]byte, send)
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		w.Write(buf)
	case "/sse", "/cut":
		w.WriteString(sseHead)
		for i := 0; i < param("chunks"); i++ {
			w.Write(chunkOf(sseEventOf(r, i)))
			if err := w.Flush(); err != nil {
				return
			}
			time.Sleep(gap)
		}
		switch {
		case req.URL.Path == "/cut" && param("mid") == 1:
			ev := chunkOf(sseEventOf(r, param("chunks")))
			w.Write(ev[:len(ev)/2])
		case req.URL.Path == "/cut":
		case param("trailer") == 1: // longer than the tail the verdict keeps, as enginesim's
			w.WriteString("0\r\nX-Enginesim-Ttft-Us: 14167\r\n\r\n")
		default:
			w.WriteString(http1.LastChunk)
		}
		w.Flush()
		if req.URL.Path == "/cut" {
			time.Sleep(gap)
		}
	}
}

// sseEventOf is event i of a stream: its size varies so chunk boundaries move.
func sseEventOf(r *rand.Rand, i int) []byte {
	tok := make([]byte, 8+r.IntN(120))
	for j := range tok {
		tok[j] = 'a' + byte(r.IntN(26))
	}
	return []byte(fmt.Sprintf("data: {\"i\":%d,\"t\":\"%s\"}\n\n", i, tok))
}

func chunkOf(p []byte) []byte {
	return append(append([]byte(strconv.FormatInt(int64(len(p)), 16)+"\r\n"), p...), "\r\n"...)
}
