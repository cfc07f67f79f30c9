package ingest

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/inventory"
)

// Target is one KV endpoint to follow: the daemon maps each subscribed
// endpoint of a KV rule (mode 1: ep_role 1; mode 3: all) to one Target.
type Target struct {
	Service uint32 // the rule's service id (metric label "service")
	EPIdx   int    // the endpoint's ep_idx in the rule (metric labels "ep", "ep_idx")
	IP      string // the endpoint's IP
	Port    int    // kvZmqPort: rank r publishes on Port+r
	Ranks   int    // kvDpRankCount, at least 1
	// ReplayPort is the rule's kvReplayPort override for rank 0 (rank r uses
	// ReplayPort+r); 0 means Port + Options.ReplayPortOffset.
	ReplayPort int
	// Inventory is the rule's index; the endpoint's ranks write into it.
	Inventory Sink
}

// Key is the target's stable identity: service and ip:port, never its position.
func (t Target) Key() string {
	return strconv.FormatUint(uint64(t.Service), 10) + "/" + net.JoinHostPort(t.IP, strconv.Itoa(t.Port))
}

// Validate reports the first problem with t.
func (t Target) Validate(replayOffset int) error {
	if t.IP == "" || net.ParseIP(t.IP) == nil {
		return fmt.Errorf("kv target %d/%d: invalid IP %q", t.Service, t.EPIdx, t.IP)
	}
	if t.EPIdx < 0 || t.EPIdx >= epset.Max {
		return fmt.Errorf("kv target %s: ep_idx %d outside [0, %d)", t.Key(), t.EPIdx, epset.Max)
	}
	if t.Ranks < 1 || t.Ranks > inventory.MaxRanks {
		return fmt.Errorf("kv target %s: rank count %d outside [1, %d]", t.Key(), t.Ranks, inventory.MaxRanks)
	}
	if t.Port < 1 || t.Port+t.Ranks-1 > 65535 {
		return fmt.Errorf("kv target %s: ports %d..%d outside 1..65535", t.Key(), t.Port, t.Port+t.Ranks-1)
	}
	if t.Inventory == nil {
		return fmt.Errorf("kv target %s: no inventory", t.Key())
	}
	if t.ReplayPort < 0 || (t.ReplayPort > 0 && t.ReplayPort+t.Ranks-1 > 65535) {
		return fmt.Errorf("kv target %s: replay ports %d..%d outside 1..65535", t.Key(), t.ReplayPort, t.ReplayPort+t.Ranks-1)
	}
	return nil
}

// replayEndpoint returns rank r's replay address, or "" when replay is off.
func (t Target) replayEndpoint(rank, offset int) string {
	base := t.ReplayPort
	if base == 0 {
		if offset == 0 {
			return ""
		}
		base = t.Port + offset
	}
	p := base + rank
	if p < 1 || p > 65535 {
		return ""
	}
	return "tcp://" + net.JoinHostPort(t.IP, strconv.Itoa(p))
}

func (t Target) pubEndpoint(rank int) string {
	return "tcp://" + net.JoinHostPort(t.IP, strconv.Itoa(t.Port+rank))
}

// Options tune the subscribers. Zero durations take the defaults.
type Options struct {
	// ReplayPortOffset is LLB_KV_REPLAY_PORT_OFFSET: the replay port is the
	// PUB port + this offset unless a target overrides it; 0 disables replay
	// for targets without an override. Use DefaultReplayPortOffset for the
	// documented default.
	ReplayPortOffset int
	// DialRetry is the wait between failed initial dials (default 5 s, as
	// the reference gateway).
	DialRetry time.Duration
	// DialTimeout bounds one TCP connect (default 2 s).
	DialTimeout time.Duration
	// RebuildDelay is the first wait before rebuilding a socket after a
	// receive error (default 500 ms); it doubles per consecutive failure up
	// to RebuildMaxDelay (default 5 s) and resets once a message arrives.
	RebuildDelay    time.Duration
	RebuildMaxDelay time.Duration
	// BootstrapTimeout bounds the replay from sequence 0 on first connect
	// (default 15 s); RepairTimeout bounds a gap repair (default 3 s).
	BootstrapTimeout time.Duration
	RepairTimeout    time.Duration
	// ReplayRetry is how long a rank waits before trying an unreachable
	// replay endpoint again (default 30 s).
	ReplayRetry time.Duration
	// MaxReplayBatches bounds one replay exchange (default 100000, vLLM's
	// largest sensible buffer_steps).
	MaxReplayBatches int
	// QueueLen is how many received messages a rank buffers ahead of
	// applying them (default 8192), so bursts and replays do not back up the
	// socket.
	QueueLen int
	// Logger receives the subscribers' logs (default slog.Default()).
	Logger *slog.Logger
	// Observer receives metrics (default: none).
	Observer Observer
	// Guard recovers a panic in a rank's goroutines; nil still recovers.
	Guard *recovery.Guard
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.DialRetry, 5*time.Second)
	def(&o.DialTimeout, 2*time.Second)
	def(&o.RebuildDelay, 500*time.Millisecond)
	def(&o.RebuildMaxDelay, 5*time.Second)
	def(&o.BootstrapTimeout, 15*time.Second)
	def(&o.RepairTimeout, 3*time.Second)
	def(&o.ReplayRetry, 30*time.Second)
	if o.MaxReplayBatches <= 0 {
		o.MaxReplayBatches = 100000
	}
	if o.QueueLen <= 0 {
		o.QueueLen = 8192
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Observer == nil {
		o.Observer = NopObserver{}
	}
	return o
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// Manager runs one subscriber per target and reconciles them with the
// desired set. Safe for concurrent use.
type Manager struct {
	opts Options

	reconcileMu sync.Mutex // serializes Reconcile and Close
	mu          sync.Mutex // guards subs
	subs        map[string]*endpointSub
	closed      bool
}

// NewManager returns a Manager with no targets.
func NewManager(opts Options) *Manager {
	return &Manager{opts: opts.withDefaults(), subs: make(map[string]*endpointSub)}
}

// Reconcile makes the running subscribers match targets: it starts the new
// ones, stops (and clears the inventory of) the ones no longer wanted, and
// leaves unchanged targets untouched, inventory included. A target whose
// endpoint, rank count, replay port or inventory changed is restarted.
// Invalid targets are skipped and reported in the returned error; the valid
// ones are still applied.
func (m *Manager) Reconcile(targets []Target) error {
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	if m.closed {
		return errors.New("kv subscriber manager is closed")
	}
	var errs []error
	want := make(map[string]Target, len(targets))
	for _, t := range targets {
		if err := t.Validate(m.opts.ReplayPortOffset); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := want[t.Key()]; dup {
			errs = append(errs, fmt.Errorf("kv target %s listed twice", t.Key()))
			continue
		}
		want[t.Key()] = t
	}
	m.mu.Lock()
	var stop []*endpointSub
	for k, s := range m.subs {
		if t, ok := want[k]; !ok || t != s.target {
			stop = append(stop, s)
			delete(m.subs, k)
		}
	}
	m.mu.Unlock()
	for _, s := range stop {
		s.stop(true)
	}
	m.mu.Lock()
	for k, t := range want {
		if _, ok := m.subs[k]; !ok {
			m.subs[k] = startEndpoint(t, m.opts)
		}
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// Close stops every subscriber. Inventories are left as they are.
func (m *Manager) Close() {
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	m.closed = true
	m.mu.Lock()
	subs := m.subs
	m.subs = map[string]*endpointSub{}
	m.mu.Unlock()
	for _, s := range subs {
		s.stop(false)
	}
}

// RankStatus is one rank's subscriber state.
type RankStatus struct {
	Rank      int
	Endpoint  string
	Connected bool
	LastSeq   uint64
	HasSeq    bool
}

// EndpointStatus is one target's subscriber state.
type EndpointStatus struct {
	Key     string
	Service uint32
	EPIdx   int
	Ranks   []RankStatus
}

// Status lists the running subscribers, for diagnostics.
func (m *Manager) Status() []EndpointStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]EndpointStatus, 0, len(m.subs))
	for k, s := range m.subs {
		st := EndpointStatus{Key: k, Service: s.target.Service, EPIdx: s.target.EPIdx}
		for _, r := range s.ranks {
			st.Ranks = append(st.Ranks, r.status())
		}
		out = append(out, st)
	}
	return out
}

// endpointSub follows every rank of one endpoint.
type endpointSub struct {
	target    Target
	ref       EndpointRef
	obs       Observer
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ranks     []*rankSub
	connected atomic.Int32 // ranks currently connected
}

func startEndpoint(t Target, opts Options) *endpointSub {
	ctx, cancel := context.WithCancel(context.Background())
	e := &endpointSub{
		target: t,
		ref:    EndpointRef{Service: t.Service, EPIdx: t.EPIdx, IP: t.IP},
		obs:    opts.Observer,
		cancel: cancel,
	}
	e.obs.EndpointInfo(e.ref)
	e.obs.Connected(e.ref, false)
	e.obs.Blocks(e.ref, t.Inventory.Blocks(t.EPIdx))
	for r := range t.Ranks {
		rs := &rankSub{
			ep:     e,
			rank:   r,
			pub:    t.pubEndpoint(r),
			replay: t.replayEndpoint(r, opts.ReplayPortOffset),
			opts:   opts,
			log: opts.Logger.With("service", t.Service, "ep_idx", t.EPIdx, "rank", r,
				"endpoint", t.pubEndpoint(r)),
			ingest: Ingester{Inventory: t.Inventory, EPIdx: t.EPIdx, Rank: r},
		}
		e.ranks = append(e.ranks, rs)
		e.obs.RankConnected(e.ref, r, false)
	}
	for _, rs := range e.ranks {
		e.wg.Add(1)
		opts.Guard.Go(recovery.Subscriber, func() {
			defer e.wg.Done()
			// A recovered panic restarts the rank (after a pause) rather
			// than leaving the endpoint silently unsubscribed.
			for opts.Guard.Run(recovery.Subscriber, func() { rs.run(ctx) }) && sleepCtx(ctx, time.Second) {
			}
		})
	}
	return e
}

// stop ends the endpoint's subscribers and waits for them; with forget, the
// endpoint left the rule: its inventory is cleared and its series retired.
func (e *endpointSub) stop(forget bool) {
	e.cancel()
	e.wg.Wait()
	for _, r := range e.ranks {
		e.obs.RankConnected(e.ref, r.rank, false)
	}
	e.obs.Connected(e.ref, false)
	if forget {
		if err := e.target.Inventory.ClearEndpoint(e.target.EPIdx); err != nil {
			e.ranks[0].log.Warn("kv subscriber: clearing inventory of removed endpoint failed", "err", err)
		}
		e.obs.Blocks(e.ref, e.target.Inventory.Blocks(e.target.EPIdx))
		e.obs.EndpointGone(e.ref)
	}
}

func (e *endpointSub) rankConnected(rank int, up bool) {
	var n int32
	if up {
		n = e.connected.Add(1)
	} else {
		n = e.connected.Add(-1)
	}
	e.obs.RankConnected(e.ref, rank, up)
	e.obs.Connected(e.ref, int(n) == len(e.ranks))
}

// rankSub follows one rank: one SUB socket, rebuilt on errors, plus replay.
type rankSub struct {
	ep     *endpointSub
	rank   int
	pub    string
	replay string
	opts   Options
	log    *slog.Logger
	ingest Ingester

	// seq, bootstrapped, replayDownUntil and replayLogged are owned by the
	// rank's goroutine; statusMu guards the copies status() reads.
	seq             SeqState
	bootstrapped    bool
	replayDownUntil time.Time
	replayLogged    bool

	statusMu  sync.Mutex
	connected bool
	lastSeq   uint64
	hasSeq    bool
}

func (r *rankSub) status() RankStatus {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	return RankStatus{Rank: r.rank, Endpoint: r.pub, Connected: r.connected, LastSeq: r.lastSeq, HasSeq: r.hasSeq}
}

func (r *rankSub) setConnected(up bool) {
	r.statusMu.Lock()
	changed := r.connected != up
	r.connected = up
	r.statusMu.Unlock()
	if changed {
		r.ep.rankConnected(r.rank, up)
	}
}

func (r *rankSub) noteSeq() {
	r.statusMu.Lock()
	r.lastSeq, r.hasSeq = r.seq.Last, r.seq.Known
	r.statusMu.Unlock()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// run connects, bootstraps once, receives, and rebuilds after errors until
// ctx ends. The inventory and the sequence state survive every rebuild.
func (r *rankSub) run(ctx context.Context) {
	delay := r.opts.RebuildDelay
	everConnected := false
	dialFailLogged := false
	for ctx.Err() == nil {
		sock, err := r.dial(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !dialFailLogged {
				r.log.Warn("kv subscriber: dial failed; retrying", "err", err, "retry", r.opts.DialRetry)
				dialFailLogged = true
			}
			wait := r.opts.DialRetry
			if everConnected {
				wait = delay
				delay = min(2*delay, r.opts.RebuildMaxDelay)
			}
			if !sleepCtx(ctx, wait) {
				return
			}
			continue
		}
		dialFailLogged = false
		if everConnected {
			r.ep.obs.Reconnected(r.ep.ref)
			r.log.Info("kv subscriber: socket rebuilt; inventory and sequence kept", "last_seq", r.seq.Last, "has_seq", r.seq.Known)
		} else {
			r.log.Info("kv subscriber: connected")
		}
		everConnected = true
		r.setConnected(true)
		got, err := r.receive(ctx, sock)
		_ = sock.Close()
		r.setConnected(false)
		if ctx.Err() != nil {
			return
		}
		r.ep.obs.RecvError(r.ep.ref)
		if got {
			delay = r.opts.RebuildDelay
		}
		r.log.Warn("kv subscriber: receive failed; rebuilding socket", "err", err, "after", delay)
		if !sleepCtx(ctx, delay) {
			return
		}
		delay = min(2*delay, r.opts.RebuildMaxDelay)
	}
}

func (r *rankSub) dial(ctx context.Context) (zmq4.Socket, error) {
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(r.opts.DialTimeout),
		zmq4.WithLogger(slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)))
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if err := dialBounded(ctx, sock, r.pub, 2*r.opts.DialTimeout); err != nil {
		_ = sock.Close()
		return nil, err
	}
	return sock, nil
}

// dialBounded dials with a bound on the whole exchange: go-zeromq bounds the
// TCP connect but not the ZMTP handshake after it, so a peer that accepts and
// stays silent would otherwise block the rank (and its removal) forever. On
// timeout the caller closes the socket; the abandoned dial ends when the peer
// closes the connection.
func dialBounded(ctx context.Context, sock zmq4.Socket, endpoint string, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- sock.Dial(endpoint) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("dial %s: no ZMTP handshake within %v", endpoint, timeout)
	}
}

type liveMsg struct {
	frames [][]byte
}

// receive drains the socket into a bounded queue on its own goroutine, so a
// burst or a replay in progress never backs up the socket, and applies the
// queue in order. It returns when the socket fails or ctx ends; got reports
// whether any message arrived.
func (r *rankSub) receive(ctx context.Context, sock zmq4.Socket) (got bool, err error) {
	queue := make(chan liveMsg, r.opts.QueueLen)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		panicked := r.opts.Guard.Run(recovery.Subscriber, func() {
			for {
				msg, err := sock.Recv()
				if err != nil {
					recvErr <- err
					close(queue)
					return
				}
				select {
				case queue <- liveMsg{frames: msg.Frames}:
				case <-done:
					return
				}
			}
		})
		if panicked { // in Recv, before either send: the rank rebuilds its socket
			recvErr <- errors.New("kv subscriber: receive panicked")
			close(queue)
		}
	}()
	if !r.bootstrapped {
		r.bootstrapped = true
		r.bootstrap(ctx)
	}
	for {
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case m, ok := <-queue:
			if !ok {
				return got, <-recvErr
			}
			got = true
			r.handle(ctx, m)
		}
	}
}

// handle applies one live message under the sequence table.
func (r *rankSub) handle(ctx context.Context, m liveMsg) {
	_, seq, payload, err := kvevents.ParseMessage(m.frames)
	if err != nil {
		r.ep.obs.DecodeError(r.ep.ref, r.rank)
		r.log.Debug("kv subscriber: skipping malformed message", "err", err)
		return
	}
	defer r.seq.Live(seq)
	c := r.seq.Classify(seq)
	last := r.seq.Last
	switch c {
	case SeqDuplicate:
		r.ep.obs.Sequence(r.ep.ref, r.rank, c, 0)
		return
	case SeqNext:
	case SeqFirst:
		// Nothing applied yet (no bootstrap data): batches before S may have
		// been published before the subscription took effect.
		if seq > 0 {
			r.repair(ctx, 0, ReplayGap)
		}
	case SeqSmallGap:
		r.ep.obs.Sequence(r.ep.ref, r.rank, c, seq-last-1)
		if st, ok := r.repair(ctx, last+1, ReplayGap); ok && st.Batches > 0 && st.First > last+1 {
			r.log.Info("kv subscriber: small gap only partly repaired; inventory kept", "from", last+1, "replay_first", st.First)
		}
	case SeqLargeGap:
		r.ep.obs.Sequence(r.ep.ref, r.rank, c, seq-last-1)
		covered := false
		var st ReplayStats
		if r.replayUsable() {
			// Peek whether the replay buffer still starts at L+1 before applying any of it.
			st, covered = r.repairIfCovered(ctx, last+1)
		}
		if !covered {
			r.log.Info("kv subscriber: large gap not covered by replay; clearing rank", "last", last, "seq", seq, "replay_batches", st.Batches)
			r.clear(ClearLargeGap)
		}
	case SeqRestart:
		r.ep.obs.Sequence(r.ep.ref, r.rank, c, 0)
		r.log.Info("kv subscriber: sequence went back (engine restart); clearing rank", "last", last, "seq", seq)
		r.clear(ClearRestart)
		r.seq.Known = false
		r.repair(ctx, 0, ReplayRestart)
	}
	// The repair may have applied this very batch from the replay buffer.
	if r.seq.Known && seq <= r.seq.Last && c != SeqNext {
		r.noteSeq()
		return
	}
	r.apply(seq, payload)
}

func (r *rankSub) apply(seq uint64, payload []byte) {
	res, err := r.ingest.Apply(payload)
	if err != nil {
		r.ep.obs.DecodeError(r.ep.ref, r.rank)
		r.log.Debug("kv subscriber: batch not applied", "seq", seq, "err", err)
	} else if res.Skipped > 0 {
		r.log.Debug("kv subscriber: events skipped", "seq", seq, "skipped", res.Skipped)
	}
	// A malformed payload still consumes its sequence number: asking for it
	// again would only fetch the same bytes.
	r.seq.Applied(seq)
	r.noteSeq()
	r.ep.obs.Blocks(r.ep.ref, r.ingest.Inventory.Blocks(r.ingest.EPIdx))
}

func (r *rankSub) clear(reason ClearReason) {
	if err := r.ingest.Inventory.ClearRank(r.ingest.EPIdx, r.rank); err != nil {
		r.log.Warn("kv subscriber: clear failed", "err", err)
	}
	r.ep.obs.Cleared(r.ep.ref, r.rank, reason)
	r.ep.obs.Blocks(r.ep.ref, r.ingest.Inventory.Blocks(r.ingest.EPIdx))
}

// replayUsable reports whether a replay may be attempted now, logging once
// when the rank has no replay endpoint at all.
func (r *rankSub) replayUsable() bool {
	if r.replay == "" {
		if !r.replayLogged {
			r.replayLogged = true
			r.log.Info("kv subscriber: no replay endpoint; gaps are handled by the 64-sequence window only")
		}
		return false
	}
	return time.Now().After(r.replayDownUntil)
}

// bootstrap replays the publisher's buffer from sequence 0 once, on the first
// connect, while live messages queue behind it.
func (r *rankSub) bootstrap(ctx context.Context) {
	if !r.replayUsable() {
		return
	}
	st, ok := r.replayFrom(ctx, 0, ReplayBootstrap, r.opts.BootstrapTimeout)
	if ok {
		r.log.Info("kv subscriber: bootstrap replay done", "batches", st.Batches, "last_seq", r.seq.Last)
	}
}

// repair replays from start and applies every batch beyond L.
func (r *rankSub) repair(ctx context.Context, start uint64, purpose ReplayPurpose) (ReplayStats, bool) {
	if !r.replayUsable() {
		return ReplayStats{}, false
	}
	return r.replayFrom(ctx, start, purpose, r.opts.RepairTimeout)
}

// repairIfCovered replays from start but applies nothing unless the first
// reply is exactly start: a buffer that no longer reaches back to L+1
// cannot repair the gap.
func (r *rankSub) repairIfCovered(ctx context.Context, start uint64) (ReplayStats, bool) {
	covered := false
	st, ok := r.replayWith(ctx, start, ReplayGap, r.opts.RepairTimeout, func(first bool, seq uint64) bool {
		if first {
			covered = seq == start
		}
		return covered
	})
	return st, ok && covered
}

func (r *rankSub) replayFrom(ctx context.Context, start uint64, purpose ReplayPurpose, timeout time.Duration) (ReplayStats, bool) {
	return r.replayWith(ctx, start, purpose, timeout, nil)
}

// replayWith runs one replay exchange. accept, if set, is asked before each
// batch is applied and can stop the exchange. Afterwards every live message
// already queued is marked as overlapping the replay.
func (r *rankSub) replayWith(ctx context.Context, start uint64, purpose ReplayPurpose, timeout time.Duration,
	accept func(first bool, seq uint64) bool) (ReplayStats, bool) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n := 0
	st, err := fetchReplay(rctx, r.replay, start, r.opts.MaxReplayBatches, r.opts.DialTimeout, func(seq uint64, payload []byte) error {
		if accept != nil && !accept(n == 0, seq) {
			return errReplayStop
		}
		n++
		if r.seq.Known && seq <= r.seq.Last {
			return nil
		}
		r.apply(seq, payload)
		return nil
	})
	ok := err == nil
	r.ep.obs.Replay(r.ep.ref, r.rank, purpose, ok, n)
	if err != nil {
		r.log.Info("kv subscriber: replay failed", "purpose", purpose, "from", start, "applied", n, "err", err)
		if st.Batches == 0 {
			r.replayDownUntil = time.Now().Add(r.opts.ReplayRetry)
		}
	}
	return st, ok
}
