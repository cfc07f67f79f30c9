//go:build linux

package fault

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// leaveBound is how long a backend may wait for kvgate to close its
// connection after the client left: generous for a loaded 2-core machine;
// the typical value is measured and stated in docs/dataplane.md.
const leaveBound = 2 * time.Second

// recBackend is a plain TCP server in the engines' namespace that records,
// per request, when it arrived and when its connection saw EOF (kvgate
// closed its side). A request to /hang gets no answer; one to /stream gets
// an SSE head and one event, then silence. Other connections (TCP probes)
// are ignored.
type recBackend struct {
	addr string
	got  chan time.Time
	eof  chan time.Time
}

func startRecBackend(t *testing.T, tp *topo, addr string) *recBackend {
	t.Helper()
	var ln net.Listener
	if err := inNS(tp.eng, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b := &recBackend{addr: addr, got: make(chan time.Time, 16), eof: make(chan time.Time, 16)}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go b.serve(c)
		}
	}()
	return b
}

func (b *recBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	b.got <- time.Now()
	if strings.HasPrefix(req.URL.Path, "/stream") {
		ev := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w\"}}]}\n\n"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
	}
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, _ = io.Copy(io.Discard, br)
	b.eof <- time.Now()
}

func recvTime(t *testing.T, ch chan time.Time, what string, bound time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-ch:
		return at
	case <-time.After(bound):
		t.Fatalf("%s: not within %s", what, bound)
	}
	return time.Time{}
}

// engineMetric reads one of an engine's own metrics (summed over series).
func (tp *topo) engineMetric(t *testing.T, host, name string) float64 {
	t.Helper()
	resp, err := tp.engineClient().Get(fmt.Sprintf("http://%s:%d/metrics", host, engPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != '{' && l[len(name)] != ' ') {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

type hangAnswer struct {
	status int
	code   string
	engine string
	err    error
	at     time.Time
}

func chatAsync(cl *http.Client, base, salt string, maxTokens int) <-chan hangAnswer {
	out := make(chan hangAnswer, 1)
	go func() {
		body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens,
			"messages": []map[string]string{{"role": "user", "content": prompt(salt)}}})
		resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			out <- hangAnswer{err: err, at: time.Now()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var eb struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &eb)
		out <- hangAnswer{status: resp.StatusCode, code: eb.Error, engine: resp.Header.Get("x-engine-id"), at: time.Now()}
	}()
	return out
}

// TestHungEngineAndDepartedClients runs the real daemon against real
// enginesim processes and a recording TCP backend:
//   - a client that leaves before the response head, or after it on the
//     sockmap and the userspace leg, makes kvgate close the backend
//     connection (seen at the backend as EOF) within leaveBound; enginesim
//     counts the request aborted;
//   - an engine stopped with SIGSTOP while requests wait on it: once the
//     probe marks it down (probe interval 1 s × retries 1 + 1 s), a request
//     on a two-engine rule is answered by the other engine, one on a
//     single-engine rule gets 503 endpoint_down, and the stopped engine's
//     in-flight gauge is back to 0.
//
// Before the fix the backend connection stayed open, and the requests
// waited, until ResponseHeaderTimeout (600 s).
func TestHungEngineAndDepartedClients(t *testing.T) {
	requireRoot(t)
	tp := newTopo(t)
	a := tp.startEngine(t, nil, eng1Addr)
	b := tp.startEngine(t, nil, eng2Addr)
	tp.startEngine(t, nil, relayIP) // a second decode engine for the P/D rule
	rec := startRecBackend(t, tp, net.JoinHostPort(relayIP, "9100"))
	httpProbe := map[string]any{"probetype": "http"}
	engA, engB := net.JoinHostPort(eng1Addr, fmt.Sprint(engPort)), net.JoinHostPort(eng2Addr, fmt.Sprint(engPort))
	engC := net.JoinHostPort(relayIP, fmt.Sprint(engPort))

	type leg struct {
		name, datapath string
		d              *daemon
		base           string
	}
	var legs []leg
	for i, dp := range []string{"auto", "userspace"} {
		d := tp.startDaemon(t, dp, 2*time.Second)
		port := 8310 + i
		d.createRule(t, port, []string{rec.addr}, nil)
		legs = append(legs, leg{name: dp, datapath: map[string]string{"auto": "sockmap", "userspace": "userspace"}[dp], d: d,
			base: fmt.Sprintf("%s:%d", gwAddr, port)})
	}
	d := legs[0].d
	both := d.createRule(t, 8300, []string{engA, engB}, httpProbe)
	single := d.createRule(t, 8301, []string{engA}, httpProbe)
	bothBase, singleBase := fmt.Sprintf("http://%s:8300", gwAddr), fmt.Sprintf("http://%s:8301", gwAddr)
	// P/D rules: prefill on A; decode on B and C, or on B alone.
	pdArgs := map[string]any{"kvExactMode": 1, "kvZmqPort": zmqPort, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16,
		"probetype": "http", "probeInterval": 1, "probeTimeout": 1, "probeRetries": 1}
	pdBoth := createRuleRoles(t, d, 8320, []string{engA, engB, engC}, []int{1, 2, 2}, pdArgs)
	pdSingle := createRuleRoles(t, d, 8321, []string{engA, engB}, []int{1, 2}, pdArgs)
	pdBothBase, pdSingleBase := fmt.Sprintf("http://%s:8320", gwAddr), fmt.Sprintf("http://%s:8321", gwAddr)

	for _, l := range legs {
		for _, path := range []string{"/hang", "/stream"} {
			t.Run("client_leaves"+path+"/"+l.name, func(t *testing.T) {
				var c net.Conn
				if err := inNS(tp.gw, func() error {
					var err error
					c, err = net.Dial("tcp", l.base)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", path)
				recvTime(t, rec.got, "the request reached the backend", 10*time.Second)
				if path == "/stream" {
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
						t.Fatal(err)
					}
					time.Sleep(100 * time.Millisecond) // the body leg is running (the splice inserted)
				}
				left := time.Now()
				c.Close()
				eof := recvTime(t, rec.eof, "the backend connection closed", leaveBound)
				t.Logf("%s: the backend saw EOF %s after the client left", l.name, eof.Sub(left).Round(time.Microsecond))
				wantPath := ""
				if path == "/stream" {
					wantPath = l.datapath
				}
				waitFor(t, "the access-log record", 5*time.Second, func() bool {
					for _, r := range l.d.accessLog(t) {
						if r["path"] == path && r["outcome"] == "client_gone" && (wantPath == "" || r["datapath"] == wantPath) {
							return true
						}
					}
					return false
				})
			})
		}
	}

	// enginesim sees the request cancelled: a long non-streamed completion
	// (its head comes with the last token) whose client leaves.
	t.Run("client_leaves/enginesim", func(t *testing.T) {
		abortedBefore := tp.engineMetric(t, eng1Addr, "enginesim_requests_aborted_total")
		cl := tp.client()
		cl.Timeout = 300 * time.Millisecond
		body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1000,
			"messages": []map[string]string{{"role": "user", "content": prompt("leaves")}}})
		if _, err := cl.Post(singleBase+"/v1/chat/completions", "application/json", strings.NewReader(string(body))); err == nil {
			t.Fatal("a 1000-token completion answered within 300 ms")
		}
		left := time.Now()
		waitFor(t, "enginesim_requests_aborted_total", leaveBound, func() bool {
			return tp.engineMetric(t, eng1Addr, "enginesim_requests_aborted_total") == abortedBefore+1
		})
		t.Logf("enginesim counted the request aborted within %s of the client leaving", time.Since(left).Round(time.Millisecond))
		waitFor(t, "vllm:num_requests_running back to 0", leaveBound, func() bool {
			return tp.engineMetric(t, eng1Addr, "vllm:num_requests_running") == 0
		})
	})

	t.Run("sigstop", func(t *testing.T) {
		cl := tp.client()
		cl.Timeout = 30 * time.Second
		a.signal(t, syscall.SIGSTOP)
		defer a.signal(t, syscall.SIGCONT)
		stopped := time.Now()
		// Round-robin over two engines: of four requests, some go to the
		// stopped one before the probe marks it down.
		var onBoth []<-chan hangAnswer
		for i := range 4 {
			onBoth = append(onBoth, chatAsync(cl, bothBase, fmt.Sprintf("stopped %d", i), 4))
		}
		onSingle := chatAsync(cl, singleBase, "stopped single", 4)
		waitFor(t, "requests in flight on the stopped engine", 5*time.Second, func() bool {
			return d.metric(t, "kvgate_endpoint_inflight", map[string]string{"ep_idx": "0"}) >= 2
		})
		const bound = 1*time.Second*1 + time.Second + 6*time.Second // interval × retries + 1 s, and a margin for load
		for i, ch := range onBoth {
			r := recvHang(t, ch, bound-time.Since(stopped))
			if r.err != nil || r.status != 200 || r.engine != "engine-"+eng2Addr {
				t.Fatalf("request %d on the two-engine rule: %+v, want 200 from engine-%s", i, r, eng2Addr)
			}
		}
		r := recvHang(t, onSingle, bound-time.Since(stopped))
		if r.err != nil || r.status != 503 || r.code != "endpoint_down" {
			t.Fatalf("request on the single-engine rule: %+v, want 503 endpoint_down", r)
		}
		t.Logf("the single-engine request got 503 endpoint_down %s after SIGSTOP", r.at.Sub(stopped).Round(time.Millisecond))
		for _, svc := range []int{both, single} {
			if n := d.metric(t, "kvgate_endpoint_inflight", map[string]string{"service": fmt.Sprint(svc), "ep_idx": "0"}); n != 0 {
				t.Fatalf("service %d: kvgate_endpoint_inflight of the stopped engine %v, want 0", svc, n)
			}
		}
		rerouted := 0
		for _, r := range d.accessLog(t) {
			if r["service"] == fmt.Sprint(both) && r["attempts"] == float64(2) && r["status"] == float64(200) {
				rerouted++
			}
		}
		if rerouted == 0 {
			t.Fatalf("no request on the two-engine rule was re-routed (attempts 2): %v", d.accessLog(t))
		}
	})

	// The P/D flow: the decode engine B stopped while decodes wait on it.
	t.Run("sigstop_pd_decode", func(t *testing.T) {
		waitFor(t, "every endpoint probed up again", 20*time.Second, func() bool { return !d.probedDown(t, "") })
		cl := tp.client()
		cl.Timeout = 30 * time.Second
		// Warm both rules (the first P/D request loads the tokenizer), so the
		// requests below reach the decode leg before the probe notices.
		for _, base := range []string{pdBothBase, pdSingleBase} {
			if r := <-chatAsync(cl, base, "pd warm", 2); r.status != 200 {
				t.Fatalf("warm-up P/D request: %+v", r)
			}
		}
		b.signal(t, syscall.SIGSTOP)
		defer b.signal(t, syscall.SIGCONT)
		stopped := time.Now()
		var onBoth []<-chan hangAnswer
		for i := range 4 {
			onBoth = append(onBoth, chatAsync(cl, pdBothBase, fmt.Sprintf("pd stopped %d", i), 4))
		}
		onSingle := chatAsync(cl, pdSingleBase, "pd stopped single", 4)
		waitFor(t, "decodes in flight on the stopped engine", 5*time.Second, func() bool {
			return d.metric(t, "kvgate_endpoint_inflight", map[string]string{"ep_idx": "1"}) >= 2
		})
		const bound = 1*time.Second*1 + time.Second + 6*time.Second
		for i, ch := range onBoth {
			r := recvHang(t, ch, bound-time.Since(stopped))
			if r.err != nil || r.status != 200 || r.engine != "engine-"+relayIP {
				t.Fatalf("P/D request %d with two decode engines: %+v, want 200 from engine-%s", i, r, relayIP)
			}
		}
		r := recvHang(t, onSingle, bound-time.Since(stopped))
		if r.err != nil || r.status != 503 || r.code != "endpoint_down" {
			t.Fatalf("P/D request with one decode engine: %+v, want 503 endpoint_down", r)
		}
		t.Logf("the one-decode P/D request got 503 endpoint_down %s after SIGSTOP", r.at.Sub(stopped).Round(time.Millisecond))
		for _, svc := range []int{pdBoth, pdSingle} {
			if n := d.metric(t, "kvgate_endpoint_inflight", map[string]string{"service": fmt.Sprint(svc), "ep_idx": "1"}); n != 0 {
				t.Fatalf("service %d: kvgate_endpoint_inflight of the stopped decode engine %v, want 0", svc, n)
			}
		}
		if n := d.metric(t, "kvgate_pd_retries_total", map[string]string{"service": fmt.Sprint(pdBoth), "leg": "decode"}); n < 1 {
			t.Fatalf("kvgate_pd_retries_total{leg=decode} %v, want the re-routes counted", n)
		}
	})
}

// createRuleRoles creates a rule on gwAddr:port whose endpoints have the
// given ep_role values (1 prefill, 2 decode).
func createRuleRoles(t *testing.T, d *daemon, port int, endpoints []string, roles []int, args map[string]any) int {
	t.Helper()
	a := map[string]any{"externalIP": gwAddr, "port": port, "protocol": "tcp", "sel": 0, "mode": 4}
	for k, v := range args {
		a[k] = v
	}
	var eps []map[string]any
	for i, ep := range endpoints {
		h, p, _ := net.SplitHostPort(ep)
		n, _ := strconv.Atoi(p)
		eps = append(eps, map[string]any{"endpointIP": h, "targetPort": n, "weight": 1, "ep_role": roles[i]})
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
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, &out) != nil || out.Result != "Success" {
		t.Fatalf("create rule: %d %s", resp.StatusCode, raw)
	}
	return out.ServiceID
}

func recvHang(t *testing.T, ch <-chan hangAnswer, bound time.Duration) hangAnswer {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(max(bound, 0)):
		t.Fatalf("no answer within the probe bound")
	}
	return hangAnswer{}
}
