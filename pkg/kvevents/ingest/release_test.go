package ingest

import (
	"testing"
	"time"
)

// TestByteBudgetDrainedPeak: a rank asks for a release only once its queue
// is empty again, with the most the burst queued.
func TestByteBudgetDrainedPeak(t *testing.T) {
	done := make(chan struct{})
	for _, tc := range []struct {
		name     string
		acquire  []int64
		release  []int64
		want     int64
		wantNext int64 // a second call right after
	}{
		{"nothing queued", nil, nil, 0, 0},
		{"burst drained", []int64{10, 20, 30}, []int64{10, 20, 30}, 60, 0},
		{"still queued", []int64{10, 20}, []int64{10}, 0, 0},
		{"peak, not the last size", []int64{40, 5}, []int64{40, 5}, 45, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newByteBudget(1 << 20)
			for _, n := range tc.acquire {
				if !b.acquire(n, done) {
					t.Fatal("acquire failed")
				}
			}
			for _, n := range tc.release {
				b.release(n)
			}
			if got := b.drainedPeak(); got != tc.want {
				t.Errorf("drainedPeak = %d, want %d", got, tc.want)
			}
			if got := b.drainedPeak(); got != tc.wantNext {
				t.Errorf("second drainedPeak = %d, want %d", got, tc.wantNext)
			}
		})
	}
}

// TestMemReleaserCoalesces: requests within the interval make one pending
// release; a nil releaser (ReleaseAfter < 0) ignores requests.
func TestMemReleaserCoalesces(t *testing.T) {
	var nilReleaser *MemReleaser
	nilReleaser.Request() // must not panic
	m := &MemReleaser{}
	m.last.Store(time.Now().UnixNano()) // the next release waits for the interval
	m.Request()
	if !m.pending.Load() {
		t.Fatal("no release pending after a request")
	}
	last := m.last.Load()
	m.Request() // coalesced into the pending one
	if m.last.Load() != last {
		t.Fatal("a coalesced request released at once")
	}
	o := Options{ReleaseAfter: -1}.withDefaults()
	if NewManager(o).opts.releaser != nil {
		t.Error("ReleaseAfter < 0 still releases")
	}
	if NewManager(Options{}).opts.releaser == nil {
		t.Error("the default does not release")
	}
	shared := NewMemReleaser(nil)
	if NewManager(Options{Releaser: shared}).opts.releaser != shared {
		t.Error("the daemon's shared releaser is not used")
	}
	if NewManager(Options{Releaser: shared, ReleaseAfter: -1}).opts.releaser != nil {
		t.Error("ReleaseAfter < 0 still releases through the shared releaser")
	}
}

type appliedRecorder struct {
	NopObserver
	calls [][3]int
}

func (a *appliedRecorder) Applied(_ EndpointRef, _ int, batches, stored, removed int) {
	a.calls = append(a.calls, [3]int{batches, stored, removed})
}

// TestFlushApplied: live batches reach the BatchObserver after each batch
// while the queue is empty, and in groups of appliedFlushBatches while a
// backlog is applied.
func TestFlushApplied(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queued []int // queue length after each applied batch
		want   [][3]int
	}{
		{"idle: every batch", []int{0, 0}, [][3]int{{1, 2, 1}, {1, 2, 1}}},
		{"backlog then empty", []int{5, 4, 0}, [][3]int{{3, 6, 3}}},
		{"long backlog", repeat(9, 65), [][3]int{{64, 128, 64}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &appliedRecorder{}
			r := &rankSub{ep: &endpointSub{obs: rec}}
			for _, q := range tc.queued {
				r.counts.batches++
				r.counts.stored += 2
				r.counts.removed++
				r.flushApplied(q)
			}
			if len(rec.calls) != len(tc.want) {
				t.Fatalf("calls %v, want %v", rec.calls, tc.want)
			}
			for i := range tc.want {
				if rec.calls[i] != tc.want[i] {
					t.Errorf("call %d = %v, want %v", i, rec.calls[i], tc.want[i])
				}
			}
		})
	}
}

func repeat(v, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}
