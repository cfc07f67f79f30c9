package metrics

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Per-model series (docs/selection.md, "Many models behind one rule"). The
// model label takes only names the gateway discovered from the engines'
// /v1/models or read from the rule, never a request's own model string, and
// at most a bounded number per rule (the rest read "other"), so a client
// cannot grow the series.
type modelSeries struct {
	Hits     *prometheus.CounterVec // kvgate_kv_model_hits_total{service,model}
	Misses   *prometheus.CounterVec // kvgate_kv_model_misses_total{service,model,reason}
	NotFound *prometheus.CounterVec // kvgate_model_not_found_total{service}
	Served   *prometheus.GaugeVec   // kvgate_endpoint_models{service,ep_idx}
	Errors   *prometheus.CounterVec // kvgate_model_discovery_errors_total{service}
	blocks   *modelBlocks           // kvgate_kv_model_blocks{service,model}
}

func newModelSeries(f factory) *modelSeries {
	s := &modelSeries{
		Hits: f.counter("kvgate_kv_model_hits_total", "Tier-1.5 hits by the request's model (a discovered or configured name).", "service", "model"),
		Misses: f.counter("kvgate_kv_model_misses_total", "Tier-1.5 guard misses by the request's model (a discovered or configured name) and reason.",
			"service", "model", "reason"),
		NotFound: f.counter("kvgate_model_not_found_total", "Requests answered 404 model_not_found: no endpoint of the rule serves the model.", "service"),
		Served:   f.gauge("kvgate_endpoint_models", "Models (base and LoRA adapters) the endpoint lists on /v1/models; 0 until discovered.", "service", "ep_idx"),
		Errors:   f.counter("kvgate_model_discovery_errors_total", "Failed /v1/models reads (unreachable, not 200, malformed or over a bound).", "service"),
		blocks:   &modelBlocks{src: map[int]func(func(model string, blocks int)){}},
	}
	f.reg.MustRegister(s.blocks)
	return s
}

// ModelHit counts a tier-1.5 hit of a request for model (a bounded label).
func (m *Metrics) ModelHit(service int, model string) {
	m.modelSeries().Hits.WithLabelValues(itoa(service), model).Inc()
}

// ModelMiss counts a tier-1.5 guard miss of a request for model.
func (m *Metrics) ModelMiss(service int, model, reason string) {
	m.modelSeries().Misses.WithLabelValues(itoa(service), model, reason).Inc()
}

// ModelNotFound counts a 404 model_not_found.
func (m *Metrics) ModelNotFound(service int) {
	m.modelSeries().NotFound.WithLabelValues(itoa(service)).Inc()
}

// ModelDiscoveryError counts one failed /v1/models read.
func (m *Metrics) ModelDiscoveryError(service int) {
	m.modelSeries().Errors.WithLabelValues(itoa(service)).Inc()
}

// SetEndpointModels sets how many models an endpoint lists.
func (m *Metrics) SetEndpointModels(service, epIdx, n int) {
	m.modelSeries().Served.WithLabelValues(itoa(service), itoa(epIdx)).Set(float64(n))
}

// SetModelBlocksSource installs the function a scrape calls for a rule's
// per-model block counts (nil removes it).
func (m *Metrics) SetModelBlocksSource(service int, fn func(yield func(model string, blocks int))) {
	b := m.modelSeries().blocks
	b.mu.Lock()
	defer b.mu.Unlock()
	if fn == nil {
		delete(b.src, service)
		return
	}
	b.src[service] = fn
}

// DeleteModelSeries removes a rule's per-model series (the rule is gone) or
// one endpoint's (epIdx >= 0).
func (m *Metrics) DeleteModelSeries(service, epIdx int) {
	s := m.modelSeries()
	if epIdx >= 0 {
		s.Served.DeletePartialMatch(prometheus.Labels{"service": itoa(service), "ep_idx": itoa(epIdx)})
		return
	}
	l := prometheus.Labels{"service": itoa(service)}
	s.Hits.DeletePartialMatch(l)
	s.Misses.DeletePartialMatch(l)
	s.NotFound.DeletePartialMatch(l)
	s.Served.DeletePartialMatch(l)
	s.Errors.DeletePartialMatch(l)
	m.SetModelBlocksSource(service, nil)
}

func (m *Metrics) modelSeries() *modelSeries {
	m.modelOnce.Do(func() { m.perModel = newModelSeries(factory{reg: m.Registry}) })
	return m.perModel
}

// modelBlocks is kvgate_kv_model_blocks{service,model}, read at scrape time
// from each rule's index so it never lags the inventory.
type modelBlocks struct {
	mu  sync.Mutex
	src map[int]func(func(model string, blocks int))
}

var modelBlocksDesc = prometheus.NewDesc("kvgate_kv_model_blocks",
	"GPU blocks in the mirrored inventories of the endpoints whose base model this is (discovered names).",
	[]string{"service", "model"}, nil)

func (b *modelBlocks) Describe(ch chan<- *prometheus.Desc) { ch <- modelBlocksDesc }

func (b *modelBlocks) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	src := make(map[int]func(func(string, int)), len(b.src))
	for k, v := range b.src {
		src[k] = v
	}
	b.mu.Unlock()
	for service, fn := range src {
		svc := strconv.Itoa(service)
		fn(func(model string, blocks int) {
			ch <- prometheus.MustNewConstMetric(modelBlocksDesc, prometheus.GaugeValue, float64(blocks), svc, model)
		})
	}
}
