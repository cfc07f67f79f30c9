//go:build linux

package splice

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kvgate/kvgate/pkg/datapath"
)

func assertNoEntries(t *testing.T, d *Datapath) {
	t.Helper()
	b, c, p, err := d.Entries()
	if err != nil {
		t.Fatalf("counting map entries: %v", err)
	}
	if b != 0 || c != 0 || p != 0 {
		t.Fatalf("leaked map entries: backends=%d clients=%d pairs=%d", b, c, p)
	}
}

func nextResult(t *testing.T, p *proxy) legResult {
	t.Helper()
	select {
	case r := <-p.results:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("the body leg did not finish within 60s")
	}
	return legResult{}
}

// TestByteIdentical: large and SSE bodies arrive byte-identical on both
// paths, and on the sockmap path the BPF counter equals the spliced bytes.
func TestByteIdentical(t *testing.T) {
	d := openTest(t, Config{})
	user := datapath.NewUserspace(0)
	be := startBackend(t, "127.0.0.1:0")
	// -short (the race step, make race) moves 16 MiB bulk bodies instead of
	// 100 MiB: the same code paths, a sixth of the copying under -race.
	bulk := 100 << 20
	if testing.Short() {
		bulk = 16 << 20
	}
	cases := []struct {
		name, target string
		kernel       bool // the sockmap leg takes the body
		spliceMost   bool // and the kernel moves most of it
	}{
		{"bulk", fmt.Sprintf("/bulk?n=%d&seed=7&delay=5000", bulk), true, true},
		{"bulk outrunning the drain", fmt.Sprintf("/bulk?n=%d&seed=8", bulk), true, false},
		{"sse 10k chunks", "/sse?chunks=10000&seed=3", true, false},
		{"sse 10k chunks paced", "/sse?chunks=10000&seed=4&gap=20", true, true},
		{"burst then close before the splice", "/burst?chunks=3000&seed=5", true, false},
		{"small body stays in userspace", "/small?n=1000&seed=6", false, false},
	}
	for _, leg := range []datapath.BodyLeg{user, d} {
		for _, tc := range cases {
			t.Run(leg.Path()+"/"+tc.name, func(t *testing.T) {
				p := startProxy(t, leg, func(string) string { return be.addr() })
				cl := dialClient(t, p.ln.Addr().String())
				before := d.SplicedBytes()
				userBefore := d.user.Stats().Moved["userspace"]
				sum, n, err := cl.get(tc.target)
				if err != nil {
					t.Fatalf("get: %v", err)
				}
				want := expectedBody(tc.target)
				if n != int64(len(want)) || sum != crc32.ChecksumIEEE(want) {
					t.Fatalf("body differs: got %d bytes crc %08x, want %d bytes crc %08x", n, sum, len(want), crc32.ChecksumIEEE(want))
				}
				r := nextResult(t, p)
				if r.res.Ending != datapath.BackendEOF {
					t.Fatalf("ending %v (%v), want backend_eof", r.res.Ending, r.res.Err)
				}
				if leg == datapath.BodyLeg(user) {
					if r.res.KernelBytes != 0 || r.res.Path != "userspace" {
						t.Fatalf("userspace leg reported kernel bytes %d path %s", r.res.KernelBytes, r.res.Path)
					}
					return
				}
				spliced := d.SplicedBytes() - before
				userMoved := d.user.Stats().Moved["userspace"] - userBefore
				if !tc.kernel {
					if spliced != 0 || r.res.Path != "userspace" {
						t.Fatalf("small body: spliced %d bytes, path %s; want 0, userspace", spliced, r.res.Path)
					}
					return
				}
				if tc.spliceMost && r.res.Path != "sockmap" {
					t.Fatalf("path %s, want sockmap", r.res.Path)
				}
				if uint64(r.res.KernelBytes) != spliced {
					t.Fatalf("BPF total counter moved %d, leg reports %d kernel bytes", spliced, r.res.KernelBytes)
				}
				// The userspace copy counter holds exactly what was not spliced:
				// the prefix read with the head plus the pre-splice drain.
				if userMoved != uint64(r.res.Bytes-r.res.KernelBytes) || userMoved < uint64(r.prefix) {
					t.Fatalf("userspace counter moved %d; leg bytes %d, kernel %d, prefix %d", userMoved, r.res.Bytes, r.res.KernelBytes, r.prefix)
				}
				if tc.spliceMost && r.res.KernelBytes < r.res.Bytes/2 {
					t.Fatalf("only %d of %d bytes spliced", r.res.KernelBytes, r.res.Bytes)
				}
				assertNoEntries(t, d)
			})
		}
	}
}

// TestHandOverWindow: bytes (and the FIN) that reach the backend socket
// after the pre-splice drain but before the sockhash insertion are
// delivered once, in order, ahead of later bytes.
func TestHandOverWindow(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	be.gate = make(chan struct{}, 1)
	for _, tc := range []struct{ name, target string }{
		{"rest and FIN queued at insertion", "/gated?chunks=4000&seed=11&split=100"},
		{"rest queued, more follows", "/gated?chunks=4000&seed=12&split=100&tailgap=200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.beforeInsert = func() {
				be.gate <- struct{}{}
				time.Sleep(100 * time.Millisecond) // the backend writes into the window
			}
			defer func() { d.beforeInsert = nil }()
			p := startProxy(t, d, func(string) string { return be.addr() })
			cl := dialClient(t, p.ln.Addr().String())
			sum, n, err := cl.get(tc.target)
			want := expectedBody(tc.target)
			if err != nil || n != int64(len(want)) || sum != crc32.ChecksumIEEE(want) {
				t.Fatalf("body differs: n=%d err=%v, want %d bytes", n, err, len(want))
			}
			r := nextResult(t, p)
			if r.res.Ending != datapath.BackendEOF || r.res.KernelBytes == 0 {
				t.Fatalf("ending %v, kernel bytes %d: the window's bytes were not spliced", r.res.Ending, r.res.KernelBytes)
			}
			assertNoEntries(t, d)
		})
	}
}

// TestDrainBufferReleasedBeforeSplice: the pre-splice drain buffer is back
// in its pool before the kernel takes the body, not held for as long as the
// spliced response lasts (2,000 long streams held 125 MiB so in the soak).
func TestDrainBufferReleasedBeforeSplice(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	held := make(chan int64, 1)
	d.beforeInsert = func() {
		select {
		case held <- d.drainHeld.Load():
		default:
		}
	}
	defer func() { d.beforeInsert = nil }()
	p := startProxy(t, d, func(string) string { return be.addr() })
	cl := dialClient(t, p.ln.Addr().String())
	target := "/sse?chunks=50&gap=2000&seed=5"
	sum, n, err := cl.get(target)
	want := expectedBody(target)
	if err != nil || n != int64(len(want)) || sum != crc32.ChecksumIEEE(want) {
		t.Fatalf("body differs: n=%d err=%v, want %d bytes", n, err, len(want))
	}
	nextResult(t, p)
	select {
	case h := <-held:
		if h != 0 {
			t.Fatalf("%d drain buffers held while the body was handed to the kernel, want 0", h)
		}
	default:
		t.Fatal("the body was never handed to the kernel")
	}
}

// TestKeepAliveDecidedAfresh: the second request on one client connection
// is routed again (to another backend) and both bodies are intact.
func TestKeepAliveDecidedAfresh(t *testing.T) {
	d := openTest(t, Config{})
	be1 := startBackend(t, "127.0.0.1:0")
	be2 := startBackend(t, "127.0.0.1:0")
	p := startProxy(t, d, func(target string) string {
		if strings.Contains(target, "seed=2") {
			return be2.addr()
		}
		return be1.addr()
	})
	cl := dialClient(t, p.ln.Addr().String())
	for i, target := range []string{"/sse?chunks=500&seed=1", "/sse?chunks=700&seed=2", "/bulk?n=300000&seed=1"} {
		sum, n, err := cl.get(target)
		want := expectedBody(target)
		if err != nil || n != int64(len(want)) || sum != crc32.ChecksumIEEE(want) {
			r := nextResult(t, p)
			t.Fatalf("request %d %s: n=%d err=%v (want %d bytes); leg %+v", i, target, n, err, len(want), r.res)
		}
		// A burst can end before the insertion on a loaded machine (the
		// sockhash refuses a closed backend), and then the userspace copy
		// finishes it: still one complete body, as TestSequentialNoLeaks
		// notes.
		if r := nextResult(t, p); r.res.Ending != datapath.BackendEOF || (r.res.Path != "sockmap" && r.res.KernelBytes != 0) {
			t.Fatalf("request %d: path %s ending %v", i, r.res.Path, r.res.Ending)
		}
		assertNoEntries(t, d)
	}
	if be1.conns.Load() != 2 || be2.conns.Load() != 1 {
		t.Fatalf("backend connections: be1=%d be2=%d, want 2 and 1", be1.conns.Load(), be2.conns.Load())
	}
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("reading fds: %v", err)
	}
	return len(es)
}

// TestSequentialNoLeaks: 10k sequential requests leave no map entries,
// file descriptors or goroutines behind.
func TestSequentialNoLeaks(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	p := startProxy(t, d, func(string) string { return be.addr() })
	n := 10000
	if testing.Short() {
		n = 1000
	}
	// Warm up, then take the baseline.
	cl := dialClient(t, p.ln.Addr().String())
	if _, _, err := cl.get("/sse?chunks=3"); err != nil {
		t.Fatal(err)
	}
	<-p.results
	fds, gor := openFDs(t), runtime.NumGoroutine()
	spliced := 0
	for i := 0; i < n; i++ {
		target := fmt.Sprintf("/sse?chunks=%d&seed=%d&gap=50", 1+i%7, i)
		sum, m, err := cl.get(target)
		want := expectedBody(target)
		if err != nil || m != int64(len(want)) || sum != crc32.ChecksumIEEE(want) {
			var leg any = "no leg ran"
			select {
			case r := <-p.results:
				leg = r.res
			case <-time.After(time.Second):
			}
			t.Fatalf("request %d: n=%d (want %d, wire %d) err=%v; leg %+v", i, m, len(want), sseWireBytes(target), err, leg)
		}
		// A backend that closes between the drain and the insertion leaves
		// the body to the userspace copy: still one leg, still in order.
		r := <-p.results
		if r.res.Ending != datapath.BackendEOF {
			t.Fatalf("request %d: path %s ending %v", i, r.res.Path, r.res.Ending)
		}
		if r.res.KernelBytes > 0 {
			spliced++
		}
	}
	if spliced == 0 {
		t.Fatalf("none of %d responses went through the kernel", n)
	}
	t.Logf("%d of %d responses spliced in the kernel (the rest ended within the pre-splice drain)", spliced, n)
	assertNoEntries(t, d)
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, g := openFDs(t), runtime.NumGoroutine()
		if f <= fds && g <= gor {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d requests: fds %d (was %d), goroutines %d (was %d)", n, f, fds, g, gor)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestResets: a client reset and a backend reset mid-stream both end the
// leg and leave nothing in the maps; a silent backend ends by the bound.
func TestResets(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	p := startProxy(t, d, func(string) string { return be.addr() })
	p.silence = 300 * time.Millisecond

	t.Run("client reset", func(t *testing.T) {
		cl := dialClient(t, p.ln.Addr().String())
		fmt.Fprintf(cl.c, "GET /sse?chunks=100000000&gap=100 HTTP/1.1\r\nHost: x\r\n\r\n")
		buf := make([]byte, 4096)
		if _, err := cl.br.Read(buf); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		cl.c.(*net.TCPConn).SetLinger(0)
		cl.c.Close()
		r := nextResult(t, p)
		if r.res.Ending != datapath.ClientGone {
			t.Fatalf("ending %v (%v), want client_gone", r.res.Ending, r.res.Err)
		}
		assertNoEntries(t, d)
	})
	t.Run("backend reset", func(t *testing.T) {
		cl := dialClient(t, p.ln.Addr().String())
		fmt.Fprintf(cl.c, "GET /reset?chunks=200 HTTP/1.1\r\nHost: x\r\n\r\n")
		r := nextResult(t, p)
		if r.res.Ending != datapath.BackendError {
			t.Fatalf("ending %v (%v), want backend_error", r.res.Ending, r.res.Err)
		}
		assertNoEntries(t, d)
	})
	t.Run("silence", func(t *testing.T) {
		cl := dialClient(t, p.ln.Addr().String())
		start := time.Now()
		fmt.Fprintf(cl.c, "GET /stall?chunks=20&gap=2000 HTTP/1.1\r\nHost: x\r\n\r\n")
		r := nextResult(t, p)
		if r.res.Ending != datapath.Silence {
			t.Fatalf("ending %v (%v), want silence", r.res.Ending, r.res.Err)
		}
		if el := time.Since(start); el < p.silence {
			t.Fatalf("silence ended after %s, before the %s bound", el, p.silence)
		}
		if r.res.KernelBytes == 0 || r.res.LastActivity.IsZero() {
			t.Fatalf("kernel bytes %d, last activity %v", r.res.KernelBytes, r.res.LastActivity)
		}
		assertNoEntries(t, d)
	})
}

// TestTwoInstances: two instances load, pin and splice at once without
// touching each other's pins; a live instance's name cannot be reused; a
// crashed run's pins are recovered.
func TestTwoInstances(t *testing.T) {
	base := fmt.Sprintf("two-%d", os.Getpid())
	a := openTest(t, Config{Instance: base + "-a"})
	b := openTest(t, Config{Instance: base + "-b"})
	if a.PinDir() == b.PinDir() {
		t.Fatal("instances share a pin dir")
	}
	if _, err := Open(Config{Instance: base + "-a"}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open of a live instance: %v, want 'in use'", err)
	}
	be := startBackend(t, "127.0.0.1:0")
	pa := startProxy(t, a, func(string) string { return be.addr() })
	pb := startProxy(t, b, func(string) string { return be.addr() })
	errs := make(chan error, 2)
	for _, p := range []*proxy{pa, pb} {
		go func() {
			cl := dialClient(t, p.ln.Addr().String())
			target := "/sse?chunks=3000&seed=9&gap=10"
			sum, n, err := cl.get(target)
			if want := expectedBody(target); err == nil && (n != int64(len(want)) || sum != crc32.ChecksumIEEE(want)) {
				err = errors.New("body differs")
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ra, rb := nextResult(t, pa), nextResult(t, pb)
	if uint64(ra.res.KernelBytes) != a.SplicedBytes() || uint64(rb.res.KernelBytes) != b.SplicedBytes() {
		t.Fatalf("counters crossed: a leg %d map %d, b leg %d map %d", ra.res.KernelBytes, a.SplicedBytes(), rb.res.KernelBytes, b.SplicedBytes())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.PinDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pins of a remain after close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.PinDir(), "pairs")); err != nil {
		t.Fatalf("closing a touched b's pins: %v", err)
	}

	// A crashed run leaves pins under its name and no lock: recover them.
	stale := base + "-stale"
	dir := filepath.Join(DefaultPinDir, stale)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(filepath.Join(dir, "pairs")); err != nil {
		t.Fatal(err)
	}
	m.Close()
	c := openTest(t, Config{Instance: stale})
	if _, err := os.Stat(filepath.Join(c.PinDir(), "splice_verdict")); err != nil {
		t.Fatalf("recovered instance did not pin: %v", err)
	}
}

// TestLoadMapAgreesWithCounts: the sock_ops counter mirrors the proxy's
// count of open backend connections, under load and at rest.
func TestLoadMapAgreesWithCounts(t *testing.T) {
	d := openTest(t, Config{})
	be0 := startBackend(t, "127.0.0.1:0")
	be1 := startBackend(t, "127.0.0.1:0")
	for i, be := range []*backend{be0, be1} {
		if err := d.SetEndpoint(i, netip.MustParseAddrPort(be.addr())); err != nil {
			t.Fatal(err)
		}
	}
	check := func(want ...int) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			ok := true
			var got []uint64
			for i, w := range want {
				l, err := d.EndpointLoad(i)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, l.ActiveConns)
				ok = ok && l.ActiveConns == uint64(w)
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("load map %v, proxy counts %v", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	check(0, 0)
	// A connection the proxy did not dial (a health probe, a metrics scrape,
	// another instance) is not load.
	probe, err := net.Dial("tcp", be0.addr())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	check(0, 0)
	probe.Close()
	// The proxy's in-flight count per endpoint: streams held open.
	p := startProxy(t, d, func(target string) string {
		if strings.Contains(target, "ep=1") {
			return be1.addr()
		}
		return be0.addr()
	})
	var clients []*client
	for i := 0; i < 5; i++ {
		cl := dialClient(t, p.ln.Addr().String())
		fmt.Fprintf(cl.c, "GET /stall?chunks=1&ep=%d HTTP/1.1\r\nHost: x\r\n\r\n", i%2)
		clients = append(clients, cl)
	}
	check(3, 2)
	for _, cl := range clients {
		cl.c.Close()
	}
	for range clients {
		nextResult(t, p)
	}
	check(0, 0)
	// Spliced bytes are attributed to the endpoint.
	cl := dialClient(t, p.ln.Addr().String())
	if _, _, err := cl.get("/sse?chunks=100&gap=1000&ep=1"); err != nil {
		t.Fatal(err)
	}
	r := nextResult(t, p)
	l, _ := d.EndpointLoad(1)
	if l.SplicedBytes != uint64(r.res.KernelBytes) || l.Streams != 1 || l.FirstByte.IsZero() {
		t.Fatalf("endpoint 1 load %+v, leg kernel bytes %d", l, r.res.KernelBytes)
	}
	check(0, 0)
}

// TestSelect: --datapath modes.
func TestSelect(t *testing.T) {
	cases := []struct {
		mode     datapath.Mode
		opener   datapath.KernelOpener
		wantPath string
		wantErr  bool
	}{
		{datapath.ModeUserspace, nil, "userspace", false},
		{datapath.ModeSockmap, nil, "", true},
		{datapath.ModeSockmap, func() (datapath.KernelLeg, error) { return nil, datapath.ErrKernelUnavailable }, "", true},
		{datapath.ModeAuto, func() (datapath.KernelLeg, error) { return nil, datapath.ErrKernelUnavailable }, "userspace", false},
		{datapath.ModeSockmap, Opener(Config{Instance: fmt.Sprintf("select-%d", os.Getpid())}), "sockmap", false},
		{datapath.ModeAuto, OpenerFor(datapath.ModeAuto, Config{Instance: fmt.Sprintf("select-auto-%d", os.Getpid())}), "sockmap", false},
	}
	for _, tc := range cases {
		s, err := datapath.New(datapath.Config{Mode: tc.mode, OpenKernel: tc.opener})
		if (err != nil) != tc.wantErr {
			if tc.wantPath == "sockmap" && os.Getenv("KVGATE_REQUIRE_BPF") != "1" && errors.Is(err, datapath.ErrKernelUnavailable) {
				continue
			}
			t.Fatalf("mode %s: err %v, want error %v", tc.mode, err, tc.wantErr)
		}
		if err != nil {
			continue
		}
		if s.Path() != tc.wantPath || s.Stats().Path != tc.wantPath {
			t.Fatalf("mode %s: path %s, want %s", tc.mode, s.Path(), tc.wantPath)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamedOnly: under auto, a large non-streamed body (declared length
// or chunked JSON) stays in userspace while a token stream is spliced.
func TestStreamedOnly(t *testing.T) {
	d := openTest(t, Config{StreamedOnly: true})
	be := startBackend(t, "127.0.0.1:0")
	p := startProxy(t, d, func(string) string { return be.addr() })
	cl := dialClient(t, p.ln.Addr().String())
	for _, tc := range []struct {
		target, path string
	}{
		{"/bulk?n=5000000&delay=5000", "userspace"},
		{"/chunkedjson?chunks=3000", "userspace"}, // chunked framing alone is not a token stream
		{"/sse?chunks=300&gap=200", "sockmap"},
	} {
		sum, n, err := cl.get(tc.target)
		want := expectedBody(tc.target)
		if err != nil || n != int64(len(want)) || sum != crc32.ChecksumIEEE(want) {
			t.Fatalf("%s: n=%d err=%v", tc.target, n, err)
		}
		if r := nextResult(t, p); r.res.Path != tc.path {
			t.Fatalf("%s: path %s, want %s", tc.target, r.res.Path, tc.path)
		}
	}
}

// TestCancel: a cancelled context (shutdown grace over) ends a spliced
// stream promptly and leaves nothing in the maps.
func TestCancel(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	cl := dialClient(t, ln.Addr().String())
	server := <-accepted
	defer server.Close()
	bc, err := net.Dial("tcp", be.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	fmt.Fprintf(bc, "GET /stall?chunks=3&gap=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan datapath.Result, 1)
	go func() { done <- d.Run(ctx, server, bc, nil, datapath.Options{Streamed: true, ContentLength: -1}) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case r := <-done:
		if r.Ending != datapath.Cancelled {
			t.Fatalf("ending %v (%v), want cancelled", r.Ending, r.Err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	_ = cl
	assertNoEntries(t, d)
}

// TestBadInstance: an instance name bpffs cannot hold is a configuration
// error, not "no BPF here" (which --datapath=auto would silently accept).
func TestBadInstance(t *testing.T) {
	for _, name := range []string{"a/b", ".", "..", "api_127.0.0.1_9090", "x\x00y"} {
		_, err := Open(Config{Instance: name})
		if err == nil || errors.Is(err, datapath.ErrKernelUnavailable) {
			t.Errorf("instance %q: err %v, want a configuration error", name, err)
		}
	}
}
