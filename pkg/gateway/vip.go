package gateway

import (
	"fmt"
	"net/netip"

	"github.com/kvgate/kvgate/pkg/config"
)

// VIPPlumber puts rule VIPs on a network device (package vip). A VIP shared
// by several rules (one per port) is claimed once per rule.
type VIPPlumber interface {
	Claim(netip.Addr) error
	Release(netip.Addr) error
}

func ruleVIP(rule *config.Rule) (netip.Addr, bool) {
	a, err := netip.ParseAddr(rule.Args.ExternalIP)
	if err != nil || a.IsUnspecified() {
		return netip.Addr{}, false // a wildcard VIP binds every address: nothing to plumb
	}
	return a, true
}

func (g *Gateway) claimVIP(rule *config.Rule) error {
	a, ok := ruleVIP(rule)
	if g.opts.VIPs == nil || !ok {
		return nil
	}
	if err := g.opts.VIPs.Claim(a); err != nil {
		return fmt.Errorf("service %d: %w", rule.ServiceID, err)
	}
	return nil
}

func (g *Gateway) releaseVIP(rule *config.Rule) {
	a, ok := ruleVIP(rule)
	if g.opts.VIPs == nil || !ok {
		return
	}
	if err := g.opts.VIPs.Release(a); err != nil {
		g.log.Warn("VIP release failed", "service", rule.ServiceID, "vip", a, "err", err)
	}
}
