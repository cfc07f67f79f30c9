package enginesim

import (
	"context"
	"net/http"
	"time"
)

// The debug endpoints expose the engine's true state to a benchmark's oracle
// policy (docs/enginesim.md, "Debug state"). They exist only with
// --debug-state; a router must learn what it knows from KV events and
// metrics like any client of vLLM.

// debugPerf is the "perf" object of GET /debug/state.
type debugPerf struct {
	Model string `json:"model"`
	StepPerf
	MaxNumBatchedTokens int `json:"max_num_batched_tokens"`
	MaxNumSeqs          int `json:"max_num_seqs"`
}

// debugState is GET /debug/state.
type debugState struct {
	EngineID             string    `json:"engine_id"`
	NowUnixNano          int64     `json:"now_unix_nano"`
	Running              int       `json:"running"`
	Waiting              int       `json:"waiting"`
	PendingPrefillTokens int       `json:"pending_prefill_tokens"`
	KVBlocksUsed         int       `json:"kv_blocks_used"`
	KVBlocksTotal        int       `json:"kv_blocks_total"`
	BlockSize            int       `json:"block_size"`
	Perf                 debugPerf `json:"perf"`
	PredictedTTFTPer1k   float64   `json:"predicted_ttft_s_for_new_tokens_per_1k"`
}

// perfSummary is the cost model in the step model's terms. The simple model
// maps onto it as a floor, a per-token prefill cost and a per-sequence
// decode interval, with no attention term.
func (e *Engine) perfSummary() debugPerf {
	p := debugPerf{Model: e.cfg.PerfModel, MaxNumBatchedTokens: e.cfg.MaxNumBatchedTokens, MaxNumSeqs: e.cfg.MaxNumSeqs}
	if e.cfg.stepped() {
		p.StepPerf = e.cfg.Step
		return p
	}
	p.StepFloorS = e.cfg.TTFTFloor.Seconds()
	p.PrefillSPerToken = e.cfg.PrefillUsPerToken * 1e-6
	if e.cfg.DecodeTokensPerS > 0 {
		p.DecodeSPerSeq = 1 / e.cfg.DecodeTokensPerS
	}
	return p
}

// pendingPrefill is how many prompt tokens r still has to prefill: all its
// uncached tokens while it waits, the rest of its prompt while a prefill is
// under way, nothing once it decodes.
func (e *Engine) pendingPrefill(st *loopState, r *request, waiting bool) int {
	if waiting {
		total := r.numTokens()
		capBlocks := (total - 1) / e.cfg.BlockSize
		hit := st.pool.lookup(r.chain[:min(capBlocks, len(r.chain))])
		return total - hit*e.cfg.BlockSize
	}
	if e.cfg.stepped() {
		if r.prefilling {
			return r.numTokens() - r.numComputed
		}
		return 0
	}
	if r.emitted == 0 {
		return len(r.prompt) - r.hitBlocks*e.cfg.BlockSize
	}
	return 0
}

func (e *Engine) handleDebugState(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	var ds debugState
	err := e.runInLoop(ctx, func(st *loopState) error {
		ds = e.debugSnapshot(st, time.Now())
		return nil
	})
	if err != nil {
		writeError(w, &badRequest{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, ds)
}

// debugSnapshot is GET /debug/state, taken inside the engine loop.
func (e *Engine) debugSnapshot(st *loopState, now time.Time) debugState {
	ds := debugState{
		EngineID:      e.cfg.ID,
		NowUnixNano:   now.UnixNano(),
		Running:       len(st.running),
		Waiting:       len(st.waiting),
		KVBlocksUsed:  st.pool.usable() - st.pool.numFree,
		KVBlocksTotal: st.pool.usable(),
		BlockSize:     e.cfg.BlockSize,
		Perf:          e.perfSummary(),
	}
	decodeSeqs, decodeContext := 0, 0
	for _, q := range st.waiting {
		ds.PendingPrefillTokens += e.pendingPrefill(st, q, true)
	}
	for _, q := range st.running {
		if n := e.pendingPrefill(st, q, false); n > 0 {
			ds.PendingPrefillTokens += n
		} else {
			decodeSeqs++
			decodeContext += q.numTokens()
		}
	}
	if e.cfg.stepped() {
		ds.PredictedTTFTPer1k = e.cfg.Step.secondsPer1kNewTokens(e.cfg.MaxNumBatchedTokens, decodeSeqs, decodeContext)
	} else {
		ds.PredictedTTFTPer1k = 1000 * ds.Perf.PrefillSPerToken
	}
	return ds
}

// handleDebugMatch answers how many tokens of a prompt the prefix cache
// holds now, counted as the scheduler counts a hit (leading full blocks, at
// most floor((n-1)/block size)), without touching LRU order or any state.
func (e *Engine) handleDebugMatch(w http.ResponseWriter, r *http.Request) {
	var parse func(*http.Request) (genParams, *badRequest)
	switch path := r.Header.Get("X-Debug-Path"); path {
	case "/v1/completions":
		parse = e.completionParams
	case "/v1/chat/completions":
		parse = e.chatParams
	default:
		writeError(w, invalid("X-Debug-Path %q: want /v1/completions or /v1/chat/completions", path))
		return
	}
	p, b := parse(r)
	if b != nil {
		writeError(w, b)
		return
	}
	var chain []blockHash
	for _, blk := range e.hasher.AppendBlocks(nil, p.prompt, p.extra) {
		chain = append(chain, blockHash{Digest: blk.Digest, Wire: blk.Hash})
	}
	capBlocks := (len(p.prompt) - 1) / e.cfg.BlockSize
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	hit, cpuHit := 0, 0
	if err := e.runInLoop(ctx, func(st *loopState) error {
		hit = st.pool.lookup(chain[:min(capBlocks, len(chain))])
		cpuHit = st.cpu.lookup(chain[hit:min(capBlocks, len(chain))])
		return nil
	}); err != nil {
		writeError(w, &badRequest{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		return
	}
	// cpu_cached_tokens: the tokens after the GPU hit that would reload from
	// the CPU offload tier (0 without one).
	writeJSON(w, http.StatusOK, map[string]int{"prompt_tokens": len(p.prompt), "cached_tokens": hit * e.cfg.BlockSize,
		"cpu_cached_tokens": cpuHit * e.cfg.BlockSize})
}
