//go:build linux

// Command datapath benchmarks kvgate's response body legs on loopback:
// many concurrent slow SSE streams (CPU per chunk, added chunk latency) and
// one bulk transfer (throughput), through
//
//	direct     the client talks to the backend itself (the baseline);
//	userspace  a proxy loop with datapath.Userspace as its body leg;
//	sockmap    the same proxy loop with the splice.Datapath body leg;
//	nginx      Debian's nginx, proxy_buffering off (bench/datapath/nginx.conf).
//
// The backend and each proxy run as separate processes (this binary, by
// role) so their CPU can be read from /proc. Kernel threads (kworker,
// ksoftirqd) are counted too: the sockmap path sends from a kworker.
// Everything is bounded by -duration per phase and runs on 127.0.0.1.
//
//	go build -o /tmp/dpbench ./bench/datapath && sudo /tmp/dpbench -streams 2000 -rate 20 -duration 15s
//
// With -tls the clients speak TLS 1.3 to the proxies (a throw-away CA and
// certificate): the userspace proxy terminates it with kvgate's own
// package tlsterm, nginx with bench/datapath/nginx-tls.conf; the backend
// stays plain HTTP and the sockmap target does not apply (TLS rules take the
// userspace copy, docs/body-leg.md). Each client finishes its handshake
// before the measurement starts, so the figures are per chunk of an
// established TLS stream.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/splice"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

func main() {
	role := flag.String("role", "run", "run | backend | proxy")
	addr := flag.String("addr", "127.0.0.1:0", "listen address (backend, proxy)")
	backendAddr := flag.String("backend", "", "backend address (proxy)")
	path := flag.String("path", "userspace", "proxy body leg: userspace | sockmap")
	streams := flag.Int("streams", 2000, "concurrent SSE streams")
	rate := flag.Float64("rate", 20, "chunks per second per stream")
	duration := flag.Duration("duration", 15*time.Second, "length of each streaming phase")
	bulk := flag.Int64("bulk", 1<<30, "bytes of the bulk transfer (0 skips it)")
	only := flag.String("only", "direct,userspace,sockmap,nginx", "targets to run")
	nginxConf := flag.String("nginx-conf", "", "nginx config template (default bench/datapath/nginx.conf, or nginx-tls.conf with -tls)")
	useTLS := flag.Bool("tls", false, "clients speak TLS to the proxies (targets direct, userspace, nginx)")
	tlsDir := flag.String("tls-dir", "", "proxy: terminate TLS with the tls.crt and tls.key in this directory")
	flag.Parse()
	if *nginxConf == "" {
		*nginxConf = "bench/datapath/nginx.conf"
		if *useTLS {
			*nginxConf = "bench/datapath/nginx-tls.conf"
		}
	}

	var err error
	switch *role {
	case "backend":
		err = runBackend(*addr)
	case "proxy":
		err = runProxy(*addr, *backendAddr, *path, *tlsDir)
	case "run":
		if *useTLS && *only == "direct,userspace,sockmap,nginx" {
			*only = "direct,userspace,nginx"
		}
		err = orchestrate(config{streams: *streams, rate: *rate, duration: *duration, bulk: *bulk,
			targets: strings.Split(*only, ","), nginxConf: *nginxConf, tls: *useTLS})
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "datapath bench:", err)
		os.Exit(1)
	}
}

// monoNow is CLOCK_MONOTONIC in ns: comparable across processes.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// announce prints the listener's address for the parent, then serves.
func announce(ln net.Listener) { fmt.Println(ln.Addr().String()) }

// --- backend ---------------------------------------------------------------

// runBackend serves /sse?n=N&every=US (N events, one every US µs, each
// carrying its send time) and /bulk?n=BYTES (Content-Length).
func runBackend(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	announce(ln)
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			serveBackend(c)
		}()
	}
}

func serveBackend(c net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	q := req.URL.Query()
	n, _ := strconv.ParseInt(q.Get("n"), 10, 64)
	switch req.URL.Path {
	case "/bulk":
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", n)
		time.Sleep(5 * time.Millisecond) // head first, like a model server
		buf := make([]byte, 256<<10)
		for n > 0 {
			m := min(n, int64(len(buf)))
			if _, err := c.Write(buf[:m]); err != nil {
				return
			}
			n -= m
		}
	case "/sse":
		every, _ := strconv.Atoi(q.Get("every"))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
		// Spread the streams' phases so chunks do not arrive in lockstep.
		time.Sleep(time.Duration(rand.Int64N(int64(every)+1)) * time.Microsecond)
		tick := time.NewTicker(time.Duration(every) * time.Microsecond)
		defer tick.Stop()
		var ev []byte
		for i := int64(0); i < n; i++ {
			ev = ev[:0]
			payload := fmt.Sprintf("data: {\"t\":%d,\"i\":%d,\"choices\":[{\"delta\":{\"content\":\" tok\"}}]}\n\n", monoNow(), i)
			ev = append(ev, strconv.FormatInt(int64(len(payload)), 16)...)
			ev = append(ev, "\r\n"...)
			ev = append(ev, payload...)
			ev = append(ev, "\r\n"...)
			if _, err := c.Write(ev); err != nil {
				return
			}
			<-tick.C
		}
		io.WriteString(c, "0\r\n\r\n")
	}
}

// --- proxy -----------------------------------------------------------------

func runProxy(addr, backend, path, tlsDir string) error {
	var term *tlsterm.Terminator
	if tlsDir != "" {
		var err error
		if term, err = tlsterm.New(tlsterm.Options{Dir: tlsDir}); err != nil {
			return err
		}
	}
	var leg datapath.BodyLeg
	switch path {
	case "userspace":
		leg = datapath.NewUserspace(0)
	case "sockmap":
		d, err := splice.Open(splice.Config{Instance: fmt.Sprintf("bench-%d", os.Getpid()),
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			return err
		}
		defer d.Close()
		leg = d
	default:
		return fmt.Errorf("unknown path %q", path)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		ln.Close()
	}()
	announce(ln)
	ctx := context.Background()
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil // closed by the signal: pins are removed by the defer
		}
		go func() {
			defer c.Close()
			if term != nil {
				tc := term.Wrap(c)
				if term.Handshake(ctx, tc) != nil {
					return
				}
				c = tc
			}
			cr := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(cr)
				if err != nil || !forward(ctx, leg, c, backend, req) {
					return
				}
			}
		}()
	}
}

// forward is the proxy's request path: the same for both body legs.
func forward(ctx context.Context, leg datapath.BodyLeg, c net.Conn, backend string, req *http.Request) bool {
	bc, err := net.Dial("tcp", backend)
	if err != nil {
		return false
	}
	defer bc.Close()
	fmt.Fprintf(bc, "GET %s HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n", req.RequestURI)
	br := bufio.NewReaderSize(bc, 16<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %s\r\n", resp.Status)
	streamed := len(resp.TransferEncoding) > 0
	if streamed {
		head.WriteString("Transfer-Encoding: chunked\r\n")
	}
	resp.Header.Del("Connection")
	resp.Header.Write(&head)
	head.WriteString("\r\n")
	if _, err := c.Write(head.Bytes()); err != nil {
		return false
	}
	prefix, _ := br.Peek(br.Buffered())
	// The body's end as kvgate's proxy passes it, so the legs follow the
	// framing here too (docs/body-leg.md, "Broken responses").
	end := fullproxy.NewBodyEnd(streamed, resp.ContentLength, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	res := leg.Run(ctx, c, bc, prefix, datapath.Options{Silence: time.Minute, Streamed: streamed, ContentLength: resp.ContentLength,
		End: end})
	return res.Ending == datapath.BackendEOF
}

// --- orchestration ---------------------------------------------------------

type config struct {
	streams   int
	rate      float64
	duration  time.Duration
	bulk      int64
	targets   []string
	nginxConf string
	tls       bool
	// certDir holds the proxies' certificate and clientTLS trusts it (-tls).
	certDir   string
	clientTLS *tls.Config
}

type proc struct {
	cmd  *exec.Cmd
	addr string
}

func spawn(args ...string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("%v: no address: %w", args, err)
	}
	return &proc{cmd: cmd, addr: strings.TrimSpace(line)}, nil
}

func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func startNginx(tmpl, backend, certDir string) (*proc, func(), error) {
	dir, err := os.MkdirTemp("", "kvgate-bench-nginx-")
	if err != nil {
		return nil, nil, err
	}
	b, err := os.ReadFile(tmpl)
	if err != nil {
		return nil, nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	conf := strings.NewReplacer("@DIR@", dir, "@LISTEN@", listen, "@BACKEND@", backend,
		"@CERT@", filepath.Join(certDir, tlsterm.CertFile), "@KEY@", filepath.Join(certDir, tlsterm.KeyFile)).Replace(string(b))
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, nil, err
	}
	cmd := exec.Command("nginx", "-c", confPath, "-p", dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	p := &proc{cmd: cmd, addr: listen}
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", listen); err == nil {
			c.Close()
			return p, func() { p.stop(); os.RemoveAll(dir) }, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	return nil, nil, errors.New("nginx did not start listening")
}

// benchCerts makes a CA and a certificate for 127.0.0.1 in a temporary
// directory.
func benchCerts(cfg *config) (func(), error) {
	dir, err := os.MkdirTemp("", "kvgate-bench-tls-")
	if err != nil {
		return nil, err
	}
	ca, err := testcerts.NewCA("bench CA")
	if err != nil {
		return nil, err
	}
	p, err := ca.Server("bench", "127.0.0.1")
	if err != nil {
		return nil, err
	}
	if err := p.Write(dir); err != nil {
		return nil, err
	}
	cfg.certDir = dir
	cfg.clientTLS = &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	return func() { os.RemoveAll(dir) }, nil
}

// target is one thing the benchmark streams through.
type target struct {
	name    string
	addr    string
	pids    func() []int
	cleanup func()
	plain   bool // direct: the backend speaks plain HTTP even with -tls
}

// startTargets starts the proxies cfg names in front of the backend; the
// targets started so far are returned with an error, for cleanup.
func startTargets(cfg config, backend string) ([]target, error) {
	var targets []target
	for _, name := range cfg.targets {
		switch name {
		case "direct":
			targets = append(targets, target{name: name, addr: backend, pids: func() []int { return nil }, cleanup: func() {}, plain: true})
		case "userspace", "sockmap":
			args := []string{"-role", "proxy", "-backend", backend, "-path", name}
			if cfg.tls {
				args = append(args, "-tls-dir", cfg.certDir)
			}
			p, err := spawn(args...)
			if err != nil {
				return targets, fmt.Errorf("starting %s proxy: %w", name, err)
			}
			pid := p.cmd.Process.Pid
			targets = append(targets, target{name: name, addr: p.addr, pids: func() []int { return []int{pid} }, cleanup: p.stop})
		case "nginx":
			p, cleanup, err := startNginx(cfg.nginxConf, backend, cfg.certDir)
			if err != nil {
				return targets, fmt.Errorf("starting nginx: %w", err)
			}
			master := p.cmd.Process.Pid
			targets = append(targets, target{name: name, addr: p.addr, pids: func() []int { return append([]int{master}, childrenOf(master)...) }, cleanup: cleanup})
		default:
			return targets, fmt.Errorf("unknown target %q", name)
		}
	}
	return targets, nil
}

func orchestrate(cfg config) error {
	if cfg.tls {
		cleanup, err := benchCerts(&cfg)
		if err != nil {
			return err
		}
		defer cleanup()
	}
	be, err := spawn("-role", "backend")
	if err != nil {
		return err
	}
	defer be.stop()

	targets, err := startTargets(cfg, be.addr)
	defer func() {
		for _, t := range targets {
			t.cleanup()
		}
	}()
	if err != nil {
		return err
	}
	clientTLS := func(t target) *tls.Config {
		if t.plain {
			return nil
		}
		return cfg.clientTLS
	}

	every := time.Duration(float64(time.Second) / cfg.rate)
	perStream := int(cfg.duration / every)
	mode := "plain HTTP"
	if cfg.tls {
		mode = "TLS 1.3 from the clients to the proxies (direct: plain)"
	}
	fmt.Printf("## Streams: %d concurrent SSE streams x %d chunks (one every %s), %s per target, %s, GOMAXPROCS=%d, %d CPUs\n\n",
		cfg.streams, perStream, every, cfg.duration, mode, runtime.GOMAXPROCS(0), numCPU())
	fmt.Println("| target | chunks | errors | proxy CPU s | kernel threads CPU s | backend CPU s | client CPU s | total CPU s | proxy CPU s / 1M chunks | total CPU s / 1M chunks | p50 ms | p99 ms |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	results := map[string]streamResult{}
	for _, t := range targets {
		r := runStreams(t.addr, clientTLS(t), cfg.streams, perStream, every, be.cmd.Process.Pid, t.pids())
		results[t.name] = r
		m := float64(r.chunks) / 1e6
		fmt.Printf("| %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f | %.3f |\n",
			t.name, r.chunks, r.errors, r.cpu.proxy, r.cpu.kthreads, r.cpu.backend, r.cpu.client, r.cpu.total(),
			r.cpu.proxy/m, r.cpu.total()/m, r.p50, r.p99)
	}
	if d, ok := results["direct"]; ok {
		fmt.Println("\nAdded versus direct (total CPU includes backend, client and kernel threads):")
		fmt.Println()
		fmt.Println("| target | added total CPU s / 1M chunks | added p50 ms | added p99 ms |")
		fmt.Println("|---|---|---|---|")
		dm := d.cpu.total() / (float64(d.chunks) / 1e6)
		for _, t := range targets {
			if t.name == "direct" {
				continue
			}
			r := results[t.name]
			fmt.Printf("| %s | %.2f | %.3f | %.3f |\n", t.name, r.cpu.total()/(float64(r.chunks)/1e6)-dm, r.p50-d.p50, r.p99-d.p99)
		}
	}
	if cfg.bulk > 0 {
		fmt.Printf("\n## Bulk: one %d MiB response (Content-Length)\n\n", cfg.bulk>>20)
		fmt.Println("| target | MiB/s | proxy CPU s | kernel threads CPU s | total CPU s |")
		fmt.Println("|---|---|---|---|---|")
		for _, t := range targets {
			rate, cpu, err := runBulk(t.addr, clientTLS(t), cfg.bulk, be.cmd.Process.Pid, t.pids())
			if err != nil {
				fmt.Printf("| %s | error: %v | | | |\n", t.name, err)
				continue
			}
			fmt.Printf("| %s | %.0f | %.2f | %.2f | %.2f |\n", t.name, rate, cpu.proxy, cpu.kthreads, cpu.total())
		}
	}
	return nil
}

func numCPU() int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return 0
	}
	return set.Count()
}

// --- CPU accounting -------------------------------------------------------

type cpuTimes struct{ proxy, kthreads, backend, client float64 }

func (c cpuTimes) total() float64 { return c.proxy + c.kthreads + c.backend + c.client }

var clkTck = 100.0

// procCPU reads utime+stime of a process (all threads) in seconds.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	return statCPU(b)
}

func statCPU(b []byte) float64 {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / clkTck
}

// kthreadCPU sums kworker and ksoftirqd CPU (redirects are sent from a
// kworker; softirq work may land in ksoftirqd).
func kthreadCPU() float64 {
	ents, _ := os.ReadDir("/proc")
	sum := 0.0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			continue
		}
		c := string(comm)
		if strings.HasPrefix(c, "kworker") || strings.HasPrefix(c, "ksoftirqd") {
			sum += procCPU(pid)
		}
	}
	return sum
}

func childrenOf(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func selfCPU() float64 {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

type cpuSnap struct{ proxy, kthreads, backend, client float64 }

func snap(backendPid int, pids []int) cpuSnap {
	s := cpuSnap{kthreads: kthreadCPU(), backend: procCPU(backendPid), client: selfCPU()}
	for _, p := range pids {
		s.proxy += procCPU(p)
	}
	return s
}

func (a cpuSnap) since(b cpuSnap) cpuTimes {
	return cpuTimes{proxy: a.proxy - b.proxy, kthreads: a.kthreads - b.kthreads, backend: a.backend - b.backend, client: a.client - b.client}
}

// --- load -----------------------------------------------------------------

type streamResult struct {
	chunks, errors int64
	cpu            cpuTimes
	p50, p99       float64
}

// runStreams opens n streams at once and reads every chunk, recording
// its latency from the backend's send time.
// dialTarget connects to a target; with tlsCfg it also completes the TLS
// handshake.
func dialTarget(addr string, tlsCfg *tls.Config) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil || tlsCfg == nil {
		return c, err
	}
	tc := tls.Client(c, tlsCfg)
	_ = tc.SetDeadline(time.Now().Add(time.Minute))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// readStream asks for one SSE stream of perStream events on c and returns
// each event's added latency (ms), ending early on a read error.
func readStream(c net.Conn, perStream int, every time.Duration) ([]float64, error) {
	c.SetDeadline(time.Now().Add(every*time.Duration(perStream) + time.Minute))
	fmt.Fprintf(c, "GET /sse?n=%d&every=%d HTTP/1.1\r\nHost: bench\r\n\r\n", perStream, every.Microseconds())
	br := bufio.NewReaderSize(c, 4096)
	l := make([]float64, 0, perStream)
	for len(l) < perStream {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return l, err
		}
		if !bytes.HasPrefix(line, []byte("data: {\"t\":")) {
			continue
		}
		now := monoNow()
		rest := line[len("data: {\"t\":"):]
		j := bytes.IndexByte(rest, ',')
		if j < 0 {
			continue
		}
		t, err := strconv.ParseInt(string(rest[:j]), 10, 64)
		if err != nil {
			continue
		}
		l = append(l, float64(now-t)/1e6)
	}
	return l, nil
}

func runStreams(addr string, tlsCfg *tls.Config, n, perStream int, every time.Duration, backendPid int, pids []int) streamResult {
	var chunks, errs atomic.Int64
	lat := make([][]float64, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		// A TLS client handshakes before the measurement starts; a plain one
		// connects inside it, as before -tls existed.
		var early net.Conn
		var earlyErr error
		if tlsCfg != nil {
			early, earlyErr = dialTarget(addr, tlsCfg)
		}
		go func() {
			defer wg.Done()
			<-start
			c, err := early, earlyErr
			if tlsCfg == nil {
				c, err = dialTarget(addr, nil)
			}
			if err != nil {
				errs.Add(1)
				return
			}
			defer c.Close()
			l, err := readStream(c, perStream, every)
			if err != nil {
				errs.Add(1)
			}
			got := len(l)
			chunks.Add(int64(got))
			lat[i] = l
		}()
	}
	before := snap(backendPid, pids)
	close(start)
	wg.Wait()
	after := snap(backendPid, pids)
	var all []float64
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(p*float64(len(all))))]
	}
	return streamResult{chunks: chunks.Load(), errors: errs.Load(), cpu: after.since(before), p50: pct(0.50), p99: pct(0.99)}
}

func runBulk(addr string, tlsCfg *tls.Config, n int64, backendPid int, pids []int) (float64, cpuTimes, error) {
	c, err := dialTarget(addr, tlsCfg)
	if err != nil {
		return 0, cpuTimes{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Minute))
	before := snap(backendPid, pids)
	start := time.Now()
	fmt.Fprintf(c, "GET /bulk?n=%d HTTP/1.1\r\nHost: bench\r\n\r\n", n)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 256<<10), nil)
	if err != nil {
		return 0, cpuTimes{}, err
	}
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return 0, cpuTimes{}, err
	}
	if got != n {
		return 0, cpuTimes{}, fmt.Errorf("got %d of %d bytes", got, n)
	}
	el := time.Since(start)
	return float64(n) / (1 << 20) / el.Seconds(), snap(backendPid, pids).since(before), nil
}
