package gateway

// P/D (mode 1) wiring of one rule: the rule's handler (the two-leg flow of
// pkg/pd in front of the plain forward), its topology, its plan and the
// observer feeding its measurements to pkg/metrics.

import (
	"fmt"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/pd"
	"github.com/kvgate/kvgate/pkg/selector"
)

// handler builds the rule's request handler: the plain forward over r,
// under the rule's circuit breaker; for a P/D rule, the two-leg flow
// (pkg/pd) in front of it.
func (h *ruleHealth) handler(rule *config.Rule, r *router, audit *usageAuditor) (fullproxy.Handler, error) {
	plain := fullproxy.NewForward(r, h)
	if !h.pdRule {
		return plain, nil
	}
	f, err := pd.New(pd.Config{
		ServiceID: rule.ServiceID, Begin: r.pdPlan, Plain: plain, Health: h, Admission: h.admission, Loads: h.pdLoads(),
		PrefillTimeout: h.settings.PrefillTimeout, DecodeSilence: h.settings.DecodeSilence,
		DecodeOnlyFallback: h.settings.DecodeOnlyFallback,
		Observer:           &pdObserver{m: h.m, service: rule.ServiceID, modelLabel: r.modelLabel}, Logger: h.log,
		PrefillUsage: audit.prefillUsage,
	}, pdTopology(rule))
	if err != nil {
		return nil, fmt.Errorf("service %d: %w", rule.ServiceID, err)
	}
	h.flow = f
	return f, nil
}

func pdTopology(rule *config.Rule) pd.Topology {
	t := pd.Topology{RequestIDReceipt: rule.Args.PDRequestIDReceipt}
	for _, e := range rule.Endpoints {
		t.Endpoints = append(t.Endpoints, pd.Endpoint{Idx: e.Idx, Role: selector.Role(e.Role), IP: e.IP, Port: e.TargetPort, NixlPort: e.NixlPort})
	}
	return t
}

// pdPlan prepares a request for the P/D flow exactly as Plan does; the
// flow owns the result for the request's life.
func (r *router) pdPlan(req *fullproxy.Request) pd.Plan {
	sc := r.planFor(req)
	p := pd.Plan{Attempt: &sc.attempt, Model: sc.facts.Model, PromptTokens: sc.tokens, Blocks: len(sc.selReq.Hashes), Stages: sc.stages}
	if ov, hashes := r.overlay, sc.selReq.Hashes; ov != nil && len(hashes) > 0 {
		p.Reserve = func(ep int) func() {
			res := ov.Reserve(ep, hashes)
			return func() { ov.Release(res) }
		}
	}
	return p
}

// pdObserver feeds the P/D flow's measurements to pkg/metrics.
type pdObserver struct {
	m       *metrics.Metrics
	service int
	// modelLabel maps a request's model to its per-model metric label ("":
	// no discovery on the rule; models.go).
	modelLabel func(model string) string
}

func (o *pdObserver) Decided(d selector.Decision) {
	if d.Reason.Miss() {
		o.m.Tier15Miss(o.service, d.Reason.String())
	}
	if d.Fallthrough {
		o.m.Tier15FallthroughInc(o.service)
	}
}

func (o *pdObserver) Committed(out selector.Outcome, model string, stages []fullproxy.Stage) {
	if out.Tier == selector.TierSession && model != "" {
		o.m.AIPDSessionHits.WithLabelValues(o.m.ModelLabel(model)).Inc()
	}
	observeStages(o.m, o.service, stages)
	recordOutcome(o.m, o.service, out)
	if out.Hit && o.modelLabel != nil {
		if l := o.modelLabel(model); l != "" {
			o.m.ModelHit(o.service, l)
		}
	}
}

func (o *pdObserver) Leg(leg, model string, d time.Duration) {
	o.m.ObservePDLeg(o.service, leg, model, d)
}
func (o *pdObserver) Timeout(kind string) { o.m.PDTimeout(o.service, kind) }
func (o *pdObserver) Retry(leg string) {
	o.m.PDRetries.WithLabelValues(strconv.Itoa(o.service), leg).Inc()
}
func (o *pdObserver) Failover() { o.m.PDInc(o.m.PDConnectFailover, o.service) }
func (o *pdObserver) EndpointDied(leg string) {
	if leg == "prefill" {
		o.m.PDInc(o.m.PDPrefillEPDied, o.service)
	} else {
		o.m.PDInc(o.m.PDDecodeEPDied, o.service)
	}
}
func (o *pdObserver) DecodeZeroByte() { o.m.PDInc(o.m.PDDecodeZeroByte, o.service) }
func (o *pdObserver) DecodeOnly()     { o.m.PDInc(o.m.PDFallbackToNormal, o.service) }
func (o *pdObserver) KVParams(model string, found bool) {
	if found {
		o.m.AIPDKVParamsFound.WithLabelValues(o.m.ModelLabel(model)).Inc()
	} else {
		o.m.AIPDKVParamsMiss.WithLabelValues(o.m.ModelLabel(model)).Inc()
	}
}
func (o *pdObserver) Request(model, phase, status string) { o.m.AIPDRequest(model, phase, status) }
