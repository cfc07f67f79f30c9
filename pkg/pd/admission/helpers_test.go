package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/health"
)

// fakeClock is a health.Clock whose timers fire only when Advance passes
// their deadline, so park timeouts are tested without sleeping.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

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

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) NewTimer(d time.Duration) health.Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{c: make(chan time.Time, 1), at: f.now.Add(d)}
	f.timers = append(f.timers, t)
	return t
}

func (f *fakeClock) pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, t := range f.timers {
		if !t.fired && !t.stopped {
			n++
		}
	}
	return n
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
	shed, queued, parkTO int
}

func (o *countObs) AdmissionShed(uint32)        { o.mu.Lock(); o.shed++; o.mu.Unlock() }
func (o *countObs) AdmissionQueued(uint32)      { o.mu.Lock(); o.queued++; o.mu.Unlock() }
func (o *countObs) AdmissionParkTimeout(uint32) { o.mu.Lock(); o.parkTO++; o.mu.Unlock() }

func (o *countObs) get(f func(*countObs) int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return f(o)
}
