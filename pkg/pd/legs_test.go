package pd

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/pkg/pd/admission"
	"github.com/kvgate/kvgate/pkg/selector"
)

// gated holds a request until release closes (or the request ends),
// telling entered first, then answers with then.
func gated(entered chan<- struct{}, release <-chan struct{}, then func(http.ResponseWriter, *http.Request, seen)) func(http.ResponseWriter, *http.Request, seen) {
	return func(w http.ResponseWriter, r *http.Request, s seen) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		then(w, r, s)
	}
}

func failing(w http.ResponseWriter, _ *http.Request, _ seen) {
	http.Error(w, "engine broken", http.StatusServiceUnavailable)
}

// TestLegCounts: the admission controller counts, per endpoint, the
// requests its engine is running (OnEngine, what the shared load view
// subtracts at each scrape: docs/replicas.md, "Shared load view"), apart
// from its in-flight count (InFlight, what the caps and the local view
// read). A prefill endpoint's leg ends at its response head while its unit
// stays held through the decode; a decode endpoint's leg runs from its
// request to the end of its stream.
func TestLegCounts(t *testing.T) {
	type counts struct{ inflight, onEngine [3]int }
	cases := []struct {
		name string
		// prefill is the handler of both prefill endpoints (0 and 2);
		// gatePrefill holds it until the first checkpoint passes.
		prefill     func(http.ResponseWriter, *http.Request, seen)
		gatePrefill bool
		// duringPrefill and duringDecode: the counts while each leg is held
		// (duringPrefill is skipped without gatePrefill).
		duringPrefill, duringDecode counts
	}{
		{
			name: "two legs", prefill: prefillOK("p", 0), gatePrefill: true,
			duringPrefill: counts{inflight: [3]int{1, 1, 0}, onEngine: [3]int{1, 0, 0}},
			duringDecode:  counts{inflight: [3]int{1, 1, 0}, onEngine: [3]int{0, 1, 0}},
		},
		{
			name: "decode-only fallback", prefill: failing,
			duringDecode: counts{inflight: [3]int{0, 1, 0}, onEngine: [3]int{0, 1, 0}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prefillIn, prefillGo := make(chan struct{}, 4), make(chan struct{})
			decodeIn, decodeGo := make(chan struct{}, 4), make(chan struct{})
			p := c.prefill
			if c.gatePrefill {
				p = gated(prefillIn, prefillGo, c.prefill)
			} else {
				close(prefillGo)
			}
			d := gated(decodeIn, decodeGo, decodeOK("d1"))
			r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){p, d, p}, prefillRoles(),
				rigOptions{cfg: Config{DecodeOnlyFallback: true}})
			done := make(chan answer, 1)
			go func() { done <- r.post(`{"model":"m","prompt":"x"}`) }()
			if c.gatePrefill {
				<-prefillIn
				r.expectCounts(t, "during the prefill", c.duringPrefill.inflight, c.duringPrefill.onEngine)
				close(prefillGo)
			}
			<-decodeIn
			r.expectCounts(t, "during the decode", c.duringDecode.inflight, c.duringDecode.onEngine)
			close(decodeGo)
			if a := <-done; a.status != 200 {
				t.Fatalf("answer %d %s", a.status, a.body)
			}
			r.atRest()
		})
	}
}

// expectCounts checks InFlight and OnEngine of endpoints 0–2. Prefill
// endpoints 0 and 2 are symmetric (either may be picked): their counts are
// compared as a sorted pair.
func (r *rig) expectCounts(t *testing.T, when string, inflight, onEngine [3]int) {
	t.Helper()
	got := func(f func(int) int) string {
		a, b := f(0), f(2)
		return fmt.Sprintf("prefill %d+%d decode %d", max(a, b), min(a, b), f(1))
	}
	want := func(v [3]int) string {
		return fmt.Sprintf("prefill %d+%d decode %d", max(v[0], v[2]), min(v[0], v[2]), v[1])
	}
	if g, w := got(r.adm.InFlight), want(inflight); g != w {
		t.Fatalf("%s: InFlight %s, want %s", when, g, w)
	}
	if g, w := got(r.adm.OnEngine), want(onEngine); g != w {
		t.Fatalf("%s: OnEngine %s, want %s", when, g, w)
	}
}

// othersOn adds the other replicas' requests to the admission count, as
// the shared load view does.
type othersOn struct {
	a      *admission.Controller
	others map[int]int
}

func (o othersOn) InFlight(ep int) int { return o.a.InFlight(ep) + o.others[ep] }

// TestDecodeRechoiceReadsLoads: a decode endpoint re-chosen during the
// request is the least loaded by Config.Loads (the shared view, with the
// other replicas' decodes), not by this replica's admission count alone,
// on which the two candidates tie.
func TestDecodeRechoiceReadsLoads(t *testing.T) {
	for _, c := range []struct {
		name   string
		others map[int]int
		want   string
	}{
		{"others decode on ep 2", map[int]int{2: 5}, "d3"},
		{"others decode on ep 3", map[int]int{3: 5}, "d2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rg *rig
			prefill := func(w http.ResponseWriter, req *http.Request, s seen) {
				// The decode chosen at admission goes admin-down while the
				// prefill runs: the flow re-chooses.
				rg.tracker.SetAdmin(1, true)
				prefillOK("p0", 0)(w, req, s)
			}
			rg = newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefill, decodeOK("d1"), decodeOK("d2"), decodeOK("d3")},
				[]selector.Role{selector.RolePrefill, selector.RoleDecode, selector.RoleDecode, selector.RoleDecode},
				rigOptions{flowLoads: func(a *admission.Controller) selector.LoadSource { return othersOn{a, c.others} }})
			for i := range 4 {
				rg.tracker.SetAdmin(1, false)
				// Make ep 1 the selector's choice: 2 and 3 carry one unit each.
				rg.adm.Track(2)
				rg.adm.Track(3)
				a := rg.post(`{"model":"m","prompt":"x"}`)
				rg.adm.Untrack(2)
				rg.adm.Untrack(3)
				if a.status != 200 || a.header.Get("x-engine-id") != c.want {
					t.Fatalf("request %d: answer %d engine %q, want %s", i, a.status, a.header.Get("x-engine-id"), c.want)
				}
			}
			if len(rg.eps[1].seen()) != 0 {
				t.Fatal("the admin-down decode endpoint was used")
			}
			rg.atRest()
		})
	}
}
