package metrics

import "github.com/prometheus/client_golang/prometheus"

// Conversation prefix cache of the tokenizers (docs/tokenizer.md, "Decision
// cost at long context"): lookups by result, the text bytes not encoded
// again, and what the caches hold.

// ConversationLookup counts one lookup of a tokenizer's conversation prefix
// cache (kvgate_tokenize_prefix_lookups_total{result}) and the bytes it
// saved (kvgate_tokenize_prefix_reused_bytes_total). Safe on a nil Metrics.
func (m *Metrics) ConversationLookup(hit bool, reusedBytes int) {
	if m == nil || m.convLookups == nil {
		return
	}
	result := "miss"
	if hit {
		result = "hit"
	}
	m.convLookups.WithLabelValues(result).Inc()
	m.convReused.Add(float64(reusedBytes))
}

// SetConversationCacheSource makes kvgate_tokenize_prefix_cache_bytes read
// fn at scrape time (the tokenizer pool's sum over loaded models).
func (m *Metrics) SetConversationCacheSource(fn func() int) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvgate_tokenize_prefix_cache_bytes",
		Help: "Bytes held by the tokenizers' conversation prefix caches (text, ids and cut points), summed over loaded models.",
	}, func() float64 { return float64(fn()) }))
}

func (m *Metrics) initConversationCache(f factory) {
	m.convLookups = f.counter("kvgate_tokenize_prefix_lookups_total", "Encodes of a long prompt (8 KiB or more) that looked up the tokenizer's conversation prefix cache, by result (hit: the ids of a shared prefix were reused; miss: encoded in full).", "result")
	for _, r := range []string{"hit", "miss"} {
		m.convLookups.WithLabelValues(r)
	}
	m.convReused = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_tokenize_prefix_reused_bytes_total", Help: "Prompt text bytes whose ids the conversation prefix cache reused instead of encoding them again."})
	f.reg.MustRegister(m.convReused)
}
