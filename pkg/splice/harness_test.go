//go:build linux

package splice

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// openTest loads the kernel path for one test under its own pin instance.
// Without BPF it skips, unless KVGATE_REQUIRE_BPF=1 (CI), where it fails.
func openTest(t testing.TB, cfg Config) *Datapath {
	t.Helper()
	if cfg.Instance == "" {
		cfg.Instance = fmt.Sprintf("test-%d-%s", os.Getpid(), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	sweepCrashedTestPins()
	d, err := Open(cfg)
	if err != nil {
		if os.Getenv("KVGATE_REQUIRE_BPF") == "1" || !errors.Is(err, datapath.ErrKernelUnavailable) {
			t.Fatalf("opening the sockmap data path: %v", err)
		}
		t.Skipf("no BPF here (set KVGATE_REQUIRE_BPF=1 to fail instead): %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
	})
	return d
}

// sweepCrashedTestPins removes pins left by test binaries that died (a
// timeout panic skips cleanups): test instances are named test-<pid>-…, so
// a new run never reuses them. Live instances hold their dir's lock.
func sweepCrashedTestPins() {
	ents, _ := os.ReadDir(DefaultPinDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "test-") && !strings.HasPrefix(e.Name(), "two-") && !strings.HasPrefix(e.Name(), "select-") &&
			!strings.HasPrefix(e.Name(), "e2e_") { // tests/e2e gateways (named after their API address)
			continue
		}
		dir := DefaultPinDir + "/" + e.Name()
		f, err := claimPinDir(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			continue // in use by a running test binary
		}
		_ = removePins(dir)
		f.Close()
	}
}

// --- backend -----------------------------------------------------------

// A request path selects the response:
//
//	/bulk?n=N&seed=S&delay=D         N random bytes, Content-Length, D µs after the head
//	/sse?chunks=C&seed=S&gap=D       C SSE events, chunked, D between events
//	/chunkedjson?chunks=C&seed=S     the same bytes as one chunked application/json burst
//	/burst?chunks=C&seed=S           C events written at once, then close
//	/stall?chunks=C                  C events, then silence until the conn dies
//	/reset?chunks=C                  C events, then RST
//	/small?n=N                       N bytes, Content-Length
//	/gated?chunks=C&split=K&tailgap=D  K events, wait for the gate, the rest
//	                                   at once (then D µs and one more flush)
type backend struct {
	gate  chan struct{} // /gated waits here between its two parts
	ln    net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
}

func startBackend(t testing.TB, addr string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("backend listen: %v", err)
	}
	b := &backend{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.conns.Add(1)
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				b.serve(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); b.wg.Wait() })
	return b
}

func (b *backend) addr() string { return b.ln.Addr().String() }

func param(q map[string]string, k string, def int) int {
	if v, ok := q[k]; ok {
		n, err := strconv.Atoi(v)
		if err == nil {
			return n
		}
	}
	return def
}

func parseTarget(target string) (string, map[string]string) {
	path, query, _ := strings.Cut(target, "?")
	q := map[string]string{}
	for _, kv := range strings.Split(query, "&") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			q[k] = v
		}
	}
	return path, q
}

// sseEvent is event i of a stream: its size varies so chunk boundaries move.
func sseEvent(r *rand.Rand, i int) []byte {
	n := 8 + r.IntN(120)
	tok := make([]byte, n)
	for j := range tok {
		tok[j] = 'a' + byte(r.IntN(26))
	}
	return []byte(fmt.Sprintf("data: {\"i\":%d,\"t\":\"%s\"}\n\n", i, tok))
}

func chunk(p []byte) []byte {
	return append(append([]byte(strconv.FormatInt(int64(len(p)), 16)+"\r\n"), p...), "\r\n"...)
}

func (b *backend) serve(c *net.TCPConn) {
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	path, q := parseTarget(req.RequestURI)
	seed := uint64(param(q, "seed", 1))
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	switch path {
	case "/bulk", "/small":
		n := param(q, "n", 0)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n)
		// A model server takes a moment between the head and the body.
		time.Sleep(time.Duration(param(q, "delay", 0)) * time.Microsecond)
		buf := make([]byte, 256<<10)
		for n > 0 {
			m := min(n, 1+r.IntN(len(buf)))
			fillRandom(r, buf[:m])
			if _, err := c.Write(buf[:m]); err != nil {
				return
			}
			n -= m
		}
	case "/gated":
		chunks, split := param(q, "chunks", 10), param(q, "split", 1)
		tailgap := time.Duration(param(q, "tailgap", 0)) * time.Microsecond
		w := bufio.NewWriterSize(c, 1<<20)
		w.WriteString(sseHead)
		for i := 0; i < chunks; i++ {
			if i == split {
				w.Flush()
				<-b.gate
			}
			w.Write(chunk(sseEvent(r, i)))
			if tailgap > 0 && i == chunks-2 {
				w.Flush()
				time.Sleep(tailgap)
			}
		}
		w.WriteString("0\r\n\r\n")
		w.Flush()
	case "/sse", "/burst", "/stall", "/reset", "/chunkedjson":
		chunks := param(q, "chunks", 10)
		gap := time.Duration(param(q, "gap", 0)) * time.Microsecond
		w := bufio.NewWriterSize(c, 64<<10)
		if path == "/chunkedjson" { // bulk in chunked framing, as a Go backend sends a large JSON body
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
		} else {
			w.WriteString(sseHead)
		}
		for i := 0; i < chunks; i++ {
			w.Write(chunk(sseEvent(r, i)))
			if path == "/burst" || path == "/chunkedjson" {
				continue
			}
			if err := w.Flush(); err != nil {
				return
			}
			if gap > 0 {
				time.Sleep(gap)
			}
		}
		switch path {
		case "/stall":
			w.Flush()
			io.Copy(io.Discard, br) // until the proxy closes us
			return
		case "/reset":
			w.Flush()
			time.Sleep(20 * time.Millisecond)
			c.SetLinger(0)
			return
		}
		w.WriteString("0\r\n\r\n")
		w.Flush()
	}
}

func fillRandom(r *rand.Rand, p []byte) {
	for i := 0; i+8 <= len(p); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(p) &^ 7; i < len(p); i++ {
		p[i] = byte(r.Uint32())
	}
}

// expectedBody rebuilds what the backend sends for target (decoded body).
func expectedBody(target string) []byte {
	path, q := parseTarget(target)
	seed := uint64(param(q, "seed", 1))
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []byte
	switch path {
	case "/bulk", "/small":
		n := param(q, "n", 0)
		buf := make([]byte, 256<<10)
		for n > 0 {
			m := min(n, 1+r.IntN(len(buf)))
			fillRandom(r, buf[:m])
			out = append(out, buf[:m]...)
			n -= m
		}
	default:
		for i := 0; i < param(q, "chunks", 10); i++ {
			out = append(out, sseEvent(r, i)...)
		}
	}
	return out
}

// sseWireBytes is the chunked body length of an /sse-like target.
func sseWireBytes(target string) int64 {
	_, q := parseTarget(target)
	seed := uint64(param(q, "seed", 1))
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var n int64
	for i := 0; i < param(q, "chunks", 10); i++ {
		n += int64(len(chunk(sseEvent(r, i))))
	}
	return n + 5
}

// --- proxy loop -----------------------------------------------------------

// legResult is what the harness proxy saw for one request.
type legResult struct {
	target string
	prefix int
	res    datapath.Result
}

// proxy is the tiny stand-in for fullproxy: per client connection, for each
// request: pick a backend (route), forward the request with Connection:
// close, read the response head, write it, then run the body leg.
type proxy struct {
	ln      net.Listener
	leg     datapath.BodyLeg
	route   func(target string) string
	silence time.Duration
	results chan legResult
	wg      sync.WaitGroup
}

func startProxy(t testing.TB, leg datapath.BodyLeg, route func(string) string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, leg: leg, route: route, results: make(chan legResult, 1<<14)}
	ctx, cancel := context.WithCancel(context.Background())
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer c.Close()
				p.serveClient(ctx, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); cancel(); p.wg.Wait() })
	return p
}

func (p *proxy) serveClient(ctx context.Context, c net.Conn) {
	cr := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintln(os.Stderr, "harness proxy: reading request:", err)
			}
			return
		}
		if !p.forward(ctx, c, req) {
			return
		}
	}
}

func (p *proxy) forward(ctx context.Context, c net.Conn, req *http.Request) bool {
	// Like kvgate's proxy, tag backend sockets so the load map counts them.
	dialer := net.Dialer{}
	if tb, ok := p.leg.(interface {
		TagBackend(network, address string, c syscall.RawConn) error
	}); ok {
		dialer.Control = tb.TagBackend
	}
	bc, err := dialer.Dial("tcp", p.route(req.RequestURI))
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness proxy: dial:", err)
		return false
	}
	defer bc.Close()
	fmt.Fprintf(bc, "GET %s HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n", req.RequestURI)
	br := bufio.NewReaderSize(bc, 16<<10)
	var head strings.Builder
	status, err := br.ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness proxy: reading response:", err)
		return false
	}
	head.WriteString(status)
	cl, streamed, tokenStream, chunked := int64(-1), false, false, false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return false
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch strings.ToLower(k) {
		case "content-length":
			cl, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		case "transfer-encoding", "content-type":
			if strings.Contains(v, "chunked") || strings.Contains(v, "event-stream") {
				streamed = true
			}
			if strings.Contains(v, "event-stream") {
				tokenStream = true
			}
			if strings.Contains(v, "chunked") {
				chunked = true
			}
		}
	}
	if _, err := io.WriteString(c, head.String()); err != nil {
		return false
	}
	prefix, _ := br.Peek(br.Buffered())
	opts := datapath.Options{Silence: p.silence, Streamed: streamed, TokenStream: tokenStream, ContentLength: cl}
	if cl >= 0 && !chunked {
		opts.End = &declaredLength{n: cl}
	}
	// Chunked bodies end when the backend closes (it serves one request per
	// connection); the legs following real chunked framing are tested in
	// package fullproxy, which owns it.
	res := p.leg.Run(ctx, c, bc, prefix, opts)
	p.results <- legResult{target: req.RequestURI, prefix: len(prefix), res: res}
	return res.Ending == datapath.BackendEOF
}

// declaredLength is the harness's datapath.BodyEnd for a body of n bytes:
// the legs stop at its last byte, and the kernel leg tells it how many it
// moved.
type declaredLength struct {
	n, seen int64
}

func (d *declaredLength) Feed(p []byte) int {
	take := min(int64(len(p)), d.n-d.seen)
	d.seen += take
	return int(take)
}

func (d *declaredLength) Skip(n int64, _ []byte, _ bool) { d.seen += n }

func (d *declaredLength) State() datapath.BodyState {
	return datapath.BodyState{Complete: d.seen >= d.n, Delimited: true, Seen: d.seen}
}

func (*declaredLength) BrokenEnd(string) []byte { return nil }

// --- client -----------------------------------------------------------------

// client is one keep-alive client connection.
type client struct {
	c  net.Conn
	br *bufio.Reader
}

func dialClient(t testing.TB, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("client dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c, br: bufio.NewReaderSize(c, 64<<10)}
}

// get sends one request and returns the decoded body's checksum and length.
func (cl *client) get(target string) (uint32, int64, error) {
	cl.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(cl.c, "GET %s HTTP/1.1\r\nHost: kvgate\r\n\r\n", target); err != nil {
		return 0, 0, err
	}
	resp, err := http.ReadResponse(cl.br, nil)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	h := crc32.NewIEEE()
	n, err := io.Copy(h, resp.Body)
	return h.Sum32(), n, err
}
