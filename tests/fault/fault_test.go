//go:build linux

package fault

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// endBound is how long a client may wait for the end of a stream whose
// backend died: before the fix it was the 120 s idle timeout; now the
// connection closes at once. The bound is generous, not a latency target.
const endBound = 15 * time.Second

// fleet is the suite's topology: two engines, and one daemon per data path
// with a KV rule over both engines.
type fleet struct {
	t       *testing.T // the test the fleet lives as long as
	tp      *topo
	engines map[string]*engine // by id
	hosts   []string
	paths   []*gw
}

type gw struct {
	name string // the data path
	d    *daemon
	base string
	id   int
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	tp := newTopo(t)
	f := &fleet{t: t, tp: tp, engines: map[string]*engine{}, hosts: []string{eng1Addr, eng2Addr}}
	for _, h := range f.hosts {
		e := tp.startEngine(t, nil, h)
		f.engines[e.id] = e
	}
	var eps []string
	for _, h := range f.hosts {
		eps = append(eps, fmt.Sprintf("%s:%d", h, engPort))
	}
	for i, dp := range []string{"auto", "userspace"} {
		d := tp.startDaemon(t, dp, 2*time.Second)
		port := 8080 + i
		id := d.createRule(t, port, eps, kvArgs)
		g := &gw{name: dp, d: d, base: fmt.Sprintf("http://%s:%d", gwAddr, port), id: id}
		waitFor(t, dp+" subscribers", 20*time.Second, func() bool {
			return d.metric(t, "loxilb_kv_subscriber_connected", nil) == 2
		})
		f.paths = append(f.paths, g)
	}
	return f
}

// restart brings a killed engine back and waits until both daemons probe
// it up again.
func (f *fleet) restart(t *testing.T, id string) {
	t.Helper()
	old := f.engines[id]
	e := f.tp.startEngine(t, f.t, old.host)
	f.engines[id] = e
	f.waitProbesUp(t)
}

// waitProbesUp waits until no endpoint of any rule is probed down (a probe
// gauge exists only once an endpoint has changed state).
func (f *fleet) waitProbesUp(t *testing.T) {
	t.Helper()
	for _, g := range f.paths {
		deadline := time.Now().Add(20 * time.Second)
		for g.d.probedDown(t, "") {
			if time.Now().After(deadline) {
				t.Fatalf("%s: endpoints still probed down after 20s\n%s", g.name, g.d.metricLines(t, "kvgate_endpoint_probe"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// epIdx is an engine's ep_idx in the KV rules (endpoints in host order).
func (f *fleet) epIdx(host string) string {
	for i, h := range f.hosts {
		if h == host {
			return fmt.Sprint(i)
		}
	}
	return "?"
}

func (f *fleet) other(id string) string {
	for k := range f.engines {
		if k != id {
			return k
		}
	}
	return ""
}

func last(evs []string) string {
	if len(evs) == 0 {
		return ""
	}
	return evs[len(evs)-1]
}

func hasDone(evs []string) bool {
	for _, e := range evs {
		if e == "[DONE]" {
			return true
		}
	}
	return false
}

// TestFaults runs every fault against one fleet, in turn (each heals before
// the next), on both data paths.
func TestFaults(t *testing.T) {
	requireRoot(t)
	f := startFleet(t)
	cl := f.tp.client()

	// An engine killed mid-stream (kill -9 after 1.5 s of an 800-token
	// stream): the client gets a final error event and the end of the
	// connection at once — not a wait for the idle timeout with no
	// terminator — the response counts as broken, and the next request
	// routes to the surviving engine.
	for _, g := range f.paths {
		t.Run("kill9/"+g.name, func(t *testing.T) {
			s := openStream(t, f.tp.keepAliveClient(), g.base, "kill9 "+g.name, 800)
			s.waitEvents(t, 3)
			time.Sleep(1500 * time.Millisecond)
			e := f.engines[s.engine]
			if e == nil {
				t.Fatalf("stream served by unknown engine %q", s.engine)
			}
			e.kill9(t)
			start := time.Now()
			evs := s.rest(t, endBound)
			if hasDone(evs) {
				t.Fatalf("a killed stream ended with [DONE]")
			}
			if !strings.Contains(last(evs), `"code":"backend_broken"`) {
				t.Fatalf("last event %q, want the backend_broken error event", last(evs))
			}
			if s.err == nil {
				t.Fatalf("the body ended cleanly; want the client to see a cut body")
			}
			t.Logf("%s: stream ended %s after the kill (%v)", g.name, time.Since(start).Round(time.Millisecond), s.err)
			waitFor(t, "kvgate_backend_broken_responses_total", 5*time.Second, func() bool {
				return g.d.metric(t, "kvgate_backend_broken_responses_total", nil) >= 1
			})
			wantPath := map[string]string{"auto": "sockmap", "userspace": "userspace"}[g.name]
			found := false
			for _, r := range g.d.accessLog(t) {
				if r["outcome"] == "backend_broken" && r["datapath"] == wantPath {
					found = true
				}
			}
			if !found {
				t.Fatalf("no access-log record with outcome backend_broken on %s: %v", wantPath, g.d.accessLog(t))
			}
			if got := complete(t, cl, g.base, "after kill "+g.name); got != f.other(e.id) {
				t.Fatalf("after the kill, served by %q, want %q", got, f.other(e.id))
			}
			f.restart(t, e.id)
		})
	}

	// SIGSTOP: the stream on the stopped engine stalls (it has received
	// bytes, so the probe-down leaves it alone; requests still waiting for
	// their head are re-routed: TestHungEngineAndDepartedClients); new
	// requests route to the other engine once the probe marks the stopped
	// one down; after SIGCONT the stalled stream completes.
	t.Run("sigstop", func(t *testing.T) {
		g := f.paths[0]
		s := openStream(t, cl, g.base, "sigstop", 60)
		brokenBefore := g.d.metric(t, "kvgate_requests_total", map[string]string{"outcome": "backend_broken", "ep_idx": f.epIdx(f.engines[s.engine].host)})
		s.waitEvents(t, 2)
		e := f.engines[s.engine]
		e.signal(t, syscall.SIGSTOP)
		waitFor(t, "the probe marks the stopped engine down", 20*time.Second, func() bool {
			return g.d.probedDown(t, f.epIdx(e.host))
		})
		for i := 0; i < 3; i++ {
			if got := complete(t, cl, g.base, fmt.Sprintf("while stopped %d", i)); got != f.other(e.id) {
				t.Fatalf("while stopped, served by %q, want %q", got, f.other(e.id))
			}
		}
		e.signal(t, syscall.SIGCONT)
		evs := s.rest(t, 30*time.Second)
		if !hasDone(evs) || s.err != nil {
			t.Fatalf("the stalled stream did not complete after SIGCONT: %v, last %q", s.err, last(evs))
		}
		// Complete, with enginesim's trailers, so not a broken response
		// (the kernel leg once misjudged a trailer longer than its tail).
		if n := g.d.metric(t, "kvgate_requests_total", map[string]string{"outcome": "backend_broken", "ep_idx": f.epIdx(e.host)}); n != brokenBefore {
			t.Fatalf("the completed stream counted as broken (%v, was %v)", n, brokenBefore)
		}
		f.waitProbesUp(t)
	})

	// Random loss on the veth (10 % each way, nftables numgen): TCP
	// recovers, every stream completes on both paths.
	t.Run("loss", func(t *testing.T) {
		heal := f.tp.fault(t,
			"in ip saddr "+gwAddr+" numgen random mod 100 < 10 drop",
			"out ip daddr "+gwAddr+" numgen random mod 100 < 10 drop")
		defer heal()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for _, g := range f.paths {
			for i := 0; i < 3; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := openStream(t, cl, g.base, fmt.Sprintf("loss %s %d", g.name, i), 32)
					evs := s.rest(t, 60*time.Second)
					if !hasDone(evs) || s.err != nil {
						errs <- fmt.Errorf("%s: stream under loss: %w, last %q", g.name, s.err, last(evs))
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	f.waitProbesUp(t)

	// Resets (reject with tcp reset) towards one engine: the stream in
	// flight ends at once with an error the client sees, and new requests
	// route to the other engine (the connect is refused).
	for _, g := range f.paths {
		t.Run("reset/"+g.name, func(t *testing.T) {
			s := openStream(t, cl, g.base, "reset "+g.name, 400)
			s.waitEvents(t, 3)
			e := f.engines[s.engine]
			heal := f.tp.fault(t, "in ip daddr "+e.host+" tcp dport "+fmt.Sprint(engPort)+" reject with tcp reset")
			defer heal()
			evs := s.rest(t, endBound)
			if hasDone(evs) {
				t.Fatalf("a reset stream ended with [DONE]")
			}
			if s.err == nil && !strings.Contains(last(evs), `"error"`) {
				t.Fatalf("the client saw a clean end of a reset stream")
			}
			for i := 0; i < 3; i++ {
				if got := complete(t, cl, g.base, fmt.Sprintf("after reset %s %d", g.name, i)); got != f.other(e.id) {
					t.Fatalf("during resets, served by %q, want %q", got, f.other(e.id))
				}
			}
			heal()
			f.waitProbesUp(t)
		})
	}

	// A partition (every packet to and from one engine dropped): new
	// requests route to the other engine (connect timeout, then the probe);
	// the stream in flight stalls and completes once the partition heals.
	t.Run("partition", func(t *testing.T) {
		g := f.paths[0]
		s := openStream(t, cl, g.base, "partition", 60)
		s.waitEvents(t, 2)
		e := f.engines[s.engine]
		heal := f.tp.fault(t, "in ip daddr "+e.host+" drop", "out ip saddr "+e.host+" drop")
		for i := 0; i < 3; i++ {
			if got := complete(t, cl, g.base, fmt.Sprintf("partitioned %d", i)); got != f.other(e.id) {
				heal()
				t.Fatalf("during the partition, served by %q, want %q", got, f.other(e.id))
			}
		}
		heal()
		evs := s.rest(t, 60*time.Second)
		if !hasDone(evs) || s.err != nil {
			t.Fatalf("the stream did not complete after the partition healed: %v, last %q", s.err, last(evs))
		}
		f.waitProbesUp(t)
	})

	// Delay (a userspace relay adding 150 ms each way): streams through the
	// delayed endpoint complete, their first byte no sooner than the delay,
	// and the KV rule keeps routing.
	t.Run("delay", func(t *testing.T) {
		const delay = 150 * time.Millisecond
		relayDelayed(t, f.tp, net.JoinHostPort(relayIP, fmt.Sprint(engPort)), net.JoinHostPort(eng1Addr, fmt.Sprint(engPort)), delay)
		for _, g := range f.paths {
			port := 8090 + len(g.name) // distinct per daemon
			g.d.createRule(t, port, []string{net.JoinHostPort(relayIP, fmt.Sprint(engPort))}, nil)
			base := fmt.Sprintf("http://%s:%d", gwAddr, port)
			start := time.Now()
			s := openStream(t, cl, base, "delay "+g.name, 16)
			first := time.Since(start)
			evs := s.rest(t, 60*time.Second)
			if !hasDone(evs) || s.err != nil {
				t.Fatalf("%s: delayed stream: %v, last %q", g.name, s.err, last(evs))
			}
			if first < 2*delay {
				t.Fatalf("%s: first byte after %s through a relay delaying %s each way", g.name, first, delay)
			}
			complete(t, cl, g.base, "beside the delay "+g.name)
		}
	})

	// A backend that breaks every response, on a rule with cb_enable: each
	// broken response is an origin failure for the circuit breaker, so after the origin-error
	// threshold (LLB_PD_ORIGIN_ERR_THRESHOLD, 3) the breaker opens and
	// requests go to the healthy endpoint only.
	t.Run("broken_backend_opens_breaker", func(t *testing.T) {
		bad := net.JoinHostPort(relayIP, "9000")
		brokenServer(t, f.tp, bad)
		for i, g := range f.paths {
			port := 8100 + i
			id := g.d.createRule(t, port, []string{bad, net.JoinHostPort(eng1Addr, fmt.Sprint(engPort))}, map[string]any{"cb_enable": true})
			base := fmt.Sprintf("http://%s:%d", gwAddr, port)
			broken := 0
			for n := 0; n < 20 && g.d.metric(t, "kvgate_circuit_breaker_state", map[string]string{"service": fmt.Sprint(id), "ep_idx": "0"}) != 1; n++ {
				s := openStream(t, cl, base, fmt.Sprintf("breaker %s %d", g.name, n), 8)
				evs := s.rest(t, endBound)
				if s.engine == "broken" {
					broken++
					if !strings.Contains(last(evs), `"code":"backend_broken"`) || s.err == nil {
						t.Fatalf("%s: a broken response ended with %q (%v)", g.name, last(evs), s.err)
					}
				}
			}
			if state := g.d.metric(t, "kvgate_circuit_breaker_state", map[string]string{"service": fmt.Sprint(id), "ep_idx": "0"}); broken != 3 || state != 1 {
				t.Fatalf("%s: after %d broken responses the breaker state is %v; want open (1) after 3", g.name, broken, state)
			}
			for n := 0; n < 3; n++ {
				s := openStream(t, cl, base, fmt.Sprintf("breaker open %s %d", g.name, n), 8)
				if evs := s.rest(t, endBound); s.engine == "broken" || !hasDone(evs) {
					t.Fatalf("%s: with the breaker open, served by %q (%v)", g.name, s.engine, s.err)
				}
			}
			if got := g.d.metric(t, "kvgate_backend_broken_responses_total", map[string]string{"service": fmt.Sprint(id)}); got != 3 {
				t.Fatalf("%s: kvgate_backend_broken_responses_total %v, want 3", g.name, got)
			}
		}
	})

	// SIGTERM with legs stuck (both engines stopped mid-stream): each daemon
	// exits within its grace plus the cut bound, and the clients' streams
	// end. Before the shutdown bound, a stuck leg kept kvgate alive.
	// A third daemon with a long grace shows the second signal: it exits at
	// once instead of waiting the grace out.
	t.Run("sigterm_stuck_legs", func(t *testing.T) {
		long := f.tp.startDaemon(t, "auto", time.Minute)
		var eps []string
		for _, h := range f.hosts {
			eps = append(eps, net.JoinHostPort(h, fmt.Sprint(engPort)))
		}
		long.createRule(t, 8200, eps, nil)
		var ss []*stream
		for _, base := range []string{f.paths[0].base, f.paths[1].base, fmt.Sprintf("http://%s:8200", gwAddr)} {
			s, err := tryStream(cl, base, "sigterm "+base, 400)
			if err != nil {
				t.Fatalf("%s: %v\n%s\n%s", base, err, long.logs.String(), long.metricLines(t, "kvgate_endpoint_probe"))
			}
			s.waitEvents(t, 2)
			ss = append(ss, s)
		}
		for _, e := range f.engines {
			e.signal(t, syscall.SIGSTOP)
		}
		start := time.Now()
		for _, g := range f.paths {
			g.d.signal(t, syscall.SIGTERM)
		}
		long.signal(t, syscall.SIGTERM)
		const bound = 2*time.Second + 5*time.Second + 8*time.Second // grace + cut + slack for a loaded machine
		for _, g := range f.paths {
			select {
			case <-g.d.exited:
			case <-time.After(bound - time.Since(start)):
				t.Fatalf("%s: kvgate still running %s after SIGTERM\n%s", g.name, bound, g.d.logs.String())
			}
		}
		t.Logf("both daemons exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
		select {
		case <-long.exited:
			t.Fatalf("the daemon with a 1 min grace exited before it: %v\n%s", long.err, long.logs.String())
		default:
		}
		long.signal(t, syscall.SIGTERM)
		select {
		case <-long.exited:
			if long.err == nil {
				t.Fatal("a daemon cut short by a second signal exited 0")
			}
		case <-time.After(endBound):
			t.Fatalf("a second SIGTERM did not stop kvgate\n%s", long.logs.String())
		}
		for i, s := range ss {
			evs := s.rest(t, endBound)
			if hasDone(evs) {
				t.Fatalf("stream %d on a stopped engine completed", i)
			}
		}
		for _, e := range f.engines {
			e.signal(t, syscall.SIGCONT)
		}
	})
}
