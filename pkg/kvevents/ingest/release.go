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
	releaseEvery        = 5 * time.Second
)

// memReleaser returns freed heap to the OS after a receive burst. A burst
// (a publisher that sends faster than kvgate applies, or a replay) queues
// up to QueueBytes per rank on the Go heap; once applied, that memory is
// garbage the runtime hands back only after later GC cycles, which an idle
// daemon may not run for minutes, so the process keeps the burst's RSS
// (at 10M hashes over 8 endpoints, twice the steady RSS; docs/ingest.md,
// "End to end"). One releaser serves a Manager: at most
// one debug.FreeOSMemory (a forced GC) per releaseEvery, and a request
// inside the interval runs at its end, so the last burst is released too.
type memReleaser struct {
	guard   *recovery.Guard
	pending atomic.Bool
	last    atomic.Int64 // UnixNano of the last release
}

func (m *memReleaser) request() {
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
