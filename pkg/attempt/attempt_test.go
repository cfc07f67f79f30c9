package attempt

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/health"
)

// tracker is a real health tracker for endpoints 0..3 whose breaker opens
// after two connect failures or two origin errors.
func tracker(t *testing.T) *health.Tracker {
	t.Helper()
	tr, err := health.NewTracker(health.TrackerConfig{ServiceID: 1, Endpoints: []int{0, 1, 2, 3},
		Breaker: health.BreakerConfig{FailureThreshold: 2, OriginErrThreshold: 2, HalfOpenTrials: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// step is one thing a leg does in a try.
type step struct {
	ep   int
	what string // admit, connect_failed, died, origin_error, answered:<status>
}

func TestLoop(t *testing.T) {
	for _, tt := range []struct {
		name         string
		max          int
		steps        []step
		wantTries    int
		wantExcluded epset.Set
		wantFailed   []int
		wantOpen     epset.Set // breakers open afterwards
		wantAccount  []int     // connect failures accounted
	}{
		{name: "first try answers", max: 3, steps: []step{{0, "admit"}, {0, "answered:200"}},
			wantTries: 1},
		{name: "connect failures exclude and are accounted once each", max: 3,
			steps:     []step{{0, "admit"}, {0, "connect_failed"}, {1, "admit"}, {1, "connect_failed"}, {2, "admit"}, {2, "answered:200"}},
			wantTries: 3, wantExcluded: epset.Of(0, 1), wantFailed: []int{0, 1}, wantAccount: []int{0, 1}},
		{name: "died is excluded, fed to the breaker, not accounted as a refused connection", max: 3,
			steps:     []step{{0, "admit"}, {0, "died"}, {1, "admit"}, {1, "answered:200"}},
			wantTries: 2, wantExcluded: epset.Of(0)},
		{name: "bounded: no fourth try", max: 3,
			steps:     []step{{0, "admit"}, {0, "connect_failed"}, {1, "admit"}, {1, "connect_failed"}, {2, "admit"}, {2, "connect_failed"}, {3, "admit"}},
			wantTries: 3, wantExcluded: epset.Of(0, 1, 2), wantFailed: []int{0, 1, 2}, wantAccount: []int{0, 1, 2}},
		{name: "a 5xx answer feeds the breaker, excludes nothing", max: 3,
			steps:     []step{{0, "admit"}, {0, "answered:503"}},
			wantTries: 1},
		{name: "origin errors open the breaker", max: 3,
			steps:     []step{{0, "admit"}, {0, "origin_error"}, {0, "admit"}, {0, "origin_error"}},
			wantTries: 2, wantExcluded: epset.Of(0), wantOpen: epset.Of(0)},
		{name: "zero max still allows one try", max: 0, steps: []step{{0, "admit"}, {0, "answered:200"}},
			wantTries: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr := tracker(t)
			var accounted []int
			l := New(tt.max, tr, func(ep int) { accounted = append(accounted, ep) })
			for _, s := range tt.steps {
				switch s.what {
				case "admit":
					if !l.Next() {
						continue
					}
					if !l.Admit(s.ep) {
						t.Fatalf("ep %d refused by a closed breaker", s.ep)
					}
				case "connect_failed":
					l.ConnectFailed(s.ep)
				case "died":
					l.Died(s.ep)
				case "origin_error":
					l.OriginError(s.ep)
				case "answered:200":
					l.Answered(s.ep, 200)
				case "answered:503":
					l.Answered(s.ep, 503)
				}
			}
			if l.Tries() != tt.wantTries {
				t.Errorf("tries %d, want %d", l.Tries(), tt.wantTries)
			}
			if l.Excluded() != tt.wantExcluded {
				t.Errorf("excluded %v, want %v", l.Excluded(), tt.wantExcluded)
			}
			if !slices.Equal(l.ConnectFailures(), tt.wantFailed) {
				t.Errorf("connect failures %v, want %v", l.ConnectFailures(), tt.wantFailed)
			}
			if !slices.Equal(accounted, tt.wantAccount) {
				t.Errorf("accounted %v, want %v", accounted, tt.wantAccount)
			}
			if got := tr.States().BreakerOpen; got != tt.wantOpen {
				t.Errorf("open breakers %v, want %v", got, tt.wantOpen)
			}
		})
	}
}

// TestBreakerRefusalSpendsATry: an endpoint whose breaker refuses is
// excluded and its try counts against the bound, as a connect failure's
// does; the plain path used to re-route such refusals without counting them.
func TestBreakerRefusalSpendsATry(t *testing.T) {
	tr := tracker(t)
	for range 2 {
		tr.ConnectFailure(0) // threshold 2: open
	}
	l := New(2, tr, nil)
	if !l.Next() || l.Admit(0) {
		t.Fatal("an open breaker admitted ep 0")
	}
	if !l.Excluded().Has(0) || len(l.ConnectFailures()) != 0 {
		t.Fatalf("refusal: excluded %v, connect failures %v", l.Excluded(), l.ConnectFailures())
	}
	if !l.Next() || !l.Admit(1) {
		t.Fatal("second try on a healthy endpoint was not admitted")
	}
	if !l.Last() || l.Next() {
		t.Fatalf("bound 2: tries %d, Last %v, a third Next allowed", l.Tries(), l.Last())
	}
}

// TestNilBreaker: without a breaker every endpoint is admitted and feedback
// is a no-op.
func TestNilBreaker(t *testing.T) {
	l := New(1, nil, nil)
	if !l.Next() || !l.Admit(5) {
		t.Fatal("nil breaker refused")
	}
	l.Answered(5, 500)
	l.ConnectFailed(5)
	if !l.Excluded().Has(5) || l.Next() {
		t.Fatalf("excluded %v; bound 1 allowed a second try", l.Excluded())
	}
}

// TestLoopDown: an endpoint that went down before its first byte is
// excluded and allows one re-route per loop, only while a try is left; the
// breaker is not told.
func TestLoopDown(t *testing.T) {
	for _, tt := range []struct {
		name  string
		max   int
		downs []int // endpoints going down, one per try
		want  []bool
	}{
		{name: "one re-route", max: 3, downs: []int{0}, want: []bool{true}},
		{name: "only once per loop", max: 3, downs: []int{0, 1}, want: []bool{true, false}},
		{name: "not on the last try", max: 1, downs: []int{0}, want: []bool{false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr := tracker(t)
			l := New(tt.max, tr, nil)
			for i, ep := range tt.downs {
				if !l.Next() {
					t.Fatalf("try %d refused", i+1)
				}
				if got := l.Down(ep); got != tt.want[i] {
					t.Fatalf("Down(%d) on try %d = %v, want %v", ep, i+1, got, tt.want[i])
				}
				if !l.Excluded().Has(ep) {
					t.Fatalf("ep %d not excluded after Down", ep)
				}
				if tr.Breaker(ep) != health.BreakerClosed {
					t.Fatalf("ep %d: breaker %v after Down, want closed", ep, tr.Breaker(ep))
				}
			}
			if l.Rerouted() != slices.Contains(tt.want, true) {
				t.Fatalf("Rerouted %v", l.Rerouted())
			}
		})
	}
}
