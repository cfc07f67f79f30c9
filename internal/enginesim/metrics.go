package enginesim

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// ttftBuckets are vLLM's buckets for vllm:time_to_first_token_seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// engineMetrics are vLLM's metric families (names, types, labels model_name
// and engine) on a registry of the engine's own, so several engines can live
// in one process.
type engineMetrics struct {
	registry *prometheus.Registry

	running          prometheus.Gauge
	waiting          prometheus.Gauge
	kvUsage          prometheus.Gauge
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	externalQueries  prometheus.Counter
	externalHits     prometheus.Counter
	preemptions      prometheus.Counter
	requestSuccess   *prometheus.CounterVec
	ttft             prometheus.Observer

	decodeLocalPrefills prometheus.Counter
	aborted             prometheus.Counter
}

func newEngineMetrics(cfg Config) *engineMetrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": cfg.Model, "engine": strconv.Itoa(cfg.DataParallelRank)}
	f := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Name: name, Help: help, ConstLabels: labels}
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts(f(name, help)))
		reg.MustRegister(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts(f(name, help)))
		reg.MustRegister(c)
		return c
	}
	m := &engineMetrics{registry: reg}
	m.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
	m.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	m.kvUsage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.generationTokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	m.prefixQueries = counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
	m.externalQueries = counter("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.")
	m.externalHits = counter("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.")
	m.preemptions = counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
	m.requestSuccess = prometheus.NewCounterVec(prometheus.CounterOpts(f("vllm:request_success_total", "Count of successfully processed requests.")), []string{"finished_reason"})
	reg.MustRegister(m.requestSuccess)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "vllm:time_to_first_token_seconds", Help: "Histogram of time to first token in seconds.",
		ConstLabels: labels, Buckets: ttftBuckets,
	})
	reg.MustRegister(h)
	m.ttft = h
	m.aborted = counter("enginesim_requests_aborted_total",
		"Requests whose client disconnected before their response completed; the engine stopped computing them.")
	m.decodeLocalPrefills = counter("enginesim_decode_local_prefills_total",
		"Requests a decode-role engine received without kv_transfer_params and prefilled locally (the P/D hand-off did not happen).")

	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"engine":                   labels["engine"],
			"block_size":               strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks":           strconv.Itoa(cfg.NumGPUBlocks),
			"num_cpu_blocks":           "None",
			"enable_prefix_caching":    "True",
			"prefix_caching_hash_algo": cfg.HashAlgo,
			"cache_dtype":              "auto",
			"gpu_memory_utilization":   "0.9",
			"sliding_window":           "None",
			"kv_cache_size_tokens":     strconv.Itoa(cfg.NumGPUBlocks * cfg.BlockSize),
		},
	})
	info.Set(1)
	reg.MustRegister(info)
	return m
}
