package health

import (
	"sync"
	"testing"
	"time"
)

type fakeTimer struct {
	c       chan time.Time
	at      time.Time
	stopped bool
	fired   bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }
func (t *fakeTimer) Stop() bool {
	was := !t.stopped && !t.fired
	t.stopped = true
	return was
}

type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{c: make(chan time.Time, 1), at: f.now.Add(d)}
	f.timers = append(f.timers, t)
	return t
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	for _, t := range f.timers {
		if !t.fired && !t.stopped && !t.at.After(f.now) {
			t.fired = true
			t.c <- f.now
		}
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type countObs struct {
	mu                   sync.Mutex
	flips                []BreakerState
	probeUps, probeDowns int
	scrapeF              int
}

func (o *countObs) BreakerFlip(_ uint32, _ int, to BreakerState) {
	o.mu.Lock()
	o.flips = append(o.flips, to)
	o.mu.Unlock()
}
func (o *countObs) ProbeTransition(_ uint32, _ int, up bool) {
	o.mu.Lock()
	if up {
		o.probeUps++
	} else {
		o.probeDowns++
	}
	o.mu.Unlock()
}
func (o *countObs) ScrapeFailed(uint32, int)                { o.mu.Lock(); o.scrapeF++; o.mu.Unlock() }
func (o *countObs) EngineFigures(uint32, int, int64, int64) {}

func (o *countObs) get(f func(*countObs) int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return f(o)
}

func newTestTracker(t *testing.T, pd bool, eps ...int) (*Tracker, *fakeClock, *countObs) {
	t.Helper()
	clk, obs := newFakeClock(), &countObs{}
	tr, err := NewTracker(TrackerConfig{ServiceID: 3, Endpoints: eps, Breaker: DefaultBreakerConfig(pd), Clock: clk, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return tr, clk, obs
}
