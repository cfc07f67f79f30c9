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
	var nilReleaser *memReleaser
	nilReleaser.request() // must not panic
	m := &memReleaser{}
	m.last.Store(time.Now().UnixNano()) // the next release waits for the interval
	m.request()
	if !m.pending.Load() {
		t.Fatal("no release pending after a request")
	}
	last := m.last.Load()
	m.request() // coalesced into the pending one
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
}
