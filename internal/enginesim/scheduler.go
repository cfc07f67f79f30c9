package enginesim

import (
	"time"
)

// This file is the step loop the profiles run: vLLM V1's scheduler over the
// block pool, with a step's duration taken from the profile's cost model
// (perf.go). docs/enginesim.md ("Step loop") describes it; the shape follows
// vLLM's vllm/v1/core/sched/scheduler.py:
//
//   - running requests first, in admission order: each gets the tokens it
//     still needs (1 while decoding, the rest of its prompt while
//     prefilling), capped by what is left of the step's token budget;
//   - a running request that cannot get KV blocks preempts the newest
//     running request (its blocks go back to the free queue with their
//     hashes, it recomputes later from the front of the waiting queue);
//   - if nothing was preempted, waiting requests are admitted FIFO while the
//     budget, max-num-seqs and free blocks allow; a prefix-cache hit skips
//     its blocks, and the head of the queue blocks the rest;
//   - full blocks are cached (BlockStored) when scheduled, and the step's
//     events go out as one batch.
//
// The step then takes its modelled time; when it ends, every request whose
// known tokens are all computed samples one token.

// maxStepLateness bounds how far back a step may start: a wake-up later than
// this after the previous step's end means the engine sat idle, and the next
// step starts now.
const maxStepLateness = 2 * time.Millisecond

// scheduled is one request's share of a step.
type scheduled struct {
	r         *request
	newTokens int
	decode    bool
}

// stepPlan is the step in flight.
type stepPlan struct {
	start, end time.Time // wall clock
	model      time.Duration
	batch      []scheduled
	load       stepLoad
}

// numTokens is how many tokens of r are known: the prompt and every token
// sampled so far.
func (r *request) numTokens() int { return len(r.prompt) + r.emitted }

// runStepped is the engine loop of the step models. One goroutine owns the
// pool and the queues; requests that arrive during a step wait for the next
// one, as they would in vLLM's engine core.
func (e *Engine) runStepped() {
	defer close(e.loopDone)
	st := &loopState{pool: e.pool, cpu: e.cpu, leases: make(map[string]lease)}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var inFlight *stepPlan
	for {
		select {
		case <-e.closing:
			e.shutdownLoop(st)
			return
		case r := <-e.submit:
			e.queueSubmitted(st, r)
		case r := <-e.abort:
			e.abortStepped(st, r)
		case id := <-e.releaseLease:
			if l, ok := st.leases[id]; ok {
				st.pool.free(l.blocks)
				delete(st.leases, id)
			}
		case c := <-e.ctl:
			c.done <- c.fn(st)
		case <-timer.C:
		}
		now := time.Now()
		var lastEnd time.Time
		if inFlight != nil && !inFlight.end.After(now) {
			e.completeStep(st, inFlight)
			lastEnd = inFlight.end
			inFlight = nil
		}
		e.expireLeases(st, now)
		if inFlight == nil {
			// A busy engine starts its next step when the last one ends;
			// timer lateness on a loaded machine must not add up across
			// steps, so a slightly late wake-up starts from the previous end.
			start := now
			if !lastEnd.IsZero() && now.Sub(lastEnd) < maxStepLateness {
				start = lastEnd
			}
			inFlight = e.scheduleStep(st, start)
		}
		e.publishStep(st.stepEvents(), now)
		e.updateGauges(st)

		rearm(timer, nextWake(st, inFlight))
	}
}

// queueSubmitted queues a submitted request, or refuses it when the waiting queue is
// full.
func (e *Engine) queueSubmitted(st *loopState, r *request) {
	if len(st.waiting) >= e.cfg.MaxWaiting {
		r.out.send(stepOutput{finished: true, err: errQueueFull})
		return
	}
	r.out.send(stepOutput{accepted: true})
	st.waiting = append(st.waiting, r)
}

// nextWake is when the loop must run again without any message: the end of
// the step in flight or the earliest lease expiry (zero: neither).
func nextWake(st *loopState, inFlight *stepPlan) time.Time {
	var next time.Time
	if inFlight != nil {
		next = inFlight.end
	}
	for _, l := range st.leases {
		if next.IsZero() || l.expires.Before(next) {
			next = l.expires
		}
	}
	return next
}

// rearm resets timer to fire at next, or in an hour when next is zero (the
// loop then waits for messages only).
func rearm(timer *time.Timer, next time.Time) {
	if !timer.Stop() {
		select {
		case <-timer.C:
		default:
		}
	}
	if next.IsZero() {
		timer.Reset(time.Hour)
	} else {
		timer.Reset(max(time.Until(next), 0))
	}
}

func (e *Engine) expireLeases(st *loopState, now time.Time) {
	for id, l := range st.leases {
		if !l.expires.After(now) {
			st.pool.free(l.blocks)
			delete(st.leases, id)
			e.cfg.Logger.Warn("kv transfer lease expired before the decoder read the blocks", "request_id", id)
		}
	}
}

// abortStepped drops a request whose client went away. A request in the
// step in flight keeps its place in the batch (the GPU is already running
// it) but frees its blocks now; completeStep skips it.
func (e *Engine) abortStepped(st *loopState, r *request) {
	for i, w := range st.waiting {
		if w == r {
			st.waiting = append(st.waiting[:i], st.waiting[i+1:]...)
			if len(r.blocks) > 0 {
				st.pool.free(r.blocks)
				r.blocks = nil
			}
			r.finished = true
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

// blocksFor is how many blocks hold tokens tokens.
func (e *Engine) blocksFor(tokens int) int { return ceilDiv(tokens, e.cfg.BlockSize) }

// scheduleStep plans one step at start (nil when there is nothing to run).
func (e *Engine) scheduleStep(st *loopState, start time.Time) *stepPlan {
	budget := e.cfg.MaxNumBatchedTokens
	plan := &stepPlan{start: start}
	preempted := false

	// Running requests, oldest first. Preemption pops from the tail, so a
	// request already given tokens this step is never the victim.
	for i := 0; i < len(st.running) && budget > 0; i++ {
		r := st.running[i]
		need := r.numTokens() - r.numComputed
		if need <= 0 {
			continue
		}
		n := min(need, budget)
		ok := true
		for e.blocksFor(r.numComputed+n)-len(r.blocks) > st.pool.numFree {
			victim := st.running[len(st.running)-1]
			st.running = st.running[:len(st.running)-1]
			e.preempt(st, victim)
			preempted = true
			if victim == r {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		e.growTo(st, r, r.numComputed+n)
		plan.add(r, n, !r.prefilling)
		budget -= n
	}

	// Waiting requests, FIFO, only in a step that preempted nothing (a
	// preempted request must not be overtaken by newer ones).
	for !preempted && budget > 0 && len(st.waiting) > 0 && len(st.running) < e.cfg.MaxNumSeqs {
		r := st.waiting[0]
		if r.ctx.Err() != nil {
			st.waiting = st.waiting[1:]
			r.finished = true
			continue
		}
		total := r.numTokens()
		capBlocks := (total - 1) / e.cfg.BlockSize // the last token is always recomputed
		hit := st.pool.lookup(r.chain[:min(capBlocks, len(r.chain))])
		computed := hit * e.cfg.BlockSize
		external, reload := 0, 0
		if r.remote != nil && r.preemptions == 0 {
			// The prefill engine computed everything but the last prompt
			// token, which vLLM recomputes locally.
			external = max(len(r.prompt)-1-computed, 0)
		} else if reload = e.offloadHit(st, r.chain, hit, capBlocks); reload > 0 {
			external = reload * e.cfg.BlockSize
		}
		n := total - computed - external
		if e.cfg.DisableChunkedPrefill && n > budget {
			break
		}
		n = min(n, budget)
		if !st.pool.canAdmit(r.chain, hit, e.blocksFor(computed+external+n)) {
			break
		}
		st.waiting = st.waiting[1:]
		r.blocks = st.pool.acquireHits(r.chain, hit)
		r.numCached = hit
		r.numComputed = computed + external
		r.prefilling = true
		if !r.admitted {
			r.admitted = true
			r.hitBlocks, r.reloadBlocks = hit, reload
			r.scheduledAt = start
			e.countAdmission(r, hit, external)
		}
		plan.load.reloadTokens += reload * e.cfg.BlockSize
		e.growTo(st, r, r.numComputed+n)
		st.running = append(st.running, r)
		plan.add(r, n, false)
		budget -= n
	}
	if len(plan.batch) == 0 {
		return nil
	}
	plan.model = e.cfg.Step.duration(plan.load) + e.reloadTime(plan.load.reloadTokens)
	plan.end = start.Add(e.wall(plan.model))
	return plan
}

func (p *stepPlan) add(r *request, n int, decode bool) {
	p.batch = append(p.batch, scheduled{r: r, newTokens: n, decode: decode})
	if decode {
		p.load.decodeSeqs++
	} else {
		p.load.prefillTokens += n
	}
	p.load.contextTokens += r.numComputed + n
}

// growTo allocates r's blocks for its first tokens tokens (the caller
// checked there are enough free) and caches the ones that become full, as
// vLLM's allocate_slots does at schedule time.
func (e *Engine) growTo(st *loopState, r *request, tokens int) {
	for len(r.blocks) < e.blocksFor(tokens) {
		e.allocateBlock(st, r)
	}
	e.cacheComputed(st, r, tokens)
}

// preempt frees a running request's blocks (they stay cached until
// reallocated) and puts it at the front of the waiting queue to recompute
// its prompt and generated tokens.
func (e *Engine) preempt(st *loopState, r *request) {
	e.offloadFinish(st, r)
	st.pool.free(r.blocks)
	r.blocks = nil
	r.numCached = 0
	r.numComputed = 0
	r.prefilling = false
	r.preemptions++
	e.metrics.preemptions.Inc()
	st.waiting = append([]*request{r}, st.waiting...)
}

// countAdmission records a request's first scheduling in vLLM's counters.
func (e *Engine) countAdmission(r *request, hit, external int) {
	n := len(r.prompt)
	e.metrics.prefixQueries.Add(float64(n))
	e.metrics.prefixHits.Add(float64(hit * e.cfg.BlockSize))
	if r.remote != nil || external > 0 {
		e.metrics.externalQueries.Add(float64(n - hit*e.cfg.BlockSize))
		e.metrics.externalHits.Add(float64(external))
	} else if e.cfg.Role == RoleDecode {
		e.metrics.decodeLocalPrefills.Inc()
	}
	e.metrics.promptTokens.Add(float64(n))
}

// completeStep applies the step's results: computed tokens advance, and
// every request whose known tokens are all computed samples its next one.
func (e *Engine) completeStep(st *loopState, plan *stepPlan) {
	modelEnd := plan.end
	for _, s := range plan.batch {
		r := s.r
		if r.finished {
			continue // aborted during the step
		}
		r.numComputed += s.newTokens
		if r.numComputed < r.numTokens() {
			continue // a prefill chunk; more of the prompt next step
		}
		r.prefilling = false
		r.nextAt = modelEnd
		if r.emitted == 0 {
			ttft := e.model(modelEnd.Sub(r.arrival))
			e.metrics.ttft.Observe(ttft.Seconds())
			r.emitted = 1
			e.metrics.generationTokens.Inc()
			r.out.send(stepOutput{
				tokens:       r.output[:1],
				first:        true,
				cachedTokens: (r.hitBlocks + r.reloadBlocks) * e.cfg.BlockSize, // connector-loaded tokens count, as in vLLM
				queueTime:    e.model(r.scheduledAt.Sub(r.arrival)),
				ttft:         ttft,
			})
		} else {
			r.out.send(stepOutput{tokens: r.output[r.emitted : r.emitted+1]})
			r.emitted++
			e.metrics.generationTokens.Inc()
		}
		if r.emitted >= r.maxTokens {
			e.finishRequest(st, r, "length")
		}
	}
	kept := st.running[:0]
	for _, r := range st.running {
		if !r.finished {
			kept = append(kept, r)
		}
	}
	clear(st.running[len(kept):])
	st.running = kept
}

// wall turns a model duration into wall-clock time (--time-scale).
func (e *Engine) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) * e.cfg.TimeScale)
}

// model turns a wall-clock duration into model time.
func (e *Engine) model(d time.Duration) time.Duration {
	return time.Duration(float64(d) / e.cfg.TimeScale)
}
