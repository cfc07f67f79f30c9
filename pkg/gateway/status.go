package gateway

import (
	"github.com/kvgate/kvgate/pkg/config"
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
		// The usage audit's per-rule count: a tokenizer or template break.
		PromptMismatches: g.promptMismatches,
		SeedSet: func(r *config.Rule) bool {
			_, ok := r.HashSeed(g.opts.Settings)
			return ok
		},
	})
}
