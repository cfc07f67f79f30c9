package gateway

import (
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/models"
	"github.com/kvgate/kvgate/pkg/status"
)

// newStatus builds the collector behind GET /netlox/v1/status from what the
// gateway already keeps: the API's rule table, the subscribers and the
// metrics registry. g.API is read when a snapshot is taken, after New.
func (g *Gateway) newStatus() *status.Collector {
	return status.New(status.Options{
		Rules: func() []*config.Rule {
			if g.API == nil {
				return nil
			}
			return g.API.Rules()
		},
		Subscribers: g.subs.Status,
		Gatherer:    g.Metrics.Registry,
		Datapath:    g.leg.Path,
		Health:      g.EndpointActive,
		ProbeError:  g.ProbeError,
		Models:      g.EndpointModels,
		// The usage audit's per-rule count: a tokenizer or template break.
		PromptMismatches: g.promptMismatches,
		SeedSet: func(r *config.Rule) bool {
			_, ok := r.HashSeed(g.opts.Settings)
			return ok
		},
	})
}

// EndpointModels is what model discovery knows of one endpoint of a rule;
// false when the rule runs no discovery (LLB_KV_MODEL_DISCOVERY_SEC=0, or
// not a KV rule) or has no such endpoint.
func (g *Gateway) EndpointModels(serviceID, epIdx int) (models.EndpointState, bool) {
	g.mu.Lock()
	rt, ok := g.rules[serviceID]
	var rm *ruleModels
	if ok {
		rm = rt.models
	}
	g.mu.Unlock()
	return rm.State(epIdx)
}
