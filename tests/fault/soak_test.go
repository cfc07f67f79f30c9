//go:build linux

package fault

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// soakConfig is one soak run; CI uses the defaults, the benchmark sets the
// KVGATE_SOAK_* variables (docs/body-leg.md, "Fault suite").
type soakConfig struct {
	streams    int           // streams kept open at once, one client goroutine each
	load       time.Duration // length of the load per data path
	idle       time.Duration // idle time after the load, before the leak checks
	tokens     int           // max_tokens of each stream
	tokensPerS int           // the engines' decode speed per sequence
	sample     time.Duration // sampling period of the daemon's RSS, goroutines, fds, in flight
	serial     bool          // one data path after the other instead of both at once
}

// The bounds keep a mistyped knob from asking for more sockets than the
// hard fd limit allows, or a run longer than a go test timeout can hold.
const (
	maxSoakStreams = 5000
	maxSoakSeconds = 3600
	// soakMaxSamples bounds the in-memory series: the period is lengthened
	// so a run never takes more samples than this.
	soakMaxSamples = 600
)

// RSS may grow between the 20 % mark of the load and its end by this
// fraction of the 20 % value plus the absolute margin. Flat means: the
// heap has reached its working set by the 20 % mark (every stream slot has
// cycled through many streams), and what remains is the Go runtime's
// pacing (the heap may reach twice the live data before a GC with
// GOGC=100, and the scavenger returns pages lazily) plus allocator noise,
// which is a few MiB whatever the stream count; a leak of even 200 bytes
// per stream crosses the bound in a 10-minute run (≈ 100,000 streams).
// A run shorter than soakWarmLoad (CI's 60 s) measures from a 20 % mark
// before the heap has reached its working set (seen: +11 to +23 MiB at 200
// streams by the end of a 20 s run), so its margin is soakShortRSSMarginKiB:
// that check catches only gross leaks (about 8 KiB per stream over CI's
// ~6,000 streams per path); the benchmark's 10-minute run is the flatness
// measure.
const (
	soakRSSGrowthFraction = 0.10
	soakRSSMarginKiB      = 16 << 10
	soakShortRSSMarginKiB = 48 << 10
	soakWarmLoad          = 2 * time.Minute
)

// rssMarginKiB is the absolute part of the RSS bound for this run.
func (c soakConfig) rssMarginKiB() int {
	if c.load < soakWarmLoad {
		return soakShortRSSMarginKiB
	}
	return soakRSSMarginKiB
}

// envInt reads a KVGATE_SOAK_* knob within [lo, hi], or def when unset.
func envInt(t *testing.T, name string, def, lo, hi int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		t.Fatalf("%s=%q: want an integer in %d-%d", name, v, lo, hi)
	}
	return n
}

// soakSettings reads the knobs. CI's defaults (200 streams for 60 s on each
// data path, both paths at once, 2 s idle) keep the test near 75 s; the
// benchmark is KVGATE_SOAK_STREAMS=2000 KVGATE_SOAK_SECONDS=600
// KVGATE_SOAK_IDLE_SECONDS=600 KVGATE_SOAK_SERIAL=1 (one path at a time, so
// each daemon has the machine's cores to itself).
func soakSettings(t *testing.T) soakConfig {
	t.Helper()
	c := soakConfig{
		streams:    envInt(t, "KVGATE_SOAK_STREAMS", 200, 1, maxSoakStreams),
		load:       time.Duration(envInt(t, "KVGATE_SOAK_SECONDS", 60, 1, maxSoakSeconds)) * time.Second,
		idle:       time.Duration(envInt(t, "KVGATE_SOAK_IDLE_SECONDS", 2, 0, maxSoakSeconds)) * time.Second,
		tokens:     envInt(t, "KVGATE_SOAK_TOKENS", 40, 1, 4000),
		tokensPerS: envInt(t, "KVGATE_SOAK_TOKENS_PER_S", 20, 1, 1000),
		serial:     envInt(t, "KVGATE_SOAK_SERIAL", 0, 0, 1) == 1,
	}
	c.sample = time.Duration(envInt(t, "KVGATE_SOAK_SAMPLE_SECONDS", 0, 0, maxSoakSeconds)) * time.Second
	if c.sample == 0 {
		// About 100 samples over the run, at least one a second.
		c.sample = max(time.Second, (c.load+c.idle)/100)
	}
	c.sample = max(c.sample, (c.load+c.idle)/soakMaxSamples)
	return c
}

// streamBound is how long one stream may take before it counts as failed.
// On a loaded 2-core machine the engines and the test's own clients starve
// too; a stream stalled by CPU starvation is not a gateway defect, so the
// bound is ten times the stream's decode time, and at least 2 minutes.
func (c soakConfig) streamBound() time.Duration {
	decode := time.Duration(c.tokens) * time.Second / time.Duration(c.tokensPerS)
	return max(2*time.Minute, 10*decode)
}

// engineArgs lets one engine hold every stream at once, running and in its
// KV cache (≈ 420 prompt tokens plus the completion, 16-token blocks, with
// a block to spare), so the engines never queue or preempt.
func (c soakConfig) engineArgs() []string {
	blocks := c.streams * ((420+c.tokens)/16 + 2)
	return []string{"--decode-tokens-per-s", strconv.Itoa(c.tokensPerS),
		"--max-num-seqs", strconv.Itoa(max(256, c.streams+64)),
		"--num-gpu-blocks", strconv.Itoa(max(8192, blocks))}
}

// fdsNeeded is the fd limit the soak needs: per stream a client socket (the
// test), a client and a backend socket (the daemon) and an engine socket,
// each process well below the total, plus a margin for everything else.
func (c soakConfig) fdsNeeded() uint64 { return uint64(max(4096, 3*c.streams+1024)) }

// raiseNoFile makes sure the test and the daemons it starts (which inherit
// the limit) may open the sockets the soak needs.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if r.Cur >= need {
		return
	}
	if r.Max < need {
		t.Fatalf("ulimit -n is %d (hard %d); the soak needs %d", r.Cur, r.Max, need)
	}
	r.Cur = need
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatalf("raising ulimit -n to %d: %v", need, err)
	}
}

// procFDs counts a process's open file descriptors.
func procFDs(pid int) (int, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, fmt.Errorf("counting fds: %w", err)
	}
	return len(es), nil
}

// procRSSKiB reads VmRSS from /proc/PID/status.
func procRSSKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading VmRSS: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				return 0, fmt.Errorf("VmRSS %q: %w", rest, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// scrape sums each named metric over its series, without a *testing.T (the
// sampler runs in its own goroutine). A name may carry a label filter after
// a space, `name to="down"`: only series whose labels contain it count.
func scrape(cl *http.Client, api string, names ...string) (map[string]float64, error) {
	resp, err := cl.Get("http://" + api + "/netlox/v1/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping metrics: %w", err)
	}
	defer resp.Body.Close()
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, q := range names {
			n, filter, _ := strings.Cut(q, " ")
			rest, ok := strings.CutPrefix(line, n)
			if !ok || (rest == "" || rest[0] != ' ' && rest[0] != '{') || !strings.Contains(rest, filter) {
				continue
			}
			if i := strings.LastIndexByte(rest, ' '); i >= 0 {
				if v, err := strconv.ParseFloat(rest[i+1:], 64); err == nil {
					out[q] += v
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	return out, nil
}

// soakSample is the daemon's state at one instant of the run.
type soakSample struct {
	at         time.Duration // since the load started
	idle       bool          // taken after the load ended
	rssKiB     int
	heapMiB    float64 // go_memstats_heap_inuse_bytes: what RSS holds for live and not yet collected objects
	goroutines int
	fds        int
	inflight   int // kvgate_endpoint_inflight over the rule's endpoints
	open       int // streams the test's clients have open
	done       int64
	failed     int64 // streams failed so far
	probeDowns int   // kvgate_endpoint_probe_transitions_total{to="down"}
	connFails  int   // kvgate_backend_connect_failures_total
}

// soakProbe reads one sample of the daemon.
type soakProbe struct {
	pid    int
	api    string
	cl     *http.Client
	open   *atomic.Int64
	done   *atomic.Int64
	failed *atomic.Int64
}

func (p soakProbe) read(at time.Duration, idle bool) (soakSample, error) {
	s := soakSample{at: at, idle: idle, open: int(p.open.Load()), done: p.done.Load(), failed: p.failed.Load()}
	var err error
	if s.rssKiB, err = procRSSKiB(p.pid); err != nil {
		return s, err
	}
	if s.fds, err = procFDs(p.pid); err != nil {
		return s, err
	}
	const downs = `kvgate_endpoint_probe_transitions_total to="down"`
	m, err := scrape(p.cl, p.api, "go_goroutines", "kvgate_endpoint_inflight", "go_memstats_heap_inuse_bytes",
		downs, "kvgate_backend_connect_failures_total")
	if err != nil {
		return s, err
	}
	s.probeDowns, s.connFails = int(m[downs]), int(m["kvgate_backend_connect_failures_total"])
	s.goroutines, s.inflight = int(m["go_goroutines"]), int(m["kvgate_endpoint_inflight"])
	s.heapMiB = m["go_memstats_heap_inuse_bytes"] / (1 << 20)
	return s, nil
}

// soakSeries samples the daemon every period into a bounded series.
type soakSeries struct {
	mu       sync.Mutex
	samples  []soakSample
	failures int   // samples that could not be read (a starved API)
	firstErr error // the first of them
	idle     atomic.Bool
	stop     chan struct{}
	stopped  chan struct{}
}

func startSampling(p soakProbe, period time.Duration) *soakSeries {
	s := &soakSeries{stop: make(chan struct{}), stopped: make(chan struct{})}
	begin := time.Now()
	go func() {
		defer close(s.stopped)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			smp, err := p.read(time.Since(begin), s.idle.Load())
			s.mu.Lock()
			switch {
			case err != nil:
				s.failures++
				if s.firstErr == nil {
					s.firstErr = err
				}
			case len(s.samples) < soakMaxSamples+10:
				s.samples = append(s.samples, smp)
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// finish stops sampling and returns the series.
func (s *soakSeries) finish() []soakSample {
	close(s.stop)
	<-s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// lastLoadSample is the last sample taken while streams were running.
func lastLoadSample(ss []soakSample) (soakSample, bool) {
	var got soakSample
	ok := false
	for _, s := range ss {
		if !s.idle {
			got, ok = s, true
		}
	}
	return got, ok
}

// table renders the series compactly, at most about 120 rows (every k-th
// sample, and always the last one): the benchmark's whole series.
func table(ss []soakSample) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%8s %5s %8s %8s %6s %6s %7s %6s %8s %6s %5s %5s\n", "t", "phase", "rss_MiB", "heap_MiB",
		"gorout", "fds", "inflght", "open", "done", "failed", "pdown", "cfail")
	step := max(1, (len(ss)+119)/120)
	for i, s := range ss {
		if i%step != 0 && i != len(ss)-1 {
			continue
		}
		phase := "load"
		if s.idle {
			phase = "idle"
		}
		fmt.Fprintf(&b, "%8s %5s %8.1f %8.1f %6d %6d %7d %6d %8d %6d %5d %5d\n", s.at.Round(time.Second), phase,
			float64(s.rssKiB)/1024, s.heapMiB, s.goroutines, s.fds, s.inflight, s.open, s.done, s.failed, s.probeDowns, s.connFails)
	}
	return b.String()
}

// rssBefore is the highest RSS of the load samples taken in the tenth of
// the load that ends at mark: one sample may fall in a dip of the heap's
// swing (the GC and the scavenger move RSS by tens of MiB at 2,000 streams
// with no trend in the heap in use), the highest of a window does not.
func rssBefore(ss []soakSample, load, mark time.Duration) (soakSample, bool) {
	var got soakSample
	ok := false
	for _, s := range ss {
		if !s.idle && s.at >= mark-load/10 && s.at <= mark && (!ok || s.rssKiB > got.rssKiB) {
			got, ok = s, true
		}
	}
	return got, ok
}

// checkRSSFlat fails when RSS near the end of the load exceeds RSS near
// its 20 % mark by more than the bound above (each the highest sample of
// the tenth of the load before the mark), and logs both.
func checkRSSFlat(t *testing.T, dp string, c soakConfig, ss []soakSample) {
	t.Helper()
	end, ok2 := lastLoadSample(ss)
	mark, ok1 := rssBefore(ss, c.load, c.load/5)
	last, ok3 := rssBefore(ss, c.load, end.at)
	if !ok1 || !ok2 || !ok3 || end.at <= c.load/5 {
		t.Fatalf("%s: too few load samples to compare RSS (%d samples, period %s)", dp, len(ss), c.sample)
	}
	limit := mark.rssKiB + int(float64(mark.rssKiB)*soakRSSGrowthFraction) + c.rssMarginKiB()
	mib := func(kib int) float64 { return float64(kib) / 1024 }
	t.Logf("%s: RSS %.1f MiB by %s (20%% mark), %.1f MiB by %s (end of load), %+.1f%%; bound %.1f MiB",
		dp, mib(mark.rssKiB), (c.load / 5).Round(time.Second), mib(last.rssKiB), end.at.Round(time.Second),
		100*float64(last.rssKiB-mark.rssKiB)/float64(mark.rssKiB), mib(limit))
	if last.rssKiB > limit {
		t.Fatalf("%s: RSS grew from %d KiB to %d KiB during the load (bound %d KiB: +%.0f%% + %d MiB)\n%s",
			dp, mark.rssKiB, last.rssKiB, limit, 100*soakRSSGrowthFraction, c.rssMarginKiB()>>10, table(ss))
	}
}

// soakLoad is the test's clients: each keeps one stream open at a time,
// on a fresh connection, until its count or the deadline is reached.
type soakLoad struct {
	cl     *http.Client
	base   string
	bound  time.Duration
	open   atomic.Int64 // streams open now
	done   atomic.Int64 // streams completed with [DONE]
	failed atomic.Int64
	errMu  sync.Mutex
	errs   map[string]int // failures by class, at most maxErrClasses classes
}

// maxErrClasses bounds the failure classes kept; the rest count as "other".
const maxErrClasses = 16

// errClass is an error's message with its digits dropped (event counts,
// ports), cut to 120 bytes, so failures of one kind share a class.
func errClass(err error) string {
	c := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, err.Error())
	if len(c) > 120 {
		c = c[:120]
	}
	return c
}

func (l *soakLoad) fail(err error) {
	l.failed.Add(1)
	c := errClass(err)
	l.errMu.Lock()
	defer l.errMu.Unlock()
	if l.errs == nil {
		l.errs = map[string]int{}
	}
	if _, ok := l.errs[c]; !ok && len(l.errs) >= maxErrClasses {
		c = "other"
	}
	l.errs[c]++
}

// failures lists the failure classes with their counts.
func (l *soakLoad) failures() string {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	var b strings.Builder
	for c, n := range l.errs {
		fmt.Fprintf(&b, "\n  %6d × %s", n, c)
	}
	return b.String()
}

// one runs one stream to its end and reports whether it completed.
func (l *soakLoad) one(salt string, tokens int) {
	l.open.Add(1)
	defer l.open.Add(-1)
	s, err := tryStream(l.cl, l.base, salt, tokens)
	if err == nil {
		evs, rerr := s.drain(l.bound)
		if rerr == nil && !hasDone(evs) {
			rerr = fmt.Errorf("stream ended without [DONE] after %d events", len(evs))
		}
		err = rerr
	}
	if err != nil {
		l.fail(err)
		return
	}
	l.done.Add(1)
}

// burst runs clients clients, each doing each streams (0: no count) until
// until (zero: no deadline), and returns the streams completed.
func (l *soakLoad) burst(clients, each, tokens int, until time.Time, tag string) int64 {
	before := l.done.Load()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; (each == 0 || i < each) && (until.IsZero() || time.Now().Before(until)); i++ {
				l.one(fmt.Sprintf("%s %d %d", tag, c, i%8), tokens)
			}
		}()
	}
	wg.Wait()
	return l.done.Load() - before
}

// TestSoak keeps many streams open through the real daemon on each data
// path (auto, which splices streams in the kernel, and userspace), one
// fresh connection per stream, while sampling the daemon's RSS, goroutines,
// fds and in-flight count; then it idles, and asserts that every stream
// completed, that RSS stayed flat during the load, that goroutines, fds and
// in-flight counts returned to their pre-run baseline, and that SIGTERM
// exits within the grace. It starts with the pattern that left sockmap legs
// stuck (8 clients × 20 streams of 8 tokens, ~400-token prompts,
// connections closed after each body). CI runs 200 streams for 60 s on
// both paths at once; the KVGATE_SOAK_* knobs make it the soak benchmark
// (docs/body-leg.md, "Fault suite").
func TestSoak(t *testing.T) {
	requireRoot(t)
	c := soakSettings(t)
	raiseNoFile(t, c.fdsNeeded())
	tp := newTopo(t)
	var eps []string
	for _, h := range []string{eng1Addr, eng2Addr} {
		tp.startEngine(t, nil, h, c.engineArgs()...)
		eps = append(eps, fmt.Sprintf("%s:%d", h, engPort))
	}
	t.Logf("soak: %d streams of %d tokens at %d tokens/s, %s load + %s idle per data path, sampled every %s",
		c.streams, c.tokens, c.tokensPerS, c.load, c.idle, c.sample)
	for i, dp := range []string{"auto", "userspace"} {
		t.Run(dp, func(t *testing.T) {
			if !c.serial {
				t.Parallel()
			}
			soakPath(t, tp, c, dp, 8080+i, eps)
		})
	}
}

// maxOddRecords bounds the access records a failed soak prints.
const maxOddRecords = 20

// oddRecords returns the daemon's access-log lines whose status is not 200,
// at most maxOddRecords of them: what the daemon recorded for the streams
// that failed. It scans the log line by line (a soak writes ~100,000).
func oddRecords(t *testing.T, d *daemon) string {
	t.Helper()
	f, err := os.Open(d.access)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var b strings.Builder
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && n < maxOddRecords {
		var r struct {
			Status int `json:"status"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Status != 200 {
			b.WriteString("  " + sc.Text() + "\n")
			n++
		}
	}
	return b.String()
}

// soakRuleArgs is the suite's KV rule with a probe that tolerates a starved
// machine: the fault tests probe every second with a 1 s timeout and no
// retry to see a dead engine fast, but on the shared 2-core machine at a
// load average of 20 an engine's /health answer can take longer than that:
// with that probe, the first 2,000-stream run had 177 of 97,206 streams
// answered 503 no_healthy_backend while probes flapped, and none with this
// one (docs/body-leg.md, "Fault suite"). Here an engine is marked down
// after 3 probes of 5 s fail.
func soakRuleArgs() map[string]any {
	a := map[string]any{"probeInterval": 5, "probeTimeout": 5, "probeRetries": 3}
	for k, v := range kvArgs {
		a[k] = v
	}
	return a
}

// soakGrace is the daemons' --shutdown-grace in the soak.
const soakGrace = 2 * time.Second

func soakPath(t *testing.T, tp *topo, c soakConfig, dp string, port int, eps []string) {
	d := tp.startDaemon(t, dp, soakGrace)
	d.createRule(t, port, eps, soakRuleArgs())
	base := fmt.Sprintf("http://%s:%d", gwAddr, port)
	waitFor(t, "subscribers", 20*time.Second, func() bool {
		return d.metric(t, "loxilb_kv_subscriber_connected", nil) == 2
	})
	cl := tp.client()
	// Warm up (first tokenizer load, pools), then the baseline.
	for i := range 4 {
		complete(t, cl, base, fmt.Sprintf("warm %s %d", dp, i))
	}
	pid := d.cmd.Process.Pid
	time.Sleep(500 * time.Millisecond)
	baseG := d.metric(t, "go_goroutines", nil)
	baseFD, err := procFDs(pid)
	if err != nil {
		t.Fatal(err)
	}

	l := &soakLoad{cl: tp.client(), base: base, bound: c.streamBound()}
	// A hard bound on each request, head included, past the stream bound.
	l.cl.Timeout = c.streamBound() + time.Minute
	sampleCl := tp.client()
	sampleCl.Timeout = 10 * time.Second

	pattern := l.burst(8, 20, 8, time.Time{}, "pattern")
	// Sample times count from the start of the load.
	series := startSampling(soakProbe{pid: pid, api: d.api, cl: sampleCl, open: &l.open, done: &l.done, failed: &l.failed}, c.sample)
	loadStart := time.Now()
	soaked := l.burst(c.streams, 0, c.tokens, loadStart.Add(c.load), "soak")
	loadTook := time.Since(loadStart)
	series.idle.Store(true)
	time.Sleep(c.idle)
	ss := series.finish()
	t.Logf("%s: %d pattern streams; %d soak streams in %s (%.1f streams/s, %d clients); %d samples, %d unreadable (first: %v)\n%s",
		dp, pattern, soaked, loadTook.Round(time.Second), float64(soaked)/loadTook.Seconds(), c.streams,
		len(ss), series.failures, series.firstErr, table(ss))
	if n := l.failed.Load(); n > 0 {
		t.Fatalf("%s: %d streams failed:%s\nprobes and breakers:\n%s\n%s\n%s\nrequests by outcome:\n%s\naccess records not 200 (at most %d):\n%s\ndaemon log (last 8 KiB):\n%s",
			dp, n, l.failures(), d.metricLines(t, "kvgate_endpoint_probe"), d.metricLines(t, "kvgate_circuit_breaker"),
			d.metricLines(t, "kvgate_backend_connect_failures"), d.metricLines(t, "kvgate_requests_total"),
			maxOddRecords, oddRecords(t, d), lastBytes(d.logs.String(), 8<<10))
	}
	if b := d.metric(t, "kvgate_backend_broken_responses_total", nil); b != 0 {
		t.Fatalf("%s: %v complete streams counted as broken", dp, b)
	}
	if k := d.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"}); (dp == "auto") != (k > 0) {
		t.Fatalf("%s: %v bytes spliced in the kernel", dp, k)
	}
	checkRSSFlat(t, dp, c, ss)
	waitBaseline(t, d, int(baseG), baseFD)
	checkSIGTERM(t, d, dp)
}

// waitBaseline waits (20 s at most) for the daemon's goroutines, fds and
// in-flight count to return to their baseline.
func waitBaseline(t *testing.T, d *daemon, baseG, baseFD int) {
	t.Helper()
	pid := d.cmd.Process.Pid
	deadline := time.Now().Add(20 * time.Second)
	for {
		g, inflight := int(d.metric(t, "go_goroutines", nil)), d.metric(t, "kvgate_endpoint_inflight", nil)
		fds, err := procFDs(pid)
		if err != nil {
			t.Fatal(err)
		}
		// A leak per stream would show as thousands; a worker the daemon
		// starts once under load and keeps (seen: one extra goroutine in
		// about one run in four, fds unchanged) is not one, so goroutines
		// get a slack of 3.
		if g <= baseG+3 && fds <= baseFD && inflight == 0 {
			t.Logf("after the idle phase: goroutines %d (baseline %d), fds %d (baseline %d), in flight 0", g, baseG, fds, baseFD)
			return
		}
		if time.Now().After(deadline) {
			// SIGQUIT makes the Go runtime print every goroutine.
			d.signal(t, syscall.SIGQUIT)
			<-d.exited
			t.Fatalf("after the soak: goroutines %d (baseline %d), fds %d (baseline %d), in flight %v\n%s",
				g, baseG, fds, baseFD, inflight, d.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkSIGTERM sends SIGTERM and fails unless the daemon exits cleanly
// within the grace, plus the 5 s the daemon allows itself past it, plus
// slack for a loaded machine.
func checkSIGTERM(t *testing.T, d *daemon, dp string) {
	t.Helper()
	start := time.Now()
	d.signal(t, syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.err != nil {
			t.Fatalf("kvgate exited with %v\n%s", d.err, d.logs.String())
		}
	case <-time.After(soakGrace + 5*time.Second + 8*time.Second):
		t.Fatalf("kvgate still running after SIGTERM\n%s", d.logs.String())
	}
	t.Logf("%s: exited %s after SIGTERM (grace %s)", dp, time.Since(start).Round(time.Millisecond), soakGrace)
}

// lastBytes is the end of s, at most n bytes.
func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
