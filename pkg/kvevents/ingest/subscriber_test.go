package ingest

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// recorder is an Observer that keeps counts for assertions.
type recorder struct {
	NopObserver
	mu          sync.Mutex
	seq         map[SeqCase]int
	clears      map[ClearReason]int
	replays     map[string]int // purpose/ok
	reconnects  int
	recvErrors  int
	connected   map[int]bool
	decodeErrs  int
	gone, infos int
}

func newRecorder() *recorder {
	return &recorder{seq: map[SeqCase]int{}, clears: map[ClearReason]int{}, replays: map[string]int{}, connected: map[int]bool{}}
}

func (r *recorder) Sequence(_ EndpointRef, _ int, c SeqCase, _ uint64) {
	r.mu.Lock()
	r.seq[c]++
	r.mu.Unlock()
}
func (r *recorder) Cleared(_ EndpointRef, _ int, reason ClearReason) {
	r.mu.Lock()
	r.clears[reason]++
	r.mu.Unlock()
}
func (r *recorder) Replay(_ EndpointRef, _ int, p ReplayPurpose, ok bool, _ int) {
	r.mu.Lock()
	r.replays[fmt.Sprintf("%s/%v", p, ok)]++
	r.mu.Unlock()
}
func (r *recorder) Reconnected(EndpointRef) { r.mu.Lock(); r.reconnects++; r.mu.Unlock() }
func (r *recorder) RecvError(EndpointRef)   { r.mu.Lock(); r.recvErrors++; r.mu.Unlock() }
func (r *recorder) DecodeError(EndpointRef, int) {
	r.mu.Lock()
	r.decodeErrs++
	r.mu.Unlock()
}
func (r *recorder) Connected(ep EndpointRef, up bool) {
	r.mu.Lock()
	r.connected[ep.EPIdx] = up
	r.mu.Unlock()
}
func (r *recorder) EndpointInfo(EndpointRef) { r.mu.Lock(); r.infos++; r.mu.Unlock() }
func (r *recorder) EndpointGone(EndpointRef) { r.mu.Lock(); r.gone++; r.mu.Unlock() }

func (r *recorder) get(f func(r *recorder) int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return f(r)
}

func testOptions(obs Observer) Options {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	return Options{
		DialRetry:        50 * time.Millisecond,
		DialTimeout:      time.Second,
		RebuildDelay:     20 * time.Millisecond,
		RebuildMaxDelay:  200 * time.Millisecond,
		BootstrapTimeout: 5 * time.Second,
		RepairTimeout:    5 * time.Second,
		ReplayRetry:      100 * time.Millisecond,
		Logger:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		Observer:         obs,
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// harness is one endpoint with its publishers (one per rank) and a Manager.
type harness struct {
	t      testing.TB
	ip     string
	port   int
	pubs   []*testPublisher
	ix     *inventory.Index
	rec    *recorder
	mgr    *Manager
	target Target
}

type harnessConfig struct {
	ranks      int
	replay     bool
	bufLen     int
	startLater bool // create publishers but start the manager first
	// sink, if set, wraps the harness's index as the target's inventory.
	sink func(*inventory.Index) Sink
}

func newHarness(t testing.TB, cfg harnessConfig) *harness {
	t.Helper()
	if cfg.ranks == 0 {
		cfg.ranks = 1
	}
	if cfg.bufLen == 0 {
		cfg.bufLen = 10000
	}
	h := &harness{t: t, ip: loopbackIP(), rec: newRecorder()}
	const replayOffset = 1000
	var spans []int
	for r := range cfg.ranks {
		if r > 0 {
			spans = append(spans, r)
		}
		spans = append(spans, replayOffset+r)
	}
	h.port = freePort(t, h.ip, spans...)
	ix, err := inventory.New(inventory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.ix = ix
	h.target = Target{Service: 7, EPIdx: 3, IP: h.ip, Port: h.port, Ranks: cfg.ranks, Inventory: ix}
	if cfg.sink != nil {
		h.target.Inventory = cfg.sink(ix)
	}
	opts := testOptions(h.rec)
	if cfg.replay {
		opts.ReplayPortOffset = replayOffset
	}
	startPubs := func() {
		for r := range cfg.ranks {
			rp := 0
			if cfg.replay {
				rp = h.port + replayOffset + r
			}
			h.pubs = append(h.pubs, newTestPublisher(t, h.ip, h.port+r, rp, cfg.bufLen))
		}
	}
	if !cfg.startLater {
		startPubs()
	}
	h.mgr = NewManager(opts)
	t.Cleanup(h.mgr.Close)
	if err := h.mgr.Reconcile([]Target{h.target}); err != nil {
		t.Fatal(err)
	}
	if cfg.startLater {
		time.Sleep(150 * time.Millisecond) // a few failed dials
		startPubs()
	}
	return h
}

func (h *harness) rank(r int) RankStatus {
	for _, st := range h.mgr.Status() {
		for _, rs := range st.Ranks {
			if rs.Rank == r {
				return rs
			}
		}
	}
	return RankStatus{}
}

// sync publishes empty batches on rank r until the subscriber has applied
// one, so later batches are known to reach it (PUB drops messages until the
// subscription arrives). It returns the applied sequence number.
func (h *harness) sync(r int) uint64 {
	h.t.Helper()
	var seq uint64
	waitFor(h.t, "subscriber to receive", func() bool {
		if st := h.rank(r); st.HasSeq && st.LastSeq >= seq && h.pubs[r].seq > 0 && st.LastSeq == h.pubs[r].seq-1 {
			return true
		}
		seq = h.pubs[r].publish(false, stored())
		time.Sleep(20 * time.Millisecond)
		return false
	})
	return seq
}

// waitSeq waits until rank r applied sequence s.
func (h *harness) waitSeq(r int, s uint64) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("rank %d to apply seq %d", r, s), func() bool {
		st := h.rank(r)
		return st.HasSeq && st.LastSeq >= s
	})
}

func (h *harness) inventory() []uint64 { return h.ix.Snapshot(h.target.EPIdx) }

func (h *harness) wantInventory(want []uint64) {
	h.t.Helper()
	slices.Sort(want)
	if got := h.inventory(); !slices.Equal(got, want) {
		h.t.Fatalf("inventory has %d hashes, want %d\n got %v\nwant %v", len(got), len(want), trunc(got), trunc(want))
	}
}

func trunc(s []uint64) []uint64 {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

func TestBootstrapThenStoreRemoveClear(t *testing.T) {
	t.Parallel()
	// History published before the subscriber existed must come from the
	// bootstrap replay.
	h2 := newHarnessWithHistory(t)
	a, b := hashRange(1, 5), hashRange(100, 5)
	h2.waitSeq(0, 2)
	h2.wantInventory(h2.pubs[0].cached())
	if got := h2.rec.get(func(r *recorder) int { return r.replays["bootstrap/true"] }); got != 1 {
		t.Errorf("bootstrap replays = %d, want 1", got)
	}
	s := h2.pubs[0].publish(false, stored(a...))
	h2.waitSeq(0, s)
	h2.wantInventory(h2.pubs[0].cached())
	s = h2.pubs[0].publish(false, stored(b...), removed(a[:2]...))
	h2.waitSeq(0, s)
	h2.wantInventory(h2.pubs[0].cached())
	if n := h2.ix.Blocks(3); n != len(h2.pubs[0].cached()) {
		t.Errorf("Blocks = %d", n)
	}
	s = h2.pubs[0].publish(false, cleared())
	h2.waitSeq(0, s)
	h2.wantInventory(nil)
	if got := h2.rec.get(func(r *recorder) int { return r.seq[SeqSmallGap] + r.seq[SeqLargeGap] + r.seq[SeqRestart] }); got != 0 {
		t.Errorf("unexpected gaps/restarts: %d", got)
	}
}

// newHarnessWithHistory starts a publisher that already published three
// batches (seq 0..2) before the subscriber exists.
func newHarnessWithHistory(t testing.TB) *harness {
	t.Helper()
	return newHarnessWithHistoryLog(t, nil)
}

// TestBootstrapReportsProgress: the bootstrap replay's closing log line says
// how many batches and hashes it applied and at what rate, so a large
// inventory's bootstrap can be followed in the log.
func TestBootstrapReportsProgress(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	h := newHarnessWithHistoryLog(t, slog.New(slog.NewTextHandler(&buf, nil)))
	h.waitSeq(0, 2)
	waitFor(t, "the bootstrap log line", func() bool { return strings.Contains(buf.String(), "bootstrap replay done") })
	line := buf.String()
	for _, want := range []string{"batches=3", "hashes=30", "hashes_per_s="} {
		if !strings.Contains(line, want) {
			t.Errorf("bootstrap log lacks %q:\n%s", want, line)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarnessWithHistoryLog(t testing.TB, log *slog.Logger) *harness {
	t.Helper()
	h := &harness{t: t, ip: loopbackIP(), rec: newRecorder()}
	h.port = freePort(t, h.ip, 1000)
	pub := newTestPublisher(t, h.ip, h.port, h.port+1000, 100)
	pub.publish(true, stored(hashRange(1000, 10)...))
	pub.publish(true, stored(hashRange(2000, 10)...), removed(hashRange(1000, 3)...))
	pub.publish(true, stored(hashRange(3000, 10)...))
	h.pubs = []*testPublisher{pub}
	ix, _ := inventory.New(inventory.Options{})
	h.ix = ix
	h.target = Target{Service: 7, EPIdx: 3, IP: h.ip, Port: h.port, Ranks: 1, Inventory: ix}
	opts := testOptions(h.rec)
	opts.ReplayPortOffset = DefaultReplayPortOffset
	if log != nil {
		opts.Logger = log
	}
	h.mgr = NewManager(opts)
	t.Cleanup(h.mgr.Close)
	if err := h.mgr.Reconcile([]Target{h.target}); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestSequenceTable drives each row of the sequence table over real sockets.
func TestSequenceTable(t *testing.T) {
	t.Parallel()
	base := hashRange(1, 8)
	for _, tc := range []struct {
		name   string
		replay bool
		bufLen int
		// act runs after base is applied at seq L; it returns the expected inventory.
		act       func(h *harness, p *testPublisher) []uint64
		wantCase  SeqCase
		wantClear ClearReason
	}{
		{"next S=L+1", true, 0, func(h *harness, p *testPublisher) []uint64 {
			h.waitSeq(0, p.publish(false, stored(7001)))
			return p.cached()
		}, SeqNext, 0},
		{"duplicate S=L ignored", true, 0, func(h *harness, p *testPublisher) []uint64 {
			want := p.cached()
			p.setSeq(p.seq - 1) // resend L with other content: must be ignored
			p.publish(false, stored(7002))
			h.waitSeq(0, p.publish(false, stored())) // a normal batch after it
			return want
		}, SeqDuplicate, 0},
		{"small gap repaired by replay", true, 0, func(h *harness, p *testPublisher) []uint64 {
			for i := range 10 {
				p.publish(true, stored(hashRange(uint64(8000+10*i), 3)...), removed(base[i%8]))
			}
			h.waitSeq(0, p.publish(false, stored(7003)))
			return p.cached()
		}, SeqSmallGap, 0},
		{"small gap without replay keeps inventory", false, 0, func(h *harness, p *testPublisher) []uint64 {
			want := append(p.cached(), 7004)
			for range 10 {
				p.publish(true, stored(hashRange(8500, 3)...))
			}
			h.waitSeq(0, p.publish(false, stored(7004)))
			return want
		}, SeqSmallGap, 0},
		{"large gap covered by replay is repaired", true, 1000, func(h *harness, p *testPublisher) []uint64 {
			for i := range 100 {
				p.publish(true, stored(uint64(9000+i)), removed(uint64(9000+i-1)))
			}
			h.waitSeq(0, p.publish(false, stored(7005)))
			return p.cached()
		}, SeqLargeGap, 0},
		{"large gap beyond the replay buffer clears", true, 10, func(h *harness, p *testPublisher) []uint64 {
			for i := range 100 {
				p.publish(true, stored(uint64(9000+i)))
			}
			h.waitSeq(0, p.publish(false, stored(7006)))
			return []uint64{7006}
		}, SeqLargeGap, ClearLargeGap},
		{"large gap without replay clears", false, 0, func(h *harness, p *testPublisher) []uint64 {
			p.setSeq(p.seq + 65)
			h.waitSeq(0, p.publish(false, stored(7007)))
			return []uint64{7007}
		}, SeqLargeGap, ClearLargeGap},
		{"gap of exactly 64 is small", false, 0, func(h *harness, p *testPublisher) []uint64 {
			want := append(p.cached(), 7008)
			p.setSeq(p.seq + 63) // S = L+64
			h.waitSeq(0, p.publish(false, stored(7008)))
			return want
		}, SeqSmallGap, 0},
		{"restart S<L clears and resyncs from replay", true, 0, func(h *harness, p *testPublisher) []uint64 {
			p.mu.Lock()
			p.seq, p.buf, p.cache = 0, nil, map[uint64]bool{} // engine restarted behind an open socket
			p.mu.Unlock()
			p.publish(true, stored(7100)) // seq 0, missed
			s := p.publish(false, stored(7101))
			waitFor(h.t, "restart handled", func() bool {
				st := h.rank(0)
				return st.HasSeq && st.LastSeq == s && h.rec.get(func(r *recorder) int { return r.clears[ClearRestart] }) > 0
			})
			return []uint64{7100, 7101}
		}, SeqRestart, ClearRestart},
		{"restart S<L without replay clears", false, 0, func(h *harness, p *testPublisher) []uint64 {
			p.setSeq(1)
			s := p.publish(false, stored(7102))
			waitFor(h.t, "restart handled", func() bool {
				st := h.rank(0)
				return st.HasSeq && st.LastSeq == s
			})
			return []uint64{7102}
		}, SeqRestart, ClearRestart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, harnessConfig{replay: tc.replay, bufLen: tc.bufLen})
			p := h.pubs[0]
			h.sync(0)
			for range 5 { // advance L a little so S<L is possible
				p.publish(false, stored())
			}
			h.waitSeq(0, p.publish(false, stored(base...)))
			h.wantInventory(p.cached())
			want := tc.act(h, p)
			h.wantInventory(want)
			if tc.wantCase != SeqNext {
				if got := h.rec.get(func(r *recorder) int { return r.seq[tc.wantCase] }); got == 0 {
					t.Errorf("case %s not observed: %v", tc.wantCase, h.rec.seq)
				}
			}
			gotClears := h.rec.get(func(r *recorder) int { return r.clears[ClearLargeGap] + r.clears[ClearRestart] })
			if tc.wantClear == 0 && gotClears != 0 {
				t.Errorf("unexpected clears: %v", h.rec.clears)
			}
			if tc.wantClear != 0 && h.rec.get(func(r *recorder) int { return r.clears[tc.wantClear] }) != 1 {
				t.Errorf("clears = %v, want one %s", h.rec.clears, tc.wantClear)
			}
		})
	}
}

func TestPublisherRestart(t *testing.T) {
	t.Parallel()
	for _, replay := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, harnessConfig{replay: replay})
			p := h.pubs[0]
			h.sync(0)
			for range 10 {
				p.publish(false, stored(hashRange(50, 4)...))
			}
			h.waitSeq(0, p.publish(false, stored(hashRange(60, 4)...)))
			h.wantInventory(p.cached())
			p.restart()
			waitFor(t, "reconnect", func() bool { return h.rec.get(func(r *recorder) int { return r.reconnects }) > 0 })
			// Publish until the restarted engine's batches reach the subscriber.
			fresh := hashRange(90, 4)
			waitFor(t, "post-restart batch applied", func() bool {
				p.publish(false, stored(fresh...))
				time.Sleep(20 * time.Millisecond)
				got := h.inventory()
				return slices.Contains(got, fresh[0]) && !slices.Contains(got, hashRange(60, 4)[0])
			})
			if replay {
				h.wantInventory(p.cached())
			}
			if h.rec.get(func(r *recorder) int { return r.clears[ClearRestart] }) != 1 {
				t.Errorf("clears = %v", h.rec.clears)
			}
			if h.rec.get(func(r *recorder) int { return r.recvErrors }) == 0 {
				t.Error("no receive error counted")
			}
		})
	}
}

// TestNearReconnect drops the connection without restarting the engine: the
// first message after the rebuild is judged with L from before, the inventory
// is kept, and the batches published meanwhile are repaired from the replay.
func TestNearReconnect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig{replay: true})
	p := h.pubs[0]
	h.sync(0)
	h.waitSeq(0, p.publish(false, stored(hashRange(1, 20)...)))
	p.stop()
	waitFor(t, "disconnect", func() bool { return !h.rank(0).Connected })
	p.publish(true, removed(hashRange(1, 5)...)) // missed while down
	p.publish(true, stored(hashRange(500, 5)...))
	p.reopen()
	waitFor(t, "reconnect", func() bool { return h.rec.get(func(r *recorder) int { return r.reconnects }) > 0 })
	waitFor(t, "inventory repaired", func() bool {
		p.publish(false, stored())
		time.Sleep(20 * time.Millisecond)
		return slices.Equal(h.inventory(), p.cached())
	})
	if n := h.rec.get(func(r *recorder) int { return len(r.clears) }); n != 0 {
		t.Errorf("a near reconnect cleared the inventory: %v", h.rec.clears)
	}
	// The reconnect check found batch L unchanged and repaired the rest
	// before the first live batch.
	if h.rec.get(func(r *recorder) int { return r.replays["verify/true"] }) == 0 {
		t.Errorf("no verify replay after the rebuild: %v", h.rec.replays)
	}
}

// TestRestartWhileDisconnected: the engine restarts (sequence from 0, empty
// cache) while the subscriber is disconnected. Its old blocks must be gone
// as soon as the subscriber is back, before the new engine publishes a
// live batch. Before the reconnect check they stayed scored until then.
func TestRestartWhileDisconnected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		replay   bool
		history  int  // batches the new engine published while kvgate was away
		probeUp  bool // the health probe reports the engine back (Manager.Verify)
		early    bool // … while the subscriber is still disconnected
		wantKeep bool // the old blocks survive (no way to tell)
	}{
		{name: "replay, nothing published yet", replay: true},
		{name: "replay, shorter new history", replay: true, history: 3},
		{name: "replay, longer new history (batch L differs)", replay: true, history: 15},
		{name: "no replay, reconnect only", wantKeep: true},
		{name: "no replay, probe up", probeUp: true},
		{name: "no replay, probe up before the reconnect", probeUp: true, early: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, harnessConfig{replay: tc.replay})
			p := h.pubs[0]
			h.sync(0)
			old := hashRange(7000, 8)
			for range 10 {
				p.publish(false, stored(old...))
			}
			h.waitSeq(0, p.publish(false, stored(old...)))
			p.stop()
			waitFor(t, "disconnect", func() bool { return !h.rank(0).Connected })
			p.mu.Lock()
			p.seq, p.buf, p.cache = 0, nil, map[uint64]bool{}
			p.mu.Unlock()
			fresh := hashRange(9000, 2)
			for range tc.history {
				p.publish(true, stored(fresh...))
			}
			if tc.early {
				h.mgr.Verify(h.target.Service, h.target.EPIdx)
			}
			p.reopen()
			waitFor(t, "reconnect", func() bool { return h.rank(0).Connected })
			if tc.probeUp && !tc.early {
				h.mgr.Verify(h.target.Service, h.target.EPIdx)
			}
			if tc.wantKeep {
				time.Sleep(200 * time.Millisecond)
				if got := h.inventory(); !slices.Contains(got, old[0]) {
					t.Fatalf("inventory %v lost the old blocks without a way to tell", trunc(got))
				}
				return
			}
			waitFor(t, "old blocks cleared", func() bool { return !slices.Contains(h.inventory(), old[0]) })
			want := p.cached()
			waitFor(t, "the new engine's history", func() bool { return slices.Equal(h.inventory(), want) })
			// Live batches of the new engine then apply in order.
			next := hashRange(9500, 2)
			waitFor(t, "a live batch of the new engine", func() bool {
				p.publish(false, stored(next...))
				time.Sleep(20 * time.Millisecond)
				return slices.Contains(h.inventory(), next[0])
			})
			if tc.replay {
				h.wantInventory(p.cached())
			}
		})
	}
}

func TestSubscriberBeforePublisher(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig{replay: true, startLater: true})
	p := h.pubs[0]
	waitFor(t, "connected", func() bool { return h.rank(0).Connected })
	a := hashRange(10, 6)
	p.publish(true, stored(a...)) // may predate the subscription: repaired by replay
	waitFor(t, "inventory", func() bool {
		p.publish(false, stored())
		time.Sleep(20 * time.Millisecond)
		return slices.Equal(h.inventory(), p.cached())
	})
	if h.rec.get(func(r *recorder) int { return btoi(r.connected[3]) }) != 1 {
		t.Error("connected gauge not 1")
	}
}

func TestRanksAreUnioned(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig{ranks: 2, replay: true})
	h.sync(0)
	h.sync(1)
	h.waitSeq(0, h.pubs[0].publish(false, stored(1, 2, 3)))
	h.waitSeq(1, h.pubs[1].publish(false, stored(3, 4)))
	h.wantInventory([]uint64{1, 2, 3, 4})
	h.waitSeq(1, h.pubs[1].publish(false, cleared()))
	h.wantInventory([]uint64{1, 2, 3})
	if h.ix.RankBlocks(3, 1) != 0 || h.ix.RankBlocks(3, 0) != 3 {
		t.Errorf("rank blocks %d/%d", h.ix.RankBlocks(3, 0), h.ix.RankBlocks(3, 1))
	}
	waitFor(t, "endpoint connected", func() bool { return h.rec.get(func(r *recorder) int { return btoi(r.connected[3]) }) == 1 })
	h.pubs[1].stop()
	waitFor(t, "endpoint disconnected", func() bool { return h.rec.get(func(r *recorder) int { return btoi(r.connected[3]) }) == 0 })
	h.wantInventory([]uint64{1, 2, 3}) // a down rank keeps its inventory (probe-down too)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestManagerReconcile(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	ip := loopbackIP()
	portA, portB := freePort(t, ip), freePort(t, ip)
	pa := newTestPublisher(t, ip, portA, 0, 10)
	pb := newTestPublisher(t, ip, portB, 0, 10)
	ix, _ := inventory.New(inventory.Options{})
	mgr := NewManager(testOptions(rec))
	t.Cleanup(mgr.Close)
	ta := Target{Service: 1, EPIdx: 0, IP: ip, Port: portA, Ranks: 1, Inventory: ix}
	tb := Target{Service: 1, EPIdx: 1, IP: ip, Port: portB, Ranks: 1, Inventory: ix}
	bad := Target{Service: 1, EPIdx: 2, IP: "not-an-ip", Port: 1, Ranks: 1, Inventory: ix}
	if err := mgr.Reconcile([]Target{ta, tb, bad}); err == nil {
		t.Error("want an error for the invalid target")
	}
	if len(mgr.Status()) != 2 {
		t.Fatalf("status: %+v", mgr.Status())
	}
	publishUntil := func(p *testPublisher, ep int, h uint64) {
		waitFor(t, "store", func() bool {
			p.publish(false, stored(h))
			time.Sleep(20 * time.Millisecond)
			return slices.Contains(ix.Snapshot(ep), h)
		})
	}
	publishUntil(pa, 0, 11)
	publishUntil(pb, 1, 22)
	before := mgr.subs[ta.Key()]
	if err := mgr.Reconcile([]Target{ta}); err != nil {
		t.Fatal(err)
	}
	if mgr.subs[ta.Key()] != before {
		t.Error("an unchanged target was restarted")
	}
	if ix.Blocks(1) != 0 || ix.Blocks(0) == 0 {
		t.Errorf("blocks after removing endpoint 1: %d/%d", ix.Blocks(0), ix.Blocks(1))
	}
	if rec.get(func(r *recorder) int { return r.gone }) != 1 {
		t.Error("EndpointGone not reported")
	}
	// A changed target (rank count) is restarted.
	ta2 := ta
	ta2.Ranks = 2
	if err := mgr.Reconcile([]Target{ta2}); err != nil {
		t.Fatal(err)
	}
	if mgr.subs[ta.Key()] == before || len(mgr.subs[ta.Key()].ranks) != 2 {
		t.Error("changed target not restarted")
	}
	// A restart clears what the old target mirrored but keeps the
	// endpoint's series: it did not leave the rule (failed before: every
	// restart reported EndpointGone, which deleted its probe and hit series).
	if ix.Blocks(0) != 0 {
		t.Errorf("a restarted target kept %d blocks of its old subscription", ix.Blocks(0))
	}
	if n := rec.get(func(r *recorder) int { return r.gone }); n != 1 {
		t.Errorf("EndpointGone reported %d times; a restart must not retire the endpoint's series", n)
	}
	mgr.Close()
	if err := mgr.Reconcile([]Target{ta}); err == nil {
		t.Error("Reconcile after Close must fail")
	}
}

func TestReplayEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target Target
		offset int
		rank   int
		want   string
	}{
		{"offset", Target{IP: "10.0.0.1", Port: 5557}, 1000, 0, "tcp://10.0.0.1:6557"},
		{"offset rank 2", Target{IP: "10.0.0.1", Port: 5557}, 1000, 2, "tcp://10.0.0.1:6559"},
		{"disabled", Target{IP: "10.0.0.1", Port: 5557}, 0, 0, ""},
		{"override", Target{IP: "10.0.0.1", Port: 5557, ReplayPort: 7000}, 0, 1, "tcp://10.0.0.1:7001"},
		{"negative offset", Target{IP: "10.0.0.1", Port: 5557}, -57, 0, "tcp://10.0.0.1:5500"},
		{"out of range", Target{IP: "10.0.0.1", Port: 65000}, 1000, 0, ""},
		{"ipv6", Target{IP: "::1", Port: 5557}, 1000, 0, "tcp://[::1]:6557"},
	} {
		if got := tc.target.replayEndpoint(tc.rank, tc.offset); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestTargetValidate(t *testing.T) {
	ix, _ := inventory.New(inventory.Options{})
	ok := Target{Service: 1, EPIdx: 0, IP: "127.0.0.1", Port: 5557, Ranks: 1, Inventory: ix}
	if err := ok.Validate(1000); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Target)
	}{
		{"ip", func(t *Target) { t.IP = "x" }},
		{"ep_idx", func(t *Target) { t.EPIdx = 256 }},
		{"ranks 0", func(t *Target) { t.Ranks = 0 }},
		{"ranks beyond ports", func(t *Target) { t.Port = 65535; t.Ranks = 2 }},
		{"port 0", func(t *Target) { t.Port = 0 }},
		{"no inventory", func(t *Target) { t.Inventory = nil }},
		{"replay port", func(t *Target) { t.ReplayPort = 70000 }},
	} {
		bad := ok
		tc.mod(&bad)
		if bad.Validate(1000) == nil {
			t.Errorf("%s: want an error", tc.name)
		}
	}
}

// TestSilentPeerDoesNotBlock points a target at a TCP listener that accepts
// and never speaks ZMTP: the subscriber must keep retrying and Reconcile must
// still be able to remove it promptly.
func TestSilentPeerDoesNotBlock(t *testing.T) {
	t.Parallel()
	ip := loopbackIP()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	ix, _ := inventory.New(inventory.Options{})
	opts := testOptions(newRecorder())
	opts.DialTimeout = 100 * time.Millisecond
	mgr := NewManager(opts)
	defer mgr.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if err := mgr.Reconcile([]Target{{Service: 1, EPIdx: 0, IP: ip, Port: port, Ranks: 1, Inventory: ix}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a silent dial", func() bool { mu.Lock(); defer mu.Unlock(); return len(conns) >= 2 })
	done := make(chan struct{})
	go func() { _ = mgr.Reconcile(nil); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Reconcile blocked behind a silent peer")
	}
}

// TestBurstWithoutGaps publishes a burst of batches as fast as the PUB socket
// takes them; the subscriber must apply every one in order, with no gap.
func TestBurstWithoutGaps(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig{replay: false})
	p := h.pubs[0]
	h.sync(0)
	const n = 5000
	var last uint64
	for i := range n {
		hs := hashRange(uint64(100000+16*i), 16)
		if i > 0 {
			last = p.publish(false, stored(hs...), removed(hashRange(uint64(100000+16*(i-1)), 8)...))
		} else {
			last = p.publish(false, stored(hs...))
		}
	}
	h.waitSeq(0, last)
	h.wantInventory(p.cached())
	if got := h.rec.get(func(r *recorder) int { return r.seq[SeqSmallGap] + r.seq[SeqLargeGap] + r.seq[SeqRestart] }); got != 0 {
		t.Errorf("a burst of %d batches produced gaps: %v", n, h.rec.seq)
	}
}

// TestByteBudget: the live queue's byte bound admits while there is room,
// always admits into an empty queue (one message of any size), and makes the
// reader wait otherwise, until a release or the end of the receive loop.
func TestByteBudget(t *testing.T) {
	b := newByteBudget(100)
	never := make(chan struct{})
	closed := make(chan struct{})
	close(closed)
	steps := []struct {
		acquire int64
		release int64
		done    chan struct{}
		want    bool
	}{
		{acquire: 60, done: never, want: true},
		{acquire: 40, done: never, want: true},  // exactly full
		{acquire: 1, done: closed, want: false}, // over: waits, and the loop ended
		{release: 100},
		{acquire: 500, done: never, want: true}, // empty: one oversized message passes
		{acquire: 1, done: closed, want: false},
		{release: 500},
		{acquire: 1, done: never, want: true},
	}
	for i, s := range steps {
		if s.release > 0 {
			b.release(s.release)
			continue
		}
		if got := b.acquire(s.acquire, s.done); got != s.want {
			t.Fatalf("step %d: acquire(%d) = %v, want %v", i, s.acquire, got, s.want)
		}
	}
	// A waiting reader proceeds once the consumer releases.
	b2 := newByteBudget(10)
	b2.acquire(10, never)
	got := make(chan bool)
	go func() { got <- b2.acquire(5, never) }()
	b2.release(10)
	if !<-got {
		t.Fatal("the waiting acquire did not proceed after the release")
	}
}
