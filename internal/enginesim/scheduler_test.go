package enginesim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// schedHarness drives the step loop's scheduler by hand, one step at a time,
// with no goroutine and no wall clock: scheduleStep plans a step and
// completeStep ends it at its modelled end.
type schedHarness struct {
	t      testing.TB
	e      *Engine
	st     *loopState
	now    time.Time
	n      int
	events [][]poolEvent // each step's batch, as it would be published
}

func newSchedHarness(t testing.TB, cfg Config) *schedHarness {
	t.Helper()
	if cfg.PerfModel == "" {
		cfg.PerfModel = DefaultPerfModel
	}
	cfg.PythonHashSeed, cfg.HashSeedSet = "0", true
	cfg.Logger = quietLogger()
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: cfg, tok: byteTokenizer{}}
	e.outVocab = outputVocabulary(e.tok)
	var err error
	if e.hasher, err = newHasher(cfg); err != nil {
		t.Fatal(err)
	}
	if e.pool, err = newBlockPool(cfg.NumGPUBlocks); err != nil {
		t.Fatal(err)
	}
	e.cpu = newCPUTier(cfg.NumCPUBlocks)
	e.metrics = newEngineMetrics(cfg)
	return &schedHarness{t: t, e: e, st: &loopState{pool: e.pool, cpu: e.cpu, leases: map[string]lease{}}, now: time.Unix(1000, 0)}
}

func (h *schedHarness) submit(prompt []uint32, maxTokens int) *request {
	h.t.Helper()
	h.n++
	r, err := h.e.newRequest(context.Background(), fmt.Sprintf("req-%d", h.n), prompt, kvhash.Extra{}, maxTokens)
	if err != nil {
		h.t.Fatal(err)
	}
	r.arrival = h.now
	h.st.waiting = append(h.st.waiting, r)
	return r
}

// step runs one engine step and returns its plan (nil when idle).
func (h *schedHarness) step() *stepPlan {
	plan := h.e.scheduleStep(h.st, h.now)
	if plan == nil {
		return nil
	}
	h.now = plan.end
	h.e.completeStep(h.st, plan)
	if ev := h.st.stepEvents(); len(ev) > 0 && len(h.events) < 10000 {
		h.events = append(h.events, ev)
	}
	return plan
}

func (h *schedHarness) runUntilIdle(maxSteps int) {
	h.t.Helper()
	for range maxSteps {
		if h.step() == nil {
			return
		}
	}
	h.t.Fatalf("still busy after %d steps", maxSteps)
}

func (p *stepPlan) tokensOf(r *request) (int, bool) {
	for _, s := range p.batch {
		if s.r == r {
			return s.newTokens, true
		}
	}
	return 0, false
}

func (p *stepPlan) total() int {
	n := 0
	for _, s := range p.batch {
		n += s.newTokens
	}
	return n
}

// drain returns the tokens a request has sent so far.
func drain(r *request) (tokens []uint32, first bool, finished bool) {
	for _, out := range r.out.take() {
		tokens = append(tokens, out.tokens...)
		first = first || out.first
		finished = finished || out.finished
	}
	return
}

func TestSchedulerChunkedPrefillBudget(t *testing.T) {
	tests := []struct {
		name       string
		budget     int
		decoders   int // short requests already decoding when the long prompt arrives
		prompt     int
		wantChunks []int
	}{
		{"alone", 100, 0, 250, []int{100, 100, 50}},
		{"beside two decoders", 100, 2, 250, []int{98, 98, 54}},
		{"fits one step", 8192, 3, 5000, []int{5000}},
		{"vLLM default budget", 8192, 0, 20000, []int{8192, 8192, 3616}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newSchedHarness(t, Config{MaxNumBatchedTokens: tc.budget})
			for i := range tc.decoders {
				h.submit(seqIDs(100000*(i+1), 10), 50)
			}
			if tc.decoders > 0 {
				h.step() // their prefill
			}
			long := h.submit(seqIDs(7, tc.prompt), 2)
			var chunks []int
			for range 20 {
				plan := h.step()
				if plan.total() > tc.budget {
					t.Fatalf("step scheduled %d tokens over the budget %d", plan.total(), tc.budget)
				}
				for _, s := range plan.batch {
					if s.r != long && s.newTokens != 1 {
						t.Fatalf("a decoding request got %d tokens", s.newTokens)
					}
				}
				if n, ok := plan.tokensOf(long); ok {
					chunks = append(chunks, n)
				}
				if long.emitted > 0 {
					break
				}
			}
			if !slices.Equal(chunks, tc.wantChunks) {
				t.Fatalf("prefill chunks %v, want %v", chunks, tc.wantChunks)
			}
			if long.numComputed != tc.prompt {
				t.Fatalf("first token after %d computed tokens, want %d", long.numComputed, tc.prompt)
			}
		})
	}
}

func TestSchedulerFIFOAdmission(t *testing.T) {
	t.Run("max-num-seqs", func(t *testing.T) {
		h := newSchedHarness(t, Config{MaxNumSeqs: 2})
		a := h.submit(seqIDs(100, 20), 3)
		b := h.submit(seqIDs(200, 20), 5)
		c := h.submit(seqIDs(300, 20), 3)
		h.step()
		if len(h.st.running) != 2 || h.st.running[0] != a || h.st.running[1] != b || h.st.waiting[0] != c {
			t.Fatalf("running %d, waiting %d: want a and b running, c waiting", len(h.st.running), len(h.st.waiting))
		}
		for a.emitted < 3 {
			h.step()
		}
		if c.admitted {
			t.Fatal("c was admitted in the step a finished in, before a's slot was free")
		}
		h.step()
		if !c.admitted {
			t.Fatal("c not admitted once a slot was free")
		}
	})
	t.Run("KV blocks block the head", func(t *testing.T) {
		h := newSchedHarness(t, Config{NumGPUBlocks: 10, BlockSize: 16}) // 9 usable
		x := h.submit(seqIDs(1000, 100), 2)                              // 7 blocks
		y := h.submit(seqIDs(2000, 100), 2)                              // 7 blocks: does not fit
		z := h.submit(seqIDs(3000, 16), 2)                               // 1 block: fits, but is behind y
		h.step()
		if !x.admitted || y.admitted || z.admitted {
			t.Fatalf("admitted x=%v y=%v z=%v: want only x (FIFO: the head y blocks z)", x.admitted, y.admitted, z.admitted)
		}
		h.runUntilIdle(50)
		for _, r := range []*request{x, y, z} {
			if r.emitted != 2 {
				t.Fatalf("%s emitted %d of 2", r.id, r.emitted)
			}
		}
	})
}

func TestSchedulerPreemptsNewest(t *testing.T) {
	// 6 usable blocks of 16 tokens; each request needs 5 for 32 prompt + 40
	// generated tokens, so they cannot both finish without a preemption.
	h := newSchedHarness(t, Config{NumGPUBlocks: 7, BlockSize: 16})
	older := h.submit(seqIDs(1000, 32), 40)
	newer := h.submit(seqIDs(5000, 32), 40)
	var got [2][]uint32
	for range 400 {
		plan := h.step()
		for i, r := range []*request{older, newer} {
			toks, _, _ := drain(r)
			got[i] = append(got[i], toks...)
		}
		if plan == nil {
			break
		}
		used := h.st.pool.usable() - h.st.pool.numFree
		if used > h.st.pool.usable() {
			t.Fatalf("%d blocks in use of %d", used, h.st.pool.usable())
		}
	}
	if older.preemptions != 0 || newer.preemptions == 0 {
		t.Fatalf("preemptions: older %d, newer %d; want only the newer preempted", older.preemptions, newer.preemptions)
	}
	for i, r := range []*request{older, newer} {
		if !slices.Equal(got[i], r.output) {
			t.Fatalf("%s sent %d tokens %v, want its %d in order", r.id, len(got[i]), got[i], len(r.output))
		}
	}
	if h.st.pool.numFree != h.st.pool.usable() {
		t.Fatalf("%d blocks still pinned after both finished", h.st.pool.usable()-h.st.pool.numFree)
	}
}

func TestSchedulerCacheHitsSkipTokens(t *testing.T) {
	tests := []struct {
		name          string
		prompt        int
		wantScheduled int // prefill tokens of the second, identical request
	}{
		{"two blocks", 32, 16},            // floor((32-1)/16) = 1 block cached
		{"six blocks and a tail", 100, 4}, // 6 blocks cached
		{"under a block", 15, 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newSchedHarness(t, Config{})
			h.submit(seqIDs(1, tc.prompt), 2)
			h.runUntilIdle(20)
			r := h.submit(seqIDs(1, tc.prompt), 2)
			plan := h.step()
			if n, _ := plan.tokensOf(r); n != tc.wantScheduled || plan.load.prefillTokens != tc.wantScheduled {
				t.Fatalf("scheduled %d prefill tokens (load %d), want %d", n, plan.load.prefillTokens, tc.wantScheduled)
			}
			if got := r.hitBlocks * 16; got != tc.prompt-tc.wantScheduled {
				t.Fatalf("cached tokens %d, want %d", got, tc.prompt-tc.wantScheduled)
			}
		})
	}
}

func TestStepTimeGrowsWithBatch(t *testing.T) {
	for _, prof := range Profiles() {
		t.Run(prof.Name, func(t *testing.T) {
			loads := []stepLoad{
				{decodeSeqs: 1, contextTokens: 1000},
				{decodeSeqs: 8, contextTokens: 8000},
				{decodeSeqs: 64, contextTokens: 64000},
				{decodeSeqs: 64, contextTokens: 64000, prefillTokens: 1000},
				{decodeSeqs: 64, contextTokens: 128000, prefillTokens: 1000},
			}
			prev := time.Duration(0)
			for _, l := range loads {
				d := prof.Perf.duration(l)
				if d <= prev {
					t.Fatalf("step %+v takes %v, not more than the smaller step's %v", l, d, prev)
				}
				prev = d
			}
			// The same through the scheduler: more decoding requests, longer steps.
			var steps []time.Duration
			for _, n := range []int{1, 4, 32} {
				h := newSchedHarness(t, Config{PerfModel: prof.Name})
				for i := range n {
					h.submit(seqIDs(10000*(i+1), 500), 10)
				}
				h.step() // prefills
				steps = append(steps, h.step().model)
			}
			if !(steps[0] < steps[1] && steps[1] < steps[2]) {
				t.Fatalf("decode step times %v do not grow with the batch", steps)
			}
		})
	}
}

// TestConcurrentPrefillsQueue: prompts that arrive together share the step
// budget, so the later ones wait for the earlier ones' chunks (under the
// simple model each had its own full-speed prefill).
func TestConcurrentPrefillsQueue(t *testing.T) {
	h := newSchedHarness(t, Config{})
	start := h.now
	var reqs []*request
	for i := range 4 {
		reqs = append(reqs, h.submit(seqIDs(100000*(i+1), 8000), 2))
	}
	var ttft []time.Duration
	for range 20 {
		h.step()
		for len(ttft) < len(reqs) && reqs[len(ttft)].emitted > 0 {
			ttft = append(ttft, h.now.Sub(start))
		}
		if len(ttft) == len(reqs) {
			break
		}
	}
	if len(ttft) != 4 {
		t.Fatalf("only %d of 4 got a first token", len(ttft))
	}
	alone := h.e.cfg.Step.ColdTTFT(8000, h.e.cfg.MaxNumBatchedTokens)
	for i, d := range ttft {
		// The i-th prompt's first token comes after about i+1 prompts' worth of prefill.
		lo, hi := time.Duration(float64(alone)*(float64(i)+0.8)), time.Duration(float64(alone)*(float64(i)+1.3))
		if d < lo || d > hi {
			t.Errorf("prompt %d: TTFT %v, want %v..%v (alone %v)", i, d, lo, hi, alone)
		}
	}
}

func TestPerfModelConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
		check   func(Config) bool
	}{
		{"zero is simple", Config{}, "", func(c Config) bool {
			return c.PerfModel == PerfModelSimple && c.MaxNumSeqs == DefaultMaxNumSeqs && c.NumGPUBlocks == DefaultNumGPUBlocks
		}},
		{"profile defaults", Config{PerfModel: "codellama-34b-h100-tp2"}, "", func(c Config) bool {
			p, _ := LookupProfile("codellama-34b-h100-tp2")
			return c.Step == p.Perf && c.NumGPUBlocks == p.NumGPUBlocks && c.MaxNumSeqs == 1024 && c.MaxNumBatchedTokens == 8192 && c.TimeScale == 1
		}},
		{"alias", Config{PerfModel: "qwen2.5-32b-h100-tp2"}, "", func(c Config) bool { return c.PerfModel == "codellama-34b-h100-tp2" }},
		{"overrides kept", Config{PerfModel: DefaultPerfModel, NumGPUBlocks: 500, MaxNumSeqs: 8, Step: StepPerf{StepFloorS: 0.001}}, "", func(c Config) bool {
			return c.NumGPUBlocks == 500 && c.MaxNumSeqs == 8 && c.Step == StepPerf{StepFloorS: 0.001}
		}},
		{"half speed", Config{PerfModel: DefaultPerfModel}.WithSpeed(0.5), "", func(c Config) bool {
			p, _ := LookupProfile(DefaultPerfModel)
			return c.Step.StepFloorS == 2*p.Perf.StepFloorS && c.Step.PrefillSPerToken == 2*p.Perf.PrefillSPerToken
		}},
		{"unknown model", Config{PerfModel: "gpt-9"}, `perf-model "gpt-9": want one of simple, llama3-8b-h100, codellama-34b-h100-tp2`, nil},
		{"negative cost", Config{PerfModel: DefaultPerfModel, Step: StepPerf{DecodeSPerSeq: -1}}, "step costs must be finite", nil},
		{"zero speed", Config{PerfModel: DefaultPerfModel}.WithSpeed(0), "step costs must be finite", nil},
		{"budget", Config{PerfModel: DefaultPerfModel, MaxNumBatchedTokens: -5}, "max-num-batched-tokens -5", nil},
		{"no chunking needs a budget of max-model-len", Config{PerfModel: DefaultPerfModel, DisableChunkedPrefill: true}, "smaller than max-model-len", nil},
		{"time scale", Config{TimeScale: -1}, "time-scale -1", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg.withDefaults()
			err := c.validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("err %v, config %+v", err, c)
			}
		})
	}
}

// TestSchedulerRemotePrefill: a decode engine given a prefill engine's KV
// computes only the last prompt token, as vLLM with NixlConnector does, and
// still caches the prompt's blocks.
func TestSchedulerRemotePrefill(t *testing.T) {
	h := newSchedHarness(t, Config{Role: RoleDecode})
	r := h.submit(seqIDs(500, 100), 3)
	r.remote = &remoteKV{engineID: "p", requestID: "x"}
	plan := h.step()
	if n, _ := plan.tokensOf(r); n != 1 || plan.load.prefillTokens != 1 {
		t.Fatalf("scheduled %d tokens, want only the last prompt token", n)
	}
	if r.emitted != 1 || h.st.pool.cachedBlocks() != 6 {
		t.Fatalf("emitted %d, cached blocks %d; want the first token and floor(100/16) = 6 blocks", r.emitted, h.st.pool.cachedBlocks())
	}
}

// TestSteppedPrefillDecodeRoles runs the NixlConnector hand-off between two
// engines on the step model.
func TestSteppedPrefillDecodeRoles(t *testing.T) {
	p := startEngine(t, Config{Role: RolePrefill, PerfModel: DefaultPerfModel, TimeScale: 0.01, Model: "m"})
	d := startEngine(t, Config{Role: RoleDecode, PerfModel: DefaultPerfModel, TimeScale: 0.01, Model: "m"})
	prompt := seqIDs(900, 100)
	stub := map[string]any{"do_remote_decode": true}
	pr := decodeCompletion(t, post(t, p.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": stub}))
	if ids, _ := pr.KVTransferParams["remote_block_ids"].([]any); len(ids) != 7 {
		t.Fatalf("kv_transfer_params %v, want 7 remote blocks", pr.KVTransferParams)
	}
	dr := post(t, d.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "kv_transfer_params": pr.KVTransferParams})
	if c := decodeCompletion(t, dr); c.Usage.CompletionTokens != 4 {
		t.Fatalf("decode usage %+v", c.Usage)
	}
	if m := scrape(t, d); !strings.Contains(m, `vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 99`) {
		t.Errorf("decoder did not count 99 external hit tokens:\n%s", m)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, _ := p.Stats(context.Background())
		if s.UsedBlocks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefill engine still pins %d blocks after the decoder read them", s.UsedBlocks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSchedulerChunkedEvents: with chunks that end inside a block, every
// prompt block is stored exactly once, in order, each BlockStored naming the
// block before it as parent, in the step that computes it.
func TestSchedulerChunkedEvents(t *testing.T) {
	h := newSchedHarness(t, Config{MaxNumBatchedTokens: 100})
	h.submit(seqIDs(100000, 10), 40) // two decoders take 2 tokens of every step's budget
	h.submit(seqIDs(200000, 10), 40)
	h.step()
	long := h.submit(seqIDs(7, 250), 2)
	h.events = nil
	for long.emitted == 0 {
		h.step()
	}
	mine := map[uint64]bool{}
	for _, b := range long.chain {
		mine[b.Wire] = true
	}
	var stored []uint64
	var parents []uint64
	for _, batch := range h.events {
		for _, ev := range batch {
			if ev.kind != eventStored || !mine[ev.hashes[0]] {
				continue // the decoders' blocks
			}
			if len(stored) > 0 && (!ev.hasParent || ev.parent != stored[len(stored)-1]) {
				t.Fatalf("BlockStored after %d blocks has parent %v/%x, want %x", len(stored), ev.hasParent, ev.parent, stored[len(stored)-1])
			}
			parents = append(parents, ev.parent)
			stored = append(stored, ev.hashes...)
		}
	}
	want := make([]uint64, 0, len(long.chain))
	for _, b := range long.chain[:250/16] {
		want = append(want, b.Wire)
	}
	if !slices.Equal(stored, want) {
		t.Fatalf("stored %d blocks %x, want the prompt's %d full blocks %x", len(stored), stored, len(want), want)
	}
	if len(parents) < 3 {
		t.Fatalf("%d BlockStored events for three chunks", len(parents))
	}
}

// TestDebugSnapshot: pending_prefill_tokens counts the uncached tokens of
// waiting requests (as a hit would be counted now) and the rest of running
// prefills; the 1k-token TTFT prediction grows with the decoders beside it.
func TestDebugSnapshot(t *testing.T) {
	h := newSchedHarness(t, Config{MaxNumBatchedTokens: 100})
	warm := seqIDs(1, 64)
	h.submit(warm, 1)
	h.runUntilIdle(10) // 64 tokens cached: 3 blocks count as a hit for a 64-token prompt
	idle := h.e.debugSnapshot(h.st, h.now).PredictedTTFTPer1k

	dec := h.submit(seqIDs(5000, 10), 50)
	h.step() // dec prefills and decodes from now on
	long := h.submit(seqIDs(9000, 250), 2)
	h.step()                       // long gets 99 of its 250 tokens
	h.submit(warm, 1)              // waiting: 64 - 48 cached = 16 tokens to prefill
	h.submit(seqIDs(20000, 30), 1) // waiting: 30
	ds := h.e.debugSnapshot(h.st, h.now)
	if got, want := ds.PendingPrefillTokens, (250-long.numComputed)+16+30; got != want {
		t.Fatalf("pending_prefill_tokens %d, want %d", got, want)
	}
	if ds.Running != 2 || ds.Waiting != 2 || dec.prefilling {
		t.Fatalf("running %d waiting %d", ds.Running, ds.Waiting)
	}
	if !(ds.PredictedTTFTPer1k > idle) {
		t.Fatalf("prediction %v with a decoder beside it, %v idle", ds.PredictedTTFTPer1k, idle)
	}
	p := h.e.cfg.Step
	if a, b, c := p.secondsPer1kNewTokens(8192, 0, 0), p.secondsPer1kNewTokens(8192, 64, 64000), p.secondsPer1kNewTokens(8192, 512, 512000); !(a < b && b < c) {
		t.Fatalf("prediction does not grow with decoders: %v %v %v", a, b, c)
	}
}
