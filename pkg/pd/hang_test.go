package pd

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/selector"
)

// hungEngine answers nothing, like an engine under SIGSTOP, and records
// when a request arrived and when its connection went away (the proxy
// closed it: net/http cancels the request's context).
type hungEngine struct {
	got, gone chan time.Time
}

func newHungEngine() *hungEngine {
	return &hungEngine{got: make(chan time.Time, 4), gone: make(chan time.Time, 4)}
}

func (h *hungEngine) handle(_ http.ResponseWriter, r *http.Request, _ seen) {
	h.got <- time.Now()
	select {
	case <-r.Context().Done():
		h.gone <- time.Now()
	case <-time.After(20 * time.Second):
	}
}

func waitTime(t *testing.T, ch chan time.Time, what string, bound time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-ch:
		return at
	case <-time.After(bound):
		t.Fatalf("%s: not within %s", what, bound)
	}
	return time.Time{}
}

// probeDown makes the rig's tracker mark ep down the way the prober does
// (ProbeRetries failed probes); the rig forwards the transition to the
// proxy as the gateway does.
func (r *rig) probeDown(ep int) {
	for range 2 {
		r.tracker.ProbeResult(ep, false)
	}
}

func (r *rig) forwardProbeDowns() {
	r.tracker.Subscribe(func(tr health.Transition) {
		if tr.Event == health.EventProbeDown {
			r.srv.EndpointDown(tr.Ep)
		}
	})
}

// TestHungEndpointInPDFlow: a prefill or decode endpoint that goes down
// (its probe) while a request waits for its first byte: the request is
// re-routed once to another endpoint of the same role, or answered 503
// endpoint_down when there is none; the hung engine's connection is closed
// and every in-flight count returns to 0. Before the fix the request
// waited the whole prefill timeout.
func TestHungEndpointInPDFlow(t *testing.T) {
	type handler = func(http.ResponseWriter, *http.Request, seen)
	cases := []struct {
		name   string
		roles  []selector.Role
		hungEp int
		spare  int // the endpoint kept admin-down until the hung one has the request (-1: none)
		others map[int]handler
		status int
		code   string
		engine string
		retry  string // the observer's retry counter that must read 1
	}{
		{name: "prefill_rerouted", roles: prefillRoles(), hungEp: 0, spare: 2,
			others: map[int]handler{1: decodeOK("d1"), 2: prefillOK("p2", 0)}, status: 200, engine: "d1", retry: "retry:prefill"},
		{name: "prefill_single", roles: []selector.Role{selector.RolePrefill, selector.RoleDecode}, hungEp: 0, spare: -1,
			others: map[int]handler{1: decodeOK("d1")}, status: 503, code: "endpoint_down"},
		{name: "decode_rerouted", roles: []selector.Role{selector.RolePrefill, selector.RoleDecode, selector.RoleDecode}, hungEp: 1, spare: 2,
			others: map[int]handler{0: prefillOK("p0", 0), 2: decodeOK("d2")}, status: 200, engine: "d2", retry: "retry:decode"},
		{name: "decode_single", roles: []selector.Role{selector.RolePrefill, selector.RoleDecode}, hungEp: 1, spare: -1,
			others: map[int]handler{0: prefillOK("p0", 0)}, status: 503, code: "endpoint_down"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hung := newHungEngine()
			hs := make([]handler, len(tc.roles))
			for i := range hs {
				hs[i] = tc.others[i]
			}
			hs[tc.hungEp] = hung.handle
			r := newRig(t, hs, tc.roles, rigOptions{cfg: Config{PrefillTimeout: 15 * time.Second}})
			r.forwardProbeDowns()
			if tc.spare >= 0 {
				r.tracker.SetAdmin(tc.spare, true) // the first choice is the hung endpoint
			}
			done := make(chan answer, 1)
			go func() { done <- r.post(`{"model":"m","prompt":"x"}`) }()
			waitTime(t, hung.got, "the request reached the hung endpoint", 5*time.Second)
			if tc.spare >= 0 {
				r.tracker.SetAdmin(tc.spare, false)
			}
			downAt := time.Now()
			r.probeDown(tc.hungEp)
			var a answer
			select {
			case a = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("no answer within 5 s of the endpoint going down")
			}
			if a.err != nil || a.status != tc.status || a.errCode() != tc.code || a.header.Get("x-engine-id") != tc.engine {
				t.Fatalf("answer %d %q from %q (%v), want %d %q from %q", a.status, a.errCode(), a.header.Get("x-engine-id"), a.err,
					tc.status, tc.code, tc.engine)
			}
			gone := waitTime(t, hung.gone, "the hung engine's connection closed", 2*time.Second)
			t.Logf("answered; the hung engine saw its request cancelled %s after the endpoint went down", gone.Sub(downAt).Round(time.Microsecond))
			if tc.retry != "" && r.obs.get(tc.retry) != 1 {
				t.Fatalf("%s = %d, want 1", tc.retry, r.obs.get(tc.retry))
			}
			r.atRest()
		})
	}
}

// TestClientGoneBeforeDecodeHead: a client that leaves while the decode
// engine has not answered makes kvgate close the decode connection at once
// (outcome client_gone). Before the fix the decode wait ran to the prefill
// timeout.
func TestClientGoneBeforeDecodeHead(t *testing.T) {
	hung := newHungEngine()
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), hung.handle},
		[]selector.Role{selector.RolePrefill, selector.RoleDecode}, rigOptions{cfg: Config{PrefillTimeout: 15 * time.Second}})
	c, err := net.Dial("tcp", r.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","prompt":"x"}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitTime(t, hung.got, "the decode request reached the engine", 5*time.Second)
	left := time.Now()
	c.Close()
	gone := waitTime(t, hung.gone, "the decode connection closed", 2*time.Second)
	t.Logf("the decode engine saw its request cancelled %s after the client left", gone.Sub(left).Round(time.Microsecond))
	waitUntil(t, func() bool { return len(r.pobs.all()) == 1 })
	if out := r.pobs.all()[0].Outcome; out != fullproxy.OutcomeClientGone {
		t.Fatalf("outcome %v, want client_gone", out)
	}
	r.atRest()
}
