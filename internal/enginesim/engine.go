package enginesim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// stepOutput is what the engine loop tells a request's HTTP handler: new
// tokens, and on the last message the finish details. The first message marks
// the first token; its times are the model's figures.
type stepOutput struct {
	tokens       []uint32
	accepted     bool // the loop queued the request (the stream's head may go out)
	first        bool
	finished     bool
	finishReason string
	err          error

	cachedTokens int           // prefix-cache hit, tokens (usage.cached_tokens)
	queueTime    time.Duration // arrival to scheduled
	ttft         time.Duration // arrival to first token, model time

	kvTransferParams map[string]any // prefill role: for the decoder
}

// remoteKV is what a decode engine accepted from kv_transfer_params.
type remoteKV struct {
	engineID  string
	requestID string
	notifyURL string
}

// request is one engine request (one prompt, n=1) from admission to finish.
type request struct {
	id        string
	prompt    []uint32
	extra     kvhash.Extra
	maxTokens int
	output    []uint32 // the whole synthetic completion, decided up front

	remote         *remoteKV // decode role: prompt KV comes from a prefill engine
	doRemoteDecode bool      // prefill role: keep the blocks for a decoder

	arrival time.Time
	out     *outbox // loop to handler; never blocks the loop
	ctx     context.Context

	// Loop-owned state.
	chain       []blockHash // hashes of full blocks, prompt then decode-filled
	blocks      []blockID
	numCached   int // leading blocks of this request that are in the cache index
	reservedRem int // blocks reserved but not yet allocated
	hitBlocks   int
	scheduledAt time.Time
	nextAt      time.Time // prefill end, then the next token's time
	emitted     int       // completion tokens sent
	finished    bool

	// Step-loop state (scheduler.go).
	numComputed int  // tokens whose KV is computed (or scheduled in the step in flight)
	prefilling  bool // admitted and not yet sampled since: its tokens count as prefill
	admitted    bool // scheduled at least once (cached_tokens and counters are from then)
	preemptions int

	offloadPending []string // digests whose CPU store is in flight (offload.go)
	reloadBlocks   int      // blocks reloaded from the CPU tier at admission
}

// totalTokens is how many tokens ever hold KV: the prompt and every generated
// token but the last (it is sampled, never fed back).
func (r *request) totalTokens() int { return len(r.prompt) + r.maxTokens - 1 }

// tokenAt returns the token at position i of the request (prompt, then output).
func (r *request) tokenAt(i int) uint32 {
	if i < len(r.prompt) {
		return r.prompt[i]
	}
	return r.output[i-len(r.prompt)]
}

func (r *request) tokens(from, to int) []uint32 {
	out := make([]uint32, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, r.tokenAt(i))
	}
	return out
}

// lease is a prefill-role request's blocks kept for the decoder.
type lease struct {
	blocks  []blockID
	expires time.Time
}

// loopState is everything the engine loop owns.
type loopState struct {
	pool    *blockPool
	cpu     *cpuTier // nil without --num-cpu-blocks (offload.go)
	waiting []*request
	running []*request
	leases  map[string]lease
}

// errEngineClosed is returned to requests still in flight at Close.
var errEngineClosed = errors.New("engine is shutting down")

// ctlMsg runs fn inside the loop (reset, stats) and returns its error.
type ctlMsg struct {
	fn   func(*loopState) error
	done chan error
}

// run is the engine loop: one goroutine owns the pool and the queues. Each
// wake-up is one engine step: it finishes prefills and decode tokens that are
// due, admits waiting requests, and publishes the step's KV events as one
// batch.
func (e *Engine) run() {
	if e.cfg.stepped() {
		e.runStepped()
		return
	}
	defer close(e.loopDone)
	st := &loopState{pool: e.pool, cpu: e.cpu, leases: make(map[string]lease)}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-e.closing:
			e.shutdownLoop(st)
			return
		case r := <-e.submit:
			if len(st.waiting) >= e.cfg.MaxWaiting {
				r.out.send(stepOutput{finished: true, err: errQueueFull})
				break
			}
			r.out.send(stepOutput{accepted: true})
			st.waiting = append(st.waiting, r)
		case r := <-e.abort:
			e.abortRequest(st, r)
		case id := <-e.releaseLease:
			if l, ok := st.leases[id]; ok {
				st.pool.free(l.blocks)
				delete(st.leases, id)
			}
		case c := <-e.ctl:
			c.done <- c.fn(st)
		case <-timer.C:
		}
		next := e.step(st, time.Now())
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
		} else {
			timer.Reset(time.Hour)
		}
	}
}

var errQueueFull = errors.New("waiting queue is full")

func (e *Engine) shutdownLoop(st *loopState) {
	for _, r := range st.waiting {
		r.out.send(stepOutput{finished: true, err: errEngineClosed})
	}
	for _, r := range st.running {
		if !r.finished {
			r.out.send(stepOutput{finished: true, err: errEngineClosed})
		}
	}
}

func (e *Engine) abortRequest(st *loopState, r *request) {
	for i, w := range st.waiting {
		if w == r {
			st.waiting = append(st.waiting[:i], st.waiting[i+1:]...)
			return
		}
	}
	for i, w := range st.running {
		if w == r {
			st.running = append(st.running[:i], st.running[i+1:]...)
			e.finishRequest(st, r, "abort")
			return
		}
	}
}

// step advances the model to now and returns when it next needs to wake.
func (e *Engine) step(st *loopState, now time.Time) time.Time {
	// Requests that are due: prefill completions and decode tokens. Like a
	// vLLM step, each request advances by at most one token; a request that
	// is still due afterwards makes the loop run another step at once.
	kept := st.running[:0]
	for _, r := range st.running {
		if !r.nextAt.After(now) {
			e.advance(st, r)
		}
		if !r.finished {
			kept = append(kept, r)
		}
	}
	clear(st.running[len(kept):])
	st.running = kept

	for id, l := range st.leases {
		if !l.expires.After(now) {
			st.pool.free(l.blocks)
			delete(st.leases, id)
			e.cfg.Logger.Warn("kv transfer lease expired before the decoder read the blocks", "request_id", id)
		}
	}

	e.admit(st, now)
	e.publishStep(st.stepEvents(), now)
	e.updateGauges(st)

	var next time.Time
	for _, r := range st.running {
		if next.IsZero() || r.nextAt.Before(next) {
			next = r.nextAt
		}
	}
	for _, l := range st.leases {
		if next.IsZero() || l.expires.Before(next) {
			next = l.expires
		}
	}
	return next
}

// admit schedules waiting requests in FIFO order while there is a free
// sequence slot and enough KV blocks; the head of the queue blocks the rest.
func (e *Engine) admit(st *loopState, now time.Time) {
	bs := e.cfg.BlockSize
	for len(st.waiting) > 0 && len(st.running) < e.cfg.MaxNumSeqs {
		r := st.waiting[0]
		if r.ctx.Err() != nil {
			st.waiting = st.waiting[1:]
			continue
		}
		n := len(r.prompt)
		capBlocks := (n - 1) / bs // a fully cached prompt still recomputes its last token
		hit := st.pool.lookup(r.chain[:min(capBlocks, len(r.chain))])
		reload := e.offloadHit(st, r.chain, hit, capBlocks)
		total := ceilDiv(r.totalTokens(), bs)
		if !st.pool.canAdmit(r.chain, hit, total) {
			break
		}
		st.waiting = st.waiting[1:]
		// Evictions this allocation causes are published with this step,
		// before the prefill's BlockStored: deferring them to the prefill's
		// end could reorder them after another request re-storing the
		// same hash.
		r.blocks = st.pool.acquireHits(r.chain, hit)
		r.hitBlocks, r.numCached, r.reloadBlocks = hit, hit, reload
		st.pool.reserve(total - hit)
		r.reservedRem = total - hit
		for len(r.blocks) < ceilDiv(n, bs) {
			e.allocateBlock(st, r)
		}
		r.scheduledAt = now
		uncached := n - hit*bs
		e.metrics.prefixQueries.Add(float64(n))
		e.metrics.prefixHits.Add(float64(hit * bs))
		if r.remote != nil {
			// The prefill engine computed everything but the last token,
			// which vLLM always recomputes locally.
			external := max(n-1-hit*bs, 0)
			e.metrics.externalQueries.Add(float64(uncached))
			e.metrics.externalHits.Add(float64(external))
			uncached -= external
		} else if e.cfg.Role == RoleDecode {
			e.metrics.decodeLocalPrefills.Inc()
		}
		// vLLM counts every prompt token here, cached or not.
		e.metrics.promptTokens.Add(float64(n))
		if reload > 0 {
			// Blocks reloaded from CPU count as external hits, as vLLM
			// counts a connector's, and cost the reload, not a prefill.
			e.metrics.externalQueries.Add(float64(uncached))
			e.metrics.externalHits.Add(float64(reload * bs))
			uncached -= reload * bs
		}
		r.nextAt = now.Add(e.prefillTime(uncached) + e.reloadTime(reload*bs))
		st.running = append(st.running, r)
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// prefillTime is the timing model's prefill: the floor plus the per-token
// cost of every token not served from the prefix cache.
func (e *Engine) prefillTime(uncachedTokens int) time.Duration {
	return e.wall(e.cfg.TTFTFloor + time.Duration(e.cfg.PrefillUsPerToken*float64(uncachedTokens)*float64(time.Microsecond)))
}

// decodeInterval is the time between two tokens of one sequence.
func (e *Engine) decodeInterval() time.Duration {
	if e.cfg.DecodeTokensPerS <= 0 {
		return 0
	}
	return e.wall(time.Duration(float64(time.Second) / e.cfg.DecodeTokensPerS))
}

func (e *Engine) allocateBlock(st *loopState, r *request) {
	id, err := st.pool.allocate()
	if err != nil {
		// canAdmit reserved the blocks, so this is a bug; fail the request
		// rather than the engine.
		e.cfg.Logger.Error("KV block allocation failed", "request_id", r.id, "err", err)
		return
	}
	r.blocks = append(r.blocks, id)
	if r.reservedRem > 0 {
		r.reservedRem--
	}
}

// advance performs the request's next due action: prefill completion (first
// token) or one decode token.
func (e *Engine) advance(st *loopState, r *request) {
	bs := e.cfg.BlockSize
	if r.emitted == 0 {
		// Prefill done: the whole prompt is computed.
		e.cacheComputed(st, r, len(r.prompt))
		ttft := e.model(r.nextAt.Sub(r.arrival))
		e.metrics.ttft.Observe(ttft.Seconds())
		r.emitted = 1
		e.metrics.generationTokens.Inc()
		r.out.send(stepOutput{
			tokens:       r.output[:1],
			first:        true,
			cachedTokens: (r.hitBlocks + r.reloadBlocks) * bs, // vLLM counts connector-loaded tokens as cached
			queueTime:    e.model(r.scheduledAt.Sub(r.arrival)),
			ttft:         ttft,
		})
	} else {
		// This step computes the previous token and samples the next one.
		computed := len(r.prompt) + r.emitted
		if need := ceilDiv(computed, bs); len(r.blocks) < need {
			e.allocateBlock(st, r)
		}
		e.cacheComputed(st, r, computed)
		r.out.send(stepOutput{tokens: r.output[r.emitted : r.emitted+1]})
		r.emitted++
		e.metrics.generationTokens.Inc()
	}
	if r.emitted >= r.maxTokens {
		e.finishRequest(st, r, "length")
		return
	}
	r.nextAt = r.nextAt.Add(e.decodeInterval())
}

// cacheComputed hashes and caches the request's blocks that became full now
// that computed tokens hold KV (one BlockStored for them).
func (e *Engine) cacheComputed(st *loopState, r *request, computed int) {
	bs := e.cfg.BlockSize
	if e.cfg.Engine == EngineTRTLLM {
		// TensorRT-LLM keys the blocks of all but the last token
		// (kvCacheManager.cpp, usableSize = size - 1).
		computed--
	}
	full := min(computed/bs, len(r.blocks))
	if full <= r.numCached {
		return
	}
	for len(r.chain) < full {
		i := len(r.chain)
		var parent []byte
		if i > 0 {
			parent = r.chain[i-1].Digest
		}
		d, w := e.hasher.Extend(parent, i, r.tokens(i*bs, (i+1)*bs), r.extra, nil)
		r.chain = append(r.chain, blockHash{Digest: d, Wire: w})
	}
	var parent *blockHash
	if r.numCached > 0 {
		parent = &r.chain[r.numCached-1]
	}
	st.pool.cacheFull(r.blocks[r.numCached:full], r.chain[r.numCached:full], parent, r.tokens(r.numCached*bs, full*bs), r.extra, r.numCached)
	e.offloadStore(st, r, r.chain[:full], r.chain[r.numCached:full])
	r.numCached = full
}

// finishRequest frees (or, for a prefill handing off to a decoder, leases)
// the request's blocks and sends the final message.
func (e *Engine) finishRequest(st *loopState, r *request, reason string) {
	r.finished = true
	e.offloadFinish(st, r)
	st.pool.release(r.reservedRem)
	r.reservedRem = 0
	var params map[string]any
	if reason == "length" && r.doRemoteDecode && e.cfg.Role != RoleDecode {
		params = e.kvTransferParams(r)
		st.leases[r.id] = lease{blocks: r.blocks, expires: r.nextAt.Add(e.cfg.KVTransferTimeout)}
	} else {
		st.pool.free(r.blocks)
	}
	if reason == "abort" {
		return
	}
	e.metrics.requestSuccess.WithLabelValues(reason).Inc()
	r.out.send(stepOutput{finished: true, finishReason: reason, kvTransferParams: params})
}

// kvTransferParams is what vLLM's NixlConnector returns from a prefill
// engine (classic field set), plus an enginesim-only notify URL that lets a
// simulated decoder release the blocks as soon as it has "read" them.
func (e *Engine) kvTransferParams(r *request) map[string]any {
	ids := make([]int, len(r.blocks))
	for i, b := range r.blocks {
		ids[i] = int(b)
	}
	return map[string]any{
		"do_remote_prefill":    true,
		"do_remote_decode":     false,
		"remote_block_ids":     ids,
		"remote_engine_id":     e.engineUUID,
		"remote_request_id":    r.id,
		"remote_host":          e.cfg.Host,
		"remote_port":          e.cfg.NixlSideChannelPort + e.cfg.DataParallelRank,
		"tp_size":              1,
		"enginesim_notify_url": e.URL() + notifyPath,
	}
}

// runInLoop executes fn on the loop goroutine, bounded by ctx.
func (e *Engine) runInLoop(ctx context.Context, fn func(*loopState) error) error {
	c := ctlMsg{fn: fn, done: make(chan error, 1)}
	select {
	case e.ctl <- c:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		return errEngineClosed
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-e.loopDone:
		return errEngineClosed
	}
}

// resetPrefixCache clears the cache (AllBlocksCleared), refusing while
// blocks are in use.
func (e *Engine) resetPrefixCache(ctx context.Context) error {
	return e.runInLoop(ctx, func(st *loopState) error {
		if err := st.pool.reset(); err != nil {
			return err
		}
		e.publishStep(st.stepEvents(), time.Now())
		return nil
	})
}

func (e *Engine) updateGauges(st *loopState) {
	e.metrics.running.Set(float64(len(st.running)))
	e.metrics.waiting.Set(float64(len(st.waiting)))
	e.metrics.kvUsage.Set(st.pool.usage())
}

// CacheStats is a snapshot of the prefix cache for tests and kvctl.
type CacheStats struct {
	CachedBlocks int
	UsedBlocks   int
	UsableBlocks int
	Running      int
	Waiting      int
}

// Stats returns a snapshot taken inside the engine loop.
// With attention-DP ranks (Config.DPSize) it sums every rank's.
func (e *Engine) Stats(ctx context.Context) (CacheStats, error) {
	s, err := e.rankStats(ctx)
	for _, r := range e.dpRanks {
		if err != nil {
			break
		}
		var rs CacheStats
		rs, err = r.rankStats(ctx)
		s.CachedBlocks += rs.CachedBlocks
		s.UsedBlocks += rs.UsedBlocks
		s.UsableBlocks += rs.UsableBlocks
		s.Running += rs.Running
		s.Waiting += rs.Waiting
	}
	return s, err
}

func (e *Engine) rankStats(ctx context.Context) (CacheStats, error) {
	var s CacheStats
	err := e.runInLoop(ctx, func(st *loopState) error {
		s = CacheStats{
			CachedBlocks: st.pool.cachedBlocks(),
			UsedBlocks:   st.pool.usable() - st.pool.numFree,
			UsableBlocks: st.pool.usable(),
			Running:      len(st.running),
			Waiting:      len(st.waiting),
		}
		return nil
	})
	return s, err
}

// newRequest prepares a request: its synthetic output and prompt hashes.
func (e *Engine) newRequest(ctx context.Context, id string, prompt []uint32, extra kvhash.Extra, maxTokens int) (*request, error) {
	if len(prompt) == 0 {
		return nil, errors.New("prompt is empty")
	}
	if maxTokens < 1 {
		return nil, fmt.Errorf("max_tokens must be at least 1, got %d", maxTokens)
	}
	r := &request{
		id:        id,
		prompt:    prompt,
		extra:     extra,
		maxTokens: maxTokens,
		output:    syntheticOutput(prompt, e.outVocab, maxTokens),
		arrival:   time.Now(),
		out:       newOutbox(),
		ctx:       ctx,
	}
	keyed := prompt
	if e.cfg.Engine == EngineTRTLLM {
		keyed = kvhash.TRTLLMRequestTokens(prompt) // the last token's KV is not computed yet
	}
	for _, b := range e.hasher.AppendBlocks(nil, keyed, extra) {
		r.chain = append(r.chain, blockHash{Digest: b.Digest, Wire: b.Hash})
	}
	if need := ceilDiv(r.totalTokens(), e.cfg.BlockSize); need > e.pool.usable() {
		return nil, fmt.Errorf("request needs %d KV blocks (%d prompt + %d completion tokens) but the engine has %d", need, len(prompt), maxTokens, e.pool.usable())
	}
	return r, nil
}

// enqueue hands r to the loop.
func (e *Engine) enqueue(ctx context.Context, r *request) error {
	select {
	case e.submit <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		return errEngineClosed
	}
}

// cancel tells the loop a request's client went away (best effort).
func (e *Engine) cancel(r *request) {
	e.metrics.aborted.Inc()
	select {
	case e.abort <- r:
	case <-e.closing:
	}
}
