package metrics

// CachedTokensErrorBuckets are the upper bounds of
// kvgate_kv_cached_tokens_error_tokens: kvgate's predicted overlap minus the
// engine's cached_tokens, in tokens. Both are whole blocks, so the (-1, 0]
// bucket is "exact"; the others are powers of 4 either side, up to 4,096
// tokens (256 blocks of 16). Positive: kvgate expected more than the engine
// had (an event not yet seen as removed, a lost race); negative: the engine
// had more than kvgate knew (events not yet applied, another request's
// blocks).
var CachedTokensErrorBuckets = []float64{-4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096}

// Results of kvgate_kv_usage_audit_total{result}.
const (
	// AuditAudited: prompt_tokens and cached_tokens were both compared.
	AuditAudited = "audited"
	// AuditNoUsage: the response carried no usage kvgate could read (a
	// stream without include_usage, an error, a body above the bound).
	AuditNoUsage = "no_usage"
	// AuditNoDetails: prompt_tokens was compared; the response had no
	// prompt_tokens_details.cached_tokens (vLLM without
	// --enable-prompt-tokens-details, or vLLM's omission for a request with
	// no cache hit).
	AuditNoDetails = "no_details"
	// AuditNoPrediction: prompt_tokens was compared; the decision made no
	// overlap prediction for the endpoint that served it (a tier-1, tier-2
	// or selector decision, a guard miss other than no_worker).
	AuditNoPrediction = "no_prediction"
	// AuditNoCount: kvgate did not tokenize the prompt (guard reasons
	// text_empty, model_empty, tokenize, hashes), so it has nothing to
	// compare.
	AuditNoCount = "no_count"
)

func (m *Metrics) registerUsageAudit(f factory) {
	m.UsageAudits = f.counter("kvgate_kv_usage_audit_total", "Responses the per-request usage audit read, by result (audited, no_usage, no_details, no_prediction, no_count).", "model", "result")
	m.PromptTokensMismatch = f.counter("kvgate_kv_prompt_tokens_mismatch_total", "Audited responses whose usage.prompt_tokens differs from kvgate's own prompt token count: a tokenizer or chat-template parity break.", "model")
	m.CachedTokensError = f.histogram("kvgate_kv_cached_tokens_error_tokens", "kvgate's predicted overlap on the serving endpoint minus the engine's usage.prompt_tokens_details.cached_tokens, in tokens.", CachedTokensErrorBuckets, "model")
}

// UsageAudit counts one response of the usage audit under model (a label
// the caller took from configuration) and result (an Audit* constant).
func (m *Metrics) UsageAudit(model, result string) {
	m.UsageAudits.WithLabelValues(m.ModelLabel(model), result).Inc()
}

// PromptTokensMismatchInc counts a prompt_tokens disagreement under model.
func (m *Metrics) PromptTokensMismatchInc(model string) {
	m.PromptTokensMismatch.WithLabelValues(m.ModelLabel(model)).Inc()
}

// ObserveCachedTokensError records predicted minus reported cached tokens.
func (m *Metrics) ObserveCachedTokensError(model string, predictedMinusReported int) {
	m.CachedTokensError.WithLabelValues(m.ModelLabel(model)).Observe(float64(predictedMinusReported))
}
