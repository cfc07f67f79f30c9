package gateway

import (
	"github.com/kvgate/kvgate/pkg/aictrl"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

// The gateway is the AI controller applier's target (aictrl.Target,
// docs/controller.md): rules are found by their "vip:port:proto" key and
// their endpoints named "ip:port" by ep_idx, kvgate's numbering in the
// order endpoints were posted.

// ruleByServiceKey returns the runtime and its rule as of now (rt.rule is
// replaced under g.mu by updates).
func (g *Gateway) ruleByServiceKey(key string) (*ruleRuntime, *config.Rule) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rt := range g.rules {
		k := rt.rule.Key()
		if aictrl.ServiceKey(k.ExternalIP, k.Port, k.Protocol) == key {
			return rt, rt.rule
		}
	}
	return nil, nil
}

// AdviceEndpoints implements aictrl.Target.
func (g *Gateway) AdviceEndpoints(key string) (map[int]string, bool) {
	rt, rule := g.ruleByServiceKey(key)
	if rt == nil {
		return nil, false
	}
	out := make(map[int]string, len(rule.Endpoints))
	for _, e := range rule.Endpoints {
		out[e.Idx] = aictrl.EndpointAddr(e.IP, e.TargetPort)
	}
	return out, true
}

// SetAdvice implements aictrl.Target.
func (g *Gateway) SetAdvice(key string, adv *selector.Advice) {
	if rt, _ := g.ruleByServiceKey(key); rt != nil {
		rt.sel.SetAdvice(adv)
	}
}

// Unavailable implements aictrl.Target.
func (g *Gateway) Unavailable(key string) epset.Set {
	if rt, _ := g.ruleByServiceKey(key); rt != nil {
		return rt.health.States().Unavailable()
	}
	return epset.Set{}
}
