package inventory

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/pkg/epset"
)

// threadCPU is the calling thread's CPU time. The machine is shared and
// oversubscribed, so wall-clock latency mostly measures the scheduler;
// thread CPU time measures the code (lock waits are reported in wall time).
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// Benchmarks for the three targets of the inventory design (see
// docs/ingest.md). Reproduce with:
//
//	go test -run '^$' -bench . -benchtime 1x ./pkg/inventory           (memory)
//	go test -run '^$' -bench 'Score|Add' ./pkg/inventory               (speed)

// processCPU is the process's user and system CPU time so far.
func processCPU() (user, sys time.Duration) {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if f := bytes.Fields(line); len(f) >= 2 && string(f[0]) == "VmRSS:" {
			kb, _ := strconv.ParseUint(string(f[1]), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMemory10M stores 10M distinct hashes spread over 8 endpoints
// (1.25M each, nothing shared: the worst case for a global table) and
// reports live heap and RSS per hash; the map variant is the naive design
// (one map[uint64]struct{} per endpoint) for comparison.
func BenchmarkMemory10M(b *testing.B) {
	const total, eps = 10_000_000, 8
	for _, design := range []string{"index", "map-per-endpoint"} {
		b.Run(design, func(b *testing.B) {
			for b.Loop() {
				debug.FreeOSMemory()
				before := liveHeap()
				r := rand.New(rand.NewPCG(1, 2))
				batch := make([]uint64, 1024)
				var keep any
				switch design {
				case "index":
					ix, err := New(Options{MaxBlocks: 2_000_000})
					if err != nil {
						b.Fatal(err)
					}
					user0, sys0 := processCPU()
					for n := 0; n < total; n += len(batch) {
						for i := range batch {
							batch[i] = r.Uint64()
						}
						if err := ix.Add((n/len(batch))%eps, 0, "", batch); err != nil {
							b.Fatal(err)
						}
					}
					// Process CPU, not the thread's: the kernel's page faults
					// and zeroing for the table's fresh memory are the fill's
					// largest system cost (docs/ingest.md "Growth").
					user1, sys1 := processCPU()
					b.ReportMetric(float64((user1-user0).Nanoseconds())/total, "userns/hash")
					b.ReportMetric(float64((sys1-sys0).Nanoseconds())/total, "sysns/hash")
					st := ix.Stats()
					b.ReportMetric(float64(st.Used)/float64(st.Slots), "load")
					keep = ix
				default:
					ms := make([]map[uint64]struct{}, eps)
					for i := range ms {
						ms[i] = map[uint64]struct{}{}
					}
					for n := 0; n < total; n += len(batch) {
						m := ms[(n/len(batch))%eps]
						for range batch {
							m[r.Uint64()] = struct{}{}
						}
					}
					keep = ms
				}
				after := liveHeap()
				b.ReportMetric(float64(after-before)/total, "heapB/hash")
				if ix, ok := keep.(*Index); ok {
					// The table's big segments live in huge-page slabs outside the Go heap.
					arena := ix.Stats().ArenaBytes
					b.ReportMetric(float64(arena)/total, "slabB/hash")
					b.ReportMetric(float64(after-before+uint64(arena))/total, "liveB/hash")
				}
				b.ReportMetric(float64(rssBytes())/total, "rssB/hash")
				runtime.KeepAlive(keep)
			}
		})
	}
}

// fleet builds an index of nEps endpoints; endpoint e holds the first
// depth(e) blocks of a shared 2,048-block prompt plus private blocks.
func fleet(b testing.TB, nEps, private int) (*Index, []uint64) {
	ix, err := New(Options{MaxBlocks: MaxMaxBlocks})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	prompt := make([]uint64, 2048)
	for i := range prompt {
		prompt[i] = r.Uint64()
	}
	priv := make([]uint64, private)
	for e := range nEps {
		depth := (e * 2048) / nEps // endpoints hold ever longer prefixes
		if err := ix.Add(e, 0, "", prompt[:depth]); err != nil {
			b.Fatal(err)
		}
		for i := range priv {
			priv[i] = r.Uint64()
		}
		if err := ix.Add(e, 0, "", priv); err != nil {
			b.Fatal(err)
		}
	}
	return ix, prompt
}

// churn adds and removes private blocks on every endpoint until stop is
// closed, as a fleet's event streams do, and counts the hashes applied.
func churn(ix *Index, nEps int, stop chan struct{}, applied *atomic.Int64) {
	r := rand.New(rand.NewPCG(5, 6))
	batch := make([]uint64, 512)
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		e := i % nEps
		seed := r.Uint64()
		for j := range batch {
			batch[j] = seed + uint64(j)*0x9e3779b97f4a7c15
		}
		_ = ix.Add(e, 0, "", batch)
		_ = ix.Remove(e, 0, "", batch)
		applied.Add(2 * int64(len(batch)))
	}
}

// BenchmarkScore scores a 2,048-block prompt over 64 endpoints (each with
// 100k private blocks besides its share of the prompt) and reports p50/p99
// latency per Score call: idle and with ingest running concurrently, and
// with the prompt's table lines hot (the same prompt scored back to back, as
// a repeated system prompt is) or cold (8 MiB streamed through the cache
// before each call, outside the timing, as for a prompt not seen lately).
//
// The scoring goroutine is deliberately NOT locked to its OS thread: with
// runtime.LockOSThread every read-lock wait parks the thread and needs a
// thread handoff to wake (two OS context switches), which added ≈60 µs to
// each wait and doubled the CPU time per call under ingest — a cost the
// daemon's request goroutines never pay. Wall time is therefore the primary
// figure; thread CPU time is reported from the samples that started and
// ended on the same thread (the others are dropped from the CPU columns).
func BenchmarkScore(b *testing.B) {
	const nEps = 64
	ix, prompt := fleet(b, nEps, 100_000)
	eligible := epset.FirstN(nEps)
	evict := make([]uint64, 1<<20) // 8 MiB, twice the per-core L2
	for i := range evict {
		evict[i] = uint64(i)
	}
	for _, ingest := range []bool{false, true} {
		for _, cold := range []bool{false, true} {
			for _, run := range []bool{true, false} {
				name := "overlap"
				if run {
					name = "leadingRun"
				}
				if ingest {
					name += "/underIngest"
				} else {
					name += "/idle"
				}
				if cold {
					name += "/cold"
				} else {
					name += "/hot"
				}
				b.Run(name, func(b *testing.B) {
					benchScore(b, ix, prompt, eligible, run, ingest, cold, evict)
				})
			}
		}
	}
}

var evictSink uint64

func benchScore(b *testing.B, ix *Index, prompt []uint64, eligible epset.Set, run, ingest, cold bool, evict []uint64) {
	nEps := eligible.Len()
	stop := make(chan struct{})
	var applied atomic.Int64
	var wg sync.WaitGroup
	if ingest {
		wg.Add(1)
		go func() { defer wg.Done(); churn(ix, nEps, stop, &applied) }()
		time.Sleep(20 * time.Millisecond)
	}
	var counts [epset.Max]uint32
	lat := make([]time.Duration, 0, 1<<16)
	cpu := make([]time.Duration, 0, 1<<16)
	start := time.Now()
	for b.Loop() {
		if cold {
			b.StopTimer()
			var s uint64
			for i := 0; i < len(evict); i += 8 {
				s += evict[i]
			}
			evictSink += s
			b.StartTimer()
		}
		tid := unix.Gettid()
		t0, c0 := time.Now(), threadCPU()
		ix.Score(prompt, eligible, run, &counts)
		c1, d := threadCPU(), time.Since(t0)
		if unix.Gettid() == tid {
			cpu = append(cpu, c1-c0)
		}
		lat = append(lat, d)
	}
	elapsed := time.Since(start) // wall, including the untimed evictions: the writer ran throughout
	close(stop)
	wg.Wait()
	if got, _ := Best(&counts, eligible); got != nEps-1 {
		b.Fatalf("best = %d", got)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	if len(cpu) > 0 {
		slices.Sort(cpu)
		b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds())/1e3, "cpu-p50-µs")
		b.ReportMetric(float64(cpu[len(cpu)*99/100].Nanoseconds())/1e3, "cpu-p99-µs")
	}
	if ingest {
		b.ReportMetric(float64(applied.Load())/elapsed.Seconds()/1e6, "ingest-Mhash/s")
	}
}

// BenchmarkScoreMapPerEndpoint is the naive design for comparison: one Go
// map per endpoint, probed for every (endpoint, block).
func BenchmarkScoreMapPerEndpoint(b *testing.B) {
	const nEps = 64
	r := rand.New(rand.NewPCG(3, 4))
	prompt := make([]uint64, 2048)
	for i := range prompt {
		prompt[i] = r.Uint64()
	}
	ms := make([]map[uint64]struct{}, nEps)
	for e := range ms {
		ms[e] = map[uint64]struct{}{}
		for _, h := range prompt[:(e*2048)/nEps] {
			ms[e][h] = struct{}{}
		}
		for range 100_000 {
			ms[e][r.Uint64()] = struct{}{}
		}
	}
	for _, run := range []bool{true, false} {
		name := "overlap"
		if run {
			name = "leadingRun"
		}
		b.Run(name, func(b *testing.B) {
			var counts [epset.Max]uint32
			lat := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				t0 := time.Now()
				for e := range nEps {
					n := uint32(0)
					for _, h := range prompt {
						if _, ok := ms[e][h]; ok {
							n++
						} else if run {
							break
						}
					}
					counts[e] = n
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// BenchmarkAdd measures apply throughput alone (no decode) on a table
// holding ~1M blocks: store then remove batches of 512 new hashes.
func BenchmarkAdd(b *testing.B) {
	ix, _ := fleet(b, 8, 125_000)
	r := rand.New(rand.NewPCG(7, 8))
	batch := make([]uint64, 512)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0 := threadCPU()
	n := 0
	for b.Loop() {
		seed := r.Uint64()
		for j := range batch {
			batch[j] = seed + uint64(j)*0x9e3779b97f4a7c15
		}
		e := n % 8
		n++
		if err := ix.Add(e, 0, "", batch); err != nil {
			b.Fatal(err)
		}
		if err := ix.Remove(e, 0, "", batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*len(batch)*b.N)/b.Elapsed().Seconds()/1e6, "Mhash/s")
	b.ReportMetric(float64(2*len(batch)*b.N)/(threadCPU()-c0).Seconds()/1e6, "cpu-Mhash/s")
}

// BenchmarkScoreSmall is the selector's case (docs/ingest.md): a 64-block prompt
// over 64 endpoints holding a spread of prefixes of it, table in cache. It
// measures Score's fixed costs rather than memory latency.
func BenchmarkScoreSmall(b *testing.B) {
	const nEps = 64
	ix, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	prompt := make([]uint64, 64)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	for e := range nEps {
		if err := ix.Add(e, 0, "", prompt[:(e*13)%64]); err != nil {
			b.Fatal(err)
		}
	}
	eligible := epset.FirstN(nEps)
	eligible.Remove(5)
	eligible.Remove(9)
	for _, impl := range []string{"new", "old"} {
		score := ix.Score
		if impl == "old" {
			score = ix.scoreOld // the previous overlap scorer (oldscore_test.go)
		}
		for _, run := range []bool{true, false} {
			name := "overlap/" + impl
			if run {
				name = "leadingRun/" + impl
			}
			b.Run(name, func(b *testing.B) {
				var counts [epset.Max]uint32
				b.ReportAllocs()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				c0 := threadCPU()
				for b.Loop() {
					score(prompt, eligible, run, &counts)
				}
				b.ReportMetric(float64(threadCPU()-c0)/float64(b.N), "cpu-ns/op")
				if ep, _ := Best(&counts, eligible); ep < 0 {
					b.Fatal("no match")
				}
			})
		}
	}
}

// BenchmarkOverlayScore is the provisional overlay's cost on top of the
// index's Score: a 64-block prompt over 64 endpoints, with nothing in
// flight (the overlay is skipped) and with 8 endpoints each holding a
// 64-block prediction that matches the prompt.
func BenchmarkOverlayScore(b *testing.B) {
	const nEps = 64
	ix, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	prompt := make([]uint64, 64)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	for e := range nEps {
		if err := ix.Add(e, 0, "", prompt[:(e*13)%64]); err != nil {
			b.Fatal(err)
		}
	}
	eligible := epset.FirstN(nEps)
	for _, inFlight := range []int{0, 8} {
		ov, err := NewOverlay(ix, ProvisionalOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for e := range inFlight {
			ov.Reserve(e*7, prompt)
		}
		b.Run(fmt.Sprintf("predicted-endpoints=%d", inFlight), func(b *testing.B) {
			var counts [epset.Max]uint32
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c0 := threadCPU()
			for b.Loop() {
				ov.Score(prompt, eligible, true, &counts)
			}
			b.ReportMetric(float64(threadCPU()-c0)/float64(b.N), "cpu-ns/op")
		})
	}
}
