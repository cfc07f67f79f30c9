package health

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

// engineServer is a real loopback HTTP server standing in for an engine's
// /health and /metrics.
type engineServer struct {
	srv     *httptest.Server
	status  atomic.Int32
	metrics atomic.Pointer[string]
	hang    atomic.Bool
}

func newEngineServer(t *testing.T) *engineServer {
	t.Helper()
	e := &engineServer{}
	e.status.Store(200)
	m := vllmMetrics
	e.metrics.Store(&m)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if e.hang.Load() {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(int(e.status.Load()))
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(*e.metrics.Load()))
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/health", http.StatusFound)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engineServer) target(ep int) Target {
	host, port, _ := net.SplitHostPort(e.srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return Target{Ep: ep, Host: host, Port: p}
}

func TestHTTPProbe(t *testing.T) {
	eng := newEngineServer(t)
	tr, _, _ := newTestTracker(t, true, 0)
	p, err := NewProber(tr, ProbeConfig{Type: "http", Timeout: 300 * time.Millisecond}, []Target{eng.target(0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tests := []struct {
		status int
		hang   bool
		pass   bool
	}{
		{200, false, true}, {204, false, true}, {299, false, true}, {301, false, false},
		{404, false, false}, {500, false, false}, {503, false, false}, {200, true, false},
	}
	for _, tc := range tests {
		eng.status.Store(int32(tc.status))
		eng.hang.Store(tc.hang)
		start := time.Now()
		err := p.Probe(ctx, eng.target(0))
		if (err == nil) != tc.pass {
			t.Errorf("status %d hang %v: err %v, want pass %v", tc.status, tc.hang, err, tc.pass)
		}
		if time.Since(start) > 3*time.Second {
			t.Errorf("probe not bounded by its timeout")
		}
	}
	eng.hang.Store(false)
	eng.status.Store(200)
	redir, _ := NewProber(tr, ProbeConfig{Type: "http", Path: "/moved"}, []Target{eng.target(0)}, nil)
	if err := redir.Probe(ctx, eng.target(0)); err == nil {
		t.Error("a redirect passed the probe")
	}
	dead := Target{Ep: 0, Host: "127.0.0.1", Port: testnet.Port(t, "127.0.0.1")}
	if err := p.Probe(ctx, dead); err == nil {
		t.Error("probe of a closed port passed")
	}
}

func TestTCPProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	tr, _, _ := newTestTracker(t, false, 0)
	live := Target{Ep: 0, Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	p, err := NewProber(tr, ProbeConfig{Type: "tcp", Timeout: time.Second}, []Target{live}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(context.Background(), live); err != nil {
		t.Fatalf("live: %v", err)
	}
	// probeport overrides the target port.
	p2, _ := NewProber(tr, ProbeConfig{Type: "tcp", Port: testnet.Port(t, "127.0.0.1")}, []Target{live}, nil)
	if err := p2.Probe(context.Background(), live); err == nil {
		t.Fatal("probeport not used")
	}
	none, _ := NewProber(tr, ProbeConfig{Type: "none"}, []Target{{Ep: 0, Host: "127.0.0.1", Port: testnet.Port(t, "127.0.0.1")}}, nil)
	if err := none.Probe(context.Background(), live); err != nil {
		t.Fatal("none failed")
	}
}

func TestProberConfigErrors(t *testing.T) {
	tr, _, _ := newTestTracker(t, false, 0)
	for _, tc := range []struct {
		cfg ProbeConfig
		tg  []Target
	}{
		{ProbeConfig{Type: "udp"}, nil},
		{ProbeConfig{Port: 70000}, nil},
		{ProbeConfig{}, []Target{{Ep: 3, Host: "127.0.0.1", Port: 80}}},
		{ProbeConfig{}, []Target{{Ep: 0, Host: "", Port: 80}}},
		{ProbeConfig{}, []Target{{Ep: 0, Host: "127.0.0.1", Port: 0}}},
	} {
		if _, err := NewProber(tr, tc.cfg, tc.tg, nil); err == nil {
			t.Errorf("%+v %+v accepted", tc.cfg, tc.tg)
		}
	}
}

// TestProberRun: probes on an interval push transitions; the scrape fills
// engine figures and logs a missing family once.
func TestProberRun(t *testing.T) {
	eng := newEngineServer(t)
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	tr, err := NewTracker(TrackerConfig{ServiceID: 5, Endpoints: []int{0}, ProbeRetries: 2})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []Event
	tr.Subscribe(func(x Transition) { mu.Lock(); events = append(events, x.Event); mu.Unlock() })
	p, err := NewProber(tr, ProbeConfig{Type: "http", Interval: 20 * time.Millisecond, Timeout: 500 * time.Millisecond, Scrape: true},
		[]Target{eng.target(0)}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "scrape", func() bool { b, ok := tr.GPUBlocks(0); return ok && b == 27354 })
	if w, _, ok := tr.Waiting(0); !ok || w != 5 {
		t.Fatalf("waiting %d %v", w, ok)
	}
	eng.status.Store(503)
	waitFor(t, "probe down", func() bool { return tr.States().ProbeDown.Has(0) })
	eng.status.Store(200)
	waitFor(t, "probe up", func() bool { return !tr.States().ProbeDown.Has(0) })
	mu.Lock()
	if len(events) != 2 || events[0] != EventProbeDown || events[1] != EventProbeUp {
		t.Fatalf("events %v", events)
	}
	mu.Unlock()

	only := "vllm:num_requests_waiting 1\n"
	eng.metrics.Store(&only)
	waitFor(t, "blocks unknown", func() bool { _, ok := tr.GPUBlocks(0); return !ok })
	time.Sleep(100 * time.Millisecond) // several more scrapes
	if n := strings.Count(logs.String(), "engine metric family missing"); n != 1 {
		t.Fatalf("missing family logged %d times:\n%s", n, logs.String())
	}
}

// invScorer is a small inventory for the selector integration test.
type invScorer map[int][]uint64

func (v invScorer) Score(hashes []uint64, eligible epset.Set, leading bool, counts *[256]uint32) {
	for ep := eligible.Next(0); ep >= 0; ep = eligible.Next(ep + 1) {
		have := map[uint64]bool{}
		for _, h := range v[ep] {
			have[h] = true
		}
		var n uint32
		for _, h := range hashes {
			if have[h] {
				n++
			} else if leading {
				break
			}
		}
		counts[ep] = n
	}
}
func (v invScorer) Blocks(ep int) int { return len(v[ep]) }

// TestRetryThenProbe: docs/pd.md's worked example with real sockets. EP0 holds the warm
// prefix and dies. The next request fails to connect to EP0, is retried with
// EP0 excluded and lands on EP2 (second-best overlap); the breaker counts
// the failure. Then the probe marks EP0 down, the transition drops its
// sessions at once, and later requests go to EP2 without a retry.
func TestRetryThenProbe(t *testing.T) {
	ep0, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ep2.Close()
	go func() {
		for {
			c, err := ep2.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := map[int]string{0: ep0.Addr().String(), 2: ep2.Addr().String()}
	ep0.Close() // EP0 is killed

	tr, err := NewTracker(TrackerConfig{ServiceID: 1, Endpoints: []int{0, 1, 2}, Breaker: DefaultBreakerConfig(true)})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []uint64{11, 12, 13}
	opts := selector.DefaultOptions()
	opts.ColdStartSeedN = 0
	sel, err := selector.New(selector.Rule{ServiceID: 1, KVExactMode: 1, PD: true, BlockSize: 16, Endpoints: []selector.Endpoint{
		{Idx: 0, Role: selector.RolePrefill}, {Idx: 1, Role: selector.RoleDecode}, {Idx: 2, Role: selector.RolePrefill},
	}}, opts, selector.Deps{Scorer: invScorer{0: prompt, 2: prompt[:1]}, Engine: tr, States: tr})
	if err != nil {
		t.Fatal(err)
	}
	tr.Subscribe(func(x Transition) {
		if x.Drops() {
			sel.DropEndpoint(x.Ep)
		}
	})
	connect := func(ep int) bool {
		c, err := net.DialTimeout("tcp", addr[ep], time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	route := func(key string) (selector.Decision, int) {
		a := sel.Begin(&selector.Request{SessionKey: key, Model: "m", HasText: true, Hashes: prompt})
		retries := 0
		for {
			d := a.Decide()
			if d.Endpoint < 0 {
				t.Fatalf("no endpoint: %+v", d)
			}
			if tr.Allow(d.Endpoint) && connect(d.Endpoint) {
				tr.Success(d.Endpoint)
				a.Commit()
				return d, retries
			}
			tr.ConnectFailure(d.Endpoint)
			a.Exclude(d.Endpoint)
			retries++
			if retries > 3 {
				t.Fatal("retries unbounded")
			}
		}
	}
	d, retries := route("conv")
	if d.Endpoint != 2 || d.Tier != selector.TierKV || retries != 1 || d.Decode != 1 {
		t.Fatalf("first request: %+v after %d retries; want EP2 by tier 1.5 after one retry", d, retries)
	}
	if sel.SessionCount() != 1 {
		t.Fatal("session not pinned")
	}
	// The probe notices (two failures), pushes the transition at once.
	p, err := NewProber(tr, ProbeConfig{Type: "tcp", Timeout: time.Second},
		[]Target{{Ep: 0, Host: "127.0.0.1", Port: ep0.Addr().(*net.TCPAddr).Port}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		p.Once(context.Background(), Target{Ep: 0, Host: "127.0.0.1", Port: ep0.Addr().(*net.TCPAddr).Port})
	}
	if !tr.States().ProbeDown.Has(0) {
		t.Fatal("probe did not mark EP0 down")
	}
	d, retries = route("other")
	if d.Endpoint != 2 || retries != 0 {
		t.Fatalf("after the probe: %+v, %d retries", d, retries)
	}
}

// TestProberScrapeInterval: a scrape interval shorter than the probe
// interval scrapes on its own ticker while the probe keeps its pace; one
// equal to or longer than it, or none, scrapes with each probe.
func TestProberScrapeInterval(t *testing.T) {
	for _, c := range []struct {
		name           string
		interval       time.Duration
		scrapeInterval time.Duration
		fastScrapes    bool
	}{
		{"faster scrape", time.Hour, 20 * time.Millisecond, true},
		{"with each probe", time.Hour, 0, false},
		{"not shorter than the probe", time.Hour, 2 * time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var probes, scrapes atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) { probes.Add(1) })
			mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
				scrapes.Add(1)
				_, _ = w.Write([]byte(vllmMetrics))
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
			pn, _ := strconv.Atoi(port)
			tr, err := NewTracker(TrackerConfig{ServiceID: 5, Endpoints: []int{0}})
			if err != nil {
				t.Fatal(err)
			}
			p, err := NewProber(tr, ProbeConfig{Type: "http", Interval: c.interval, ScrapeInterval: c.scrapeInterval, Timeout: time.Second, Scrape: true},
				[]Target{{Ep: 0, Host: host, Port: pn}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { p.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			waitFor(t, "the first probe and scrape", func() bool { return probes.Load() >= 1 && scrapes.Load() >= 1 })
			if c.fastScrapes {
				waitFor(t, "scrapes between probes", func() bool { return scrapes.Load() >= 4 })
			} else {
				time.Sleep(100 * time.Millisecond)
				if n := scrapes.Load(); n != 1 {
					t.Fatalf("%d scrapes, want 1 (with the one probe)", n)
				}
			}
			if n := probes.Load(); n != 1 {
				t.Fatalf("%d probes in an hour's interval, want 1", n)
			}
		})
	}
}
