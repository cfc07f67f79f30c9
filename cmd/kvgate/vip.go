package main

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/vip"
)

// openVIPs opens the VIP plumber for --vip-dev, or returns nil when the flag
// is off. The metrics are bound later, once the gateway has built them.
func openVIPs(f daemonFlags, log *slog.Logger) (*vip.Plumber, *vipMetrics, error) {
	if f.vipDev == "" {
		if f.vipGARP {
			return nil, nil, fmt.Errorf("--vip-garp needs --vip-dev")
		}
		return nil, nil, nil
	}
	obs := &vipMetrics{}
	p, err := vip.Open(vip.Options{Device: f.vipDev, StateDir: f.stateDir, Announce: f.vipGARP, Observer: obs, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return p, obs, nil
}

// vipMetrics forwards the plumber's counts to kvgate_vip_addresses once the
// gateway's metrics exist (the plumber is opened before the gateway, which
// restores persisted rules and so claims their VIPs).
type vipMetrics struct {
	m atomic.Pointer[metrics.Metrics]
}

func (o *vipMetrics) Addresses(owner string, n int) {
	if m := o.m.Load(); m != nil {
		m.VIPAddresses.WithLabelValues(owner).Set(float64(n))
	}
}
