package aictrl

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
)

// Metrics are the reference applier's eight loxilb_pd_ctrl_* series.
type Metrics struct {
	weight       *prometheus.GaugeVec
	state        *prometheus.GaugeVec
	appliedEpoch *prometheus.GaugeVec
	mode         prometheus.Gauge
	alpha        prometheus.Gauge
	overrides    prometheus.Counter
	nacks        prometheus.Counter
	applied      prometheus.Counter
}

// NewMetrics registers the series on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		weight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "loxilb_pd_ctrl_effective_weight",
			Help: "Controller weight in force (0..100; 100 is static)."}, []string{"service", "ep_idx"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "loxilb_pd_ctrl_state",
			Help: "Controller state in force: 1 active, 2 draining, 3 disabled."}, []string{"service", "ep_idx"}),
		appliedEpoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "loxilb_pd_ctrl_applied_epoch",
			Help: "Epoch of the last applied snapshot."}, []string{"service"}),
		mode: prometheus.NewGauge(prometheus.GaugeOpts{Name: "loxilb_pd_ctrl_mode",
			Help: "0 static weights, 1 advised, 2 decaying back to static past the deadline."}),
		alpha: prometheus.NewGauge(prometheus.GaugeOpts{Name: "loxilb_pd_ctrl_alpha",
			Help: "Share of the advice in force: 1 advised, falling to 0 over the decay window."}),
		overrides: prometheus.NewCounter(prometheus.CounterOpts{Name: "loxilb_pd_ctrl_override_events_total",
			Help: "Advised endpoints that local health kept out of service."}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "loxilb_pd_ctrl_nacks_total",
			Help: "Snapshots rejected."}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "loxilb_pd_ctrl_snapshots_applied_total",
			Help: "Snapshots applied."}),
	}
	for _, c := range []prometheus.Collector{m.weight, m.state, m.appliedEpoch, m.mode, m.alpha, m.overrides, m.nacks, m.applied} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ai controller metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) ep(key string, idx, weight int, st pb.EpState) {
	i := strconv.Itoa(idx)
	m.weight.WithLabelValues(key, i).Set(float64(weight))
	m.state.WithLabelValues(key, i).Set(float64(st))
}

// static shows a service back on static weights.
func (m *Metrics) static(key string, t Target) {
	eps, _ := t.AdviceEndpoints(key)
	for idx := range eps {
		m.ep(key, idx, 100, pb.EpState_EP_STATE_ACTIVE)
	}
}
