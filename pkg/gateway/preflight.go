package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/models"
	"github.com/kvgate/kvgate/pkg/preflight"
)

// Preflight implements api.PreflightRunner (docs/preflight.md).
func (g *Gateway) Preflight(ctx context.Context, rule *config.Rule, probe bool) preflight.Report {
	return preflight.New(preflightSource{g}).Run(ctx, rule, probe)
}

// preflightSource is what the preflight reads from the running gateway.
type preflightSource struct{ g *Gateway }

func (s preflightSource) SubscriberConnected(service, epIdx int) (bool, bool) {
	for _, st := range s.g.subs.Status() {
		if int(st.Service) != service || st.EPIdx != epIdx {
			continue
		}
		for _, r := range st.Ranks {
			if !r.Connected {
				return false, true
			}
		}
		return len(st.Ranks) > 0, true
	}
	return false, false
}

func (s preflightSource) Parity(service int) *ingest.Parity { return s.g.Parity(service) }

func (s preflightSource) StagedTokenizer(model string) (string, error) {
	_, err := s.g.pool.Get(model)
	return s.g.pool.Path(model), err
}

func (s preflightSource) Tokenize(model, prompt string) ([]uint32, error) {
	m, err := s.g.pool.Get(model)
	if err != nil {
		return nil, err
	}
	return m.EncodePrompt(prompt, nil)
}

// PredictHashes hashes a completion prompt exactly as the router does for a
// request, at the stride the engines publish.
func (s preflightSource) PredictHashes(service int, model, prompt string) ([]uint64, error) {
	s.g.mu.Lock()
	rt, ok := s.g.rules[service]
	s.g.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("service %d: no such rule", service)
	}
	st := rt.router.state.Load()
	if st.hasher == nil {
		return nil, errors.New("the rule has no usable hash contract")
	}
	ids, err := s.Tokenize(model, prompt)
	if err != nil {
		return nil, err
	}
	hs := st.hasher.AppendHashes(nil, ids, kvhash.Extra{})
	if st.gran != nil {
		hs = ingest.EveryKth(hs, st.gran.Step())
	}
	return hs, nil
}

func (s preflightSource) Inventory(service, epIdx int) ([]uint64, bool) {
	_, hs, ok := s.g.Snapshot(service, epIdx)
	return hs, ok
}

func (s preflightSource) Tier15Hits(service, epIdx int) float64 {
	c, err := s.g.Metrics.Tier15Hits.GetMetricWithLabelValues(fmt.Sprint(service), fmt.Sprint(epIdx))
	if err != nil {
		return 0
	}
	var m dto.Metric
	if c.Write(&m) != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}

// EngineClient is the rule's engine-facing client (https on security 2).
func (s preflightSource) EngineClient(service int) *engineclient.Client {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if rt, ok := s.g.rules[service]; ok {
		return rt.engine
	}
	return nil
}

// DiscoveredModels is the rule's model discovery state of an endpoint.
func (s preflightSource) DiscoveredModels(service, epIdx int) (models.EndpointState, bool) {
	return s.g.EndpointModels(service, epIdx)
}

// VIPClientTLS pins the certificate the rule's listener serves now.
func (s preflightSource) VIPClientTLS(service int) (*tls.Config, error) {
	s.g.mu.Lock()
	rt, ok := s.g.rules[service]
	s.g.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("service %d is not running", service)
	}
	if rt.term == nil {
		return nil, nil
	}
	return rt.term.SelfClientConfig(), nil
}
