package gateway

// The per-request usage audit (docs/parity.md, "Per-request usage audit"):
// the engine's usage.prompt_tokens against kvgate's own count, and its
// prompt_tokens_details.cached_tokens against the overlap kvgate predicted on
// the endpoint that served the request.

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/usageaudit"
)

// usageAuditor audits one rule's responses. It is the rule's
// fullproxy.BodyAuditor and the P/D flow's prefill usage hook.
type usageAuditor struct {
	service int
	r       *router
	m       *metrics.Metrics
	// log is rate-limited per model (lograte.go): a broken tokenizer
	// mismatches every request.
	log *slog.Logger
	// sample takes 1 in LLB_KV_AUDIT_SAMPLE of the streamed bodies the
	// kernel leg would splice.
	sample *usageaudit.Sampler
	// mismatches counts the rule's prompt-token mismatches for the status
	// page (the metric is per model, the page per rule).
	mismatches atomic.Uint64
	staged     stagedModels
}

func newUsageAuditor(service int, r *router, m *metrics.Metrics, log *slog.Logger, sampleN int) *usageAuditor {
	return &usageAuditor{service: service, r: r, m: m, log: log, sample: usageaudit.NewSampler(sampleN)}
}

// auditBody is the sampling decision: a token stream on the sockmap leg,
// which the kernel would splice, is tapped, and so copied in userspace,
// only when the sampler takes it; any other body is always read (it passes
// through userspace anyway, or is one bounded JSON document).
func auditBody(leg string, tokenStream bool, sample *usageaudit.Sampler) bool {
	if leg == "userspace" || !tokenStream {
		return true
	}
	return sample.Take()
}

// Tap implements fullproxy.BodyAuditor.
func (a *usageAuditor) Tap(rec *fullproxy.Record, resp *fullproxy.BackendResponse, leg string) fullproxy.BodyTap {
	d := rec.Decision
	if !rec.Routed || d.Model == "" || !generationPath(rec.Path) || resp.Status < 200 || resp.Status >= 300 {
		return nil // not a generation request kvgate read, or no usage to expect
	}
	if d.PromptTokens == 0 {
		a.count(d.Model, metrics.AuditNoCount)
		return nil
	}
	// A token stream is what the kernel leg splices; a JSON answer, even a
	// chunked one, is one document, cheap to read.
	if !auditBody(leg, resp.EventStream, a.sample) {
		return nil
	}
	if enc := resp.Get("Content-Encoding"); (enc != "" && !strings.EqualFold(enc, "identity")) ||
		(!resp.EventStream && resp.ContentLength > usageaudit.DefaultMaxBytes) {
		a.count(d.Model, metrics.AuditNoUsage)
		return nil
	}
	kind := usageaudit.KindJSON
	if resp.EventStream {
		kind = usageaudit.KindEventStream
	}
	return &usageTap{a: a, d: d, c: usageaudit.NewCollector(kind, 0)}
}

// generationPath reports whether a request path answers with usage: the
// generation endpoints vLLM serves (a /tokenize through the VIP does not).
func generationPath(p string) bool {
	switch strings.TrimSuffix(p, "/") {
	case "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages":
		return true
	}
	return false
}

// usageTap collects one relayed body.
type usageTap struct {
	a *usageAuditor
	d fullproxy.Decision
	c *usageaudit.Collector
}

func (t *usageTap) Write(p []byte) { t.c.Write(p) }

func (t *usageTap) Done(res datapath.Result) {
	if res.Ending != datapath.BackendEOF {
		t.a.count(t.d.Model, metrics.AuditNoUsage)
		return
	}
	u, outcome := t.c.Usage()
	t.a.audit(t.d, u, outcome == usageaudit.Found)
}

// prefillUsage audits a P/D request from its prefill leg's answer: the
// prefill computed the prompt and reports its own cache hit, which is the
// overlap kvgate predicted on the prefill endpoint (the decode's usage
// describes the transferred blocks instead; docs/pd.md).
func (a *usageAuditor) prefillUsage(rec *fullproxy.Record, body []byte) {
	d := rec.Decision
	if d.Model == "" || !generationPath(rec.Path) {
		return
	}
	if d.PromptTokens == 0 {
		a.count(d.Model, metrics.AuditNoCount)
		return
	}
	u, ok := usageaudit.ParseJSON(body)
	a.audit(d, u, ok)
}

// audit compares one response's usage with the decision.
func (a *usageAuditor) audit(d fullproxy.Decision, u usageaudit.Usage, found bool) {
	model := a.modelLabel(d.Model)
	if !found {
		a.m.UsageAudit(model, metrics.AuditNoUsage)
		return
	}
	st := a.r.state.Load()
	pred, predicted := predictedCached(d, st)
	if u.PromptTokens != d.PromptTokens {
		a.m.PromptTokensMismatchInc(model)
		a.mismatches.Add(1)
		a.logMismatch(model, d, u, pred, predicted)
	}
	switch {
	case !u.HasCached:
		a.m.UsageAudit(model, metrics.AuditNoDetails)
	case !predicted:
		a.m.UsageAudit(model, metrics.AuditNoPrediction)
	default:
		a.m.ObserveCachedTokensError(model, pred-u.CachedTokens)
		a.m.UsageAudit(model, metrics.AuditAudited)
	}
}

func (a *usageAuditor) count(model, result string) {
	a.m.UsageAudit(a.modelLabel(model), result)
}

// predictedCached is the overlap, in tokens, kvgate predicted on the
// endpoint that served d: a tier-1.5 hit's matched blocks, or 0 when no
// endpoint held any block (no_worker). Other decisions scored no endpoint
// or chose one by something else than its overlap, so they predict
// nothing. Each matched hash stands for kvBlockSize × the granularity step
// tokens (docs/parity.md, "Hash granularity"); like vLLM, a prompt's last
// token is never a cache hit, so the prediction stops a block short of a
// prompt that ends on a block boundary.
func predictedCached(d fullproxy.Decision, st *ruleState) (int, bool) {
	switch {
	case d.Tier == "1.5" && d.Reason == "hit":
	case d.Reason == "no_worker":
		return 0, true
	default:
		return 0, false
	}
	block := st.rule.BlockSize()
	if st.gran != nil {
		block *= max(st.gran.Step(), 1)
	}
	if block <= 0 {
		return 0, false
	}
	pred := d.Score * block
	if d.PromptTokens > 0 {
		pred = min(pred, (d.PromptTokens-1)/block*block)
	}
	return pred, true
}

// modelLabel bounds the model label to configured names: a kvLoraAdapters
// name of the rule, or a model whose tokenizer is staged. Anything else,
// such as a client's model on a token-id prompt, is "other".
func (a *usageAuditor) modelLabel(model string) string {
	st := a.r.state.Load()
	for _, name := range st.facts.Adapters {
		if name == model {
			return model
		}
	}
	if a.r.pool != nil && a.staged.has(a.r.pool, model) {
		return model
	}
	return "other"
}

// stagedTTL is how long a staging answer is reused: a tokenizer staged
// while kvgate runs is labelled by its name within this long.
const stagedTTL = 10 * time.Second

// maxStagedNames bounds the answers kept; a full table is cleared, so a
// flood of made-up model names costs stat calls, not memory.
const maxStagedNames = 256

// stagedModels answers whether a model's tokenizer.json is staged by a stat
// of the file, not by loading it: a token-id prompt naming an unknown model
// must not make the pool try (and log) a load.
type stagedModels struct {
	mu      sync.Mutex
	answers map[string]stagedAnswer
}

type stagedAnswer struct {
	staged bool
	at     time.Time
}

func (s *stagedModels) has(pool *tokenizer.Pool, model string) bool {
	slug := tokenizer.Slug(model)
	if slug == "" || len(slug) > 255 || slug == "." || slug == ".." || strings.ContainsAny(slug, "\x00\\") {
		return false
	}
	now := time.Now()
	s.mu.Lock()
	if a, ok := s.answers[model]; ok && now.Sub(a.at) < stagedTTL {
		s.mu.Unlock()
		return a.staged
	}
	s.mu.Unlock()
	fi, err := os.Stat(pool.Path(model))
	staged := err == nil && fi.Mode().IsRegular()
	s.mu.Lock()
	if s.answers == nil || len(s.answers) >= maxStagedNames {
		s.answers = map[string]stagedAnswer{}
	}
	s.answers[model] = stagedAnswer{staged: staged, at: now}
	s.mu.Unlock()
	return staged
}

// logMismatch logs a prompt-token disagreement. kvgate cannot see the
// engine's token ids, so it logs the range the first differing token lies
// in: not past the shorter count (where one prompt ends inside the other,
// or earlier), and not before the overlap both sides found in the engine's
// cache, when both are positive (the engine's blocks for that many tokens
// hashed equal to kvgate's ids).
func (a *usageAuditor) logMismatch(model string, d fullproxy.Decision, u usageaudit.Usage, pred int, predicted bool) {
	atMost := min(d.PromptTokens, u.PromptTokens)
	atLeast := 0
	if predicted && u.HasCached && pred > 0 && u.CachedTokens > 0 {
		atLeast = min(pred, u.CachedTokens)
	}
	a.log.Warn("kv usage audit: the engine counted a different number of prompt tokens than kvgate; "+
		"its tokenizer or chat template differs from the one staged for kvgate, so prompts hash differently",
		"reason", "prompt_tokens", "service", a.service, "model", model, "ep_idx", d.Endpoint,
		"kvgate_prompt_tokens", d.PromptTokens, "engine_prompt_tokens", u.PromptTokens,
		"difference", u.PromptTokens-d.PromptTokens,
		"first_diff_at_least", atLeast, "first_diff_at_most", atMost,
		"fix", "stage the engine's own tokenizer.json (and chat template) for this model (docs/tokenizer.md)")
}

// promptMismatches is a rule's running prompt-token mismatch count
// (status.Options.PromptMismatches); 0 for an unknown rule.
func (g *Gateway) promptMismatches(service int) uint64 {
	g.mu.Lock()
	rt := g.rules[service]
	g.mu.Unlock()
	if rt == nil || rt.audit == nil {
		return 0
	}
	return rt.audit.mismatches.Load()
}
