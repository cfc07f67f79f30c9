package controller

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the reference controller's names on :18857 (docs/controller.md).
type metrics struct {
	emitted             prometheus.Counter
	epoch               prometheus.Gauge
	staleness           *prometheus.GaugeVec
	stale               *prometheus.GaugeVec
	fleetStale          prometheus.Gauge
	epWeight            *prometheus.GaugeVec
	registryMismatch    *prometheus.CounterVec
	watchers            prometheus.Gauge
	acksApplied         *prometheus.CounterVec
	acksRejected        *prometheus.CounterVec
	negativeControl     prometheus.Gauge
	dropped             *prometheus.CounterVec
	fingerprintMismatch *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		emitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "aictrl_snapshots_emitted_total",
			Help: "Snapshots emitted."}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aictrl_current_epoch", Help: "Epoch of the last snapshot."}),
		staleness: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aictrl_source_staleness_seconds",
			Help: "Seconds since the source's last successful scrape."}, []string{"source"}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aictrl_source_stale",
			Help: "1 while the source is past --stale-budget-sec."}, []string{"source"}),
		fleetStale: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aictrl_fleet_stale",
			Help: "1 while every source is stale (nothing is emitted)."}),
		epWeight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aictrl_ep_weight",
			Help: "Last emitted weight (0..100)."}, []string{"service", "ep_idx"}),
		registryMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aictrl_registry_mismatch_total",
			Help: "Transitions into a live num_gpu_blocks that differs from expected_num_gpu_blocks."}, []string{"source"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aictrl_watchers_connected",
			Help: "Gateways watching snapshots."}),
		acksApplied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aictrl_acks_applied_total",
			Help: "Snapshots a gateway acknowledged as applied."}, []string{"gateway"}),
		acksRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aictrl_acks_rejected_total",
			Help: "Snapshots a gateway rejected (NACK)."}, []string{"gateway"}),
		negativeControl: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aictrl_negative_control_active",
			Help: "1 while negative control is active; kvgate's controller has none, so 0."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aictrl_watcher_dropped_snapshots_total",
			Help: "Snapshots replaced by a newer one before a slow gateway read them."}, []string{"gateway"}),
		fingerprintMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aictrl_fingerprint_mismatch_total",
			Help: "Epochs in which the live num_gpu_blocks did not match calibration.fingerprint_fields."}, []string{"source"}),
	}
	for _, c := range []prometheus.Collector{m.emitted, m.epoch, m.staleness, m.stale, m.fleetStale, m.epWeight,
		m.registryMismatch, m.watchers, m.acksApplied, m.acksRejected, m.negativeControl, m.dropped, m.fingerprintMismatch} {
		if err := r.Register(c); err != nil {
			return nil, fmt.Errorf("controller metrics: %w", err)
		}
	}
	return m, nil
}
