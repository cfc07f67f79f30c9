package ingest

import (
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
)

// Defaults of Options.ReleaseAfter and of the interval between releases.
const (
	DefaultReleaseAfter = 8 << 20
	releaseEvery        = time.Second
)

// MemReleaser returns freed heap to the OS after a burst of garbage. A
// receive burst (a publisher that sends faster than kvgate applies, or a
// replay) queues up to QueueBytes per rank on the Go heap, and parsing a
// tokenizer.json leaves about twice the loaded tokenizer as garbage; the
// runtime hands such memory back only after later GC cycles, which an idle
// daemon may not run for minutes, so the process keeps the burst's RSS (at
// 10M hashes over 8 endpoints, twice the steady RSS; docs/ingest.md, "End
// to end"). One releaser serves a daemon: at most one debug.FreeOSMemory (a
// forced GC) per releaseEvery, and a request inside the interval runs at its
// end, so the last burst is released too. The ranks of a fill drain one
// after another (they share the rule's index), and the first release sees
// only the first rank's garbage: a short interval returns the rest within a
// second of the last drain, for one GC of the steady heap (≈ 40 MB live,
// tens of ms of CPU) at most once a second while bursts keep ending.
type MemReleaser struct {
	guard   *recovery.Guard
	pending atomic.Bool
	last    atomic.Int64 // UnixNano of the last release
}

// NewMemReleaser returns a releaser whose releases run under guard (nil
// still recovers).
func NewMemReleaser(guard *recovery.Guard) *MemReleaser { return &MemReleaser{guard: guard} }

// Request schedules a release: now, or at the end of the current interval.
// A nil releaser ignores it.
func (m *MemReleaser) Request() {
	if m == nil || !m.pending.CompareAndSwap(false, true) {
		return // one is scheduled already; it will see this burst's garbage
	}
	wait := time.Duration(m.last.Load() + int64(releaseEvery) - time.Now().UnixNano())
	m.guard.Go(recovery.Subscriber, func() {
		defer m.pending.Store(false)
		if wait > 0 {
			time.Sleep(wait)
		}
		m.last.Store(time.Now().UnixNano())
		debug.FreeOSMemory()
	})
}
