package health

import (
	"fmt"
	"io"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine metric families the scrape reads.
const (
	FamilyWaiting = "vllm:num_requests_waiting"
	// FamilyRunning is the engine's batch; with FamilyWaiting it is the
	// engine's own load, which every replica sees alike (docs/replicas.md).
	FamilyRunning     = "vllm:num_requests_running"
	FamilyCacheConfig = "vllm:cache_config_info"
	labelGPUBlocks    = "num_gpu_blocks"
	// MaxScrapeBytes bounds one /metrics body.
	MaxScrapeBytes = 8 << 20
)

// EngineMetrics is one scrape's result; -1 means the family (or label) was
// missing, so the value is unknown.
type EngineMetrics struct {
	GPUBlocks int64
	Waiting   int64
	Running   int64
}

// ParseEngineMetrics reads a Prometheus text exposition. The queue depth is
// the sum of vllm:num_requests_waiting over its samples (one per engine
// rank); num_gpu_blocks is the sum of the label over vllm:cache_config_info
// samples. At most MaxScrapeBytes are read.
func ParseEngineMetrics(r io.Reader) (EngineMetrics, error) {
	m := EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}
	lr := &io.LimitedReader{R: r, N: MaxScrapeBytes + 1}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(lr)
	if lr.N <= 0 {
		return m, fmt.Errorf("engine metrics: body exceeds %d bytes", MaxScrapeBytes)
	}
	if err != nil {
		return m, fmt.Errorf("engine metrics: %w", err)
	}
	m.Waiting = sumFamily(families[FamilyWaiting])
	m.Running = sumFamily(families[FamilyRunning])
	if f := families[FamilyCacheConfig]; f != nil {
		var sum int64
		found := false
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() != labelGPUBlocks {
					continue
				}
				n, err := strconv.ParseInt(l.GetValue(), 10, 64)
				if err == nil && n >= 0 && n < math.MaxInt32 {
					sum += n
					found = true
				}
			}
		}
		if found {
			m.GPUBlocks = sum
		}
	}
	return m, nil
}

// sumFamily is the sum of a gauge family over its samples (one per engine
// rank), -1 when it is missing or not a count.
func sumFamily(f *dto.MetricFamily) int64 {
	if f == nil || len(f.GetMetric()) == 0 {
		return -1
	}
	var sum float64
	for _, s := range f.GetMetric() {
		sum += sampleValue(s)
	}
	if math.IsNaN(sum) || sum < 0 {
		return -1
	}
	return int64(min(sum, math.MaxInt32))
}

func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	}
	return 0
}
