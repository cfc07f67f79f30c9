package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReplicaMetrics are the series of active-active replicas (docs/replicas.md):
// the --rules-file reconcile.
type ReplicaMetrics struct {
	RulesFileReloads     *prometheus.CounterVec // kvgate_rules_file_reloads_total{result}
	RulesFileLastSuccess prometheus.Gauge       // kvgate_rules_file_last_reload_success
	RulesFileLastReload  prometheus.Gauge       // kvgate_rules_file_last_reload_timestamp_seconds
	RulesFileRules       prometheus.Gauge       // kvgate_rules_file_rules
}

func newReplicaMetrics(f factory) ReplicaMetrics {
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		f.reg.MustRegister(g)
		return g
	}
	return ReplicaMetrics{
		RulesFileReloads: f.counter("kvgate_rules_file_reloads_total",
			"Reconciles of the rule table with --rules-file, by result: ok, invalid (nothing changed), partial (some rules refused, retried).", "result"),
		RulesFileLastSuccess: gauge("kvgate_rules_file_last_reload_success", "1 when the last --rules-file reconcile succeeded, else 0."),
		RulesFileLastReload:  gauge("kvgate_rules_file_last_reload_timestamp_seconds", "Unix time of the last --rules-file reconcile, whatever its result."),
		RulesFileRules:       gauge("kvgate_rules_file_rules", "Rules the --rules-file named at its last applied reconcile."),
	}
}

// RulesFileReload records one reconcile (rulesfile.Observer).
func (m *Metrics) RulesFileReload(result string, rules int, at time.Time) {
	r := m.Replicas
	r.RulesFileReloads.WithLabelValues(result).Inc()
	r.RulesFileLastReload.Set(float64(at.UnixNano()) / 1e9)
	if result == "ok" {
		r.RulesFileLastSuccess.Set(1)
	} else {
		r.RulesFileLastSuccess.Set(0)
	}
	if result != "invalid" {
		r.RulesFileRules.Set(float64(rules))
	}
}
