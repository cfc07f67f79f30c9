package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/zmtpguard"
)

// Target is one KV endpoint to follow: the daemon maps each subscribed
// endpoint of a KV rule (mode 1: ep_role 1; mode 3: all) to one Target.
type Target struct {
	Service uint32 // the rule's service id (metric label "service")
	EPIdx   int    // the endpoint's ep_idx in the rule (metric labels "ep", "ep_idx")
	IP      string // the endpoint's IP
	Port    int    // kvZmqPort: rank r publishes on Port+r; TensorRT-LLM: the endpoint's HTTP port
	Ranks   int    // kvDpRankCount, at least 1
	// HTTPPort is the endpoint's targetPort, where an SGLang engine answers
	// GET /get_server_info (its page_size); 0 skips that read.
	HTTPPort int
	// Engine is the rule's kvEngineType adapter: vLLM and SGLang speak
	// vLLM's ZeroMQ transport with their own payloads; TensorRT-LLM's
	// events are drained over HTTP from Port (trtllm.go).
	Engine Engine
	// ReplayPort is the rule's kvReplayPort override for rank 0 (rank r uses
	// ReplayPort+r); 0 means Port + Options.ReplayPortOffset.
	ReplayPort int
	// Inventory is the rule's index; the endpoint's ranks write into it.
	Inventory Sink
	// Granularity, when set, is the rule's: the endpoint's ranks report the
	// block size their engine publishes (see Granularity).
	Granularity *Granularity
	// Parity, when set, is the rule's live parity self-check: the ranks
	// check their BlockStored events against the rule's contract.
	Parity *Parity
	// Token, when set, is the rule's backendTokenFile token, sent as
	// Authorization: Bearer on kvgate's HTTP calls to the engine (SGLang's
	// /get_server_info, TensorRT-LLM's drain and /server_info). It must be
	// one value for the rule's life: targets are compared.
	Token TokenSource
	// HTTP is the rule's engine-facing client for those calls (https on
	// security-2 rules; nil: plain HTTP). One value for the rule's life,
	// like Token.
	HTTP *engineclient.Client
}

// httpClient is t's engine client, plain HTTP when the rule gave none.
func (t Target) httpClient() *engineclient.Client {
	if t.HTTP == nil {
		return engineclient.New(nil)
	}
	return t.HTTP
}

// TokenSource supplies the bearer token for a target's HTTP calls ("" none).
type TokenSource interface {
	Token() (token string, err error)
}

// authorize adds t's token, if any, to one of kvgate's requests to the engine.
func (t Target) authorize(req *http.Request) {
	if t.Token == nil {
		return
	}
	if tok, _ := t.Token.Token(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
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
	// QueueBytes bounds the bytes of those messages (default 256 MiB): the
	// reader stops taking from the socket above it, so a publisher of large
	// batches cannot grow the queue without bound. One message always fits,
	// whatever its size (it is itself bounded by MaxFrameBytes).
	QueueBytes int64
	// ReleaseAfter is the queued bytes of a burst (the most a rank's queue
	// held since it was last empty) at or above which the rank, once its
	// queue is empty again, has the Go runtime return the freed heap to the
	// OS (at most once a second per Manager). Default DefaultReleaseAfter
	// (8 MiB); negative: never.
	ReleaseAfter int64
	// MaxFrameBytes is LLB_KV_MAX_FRAME_BYTES: the largest ZMTP frame, and
	// multipart message, accepted from a publisher or replay socket (default
	// zmtpguard.DefaultMaxFrameBytes). A peer declaring more loses its
	// connection before anything is allocated; see docs/ingest.md.
	MaxFrameBytes int
	// Logger receives the subscribers' logs (default slog.Default()).
	Logger *slog.Logger
	// Observer receives metrics (default: none).
	Observer Observer
	// PollMin and PollMax bound the TensorRT-LLM drain interval
	// (LOXILB_KV_TRTLLM_POLL_MIN_MS / _MAX_MS; defaults 5 and 20 ms): PollMin
	// while drains return events, doubling to PollMax while they are empty.
	PollMin, PollMax time.Duration
	// DrainTimeout bounds one drain request (default 5 s); MaxDrainBytes
	// bounds its body (default MaxFrameBytes).
	DrainTimeout  time.Duration
	MaxDrainBytes int
	// Guard recovers a panic in a rank's goroutines; nil still recovers.
	Guard *recovery.Guard

	// Releaser, when set, is the daemon's MemReleaser, shared with its other
	// sources of transient garbage (the tokenizer preload) so their releases
	// coalesce; nil: NewManager makes one for its ranks.
	Releaser *MemReleaser

	releaser *MemReleaser // what the ranks use; nil when ReleaseAfter < 0
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
	if o.QueueBytes <= 0 {
		o.QueueBytes = 256 << 20
	}
	if o.ReleaseAfter == 0 {
		o.ReleaseAfter = DefaultReleaseAfter
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = zmtpguard.DefaultMaxFrameBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	def(&o.PollMin, DefaultTRTLLMPollMin)
	def(&o.PollMax, DefaultTRTLLMPollMax)
	if o.PollMin > o.PollMax {
		o.PollMin, o.PollMax = DefaultTRTLLMPollMin, DefaultTRTLLMPollMax
	}
	def(&o.DrainTimeout, 5*time.Second)
	if o.MaxDrainBytes <= 0 {
		o.MaxDrainBytes = o.MaxFrameBytes
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
	opts = opts.withDefaults()
	if opts.ReleaseAfter > 0 {
		opts.releaser = opts.Releaser
		if opts.releaser == nil {
			opts.releaser = NewMemReleaser(opts.Guard)
		}
	}
	return &Manager{opts: opts, subs: make(map[string]*endpointSub)}
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
	errs = append(errs, m.oneDrainer(want)...)
	m.mu.Lock()
	type stopping struct {
		s *endpointSub
		// gone: the endpoint left (or moved to another ep_idx), so its
		// series retire; a changed target that stays restarts and keeps
		// them (its probe and hit series are not the subscriber's).
		gone bool
	}
	var stop []stopping
	for k, s := range m.subs {
		if t, ok := want[k]; !ok || t != s.target {
			stop = append(stop, stopping{s: s, gone: !ok || t.EPIdx != s.target.EPIdx})
			delete(m.subs, k)
		}
	}
	m.mu.Unlock()
	for _, st := range stop {
		st.s.stop(true, st.gone)
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

// oneDrainer keeps one target per TensorRT-LLM endpoint (ip:port) in want:
// POST /kv_cache_events is a destructive drain, so two pollers of one
// engine (two rules over it) would each see half its events. The one already
// running is kept, else the lowest service id; the others are dropped and
// reported. Their rules' requests find no inventory there.
func (m *Manager) oneDrainer(want map[string]Target) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	byAddr := map[string][]string{}
	for k, t := range want {
		if t.Engine == EngineTRTLLM {
			addr := net.JoinHostPort(t.IP, strconv.Itoa(t.Port))
			byAddr[addr] = append(byAddr[addr], k)
		}
	}
	var errs []error
	for addr, keys := range byAddr {
		if len(keys) < 2 {
			continue
		}
		slices.SortFunc(keys, func(a, b string) int {
			_, ra := m.subs[a]
			_, rb := m.subs[b]
			if ra != rb {
				if ra {
					return -1
				}
				return 1
			}
			return int(want[a].Service) - int(want[b].Service)
		})
		for _, k := range keys[1:] {
			errs = append(errs, fmt.Errorf("kv target %s: TensorRT-LLM endpoint %s is already drained for service %d; POST /kv_cache_events has one consumer, so this rule gets no inventory from it", k, addr, want[keys[0]].Service))
			delete(want, k)
		}
	}
	return errs
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
		s.stop(false, false)
	}
}

// Verify asks every rank of the endpoint (service, epIdx) to check that the
// engine behind it is the one whose blocks it holds; the daemon calls it when
// the endpoint's health probe sees it come back. It does not wait: each rank
// checks before it applies its next batch (see rankSub.verify). Unknown
// endpoints are ignored.
func (m *Manager) Verify(service uint32, epIdx int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.subs {
		if s.target.Service != service || s.target.EPIdx != epIdx {
			continue
		}
		for _, r := range s.ranks {
			select {
			case r.verifyReq <- struct{}{}:
			default: // one check is already pending
			}
		}
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
		if s.target.Engine == EngineTRTLLM {
			// The drain stands in for the one rank a TensorRT-LLM endpoint has.
			st.Ranks = append(st.Ranks, RankStatus{Rank: 0, Endpoint: s.target.Key(), Connected: s.drainUp.Load()})
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
	log       *slog.Logger
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ranks     []*rankSub
	connected atomic.Int32 // ranks currently connected
	// drainUp is a TensorRT-LLM endpoint's drain state (it has no ranks).
	drainUp atomic.Bool
	// backlog is each rank's queued hashes, as reserved in the inventory (reserve.go).
	backlog endpointBacklog
}

func startEndpoint(t Target, opts Options) *endpointSub {
	ctx, cancel := context.WithCancel(context.Background())
	e := &endpointSub{
		target: t,
		ref:    EndpointRef{Service: t.Service, EPIdx: t.EPIdx, IP: t.IP},
		obs:    opts.Observer,
		log:    opts.Logger.With("service", t.Service, "ep_idx", t.EPIdx),
		cancel: cancel,
	}
	e.backlog = make(endpointBacklog, max(t.Ranks, 1))
	e.obs.EndpointInfo(e.ref)
	e.obs.Connected(e.ref, false)
	reportBlocks(e.obs, e.ref, t.Inventory, t.EPIdx)
	if t.Engine == EngineTRTLLM {
		p := newDrainPoller(e, t, opts)
		e.obs.RankConnected(e.ref, 0, false)
		e.wg.Add(1)
		opts.Guard.Go(recovery.Subscriber, func() {
			defer e.wg.Done()
			// As for a rank: a recovered panic restarts the poller.
			for opts.Guard.Run(recovery.Subscriber, func() { p.run(ctx) }) && sleepCtx(ctx, time.Second) {
			}
		})
		return e
	}
	if t.Engine == EngineSGLang && t.HTTPPort > 0 && t.Granularity != nil {
		e.wg.Add(1)
		opts.Guard.Go(recovery.Subscriber, func() {
			defer e.wg.Done()
			readSGLangPageSize(ctx, t, opts, e.log)
		})
	}
	for r := range t.Ranks {
		rs := &rankSub{
			ep:     e,
			rank:   r,
			pub:    t.pubEndpoint(r),
			replay: t.replayEndpoint(r, opts.ReplayPortOffset),
			opts:   opts,
			log: opts.Logger.With("service", t.Service, "ep_idx", t.EPIdx, "rank", r,
				"endpoint", t.pubEndpoint(r)),
			ingest:     Ingester{Inventory: t.Inventory, EPIdx: t.EPIdx, Rank: r, Engine: t.Engine, Granularity: t.Granularity},
			digestSeed: maphash.MakeSeed(),
			verifyReq:  make(chan struct{}, 1),
		}
		rs.ingest.EnableParity(t.Parity, e.ref)
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
// target left or changed: its inventory is cleared; with gone too, the
// endpoint left the rule and its series are retired.
func (e *endpointSub) stop(forget, gone bool) {
	e.cancel()
	e.wg.Wait()
	for _, r := range e.ranks {
		e.obs.RankConnected(e.ref, r.rank, false)
	}
	if e.target.Engine == EngineTRTLLM {
		e.obs.RankConnected(e.ref, 0, false)
	}
	e.obs.Connected(e.ref, false)
	if forget {
		if err := e.target.Inventory.ClearEndpoint(e.target.EPIdx); err != nil {
			e.log.Warn("kv subscriber: clearing inventory of removed endpoint failed", "err", err)
		}
		reportBlocks(e.obs, e.ref, e.target.Inventory, e.target.EPIdx)
		if e.target.Granularity != nil {
			e.target.Granularity.forget(e.target.EPIdx)
		}
		if e.target.Parity != nil {
			e.target.Parity.forget(e.target.EPIdx)
		}
	}
	if gone {
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
	ep      *endpointSub
	rank    int
	counts  appliedCounts // live batches applied, not yet reported (flushApplied)
	backlog backlog       // queued hashes reserved in the inventory (reserve.go)
	pub     string
	replay  string
	opts    Options
	log     *slog.Logger
	ingest  Ingester

	// seq, bootstrapped, replayDownUntil and replayLogged are owned by the
	// rank's goroutine; statusMu guards the copies status() reads.
	seq             SeqState
	bootstrapped    bool
	replayDownUntil time.Time
	replayLogged    bool
	// lastDigest fingerprints the payload applied at seq.Last, so a replay
	// can tell the same engine (same batch at L) from a restarted one.
	digestSeed maphash.Seed
	lastDigest uint64

	// verifyReq asks the rank's goroutine to check the engine (Manager.Verify).
	verifyReq chan struct{}

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
		everConnectedBefore := everConnected
		if everConnected {
			r.ep.obs.Reconnected(r.ep.ref)
			r.log.Info("kv subscriber: socket rebuilt; inventory and sequence kept", "last_seq", r.seq.Last, "has_seq", r.seq.Known)
		} else {
			r.log.Info("kv subscriber: connected")
		}
		everConnected = true
		r.ingest.Connected()
		r.setConnected(true)
		got, err := r.receive(ctx, sock, everConnectedBefore)
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
	// Every socket dials through zmtpguard: zmq4 would otherwise allocate
	// whatever frame size the peer declares (docs/ingest.md, "Bounded frames").
	if err := dialBounded(ctx, sock, zmtpguard.Wrap(r.pub, uint64(r.opts.MaxFrameBytes)), 2*r.opts.DialTimeout); err != nil {
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
	size   int64
}

// byteBudget bounds the bytes of received messages waiting to be applied.
type byteBudget struct {
	limit int64
	mu    sync.Mutex
	used  int64
	peak  int64         // the most used since used was last 0 (drainedPeak)
	freed chan struct{} // signalled on release
}

func newByteBudget(limit int64) *byteBudget {
	return &byteBudget{limit: limit, freed: make(chan struct{}, 1)}
}

// acquire waits until n more bytes fit, or the budget is empty (so a single
// message larger than the limit still passes), or done closes (false).
func (b *byteBudget) acquire(n int64, done <-chan struct{}) bool {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.limit {
			b.used += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			return true
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-done:
			return false
		}
	}
}

// drainedPeak returns the burst's peak and starts a new burst when the
// budget is empty, and 0 while messages are still queued.
// queued is the bytes of the messages queued, the one being applied included.
func (b *byteBudget) queued() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

func (b *byteBudget) drainedPeak() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used != 0 {
		return 0
	}
	p := b.peak
	b.peak = 0
	return p
}

func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// receive drains the socket into a bounded queue on its own goroutine, so a
// burst or a replay in progress never backs up the socket, and applies the
// queue in order. It returns when the socket fails or ctx ends; got reports
// whether any message arrived.
func (r *rankSub) receive(ctx context.Context, sock zmq4.Socket, reconnect bool) (got bool, err error) {
	queue := make(chan liveMsg, r.opts.QueueLen)
	budget := newByteBudget(r.opts.QueueBytes)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go r.readSocket(sock, queue, budget, recvErr, done)
	r.resync(ctx, reconnect)
	for {
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-r.verifyReq:
			r.verify(ctx, true)
		case m, ok := <-queue:
			if !ok {
				return got, <-recvErr
			}
			got = true
			r.reserveBacklog(budget.queued())
			stored := r.counts.stored
			r.handle(ctx, m)
			r.backlog.noteApplied(m.size, r.counts.stored-stored)
			budget.release(m.size)
			r.flushApplied(len(queue))
			if len(queue) == 0 && r.opts.releaser != nil && budget.drainedPeak() >= r.opts.ReleaseAfter {
				r.opts.releaser.Request()
			}
		}
	}
}

// readSocket is receive's reader goroutine: it queues each message within
// the byte budget until the socket fails (the error goes to recvErr and the
// queue is closed) or done closes.
func (r *rankSub) readSocket(sock zmq4.Socket, queue chan<- liveMsg, budget *byteBudget, recvErr chan<- error, done <-chan struct{}) {
	panicked := r.opts.Guard.Run(recovery.Subscriber, func() {
		for {
			msg, err := sock.Recv()
			if err != nil {
				recvErr <- err
				close(queue)
				return
			}
			var size int64
			for _, f := range msg.Frames {
				size += int64(len(f))
			}
			if !budget.acquire(size, done) {
				return
			}
			select {
			case queue <- liveMsg{frames: msg.Frames, size: size}:
			case <-done:
				return
			}
		}
	})
	if panicked { // in Recv, before either send: the rank rebuilds its socket
		recvErr <- errors.New("kv subscriber: receive panicked")
		close(queue)
	}
}

// resync runs once a socket is up, before any live message is applied: the
// first time it bootstraps the rank; after a reconnect it verifies it.
func (r *rankSub) resync(ctx context.Context, reconnect bool) {
	if !r.bootstrapped {
		r.bootstrapped = true
		r.bootstrap(ctx)
		return
	}
	if !reconnect {
		return
	}
	// The engine may have restarted while the socket was down: check
	// before the next live batch, so a restarted engine's old blocks are
	// gone before anything is scored against the new one.
	// A probe-up that came while the socket was down is answered by
	// this check, with its meaning (no replay: clear).
	probeUp := false
	select {
	case <-r.verifyReq:
		probeUp = true
	default:
	}
	r.verify(ctx, probeUp)
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
	res := r.apply(seq, payload)
	r.counts.batches++
	r.counts.stored += res.Stored
	r.counts.removed += res.Removed
}

// appliedCounts accumulates live batches between reports to a BatchObserver.
type appliedCounts struct{ batches, stored, removed int }

// appliedFlushBatches bounds how many applied batches a rank holds back
// from its BatchObserver while a backlog is being applied.
const appliedFlushBatches = 64

// flushApplied reports the accumulated live batches when the queue is
// empty or appliedFlushBatches have accumulated: one metric update per
// batch cost ≈ 0.4–0.6 µs (three labelled counters), a fifth of a small
// batch's receive and apply, so under a backlog the updates are batched.
func (r *rankSub) flushApplied(queued int) {
	c := r.counts
	if c.batches == 0 || (queued > 0 && c.batches < appliedFlushBatches) {
		return
	}
	r.counts = appliedCounts{}
	if bo, ok := r.ep.obs.(BatchObserver); ok {
		bo.Applied(r.ep.ref, r.rank, c.batches, c.stored, c.removed)
	}
}

// apply applies one batch and returns what it applied (zero when the
// payload did not decode).
func (r *rankSub) apply(seq uint64, payload []byte) IngestResult {
	res, err := r.ingest.Apply(payload)
	if err != nil {
		r.ep.obs.DecodeError(r.ep.ref, r.rank)
		r.log.Debug("kv subscriber: batch not applied", "seq", seq, "err", err)
	} else if res.Skipped > 0 {
		r.log.Debug("kv subscriber: events skipped", "seq", seq, "skipped", res.Skipped)
	}
	if res.BlockSize != 0 {
		g := r.ingest.Granularity
		if res.BadBlockSize {
			r.log.Warn("kv subscriber: the engine publishes block_size that is not a multiple of kvBlockSize; its blocks can never match a request and are not stored (requests skip the KV tier with reason hashes, kvgate_kv_skip_total{cause=\"block_size\"})",
				"block_size", res.BlockSize, "kvBlockSize", g.HashBlockSize())
		} else {
			r.log.Info("kv subscriber: engine block size", "block_size", res.BlockSize, "kvBlockSize", g.HashBlockSize(),
				"hashes_per_block", res.BlockSize/g.HashBlockSize(), "rule_step", g.Step())
		}
	}
	// A malformed payload still consumes its sequence number: asking for it
	// again would only fetch the same bytes.
	r.seq.Applied(seq)
	r.lastDigest = maphash.Bytes(r.digestSeed, payload)
	r.noteSeq()
	reportBlocks(r.ep.obs, r.ep.ref, r.ingest.Inventory, r.ingest.EPIdx)
	return res
}

func (r *rankSub) clear(reason ClearReason) {
	if err := r.ingest.Inventory.ClearRank(r.ingest.EPIdx, r.rank); err != nil {
		r.log.Warn("kv subscriber: clear failed", "err", err)
	}
	r.ep.obs.Cleared(r.ep.ref, r.rank, reason)
	reportBlocks(r.ep.obs, r.ep.ref, r.ingest.Inventory, r.ingest.EPIdx)
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
	start := time.Now()
	st, ok := r.replayFrom(ctx, 0, ReplayBootstrap, r.opts.BootstrapTimeout)
	if ok {
		secs := time.Since(start).Seconds()
		r.log.Info("kv subscriber: bootstrap replay done", "batches", st.Batches, "hashes", st.Hashes, "last_seq", r.seq.Last,
			"seconds", secs, "hashes_per_s", rate(st.Hashes, secs))
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
	st, ok := r.replayWith(ctx, start, ReplayGap, r.opts.RepairTimeout, func(first bool, seq uint64, _ []byte) bool {
		if first {
			covered = seq == start
		}
		return covered
	})
	return st, ok && covered
}

// verify checks that the engine behind the rank is still the one whose blocks
// the rank holds, after a socket rebuild or when the health probe saw the
// engine come back (probeUp). With a replay endpoint it asks for the buffer
// from L: the same engine still has batch L, byte for byte, and the batches
// after it are applied as a gap repair; a restarted engine has no batch L
// (its sequence restarted below L) or a different one, and the rank is
// cleared and rebuilt from the new engine's buffer. Without replay, a
// reconnect keeps the inventory (the spec's near reconnect; a restart still
// shows as the sequence going back), but a probe-up clears it: the engine
// was unreachable, and stale blocks score hits that are not there.
// See docs/ingest.md, "Engine restarts".
func (r *rankSub) verify(ctx context.Context, probeUp bool) {
	if !r.seq.Known {
		return // nothing applied, so nothing stale
	}
	last, digest := r.seq.Last, r.lastDigest
	if !r.replayUsable() {
		if probeUp {
			r.log.Info("kv subscriber: engine came back and there is no replay to check it; clearing rank", "last", last)
			r.clear(ClearUnverified)
		}
		return
	}
	same, decided := false, false
	st, ok := r.replayWith(ctx, last, ReplayVerify, r.opts.RepairTimeout, func(first bool, seq uint64, payload []byte) bool {
		if first {
			// Batch L decides, before anything is applied.
			decided = true
			same = seq == last && maphash.Bytes(r.digestSeed, payload) == digest
		}
		return same
	})
	if !ok {
		// Unknown: the live table still catches a sequence that goes back.
		return
	}
	if !decided {
		same = false // the buffer ends below L: the sequence restarted
	}
	if same {
		r.log.Debug("kv subscriber: same engine after reconnect", "last", last, "replay_last", st.Last)
		return
	}
	r.log.Info("kv subscriber: engine restarted while disconnected; clearing rank and replaying its new history",
		"last", last, "replay_first", st.First, "replay_batches", st.Batches)
	r.ep.obs.Sequence(r.ep.ref, r.rank, SeqRestart, 0)
	r.clear(ClearRestart)
	r.seq = SeqState{}
	r.noteSeq()
	r.replayFrom(ctx, 0, ReplayRestart, r.opts.RepairTimeout)
}

func (r *rankSub) replayFrom(ctx context.Context, start uint64, purpose ReplayPurpose, timeout time.Duration) (ReplayStats, bool) {
	return r.replayWith(ctx, start, purpose, timeout, nil)
}

// replayWith runs one replay exchange. accept, if set, is asked before each
// batch is applied and can stop the exchange. Afterwards every live message
// already queued is marked as overlapping the replay.
func (r *rankSub) replayWith(ctx context.Context, start uint64, purpose ReplayPurpose, timeout time.Duration,
	accept func(first bool, seq uint64, payload []byte) bool) (ReplayStats, bool) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, hashes := 0, 0
	began, lastLog := time.Now(), time.Now()
	st, err := fetchReplay(rctx, zmtpguard.Wrap(r.replay, uint64(r.opts.MaxFrameBytes)), start, r.opts.MaxReplayBatches, r.opts.DialTimeout, func(seq uint64, payload []byte) error {
		if accept != nil && !accept(n == 0, seq, payload) {
			return errReplayStop
		}
		n++
		if r.seq.Known && seq <= r.seq.Last {
			return nil
		}
		hashes += r.apply(seq, payload).Stored
		// A large inventory takes a while to replay: say how far it got.
		if now := time.Now(); now.Sub(lastLog) >= replayProgressEvery {
			lastLog = now
			secs := now.Sub(began).Seconds()
			r.log.Info("kv subscriber: replay progress", "purpose", purpose, "batches", n, "hashes", hashes,
				"seconds", secs, "hashes_per_s", rate(hashes, secs))
		}
		return nil
	})
	st.Hashes = hashes
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

// replayProgressEvery is how often a long replay logs its progress.
const replayProgressEvery = 5 * time.Second

func rate(n int, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(n) / secs
}
