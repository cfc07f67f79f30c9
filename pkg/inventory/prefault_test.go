package inventory

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestPrefaultReserved: a reservation has the arena fault in the slabs the
// burst will grow the segments into, the rebuilds take them, and the index
// ends exact; a prepared slab nobody takes is unmapped once the reservation
// is withdrawn. Before, every rebuild mapped a fresh slab and faulted it in
// on the writer's thread (no prepared slab was ever taken).
func TestPrefaultReserved(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reserve   int
		add       int
		withdraw  bool // withdraw the reservation before the burst
		failMaps  bool
		wantTaken bool
		wantFault bool
	}{
		{"burst fits", 150_000, 120_000, false, false, true, true},
		{"withdrawn before the burst", 150_000, 120_000, true, false, false, true},
		{"mapping fails", 150_000, 120_000, false, true, false, false},
		{"too small to reserve", minReserve - 1, 1000, false, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, 200_000)
			useTinySlabs(ix)
			var faulted atomic.Int64
			ix.writeMu.Lock()
			pre := ix.gpu.arena.pre
			pre.populate = func(mem []byte) { faulted.Add(int64(len(mem))); populateSlab(mem) }
			if tc.failMaps {
				ix.gpu.arena.mapSlab = func(int) ([]byte, []byte, error) { return nil, nil, errors.New("injected mapping failure") }
			}
			ix.writeMu.Unlock()
			r := rand.New(rand.NewPCG(9, uint64(tc.reserve)))
			ix.ExpectStored(0, tc.reserve)
			if tc.withdraw {
				waitPrefaulter(t, pre)
				ix.ExpectStored(0, 0)
				waitNoPrepared(t, pre)
			}
			batch := make([]uint64, tc.add)
			for i := range batch {
				batch[i] = r.Uint64()
			}
			for i := 0; i < len(batch); i += 256 {
				must(t, ix.Add(0, 0, "", batch[i:min(i+256, len(batch))]))
			}
			ix.ExpectStored(0, 0)
			waitNoPrepared(t, pre)
			if got := pre.taken.Load() > 0; got != tc.wantTaken {
				t.Errorf("prepared slabs taken: %d, want some: %v", pre.taken.Load(), tc.wantTaken)
			}
			if got := faulted.Load() > 0; got != tc.wantFault {
				t.Errorf("bytes faulted ahead: %d, want some: %v", faulted.Load(), tc.wantFault)
			}
			sorted := slices.Clone(batch)
			slices.Sort(sorted)
			if snap := ix.Snapshot(0); !slices.Equal(snap, sorted) {
				t.Fatalf("endpoint 0 holds %d hashes, want %d", len(snap), len(sorted))
			}
			if ix.Blocks(0) != len(batch) {
				t.Fatalf("Blocks = %d, want %d", ix.Blocks(0), len(batch))
			}
		})
	}
}

// waitPrefaulter waits (bounded) until the background worker is idle.
func waitPrefaulter(t *testing.T, p *prefaulter) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p.mu.Lock()
		running := p.running
		p.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("prefaulter still running after a minute")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitNoPrepared waits (bounded) until no slab is left prepared.
func waitNoPrepared(t *testing.T, p *prefaulter) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.pending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slabs still prepared after a minute", p.pending())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPrefaulterCancelsQueued: a slab still queued behind another segment's
// is never mapped once a rebuild or a discard no longer wants it, and one
// outgrown before it started is replaced; one being faulted in is waited for.
func TestPrefaulterCancelsQueued(t *testing.T) {
	for _, tc := range []struct {
		name       string
		act        func(p *prefaulter) *slab
		wantMapped int64 // slabs mapped in all
		wantTaken  bool
	}{
		{"taken while queued: the caller maps its own", func(p *prefaulter) *slab { return p.take(1, 4096, 4096) }, 1, false},
		{"discarded while queued", func(p *prefaulter) *slab { p.discard(); return nil }, 1, false},
		{"outgrown while queued: replaced", func(p *prefaulter) *slab {
			p.prepare(1, 8192, 8192)
			return nil
		}, 2, false},
		{"being faulted in: waited for", func(p *prefaulter) *slab { return p.take(0, 4096, 4096) }, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mapped atomic.Int64
			release := make(chan struct{})
			p := newPrefaulter(func(n int) ([]byte, []byte, error) {
				mapped.Add(1)
				return mapSlab(n)
			})
			first := true
			p.populate = func([]byte) {
				if first { // hold the worker on segment 0
					first = false
					<-release
				}
			}
			p.prepare(0, 4096, 4096)
			p.prepare(1, 4096, 4096)
			for mapped.Load() == 0 { // the worker is on segment 0
				time.Sleep(time.Millisecond)
			}
			p.mu.Lock()
			queued := p.prepared[1]
			p.mu.Unlock()
			done := make(chan *slab, 1)
			go func() { done <- tc.act(p) }()
			if !tc.wantTaken {
				// Segment 1's request is settled (taken, discarded or
				// replaced) before the worker may move on to it.
				deadline := time.Now().Add(time.Minute)
				for {
					p.mu.Lock()
					settled := p.prepared[1] != queued
					p.mu.Unlock()
					if settled {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("segment 1 not settled after a minute")
					}
					time.Sleep(time.Millisecond)
				}
				close(release)
				if sb := <-done; sb != nil {
					t.Fatal("a queued slab was handed out")
				}
			} else {
				close(release)
				if sb := <-done; sb == nil {
					t.Fatal("the slab being faulted in was not handed out")
				} else {
					unmapSlab(sb.raw)
				}
			}
			waitPrefaulter(t, p)
			p.discard()
			if got := mapped.Load(); got != tc.wantMapped {
				t.Errorf("slabs mapped: %d, want %d", got, tc.wantMapped)
			}
		})
	}
}
