//go:build linux

// Package fault runs the real kvgate daemon and real enginesim processes and
// breaks things between them: an engine killed or stopped mid-stream, and
// loss, delay, resets and partitions on the path between the gateway and the
// engines. The gateway (and the test's clients) live in one network
// namespace and the engines in another, joined by a veth pair; every address
// is inside those namespaces, and nftables rules in the engines' namespace
// make the faults (this kernel has no netem; delay is a userspace relay).
// docs/body-leg.md, "Fault suite", lists what each test asserts.
package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const model = "Qwen/Qwen3-0.6B"

// Addresses inside the test's namespaces only.
const (
	gwAddr   = "10.77.0.1" // the gateway's side of the veth (VIPs live here)
	eng1Addr = "10.77.0.2"
	eng2Addr = "10.77.0.3"
	relayIP  = "10.77.0.4" // the delaying relay, in the engines' namespace
	engPort  = 8000
	zmqPort  = 5557
)

var (
	binDir string // built kvgate and enginesim
	repo   string // repository root
)

// TestMain builds the binaries once and sweeps namespaces left by a test
// binary that died (a timeout panic skips cleanups).
func TestMain(m *testing.M) {
	sweepStaleNamespaces()
	dir, err := os.MkdirTemp("", "kvgate-fault-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	repo, _ = filepath.Abs("../..")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireRoot skips without root, ip, nft and nsenter, unless KVGATE_REQUIRE_BPF=1
// (CI runs as root), where it fails.
func requireRoot(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("KVGATE_REQUIRE_BPF") == "1" {
		t.Fatalf("the fault suite needs %v (KVGATE_REQUIRE_BPF=1)", missing)
	}
	t.Skipf("the fault suite needs %v; set KVGATE_REQUIRE_BPF=1 to fail instead", missing)
}

var buildOnce sync.Once
var buildErr error

// binaries builds cmd/kvgate and cmd/enginesim once per test binary.
func binaries(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		for _, cmd := range []string{"kvgate", "enginesim"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), filepath.Join(repo, "cmd", cmd)).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %w\n%s", cmd, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// --- namespaces ---------------------------------------------------------------

var nsName = regexp.MustCompile(`^dpf(\d+)x(\d+)[ge]$`)

// sweepStaleNamespaces deletes namespaces of test binaries that are gone.
func sweepStaleNamespaces() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		m := nsName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		_ = exec.Command("ip", "netns", "del", name).Run()
	}
}

// topo is the gateway namespace and the engines' namespace, joined by veth.
type topo struct {
	gw, eng string // namespace names
}

var topoSeq int

// newTopo makes the namespaces and the veth pair; they are deleted when the
// test ends, failed or not.
func newTopo(t *testing.T) *topo {
	t.Helper()
	topoSeq++
	base := fmt.Sprintf("dpf%dx%d", os.Getpid(), topoSeq)
	tp := &topo{gw: base + "g", eng: base + "e"}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", tp.gw).Run()
		_ = exec.Command("ip", "netns", "del", tp.eng).Run()
	})
	run(t, "ip", "netns", "add", tp.gw)
	run(t, "ip", "netns", "add", tp.eng)
	run(t, "ip", "link", "add", base+"a", "netns", tp.gw, "type", "veth", "peer", "name", base+"b", "netns", tp.eng)
	run(t, "ip", "-n", tp.gw, "link", "set", "lo", "up")
	run(t, "ip", "-n", tp.eng, "link", "set", "lo", "up")
	run(t, "ip", "-n", tp.gw, "addr", "add", gwAddr+"/24", "dev", base+"a")
	for _, a := range []string{eng1Addr, eng2Addr, relayIP} {
		run(t, "ip", "-n", tp.eng, "addr", "add", a+"/24", "dev", base+"b")
	}
	run(t, "ip", "-n", tp.gw, "link", "set", base+"a", "up")
	run(t, "ip", "-n", tp.eng, "link", "set", base+"b", "up")
	// The fault rules go in one table of the engines' namespace.
	run(t, "ip", "netns", "exec", tp.eng, "nft", "add table inet fault")
	run(t, "ip", "netns", "exec", tp.eng, "nft", "add chain inet fault in { type filter hook input priority 0 ; }")
	run(t, "ip", "netns", "exec", tp.eng, "nft", "add chain inet fault out { type filter hook output priority 0 ; }")
	return tp
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// fault adds nftables rules (one per line, "in …" or "out …") in the
// engines' namespace and returns a function that removes them all.
func (tp *topo) fault(t *testing.T, rules ...string) func() {
	t.Helper()
	for _, r := range rules {
		chain, rule, _ := strings.Cut(r, " ")
		run(t, "ip", "netns", "exec", tp.eng, "nft", "add rule inet fault "+chain+" "+rule)
	}
	heal := func() {
		run(t, "ip", "netns", "exec", tp.eng, "nft", "flush chain inet fault in")
		run(t, "ip", "netns", "exec", tp.eng, "nft", "flush chain inet fault out")
	}
	return heal
}

// inNS runs f on a thread switched into namespace ns: sockets f creates
// (dials, listeners) belong to ns and stay there after the switch back.
func inNS(ns string, f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with the goroutine, so no
		// other goroutine runs in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("setns back: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// client is an HTTP client whose connections are made in the gateway's
// namespace, one fresh connection per request.
func (tp *topo) client() *http.Client { return tp.httpClient(false) }

// keepAliveClient is client with keep-alive connections, as OpenAI SDKs
// use: a proxy that keeps a broken response's connection open leaves such a
// client waiting for the rest of the body.
func (tp *topo) keepAliveClient() *http.Client { return tp.httpClient(true) }

func (tp *topo) httpClient(keepAlive bool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: !keepAlive,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := inNS(tp.gw, func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// --- processes ----------------------------------------------------------------

// proc is a process started in a namespace.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	logs   *lockedBuf
}

type lockedBuf struct {
	mu      sync.Mutex
	head    strings.Builder // the first logHeadBytes
	tail    []byte          // the latest bytes after the head, at most 2 × logTailBytes
	dropped int             // bytes between head and tail no longer kept
}

// A process's log keeps its first logHeadBytes (start-up) and its last
// logTailBytes (what happened before a failure): a long soak writes far
// more than a test should hold, and its failures come late.
const (
	logHeadBytes = 256 << 10
	logTailBytes = 768 << 10
)

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	if room := logHeadBytes - l.head.Len(); room > 0 {
		k := min(room, len(p))
		l.head.Write(p[:k])
		p = p[k:]
	}
	l.tail = append(l.tail, p...)
	if len(l.tail) > 2*logTailBytes {
		cut := len(l.tail) - logTailBytes
		l.dropped += cut
		l.tail = append(l.tail[:0], l.tail[cut:]...)
	}
	return n, nil
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped == 0 {
		return l.head.String() + string(l.tail)
	}
	return fmt.Sprintf("%s\n[… %d bytes of log not kept …]\n%s", l.head.String(), l.dropped, l.tail)
}

// start runs bin in ns and kills it when the test ends. nsenter switches
// only the network namespace and execs bin (so the pid is bin's); `ip netns
// exec` would also remount /sys, hiding bpffs and the cgroup v2 root the
// sockmap data path needs.
// owner, when not nil, is the test whose end kills the process (an engine
// restarted inside a subtest outlives that subtest).
func start(t, owner *testing.T, ns string, env []string, bin string, args ...string) *proc {
	t.Helper()
	if owner == nil {
		owner = t
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, bin}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{cmd: cmd, exited: make(chan struct{}), logs: &lockedBuf{}}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	owner.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// kill9 kills the process and waits for it.
func (p *proc) kill9(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	<-p.exited
}

// engine is one enginesim process.
type engine struct {
	*proc
	id, host string
}

// startEngine starts enginesim on host in the engines' namespace and waits
// until it answers.
func (tp *topo) startEngine(t, owner *testing.T, host string, extra ...string) *engine {
	t.Helper()
	binaries(t)
	args := append([]string{"--host", host, "--port", strconv.Itoa(engPort), "--id", "engine-" + host,
		"--tokenizer", filepath.Join(repo, "pkg/tokenizer/testdata/qwen3"), "--ttft-floor", "1ms",
		"--prefill-us-per-token", "5", "--decode-tokens-per-s", "100"}, extra...)
	e := &engine{proc: start(t, owner, tp.eng, []string{"PYTHONHASHSEED=0"}, filepath.Join(binDir, "enginesim"), args...),
		id: "engine-" + host, host: host}
	cl := tp.engineClient()
	waitFor(t, "engine "+host, 20*time.Second, func() bool {
		resp, err := cl.Get(fmt.Sprintf("http://%s:%d/health", host, engPort))
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return e
}

// engineClient dials from the engines' namespace (to check an engine
// directly, past the faults on the veth).
func (tp *topo) engineClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := inNS(tp.eng, func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// daemon is one kvgate process in the gateway's namespace.
type daemon struct {
	*proc
	api, access string
	tp          *topo
}

// startDaemon runs kvgate with --datapath dp and waits for its API.
func (tp *topo) startDaemon(t *testing.T, dp string, grace time.Duration) *daemon {
	t.Helper()
	return tp.startDaemonEnv(t, dp, grace)
}

// startDaemonEnv is startDaemon with extra environment variables.
func (tp *topo) startDaemonEnv(t *testing.T, dp string, grace time.Duration, env ...string) *daemon {
	t.Helper()
	binaries(t)
	staging := t.TempDir()
	if err := os.Symlink(filepath.Join(repo, "pkg/tokenizer/testdata/qwen3"), filepath.Join(staging, "Qwen__Qwen3-0.6B")); err != nil {
		t.Fatal(err)
	}
	// The API listens in the gateway's namespace, but the BPF pin instance
	// derived from --api lives in the host's bpffs: pick a port no other
	// kvgate instance pins under.
	// Below the ephemeral range (32768+): a client connection's local port in
	// the same namespace could otherwise hold the port (seen once under load).
	var api, pins string
	for {
		api = fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		pins = filepath.Join("/sys/fs/bpf/kvgate", "api_"+strings.NewReplacer(".", "_", ":", "_").Replace(api))
		if _, err := os.Stat(pins); os.IsNotExist(err) {
			break
		}
	}
	access := filepath.Join(t.TempDir(), "access.log")
	d := &daemon{api: api, access: access, tp: tp,
		proc: start(t, nil, tp.gw, append([]string{"LLB_KV_NONE_HASH_SEED=0"}, env...), filepath.Join(binDir, "kvgate"),
			"--api", api, "--state-dir", t.TempDir(), "--tokenizer-dir", staging, "--datapath", dp,
			"--shutdown-grace", grace.String(), "--access-log="+access, "--log-level", "warn")}
	// Stop it as an operator would, so it removes its BPF pins; whatever a
	// killed daemon leaves under bpffs is removed here (pinned maps would
	// otherwise hold kernel memory until the next start of that instance).
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(grace + 10*time.Second):
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		_ = os.RemoveAll(pins)
	})
	waitFor(t, "kvgate API", 20*time.Second, func() bool {
		resp, err := tp.client().Get("http://" + api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
		}
		select {
		case <-d.exited:
			t.Fatalf("kvgate exited: %v\n%s", d.err, d.logs.String())
		default:
		}
		return err == nil
	})
	return d
}

// createRule creates a fullproxy rule on gwAddr:port over endpoints
// (host:port) with extra service arguments, and waits for kvSubscribers.
func (d *daemon) createRule(t *testing.T, port int, endpoints []string, args map[string]any) int {
	t.Helper()
	a := map[string]any{"externalIP": gwAddr, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
		"probeInterval": 1, "probeTimeout": 1, "probeRetries": 1}
	for k, v := range args {
		a[k] = v
	}
	var eps []map[string]any
	for _, ep := range endpoints {
		h, p, _ := net.SplitHostPort(ep)
		n, _ := strconv.Atoi(p)
		eps = append(eps, map[string]any{"endpointIP": h, "targetPort": n, "weight": 1})
	}
	body, _ := json.Marshal(map[string]any{"serviceArguments": a, "endpoints": eps})
	resp, err := d.tp.client().Post("http://"+d.api+"/netlox/v1/config/loadbalancer", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result    string `json:"result"`
		ServiceID int    `json:"service_id"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || out.Result != "Success" {
		t.Fatalf("create rule: %d %s", resp.StatusCode, b)
	}
	return out.ServiceID
}

// kvArgs is a kvExactMode-3 rule over the engines' KV events.
var kvArgs = map[string]any{"kvExactMode": 3, "kvZmqPort": zmqPort, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}

// metric sums a metric's series whose labels include labels.
func (d *daemon) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := d.tp.client().Get("http://" + d.api + "/netlox/v1/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		lbl := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			lbl, rest = rest[1:end], rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue
		}
		ok := true
		for k, v := range labels {
			if !strings.Contains(lbl, k+`="`+v+`"`) {
				ok = false
			}
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); ok && err == nil {
			total += v
		}
	}
	return total
}

// metricLines returns the exposition lines starting with prefix (for
// failure messages).
func (d *daemon) metricLines(t *testing.T, prefix string) string {
	t.Helper()
	resp, err := d.tp.client().Get("http://" + d.api + "/netlox/v1/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// probedDown reports whether endpoint ep ("" = any endpoint of any rule) is
// probed down.
func (d *daemon) probedDown(t *testing.T, ep string) bool {
	t.Helper()
	for _, l := range strings.Split(d.metricLines(t, "kvgate_endpoint_probe_up{"), "\n") {
		if strings.HasSuffix(l, " 0") && (ep == "" || strings.Contains(l, `ep_idx="`+ep+`"`)) {
			return true
		}
	}
	return false
}

// accessLog returns the daemon's access-log records.
func (d *daemon) accessLog(t *testing.T) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(d.access)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var recs []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil {
			recs = append(recs, r)
		}
	}
	return recs
}

// --- requests -----------------------------------------------------------------

// prompt is a ~400-token prompt; salt makes it distinct.
func prompt(salt string) string {
	var b strings.Builder
	b.WriteString(salt)
	for i := 0; b.Len() < 1800; i++ {
		fmt.Fprintf(&b, " the gateway routes request %d to the engine holding its prefix.", i)
	}
	return b.String()
}

// stream is one streamed chat completion read event by event.
type stream struct {
	resp   *http.Response
	engine string
	events chan string // data payloads; closed at the end of the body
	err    error       // why the body ended (nil: clean EOF)
	done   chan struct{}
}

// openStream starts a streamed chat completion through base.
func openStream(t *testing.T, cl *http.Client, base, salt string, maxTokens int) *stream {
	t.Helper()
	s, err := tryStream(cl, base, salt, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryStream is openStream reporting failures as an error (for goroutines).
func tryStream(cl *http.Client, base, salt string, maxTokens int) (*stream, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt(salt)}}})
	resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("stream request: %w", err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("stream request: %d %s", resp.StatusCode, b)
	}
	s := &stream{resp: resp, engine: resp.Header.Get("x-engine-id"), events: make(chan string, 4096), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.events)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") {
				s.events <- strings.TrimSpace(strings.TrimPrefix(line, "data: "))
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.err = err
				}
				return
			}
		}
	}()
	return s, nil
}

// drain reads the stream to its end within bound.
func (s *stream) drain(bound time.Duration) ([]string, error) {
	var got []string
	deadline := time.After(bound)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				<-s.done
				return got, s.err
			}
			got = append(got, ev)
		case <-deadline:
			s.resp.Body.Close()
			return got, fmt.Errorf("the stream did not end within %s (%d events)", bound, len(got))
		}
	}
}

// waitEvents waits for n events.
func (s *stream) waitEvents(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	deadline := time.After(30 * time.Second)
	for len(got) < n {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("stream ended after %d events (want %d): %v", len(got), n, s.err)
			}
			got = append(got, ev)
		case <-deadline:
			t.Fatalf("only %d of %d events within 30s", len(got), n)
		}
	}
	return got
}

// rest reads the stream to its end within bound and returns the events.
func (s *stream) rest(t *testing.T, bound time.Duration) []string {
	t.Helper()
	var got []string
	deadline := time.After(bound)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				<-s.done
				return got
			}
			got = append(got, ev)
		case <-deadline:
			t.Fatalf("the stream did not end within %s (%d events so far)", bound, len(got))
		}
	}
}

// complete sends a non-streamed completion and returns the engine that
// served it.
func complete(t *testing.T, cl *http.Client, base, salt string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": prompt(salt)}}})
	cl.Timeout = 30 * time.Second
	resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"choices"`) {
		t.Fatalf("request: %d %s", resp.StatusCode, b)
	}
	return resp.Header.Get("x-engine-id")
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
