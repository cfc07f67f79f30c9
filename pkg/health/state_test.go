package health

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

func TestProbeStateMachine(t *testing.T) {
	tests := []struct {
		retries int
		results string // F fail, S success
		down    bool
		changes int
	}{
		{2, "", false, 0},
		{2, "F", false, 0},
		{2, "FF", true, 1},
		{2, "FFF", true, 1},
		{2, "FFS", false, 2},
		{2, "FSF", false, 0},
		{2, "FFSFF", true, 3},
		{1, "F", true, 1},
		{3, "FFSFF", false, 0},
		{3, "FFF", true, 1},
	}
	for _, tc := range tests {
		var p probeState
		changes := 0
		for _, r := range tc.results {
			if p.record(r == 'S', tc.retries) {
				changes++
			}
		}
		if p.down != tc.down || changes != tc.changes {
			t.Errorf("retries %d %q: down %v changes %d, want %v %d", tc.retries, tc.results, p.down, changes, tc.down, tc.changes)
		}
	}
}

func TestBreakerStateMachine(t *testing.T) {
	tr, clk, obs := newTestTracker(t, false, 0, 1)
	var events []Event
	tr.Subscribe(func(x Transition) { events = append(events, x.Event) })
	open := func() bool { return tr.States().BreakerOpen.Has(0) }

	for i := 0; i < 4; i++ {
		tr.ConnectFailure(0)
	}
	if open() || tr.Breaker(0) != BreakerClosed {
		t.Fatal("opened before 5 failures")
	}
	tr.ConnectFailure(0)
	if !open() || tr.Breaker(0) != BreakerOpen || tr.Allow(0) {
		t.Fatal("not open after 5 failures")
	}
	clk.Advance(29 * time.Second)
	if !open() {
		t.Fatal("half-open before 30 s")
	}
	clk.Advance(time.Second)
	if open() || tr.Breaker(0) != BreakerHalfOpen {
		t.Fatal("not half-open at 30 s")
	}
	for i := 0; i < 3; i++ {
		if !tr.Allow(0) {
			t.Fatalf("half-open refused trial %d", i+1)
		}
	}
	if tr.Allow(0) || !open() {
		t.Fatal("half-open admitted a fourth trial / not excluded once trials are used")
	}
	clk.Advance(30 * time.Second) // trials never reported: a fresh window, no new flip
	if open() || !tr.Allow(0) {
		t.Fatal("lost half-open trials excluded the endpoint for ever")
	}
	tr.ConnectFailure(0) // a failed trial reopens
	if tr.Breaker(0) != BreakerOpen {
		t.Fatal("failure in half-open did not reopen")
	}
	clk.Advance(30 * time.Second)
	if !tr.Allow(0) {
		t.Fatal("no trial after reopening")
	}
	tr.Success(0)
	if tr.Breaker(0) != BreakerClosed || open() {
		t.Fatal("success in half-open did not close")
	}
	want := []Event{EventBreakerOpen, EventBreakerHalfOpen, EventBreakerOpen, EventBreakerHalfOpen, EventBreakerClosed}
	if len(events) != len(want) {
		t.Fatalf("events %v, want %v", events, want)
	}
	for i := range want {
		if events[i] != want[i] {
			t.Fatalf("events %v, want %v", events, want)
		}
	}
	if n := obs.get(func(o *countObs) int { return len(o.flips) }); n != 5 {
		t.Fatalf("%d flips counted", n)
	}
	// A success resets the consecutive count.
	for i := 0; i < 4; i++ {
		tr.ConnectFailure(1)
	}
	tr.Success(1)
	for i := 0; i < 4; i++ {
		tr.ConnectFailure(1)
	}
	if tr.Breaker(1) != BreakerClosed {
		t.Fatal("non-consecutive failures opened the breaker")
	}
}

func TestBreakerThresholds(t *testing.T) {
	tests := []struct {
		name   string
		pd     bool
		origin int    // -1: default
		events string // C connect failure, 5 origin 5xx, S success
		open   bool
		off    bool // the rule has no breaker (cb_enable false)
	}{
		{"P/D opens at 3", true, -1, "CCC", true, false},
		{"P/D closed at 2", true, -1, "CC", false, false},
		{"plain closed at 4", false, -1, "CCCC", false, false},
		{"three 5xx open", false, -1, "555", true, false},
		{"5xx broken by success", false, -1, "55S5", false, false},
		{"5xx and connect counted apart", true, -1, "5C5C", false, false},
		{"origin threshold 0 disables", false, 0, "5555555", false, false},
		{"origin threshold 1", false, 1, "5", true, false},
		{"off: connect failures not counted", false, -1, "CCCCCCCCCC", false, true},
		{"off: 5xx not counted", false, 1, "5555", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig(tc.pd)
			if tc.origin >= 0 {
				cfg.OriginErrThreshold = tc.origin
			}
			cfg.Off = tc.off
			tr, err := NewTracker(TrackerConfig{Endpoints: []int{4}, Breaker: cfg, Clock: newFakeClock()})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tc.events {
				switch e {
				case 'C':
					tr.ConnectFailure(4)
				case '5':
					tr.OriginError(4)
				case 'S':
					tr.Success(4)
				}
			}
			if got := tr.Breaker(4) == BreakerOpen; got != tc.open {
				t.Fatalf("open = %v, want %v", got, tc.open)
			}
			if tc.off && !tr.Allow(4) {
				t.Fatal("a rule without a breaker refused a request")
			}
		})
	}
}

func TestAdminAndProbeStates(t *testing.T) {
	tr, _, obs := newTestTracker(t, true, 0, 1, 2)
	var got []Transition
	tr.Subscribe(func(x Transition) { got = append(got, x) })
	tr.SetAdmin(1, true)
	tr.SetAdmin(1, true) // no change, no event
	tr.ProbeResult(2, false)
	tr.ProbeResult(2, false)
	st := tr.States()
	if !st.AdminDown.Has(1) || !st.ProbeDown.Has(2) || st.ProbeDown.Has(0) {
		t.Fatalf("states %+v", st)
	}
	tr.ProbeResult(2, true)
	tr.SetAdmin(1, false)
	if st := tr.States(); !st.Unavailable().Empty() {
		t.Fatalf("states %+v", st)
	}
	want := []Event{EventAdminDown, EventProbeDown, EventProbeUp, EventAdminUp}
	if len(got) != len(want) {
		t.Fatalf("transitions %+v", got)
	}
	for i, e := range want {
		if got[i].Event != e || got[i].ServiceID != 3 {
			t.Fatalf("transitions %+v", got)
		}
	}
	if !got[0].Drops() || !got[1].Drops() || got[2].Drops() {
		t.Fatal("Drops")
	}
	if obs.get(func(o *countObs) int { return o.probeDowns }) != 1 {
		t.Fatal("probe down not observed")
	}
	// Unknown endpoints are ignored, not a panic.
	tr.ProbeResult(200, false)
	tr.SetAdmin(-1, true)
	tr.ConnectFailure(epset.Max + 5)
	if _, err := NewTracker(TrackerConfig{Endpoints: []int{epset.Max}}); err == nil {
		t.Fatal("out-of-range endpoint accepted")
	}
}

func TestEngineFigures(t *testing.T) {
	tr, clk, _ := newTestTracker(t, true, 0)
	if _, ok := tr.GPUBlocks(0); ok {
		t.Fatal("known before a scrape")
	}
	if _, _, ok := tr.Waiting(0); ok {
		t.Fatal("known before a scrape")
	}
	tr.SetEngineFigures(0, 1000, 4, clk.Now())
	b, ok := tr.GPUBlocks(0)
	w, at, ok2 := tr.Waiting(0)
	if !ok || b != 1000 || !ok2 || w != 4 || !at.Equal(clk.Now()) {
		t.Fatalf("figures %d %v %d %v %v", b, ok, w, at, ok2)
	}
	tr.SetEngineFigures(0, -1, -1, clk.Now())
	if _, ok := tr.GPUBlocks(0); ok {
		t.Fatal("missing family kept the old value")
	}
}

// TestEngineLoad: running + waiting is the engine load; the hook runs before
// the value is stored; a missing running family makes it unknown.
func TestEngineLoad(t *testing.T) {
	var hooked []int
	tr, err := NewTracker(TrackerConfig{ServiceID: 1, Endpoints: []int{0, 3}, OnEngineLoad: func(ep int) { hooked = append(hooked, ep) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := tr.EngineLoad(3); ok {
		t.Fatal("known before a scrape")
	}
	at := time.Unix(100, 0)
	for _, c := range []struct {
		running, waiting int64
		want             int
		known            bool
	}{
		{4, 2, 6, true},
		{4, -1, 4, true},
		{-1, 2, 0, false},
		{0, 0, 0, true},
	} {
		tr.SetEngineLoad(3, c.running, c.waiting, at)
		l, got, ok := tr.EngineLoad(3)
		if ok != c.known || l != c.want || ok && !got.Equal(at) {
			t.Errorf("running %d waiting %d: load %d %v %v, want %d %v", c.running, c.waiting, l, got, ok, c.want, c.known)
		}
	}
	if len(hooked) != 4 || hooked[0] != 3 {
		t.Fatalf("hook calls %v", hooked)
	}
	tr.SetEngineLoad(-1, 1, 1, at)
	tr.SetEngineLoad(1<<20, 1, 1, at)
}
