package metrics

import "github.com/prometheus/client_golang/prometheus"

// Decoded-message cache of the rules (docs/tokenizer.md, "Decision cost at
// long context"): lookups of a chat body's messages by result, and the
// message bytes not decoded again.

// MessageLookup counts one lookup of a rule's decoded-message cache
// (kvgate_extract_messages_lookups_total{result}) and the bytes it saved
// (kvgate_extract_messages_reused_bytes_total). Safe on a nil Metrics.
func (m *Metrics) MessageLookup(hit bool, reusedBytes int) {
	if m == nil || m.msgLookups == nil {
		return
	}
	result := "miss"
	if hit {
		result = "hit"
	}
	m.msgLookups.WithLabelValues(result).Inc()
	m.msgReused.Add(float64(reusedBytes))
}

// SetMessageCacheSource makes kvgate_extract_messages_cache_bytes read fn
// at scrape time (the gateway's sum over its rules' caches).
func (m *Metrics) SetMessageCacheSource(fn func() int64) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvgate_extract_messages_cache_bytes",
		Help: "Estimated bytes held by the rules' decoded-message caches (the array bytes kept alive and the decoded messages), summed over rules.",
	}, func() float64 { return float64(fn()) }))
}

func (m *Metrics) initMessageCache(f factory) {
	m.msgLookups = f.counter("kvgate_extract_messages_lookups_total", "Chat bodies whose messages array (8 KiB or more) looked up the rule's decoded-message cache, by result (hit: the leading messages were reused; miss: decoded in full).", "result")
	for _, r := range []string{"hit", "miss"} {
		m.msgLookups.WithLabelValues(r)
	}
	m.msgReused = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_extract_messages_reused_bytes_total", Help: "Bytes of chat messages arrays whose decoded messages the decoded-message cache reused instead of decoding them again."})
	f.reg.MustRegister(m.msgReused)
}
