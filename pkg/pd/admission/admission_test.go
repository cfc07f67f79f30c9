package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/health"
)

func newTestAdmission(t *testing.T, cfg Config) (*Controller, *fakeClock, *countObs) {
	t.Helper()
	clk, obs := newFakeClock(), &countObs{}
	cfg.Clock, cfg.Observer = clk, obs
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, clk, obs
}

func TestAdmissionCap(t *testing.T) {
	a, _, obs := newTestAdmission(t, Config{MaxInflightPerEP: 2})
	for i := 0; i < 2; i++ {
		if err := a.AcquirePrefill(0); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.AcquirePrefill(0); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third admission: %v", err)
	}
	if !a.Saturated().Has(0) || a.InFlight(0) != 2 || obs.get(func(o *countObs) int { return o.shed }) != 1 {
		t.Fatalf("saturated %v inflight %d", a.Saturated(), a.InFlight(0))
	}
	if err := a.AcquirePrefill(1); err != nil {
		t.Fatal("other endpoint refused")
	}
	a.ReleasePrefill(0)
	if a.Saturated().Has(0) || a.InFlight(0) != 1 {
		t.Fatal("release did not free a slot")
	}
	// Decode tracking is uncapped and does not saturate.
	for i := 0; i < 5; i++ {
		a.Track(7)
	}
	if a.InFlight(7) != 5 || a.Saturated().Has(7) {
		t.Fatal("track")
	}
	for i := 0; i < 6; i++ {
		a.Untrack(7)
	}
	if a.InFlight(7) != 0 {
		t.Fatal("untrack went negative")
	}
	a.ReleasePrefill(5) // unbalanced: ignored
	if a.InFlight(5) != 0 {
		t.Fatal("unbalanced release")
	}
}

func TestAdmissionTotalCap(t *testing.T) {
	a, _, _ := newTestAdmission(t, Config{MaxTotalInflight: 3})
	for ep := 0; ep < 3; ep++ {
		if err := a.AcquirePrefill(ep); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.AcquirePrefill(9); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("total cap: %v", err)
	}
	a.ReleasePrefill(1)
	if err := a.AcquirePrefill(9); err != nil {
		t.Fatal(err)
	}
}

func TestAdmissionPark(t *testing.T) {
	ctx := context.Background()
	t.Run("queueing off sheds", func(t *testing.T) {
		a, _, obs := newTestAdmission(t, Config{MaxInflightPerEP: 1})
		_ = a.AcquirePrefill(0)
		if _, err := a.Park(ctx, epset.Of(0)); !errors.Is(err, ErrOverloaded) || obs.get(func(o *countObs) int { return o.shed }) != 1 {
			t.Fatalf("park without queue: %v", err)
		}
	})
	t.Run("free candidate admits at once", func(t *testing.T) {
		a, _, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 2})
		_ = a.AcquirePrefill(0)
		if ep, err := a.Park(ctx, epset.Of(0, 1)); err != nil || ep != 1 {
			t.Fatalf("ep %d err %v", ep, err)
		}
	})
	t.Run("grant in FIFO order, slot handed over", func(t *testing.T) {
		a, clk, obs := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 2})
		_ = a.AcquirePrefill(0)
		type res struct {
			ep  int
			err error
		}
		first, second := make(chan res, 1), make(chan res, 1)
		go func() { ep, err := a.Park(ctx, epset.Of(0)); first <- res{ep, err} }()
		waitFor(t, "first parked", func() bool { return a.Parked(0) == 1 && clk.pending() == 1 })
		go func() { ep, err := a.Park(ctx, epset.Of(0)); second <- res{ep, err} }()
		waitFor(t, "second parked", func() bool { return a.Parked(0) == 2 && clk.pending() == 2 })
		if _, err := a.Park(ctx, epset.Of(0)); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("full queue: %v", err)
		}
		a.ReleasePrefill(0)
		if r := <-first; r.err != nil || r.ep != 0 {
			t.Fatalf("first: %+v", r)
		}
		if a.InFlight(0) != 1 {
			t.Fatalf("in-flight %d after hand-over", a.InFlight(0))
		}
		select {
		case r := <-second:
			t.Fatalf("second granted early: %+v", r)
		default:
		}
		a.ReleasePrefill(0)
		if r := <-second; r.err != nil || r.ep != 0 {
			t.Fatalf("second: %+v", r)
		}
		a.ReleasePrefill(0)
		if a.InFlight(0) != 0 || obs.get(func(o *countObs) int { return o.queued }) != 2 {
			t.Fatal("counts")
		}
	})
	t.Run("park timeout", func(t *testing.T) {
		a, clk, obs := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 4, MaxPark: 10 * time.Second})
		_ = a.AcquirePrefill(0)
		done := make(chan error, 1)
		go func() { _, err := a.Park(ctx, epset.Of(0)); done <- err }()
		waitFor(t, "parked", func() bool { return clk.pending() == 1 })
		clk.Advance(9 * time.Second)
		select {
		case err := <-done:
			t.Fatalf("returned before the park timeout: %v", err)
		default:
		}
		clk.Advance(time.Second)
		if err := <-done; !errors.Is(err, ErrParkTimeout) {
			t.Fatalf("err %v", err)
		}
		if a.Parked(0) != 0 || obs.get(func(o *countObs) int { return o.parkTO }) != 1 || a.InFlight(0) != 1 {
			t.Fatal("timeout bookkeeping")
		}
	})
	t.Run("park timeout defaults to prefill timeout", func(t *testing.T) {
		a, clk, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 1, PrefillTimeout: 40 * time.Second})
		_ = a.AcquirePrefill(0)
		done := make(chan error, 1)
		go func() { _, err := a.Park(ctx, epset.Of(0)); done <- err }()
		waitFor(t, "parked", func() bool { return clk.pending() == 1 })
		clk.Advance(39 * time.Second)
		select {
		case err := <-done:
			t.Fatalf("early: %v", err)
		default:
		}
		clk.Advance(time.Second)
		if err := <-done; !errors.Is(err, ErrParkTimeout) {
			t.Fatal(err)
		}
	})
	t.Run("drain and cancel", func(t *testing.T) {
		a, clk, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 4})
		_ = a.AcquirePrefill(0)
		done := make(chan error, 2)
		go func() { _, err := a.Park(ctx, epset.Of(0)); done <- err }()
		waitFor(t, "parked", func() bool { return clk.pending() == 1 })
		a.Drain(0)
		if err := <-done; !errors.Is(err, ErrDrained) {
			t.Fatalf("drain: %v", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		go func() { _, err := a.Park(cctx, epset.Of(0)); done <- err }()
		waitFor(t, "parked", func() bool { return a.Parked(0) == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel: %v", err)
		}
		if a.Parked(0) != 0 || a.InFlight(0) != 1 {
			t.Fatal("bookkeeping after cancel")
		}
	})
	t.Run("shortest queue", func(t *testing.T) {
		a, _, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 4})
		_ = a.AcquirePrefill(0)
		_ = a.AcquirePrefill(1)
		go func() { _, _ = a.Park(ctx, epset.Of(0, 1)) }()
		waitFor(t, "parked", func() bool { return a.Parked(0) == 1 })
		go func() { _, _ = a.Park(ctx, epset.Of(0, 1)) }()
		waitFor(t, "parked on 1", func() bool { return a.Parked(1) == 1 })
		a.Drain(0)
		a.Drain(1)
	})
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{MaxInflightPerEP: -1}, {MaxInflightPerEP: 100000}, {QueueDepthPerEP: MaxQueueDepthPerEP + 1},
		{MaxPark: -time.Second}, {MaxTotalInflight: -1},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestTrackerSaturated: States reports the admission controller's saturated set.
func TestTrackerSaturated(t *testing.T) {
	tr, err := health.NewTracker(health.TrackerConfig{ServiceID: 3, Endpoints: []int{0, 1}, Breaker: health.DefaultBreakerConfig(true), Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1})
	tr.AttachAdmission(a)
	_ = a.AcquirePrefill(1)
	if st := tr.States(); !st.Saturated.Has(1) || st.Saturated.Has(0) {
		t.Fatalf("%+v", st)
	}
}

// TestTotalGateShared: LLB_PD_MAX_TOTAL_INFLIGHT spans rules.
func TestTotalGateShared(t *testing.T) {
	g, err := NewTotalGate(2)
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := New(Config{ServiceID: 1, Total: g})
	a2, _ := New(Config{ServiceID: 2, Total: g})
	if a1.AcquirePrefill(0) != nil || a2.AcquirePrefill(0) != nil {
		t.Fatal("under the gate")
	}
	if err := a2.AcquirePrefill(1); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("over the shared gate: %v", err)
	}
	a1.ReleasePrefill(0)
	if a2.AcquirePrefill(1) != nil || g.InFlight() != 2 {
		t.Fatal("release did not free the gate")
	}
	if _, err := NewTotalGate(-1); err == nil {
		t.Fatal("negative gate")
	}
}

// TestTrackerDrainsAttached: a health.Tracker holds the controller only as a
// health.Shaper; when an endpoint drops (here admin-down) the requests parked
// on it wake with ErrDrained, and a detached controller is left alone.
func TestTrackerDrainsAttached(t *testing.T) {
	for _, tc := range []struct {
		name     string
		detach   bool
		wantWake bool
	}{
		{"attached: drained", false, true},
		{"detached: still parked", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := health.NewTracker(health.TrackerConfig{ServiceID: 3, Endpoints: []int{0, 1}, Breaker: health.DefaultBreakerConfig(true), Clock: newFakeClock()})
			if err != nil {
				t.Fatal(err)
			}
			a, clk, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1, QueueDepthPerEP: 4})
			tr.AttachAdmission(a)
			if tc.detach {
				tr.AttachAdmission(nil)
			}
			_ = a.AcquirePrefill(0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { _, err := a.Park(ctx, epset.Of(0)); done <- err }()
			waitFor(t, "parked", func() bool { return a.Parked(0) == 1 && clk.pending() == 1 })
			tr.SetAdmin(0, true)
			if tc.wantWake {
				if err := <-done; !errors.Is(err, ErrDrained) {
					t.Fatalf("parked request: %v, want ErrDrained", err)
				}
				return
			}
			if a.Parked(0) != 1 {
				t.Fatal("a detached controller was drained")
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("after cancel: %v", err)
			}
		})
	}
}

// TestLegCounts: OnEngine follows LegStarted/LegEnded apart from the
// admission count and the cap, never goes negative and ignores
// out-of-range endpoints.
func TestLegCounts(t *testing.T) {
	for _, c := range []struct {
		name              string
		ep                int
		started, ended    int
		wantOn, wantLegsN int
	}{
		{"two legs, one ended", 3, 2, 1, 1, 1},
		{"unbalanced end", 3, 1, 3, 0, 0},
		{"negative ep", -1, 2, 0, 0, 0},
		{"ep beyond the set", epset.Max, 2, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, _, _ := newTestAdmission(t, Config{MaxInflightPerEP: 1})
			for range c.started {
				a.LegStarted(c.ep)
			}
			for range c.ended {
				a.LegEnded(c.ep)
			}
			if got := a.OnEngine(c.ep); got != c.wantOn {
				t.Fatalf("OnEngine = %d, want %d", got, c.wantOn)
			}
			if got := a.Legs().InFlight(c.ep); got != c.wantLegsN {
				t.Fatalf("Legs().InFlight = %d, want %d", got, c.wantLegsN)
			}
			if a.InFlight(c.ep) != 0 || !a.Saturated().Empty() {
				t.Fatal("legs moved the admission count or the cap")
			}
		})
	}
}
