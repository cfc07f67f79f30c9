package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/chattemplate"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/reqfacts"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// ruleState is the immutable per-version view of a rule the router reads.
type ruleState struct {
	rule   *config.Rule
	hasher *kvhash.Hasher // nil when the rule is not a KV rule or its contract is invalid
	addrs  [epset.Max]string
	ids    [epset.Max]string
	// facts carries the rule's LoRA adapter names (kvLoraAdapters) to reqfacts.
	facts reqfacts.Options
	// loraTokenizer maps an adapter name to the model whose staged tokenizer
	// encodes its prompts (vLLM tokenizes adapter requests with the base
	// model's tokenizer; see config.LoraAdapter).
	loraTokenizer map[string]string
	// gran is the block size the rule's engines publish against kvBlockSize
	// (docs/parity.md, "Hash granularity"); nil for non-KV rules.
	gran *ingest.Granularity
	// trtllm: TensorRT-LLM keys the blocks of every prompt token but the
	// last, and keys LoRA by task id (docs/engines.md).
	trtllm bool
	// loraTask maps adapter names to TensorRT-LLM lora_task_ids (kvLoraTaskIds).
	loraTask map[string]uint64
	// parity is the rule's live parity self-check (docs/parity.md); nil
	// without a hasher.
	parity *ingest.Parity
	// models is the rule's model discovery (models.go); nil when off.
	models *ruleModels
	// all is every endpoint of the rule.
	all epset.Set
}

// router implements fullproxy.Router for one rule: request facts →
// tokenize → hash → selector.
type router struct {
	service int
	state   atomic.Pointer[ruleState]
	sel     *selector.Selector
	scores  *timedScorer // the selector's scorer, timed (the "score" stage)
	// overlay takes each routed prompt's blocks as provisional until the
	// engine reports them (nil: off); costs tracks the prefill work in
	// flight per endpoint for LOXILB_KV_LB_MODE=cost.
	overlay *inventory.Overlay
	costs   *selector.Costs
	opts    selector.Options
	pool    *tokenizer.Pool
	// ids lends prompt id buffers to the encode; prepare gives each back
	// once the block hashes are computed (docs/tokenizer.md, "Decision cost
	// at long context").
	ids tokenizer.IDPool
	// decideMu makes each request's decision and reservation one step
	// (Route).
	decideMu sync.Mutex
	m        *metrics.Metrics
	log      *slog.Logger
	// maxTokens is LLB_KV_MAX_PROMPT_TOKENS; gate bounds the bodies being
	// tokenized at once, process-wide (inspect.go).
	maxTokens int
	gate      *inspectGate
	// pending holds the plans the model gate prepared, by request, until
	// the rule's handler asks for them (Plan, pdPlan).
	pending sync.Map
}

// plan is one request's routing state, prepared once and kept by the
// handler serving the request (the plain forward's fullproxy.RoutePlan, or
// the P/D flow's pd.Plan) across retries.
type plan struct {
	r       *router
	selReq  selector.Request
	attempt selector.Attempt
	facts   reqfacts.Facts
	tokens  int // prompt tokens after truncation (0 when not tokenized)
	stages  []fullproxy.Stage
	// model is where the request's model may run (models.go).
	model modelRoute
	// blockTokens is the prompt tokens one hash covers (kvBlockSize times
	// the engines' granularity step).
	blockTokens int
	// What the routed request holds until it ends: its provisional blocks
	// and its share of the endpoint's pending prefill work.
	reservation inventory.Reservation
	ticket      *selector.CostTicket
	sentAt      time.Time
}

// Plan implements fullproxy.Router.
func (r *router) Plan(_ context.Context, req *fullproxy.Request) fullproxy.RoutePlan {
	return r.planFor(req)
}

// planFor is the plan the model gate prepared for req, or a new one.
func (r *router) planFor(req *fullproxy.Request) *plan {
	if sc, ok := r.pending.LoadAndDelete(req); ok {
		return sc.(*plan)
	}
	return r.prepare(r.state.Load(), req)
}

// Route implements fullproxy.RoutePlan: one pass of the ladder with the
// endpoints the forward's tries failed on excluded.
func (sc *plan) Route(_ context.Context, excluded epset.Set) (fullproxy.Decision, error) {
	r := sc.r
	st := r.state.Load()
	for ep := excluded.Next(0); ep >= 0; ep = excluded.Next(ep + 1) {
		if !sc.attempt.Excluded().Has(ep) {
			sc.attempt.Exclude(ep)
		}
	}
	var scored scoreTime
	untrack := r.scores.track(sc.selReq.Hashes, &scored)
	t0 := time.Now()
	// Deciding and reserving are one step: a request of a new prefix that
	// arrives while the first one is being routed sees the first one's
	// provisional blocks and pending work, so a burst follows its first
	// request instead of each scoring zero (docs/selection.md, "Provisional
	// blocks").
	r.decideMu.Lock()
	d := sc.attempt.Decide()
	sc.reserve(d.Endpoint, d.Score)
	r.decideMu.Unlock()
	decide := time.Since(t0)
	untrack()
	stages := append([]fullproxy.Stage(nil), sc.stages...)
	if scored.calls > 0 {
		// Score runs inside Decide: report it apart and leave select the rest.
		stages = append(stages, fullproxy.Stage{Name: "score", Duration: scored.d})
		decide = max(decide-scored.d, 0)
	}
	stages = append(stages, fullproxy.Stage{Name: "select", Duration: decide})

	if d.Reason.Miss() {
		r.m.Tier15Miss(r.service, d.Reason.String())
		if sc.model.label != "" {
			r.m.ModelMiss(r.service, sc.model.label, d.Reason.String())
		}
	}
	if d.Fallthrough {
		r.m.Tier15FallthroughInc(r.service)
	}
	out := fullproxy.Decision{
		Endpoint: d.Endpoint, Tier: d.Tier.String(), Reason: reasonLabel(d), Score: d.Score,
		Model: sc.facts.Model, PromptTokens: sc.tokens, Blocks: len(sc.selReq.Hashes),
		Stages: stages,
	}
	if d.Endpoint < 0 {
		if d.Saturated {
			return out, fmt.Errorf("every prefill endpoint is at its admission cap: %w", fullproxy.ErrNoBackend)
		}
		return out, fullproxy.ErrNoBackend
	}
	out.Addr, out.EndpointID = st.addrs[d.Endpoint], st.ids[d.Endpoint]
	if out.Addr == "" {
		return out, fmt.Errorf("selector chose ep_idx %d, which the rule no longer has: %w", d.Endpoint, fullproxy.ErrNoBackend)
	}
	return out, nil
}

func reasonLabel(d selector.Decision) string {
	if d.Reason == selector.ReasonNone {
		return "-"
	}
	return d.Reason.String()
}

// Finish implements fullproxy.RoutePlan: the routed decision is committed
// once, so a request counts as one hit at most across retries.
func (sc *plan) Finish(d fullproxy.Decision, connected bool) {
	r := sc.r
	observeStages(r.m, r.service, d.Stages)
	if !connected {
		return
	}
	o := sc.attempt.Commit()
	recordOutcome(r.m, r.service, o)
	if o.Hit && sc.model.label != "" {
		r.m.ModelHit(r.service, sc.model.label)
	}
	sc.sentAt = time.Now() // the per-token time is learned from the connection on
}

// reserve makes the prompt's blocks provisional on endpoint ep and its
// uncached tokens pending prefill work there, until FirstBody and Ended
// settle them. A re-route (a failed connect, a breaker's refusal) moves
// them to the new endpoint.
func (sc *plan) reserve(ep, score int) {
	r := sc.r
	sc.unreserve()
	hashes := sc.selReq.Hashes
	if ep < 0 || len(hashes) == 0 {
		return
	}
	if r.overlay != nil {
		sc.reservation = r.overlay.Reserve(ep, hashes)
	}
	if r.costs != nil {
		bt := max(sc.blockTokens, 1)
		prompt := max(sc.tokens, len(hashes)*bt)
		sc.ticket = r.costs.Dispatch(ep, int64(max(prompt-score*bt, 0)))
	}
}

// unreserve gives back what reserve took: the work untaught, the
// predictions the engine never confirmed.
func (sc *plan) unreserve() {
	sc.ticket.Abandon()
	sc.ticket = nil
	if sc.r.overlay != nil {
		sc.r.overlay.Release(sc.reservation)
	}
	sc.reservation = inventory.Reservation{}
}

// FirstBody implements fullproxy.BodyTracker: the prefill is done, so its
// work leaves the endpoint's queue, and its time teaches the cost model.
func (sc *plan) FirstBody() {
	if sc.ticket != nil {
		sc.ticket.FirstByte(time.Since(sc.sentAt))
	}
}

// Ended implements fullproxy.BodyTracker: a request that never produced a
// body byte gives its work back untaught, and predictions its engine never
// confirmed are dropped.
func (sc *plan) Ended() {
	sc.unreserve()
}

func observeStages(m *metrics.Metrics, service int, stages []fullproxy.Stage) {
	for _, s := range stages {
		m.ObserveStage(service, s.Name, s.Duration)
	}
}

// recordOutcome counts a committed decision: its tier and, for tier 1.5,
// whether it hit, spilled or seeded a cold endpoint.
func recordOutcome(m *metrics.Metrics, service int, o selector.Outcome) {
	m.Decision(service, o.Tier.String())
	if o.Hit {
		m.Tier15Hit(service, o.Endpoint)
	}
	if o.Spilled {
		m.Tier15Spill(service, o.Endpoint)
	}
	if o.ColdSeed {
		m.Tier15ColdSeed(service, o.Endpoint)
	}
}

// prepare extracts the request facts, tokenizes and hashes the prompt, and
// begins the selector attempt. Failures become the guard reason the selector
// reports (text_empty, model_empty, tokenize, hashes). The attempt excludes
// every endpoint that does not serve the request's model.
func (r *router) prepare(st *ruleState, req *fullproxy.Request) *plan {
	sc := r.preparePlan(st, req)
	if sc.model.restrict {
		out := st.all.AndNot(sc.model.eligible)
		for ep := out.Next(0); ep >= 0; ep = out.Next(ep + 1) {
			sc.attempt.Exclude(ep)
			sc.attempt.ExcludeDecode(ep)
		}
	}
	return sc
}

func (r *router) preparePlan(st *ruleState, req *fullproxy.Request) *plan {
	sc := &plan{r: r}
	sr := &sc.selReq
	if ap, err := netip.ParseAddrPort(req.RemoteAddr.String()); err == nil {
		sr.Client = ap.Addr().Unmap()
	}
	if !st.rule.KVEnabled() {
		sc.attempt = r.sel.Begin(sr)
		return sc
	}

	t0 := time.Now()
	if req.BodyInspected {
		sc.facts = reqfacts.ExtractPath(req.Path(), req.Body, req.Get("X-Model"), st.facts)
	}
	f := &sc.facts
	sr.Model = f.Model
	if f.Model != "" && st.models != nil {
		sc.model = st.models.current().resolve(f.Model, st.all)
		if sc.model.parent != "" && f.LoRA == "" {
			f.LoRA = f.Model // a discovered adapter: its name enters the block keys, as vLLM hashes it
		}
		if sc.model.notFound {
			sc.attempt = r.sel.Begin(sr) // answered 404 by the model gate
			return sc
		}
	}
	sr.SessionKey = r.opts.SessionKey(req.Get, f.User)
	switch {
	case !req.BodyInspected:
		// Above the inspection limit: forwarded unread (text_empty).
	case f.NotPromptPath:
		// Not an API whose body kvgate hashes (docs/tokenizer.md,
		// "Prompt-bearing paths"): forwarded unchanged (text_empty).
		if len(req.Body) > 0 && r.m != nil {
			r.m.KVSkip(r.service, causePath)
		}
	case f.Unsupported != "":
		// vLLM serves it, but its ids cannot be computed (an image, a
		// generated value): tokenize, with the detail as the skip cause.
		sr.HasText = true
	case f.Kind == reqfacts.KindUnknown && len(req.Body) > 0 && !isJSONObject(req.Body):
		// Not OpenAI JSON: there is text, but no model (model_empty).
		sr.HasText = true
	default:
		sr.HasText = f.HasPrompt()
	}
	sr.TrieText = trieText(f)
	sc.stages = append(sc.stages, fullproxy.Stage{Name: "extract", Duration: time.Since(t0)})
	if !sr.HasText || sr.Model == "" {
		sc.attempt = r.sel.Begin(sr)
		return sc
	}

	// Bounded inspection (docs/tokenizer.md, "Bounds"): a request that would
	// cost too much is forwarded unchanged under reason tokenize, with the
	// detail in kvgate_kv_skip_total{cause}.
	skip := func(cause string, err error) *plan {
		r.log.Debug("tokenize miss", "model", f.Model, "cause", cause, "err", err)
		if r.m != nil { // nil in the router's unit tests
			r.m.KVSkip(r.service, cause)
		}
		sr.Upstream = selector.ReasonTokenize
		sc.attempt = r.sel.Begin(sr)
		return sc
	}
	if f.Unsupported != "" {
		return skip(f.Unsupported, errors.New(f.Problem))
	}
	if cause := r.refuse(st, f); cause != "" {
		return skip(cause, nil)
	}
	release, ok := r.gate.acquire(len(req.Body))
	if !ok {
		return skip(causeBusy, nil)
	}
	t1 := time.Now()
	ids, pooled, err := func() ([]uint32, bool, error) {
		defer release() // a recovered panic must not keep the budget forever
		return r.tokenize(st, f, sc.model.parent)
	}()
	buf := ids // before truncation: what goes back to r.ids
	sc.stages = append(sc.stages, fullproxy.Stage{Name: "tokenize", Duration: time.Since(t1)})
	if err == nil && r.maxTokens > 0 && len(ids) > r.maxTokens {
		err = &tokenizer.LimitError{Cause: tokenizer.CauseTokens, Detail: fmt.Sprintf("%d tokens, limit %d", len(ids), r.maxTokens)}
	}
	if err != nil {
		return skip(skipCause(err), err)
	}
	ids = reqfacts.Truncate(ids, f.TruncatePromptTokens)
	sc.tokens = len(ids)
	sr.PromptTokens = len(ids)
	sc.blockTokens = st.rule.BlockSize()
	if st.gran != nil {
		sc.blockTokens *= max(st.gran.Step(), 1)
	}
	sr.BlockTokens = sc.blockTokens

	t2 := time.Now()
	var skipped selector.Reason
	if sr.Hashes, skipped = r.kvHashes(st, ids, f); skipped != selector.ReasonNone {
		sr.Upstream = skipped
	}
	if pooled {
		r.ids.Put(buf) // hashed: only len(ids) is kept (sc.tokens, sr.PromptTokens)
	}
	sc.model.salt.KeyAll(sr.Hashes) // the index holds model-keyed hashes (inventory.ModelSalt)
	sc.stages = append(sc.stages, fullproxy.Stage{Name: "hash", Duration: time.Since(t2)})
	sc.attempt = r.sel.Begin(sr)
	return sc
}

// kvHashes are the request's block hashes as the rule's engine keys its
// blocks, or ReasonHashes (with kvgate_kv_skip_total's cause) when none of
// ours can match; ReasonNone otherwise.
func (r *router) kvHashes(st *ruleState, ids []uint32, f *reqfacts.Facts) ([]uint64, selector.Reason) {
	if st.hasher == nil {
		return nil, selector.ReasonHashes
	}
	extra := kvhash.Extra{LoRAName: f.LoRA, CacheSalt: f.CacheSalt}
	if st.trtllm {
		if f.LoRA != "" {
			// TensorRT-LLM mixes the adapter's lora_task_id into every block,
			// not its name; without kvLoraTaskIds for it, no hash can match.
			id, ok := st.loraTask[f.LoRA]
			if !ok {
				r.m.KVSkip(r.service, "lora_task_id")
				return nil, selector.ReasonHashes
			}
			extra.LoRATaskID, extra.HasLoRATaskID = id, true
		}
		ids = kvhash.TRTLLMRequestTokens(ids) // the engine keys all but the last token
	}
	hashes := st.hasher.AppendHashes(nil, ids, extra)
	if st.gran == nil {
		return hashes, selector.ReasonNone
	}
	if bs, bad := st.gran.Unusable(); bad {
		// No hash of ours can match: say why instead of scoring 0.
		r.m.KVSkip(r.service, "block_size")
		r.log.Debug("KV tier skipped: engines publish a block_size that is not a multiple of kvBlockSize", "block_size", bs, "kvBlockSize", st.gran.HashBlockSize())
		return nil, selector.ReasonHashes
	}
	if algo, bad := st.gran.Refused(); bad {
		r.m.KVSkip(r.service, "hash_algo")
		r.log.Debug("KV tier skipped: the engines hash blocks with an algorithm kvgate does not compute", "kv_cache_hash_algo", algo)
		return nil, selector.ReasonHashes
	}
	return ingest.EveryKth(hashes, st.gran.Step()), selector.ReasonNone
}

// refuse names why a request must not be tokenized at all, or "": a request
// chat_template on a rule that does not trust them (vLLM refuses those
// unless started with --trust-request-chat-template, and rendering untrusted
// Jinja is the costliest thing a body can ask of kvgate), or a token-id
// prompt above LLB_KV_MAX_PROMPT_TOKENS.
func (r *router) refuse(st *ruleState, f *reqfacts.Facts) string {
	if f.Kind.Chat() && f.ChatTemplate != "" && !st.rule.Args.TrustRequestChatTemplate {
		return causeUntrusted
	}
	if p, ok := f.FirstPrompt(); ok && p.IsTokens && r.maxTokens > 0 && len(p.Tokens) > r.maxTokens {
		return causeTokens
	}
	return ""
}

// hashChainCacheBytes bounds each rule's cache of recent hash chains
// (tokens, digests and wire values: about 6.5 MB for eight 100k-token
// prompts with sha256).
const hashChainCacheBytes = 16 << 20

// limits bound one request's encode: LLB_KV_MAX_PROMPT_TOKENS, the word
// bound that keeps BPE from running for seconds on one pathological word,
// and tokenizeBudget.
func (r *router) limits() tokenizer.Limits {
	return tokenizer.Limits{MaxTokens: r.maxTokens, MaxWordBytes: tokenizer.DefaultMaxWordBytes, Deadline: time.Now().Add(tokenizeBudget)}
}

// tokenize produces the prompt ids vLLM computes for the request: chat
// through the model's template, completion strings with the tokenizer's
// special tokens unless add_special_tokens says otherwise, token ids as
// given. A list of prompts routes by its first prompt (vLLM runs each as its
// own engine request; the first shares the request's prefix). A LoRA
// adapter's prompt is encoded with its base model's tokenizer, as vLLM does:
// the one kvLoraAdapters names, else the parent its engines list.
// pooled says the ids are a buffer from r.ids (the request's own token ids
// are not).
func (r *router) tokenize(st *ruleState, f *reqfacts.Facts, discoveredParent string) (ids []uint32, pooled bool, err error) {
	first, isCompletion := f.FirstPrompt()
	if f.Kind == reqfacts.KindCompletion && !isCompletion {
		return nil, false, errors.New("completion without a prompt")
	}
	if isCompletion && first.IsTokens {
		return first.Tokens, false, nil
	}
	model := f.Model
	if base, ok := st.loraTokenizer[f.LoRA]; ok && f.LoRA != "" {
		model = base
	} else if discoveredParent != "" {
		model = discoveredParent
	}
	m, err := r.pool.Get(model)
	if err != nil {
		return nil, false, err
	}
	if isCompletion {
		ids, err = m.AppendPromptLimited(r.ids.Get(), first.Text, f.AddSpecialTokens, r.limits())
		return ids, true, err
	}
	tools := f.Tools
	if len(tools) > 0 {
		if tools, err = chattemplate.VLLMToolDicts(tools, true); err != nil {
			return nil, false, fmt.Errorf("tools: %w", err)
		}
	}
	agp := f.AddGenerationPrompt
	ids, err = m.AppendChat(r.ids.Get(), tokenizer.ChatRequest{
		Messages:             f.Messages,
		Tools:                tools,
		Documents:            f.Documents,
		AddGenerationPrompt:  &agp,
		ContinueFinalMessage: f.ContinueFinalMessage,
		ChatTemplateKwargs:   f.ChatTemplateKwargs,
		ChatTemplate:         f.ChatTemplate,
		AddSpecialTokens:     f.SpecialTokens(),
		Limits:               r.limits(),
	})
	return ids, true, err
}

// trieText is what the Tier-1 trie keys on: the completion prompt, or a
// chat's first system message.
func trieText(f *reqfacts.Facts) string {
	switch f.Kind {
	case reqfacts.KindCompletion:
		if p, ok := f.FirstPrompt(); ok && !p.IsTokens {
			return p.Text
		}
	case reqfacts.KindChat, reqfacts.KindResponses, reqfacts.KindMessages:
		for _, m := range f.Messages {
			if m["role"] == "system" {
				t, _ := reqfacts.TextContent(m["content"])
				return t
			}
		}
	}
	return ""
}

func isJSONObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return true
		}
		return false
	}
	return false
}

// newRuleState compiles a rule for the router.
func newRuleState(rule *config.Rule, env config.Settings, log *slog.Logger) (*ruleState, error) {
	st := &ruleState{rule: rule}
	for _, e := range rule.Endpoints {
		st.addrs[e.Idx] = net.JoinHostPort(e.IP, strconv.Itoa(e.TargetPort))
		st.ids[e.Idx] = e.Key()
		st.all.Add(e.Idx)
	}
	if !rule.KVEnabled() {
		return st, nil
	}
	st.trtllm = rule.EffectiveEngine() == config.EngineTRTLLM
	if ids := rule.Args.KVLoraTaskIDs; len(ids) > 0 {
		st.loraTask = make(map[string]uint64, len(ids))
		for name, id := range ids {
			st.loraTask[name] = id
		}
	}
	if rule.EffectiveEngine() == config.EngineVLLM {
		st.gran = ingest.NewGranularity(rule.BlockSize())
	} else {
		st.gran = ingest.NewExactGranularity(rule.BlockSize()) // one hash per page or block
	}
	// The decoded messages of recent chat bodies are kept so a growing
	// conversation decodes only its new messages (docs/tokenizer.md,
	// "Decision cost at long context").
	st.facts.Messages = reqfacts.NewMessageCache(reqfacts.DefaultMessageCacheBytes)
	if ads := rule.LoraAdapters(); len(ads) > 0 {
		st.loraTokenizer = make(map[string]string, len(ads))
		for _, a := range ads {
			st.facts.Adapters = append(st.facts.Adapters, a.Name)
			st.loraTokenizer[a.Name] = a.TokenizerModel
		}
	}
	algo, err := kvhash.ParseAlgo(rule.EffectiveHashAlgo())
	if err != nil {
		return nil, fmt.Errorf("service %d: %w", rule.ServiceID, err)
	}
	seed, set := rule.HashSeed(env)
	contract := kvhash.Contract{Algo: algo, BlockSize: rule.BlockSize(), Seed: kvhash.Seed{Value: seed, Set: set}}
	// Recent chains are kept so a growing conversation hashes only its new
	// blocks (docs/tokenizer.md, "Decision cost at long context").
	opts := []kvhash.Option{kvhash.WithChainCache(hashChainCacheBytes)}
	if env.HashDebug {
		opts = append(opts, kvhash.WithDebugLogger(log))
	}
	h, err := kvhash.New(contract, opts...)
	if err != nil {
		// Validation normally refuses such a rule; a restored one keeps
		// routing through the fallback (reason hashes) rather than failing.
		if errors.Is(err, kvhash.ErrUnsetSeed) || errors.Is(err, kvhash.ErrUnsupported) {
			log.Warn("KV hashing disabled for this rule; requests take the fallback (reason hashes)", "service", rule.ServiceID, "err", err)
			return st, nil
		}
		return nil, fmt.Errorf("service %d: hash contract %s: %w", rule.ServiceID, contract, err)
	}
	st.hasher = h
	return st, nil
}

// selectorRule maps the rule model to the selector's view.
func selectorRule(r *config.Rule) selector.Rule {
	out := selector.Rule{
		ServiceID:        uint32(r.ServiceID),
		KVExactMode:      r.Args.KVExactMode,
		PD:               r.PDDisagg(),
		Sel:              r.Args.Sel,
		BlockSize:        r.BlockSize(),
		KVWarmupSec:      r.Args.KVWarmupSec,
		SessionTTL:       r.SessionTTL(),
		CacheAware:       r.Args.PDCacheAwareMode,
		CacheThreshold:   r.CacheThreshold(),
		BalanceThreshold: r.BalanceAbsThreshold(),
	}
	for _, e := range r.Endpoints {
		out.Endpoints = append(out.Endpoints, selector.Endpoint{Idx: e.Idx, Role: selector.Role(e.Role), Weight: e.Weight})
	}
	return out
}

// selectorOptions hands the process settings (parsed once by pkg/config,
// already in the selector's types) to the selector.
func selectorOptions(s config.Settings) (selector.Options, error) {
	o := selector.DefaultOptions()
	o.MinMatchTokens = s.MinMatchTokens
	o.LBMode = s.LBMode
	o.MeanLoadFactor = s.MeanLoadFactor
	o.LoadPenalty = s.LoadPenalty
	o.SpillRelief = s.SpillRelief
	o.ReliefTarget = s.ReliefTarget
	o.ColdStartSeedN = s.ColdStartSeedN
	o.ColdStartMinBlocks = s.ColdStartMinBlocks
	o.ZeroHitN = s.ZeroHitN
	o.Score = s.Score
	o.CostWorkWeight = s.CostWorkWeight
	o.CapFullGain = s.CapFullGain
	o.LoadGuard = s.LoadGuard
	o.SessionHash = s.SessionHash
	o.ColdPlacement = s.ColdPlacement
	return o, o.Validate()
}
