package gateway

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/metrics"
)

// TestRuleBreakerFollowsCBEnable: a plain rule has a circuit breaker only
// with cb_enable (docs/api.md: default false); a P/D rule always has one,
// with threshold 3. Before this, every rule had a breaker, so a burst of
// connect timeouts on a loaded host opened the breakers of rules that never
// asked for one and answered their requests 503.
func TestRuleBreakerFollowsCBEnable(t *testing.T) {
	tests := []struct {
		name     string
		args     config.ServiceArguments
		failures int  // connect failures recorded on endpoint 0
		open     bool // the breaker is open after them
	}{
		{"plain rule, cb_enable off: never opens", config.ServiceArguments{}, 20, false},
		{"plain rule, cb_enable on: opens at 5", config.ServiceArguments{CBEnable: true}, 5, true},
		{"plain rule, cb_enable on: closed at 4", config.ServiceArguments{CBEnable: true}, 4, false},
		{"P/D rule: forced on, opens at 3", config.ServiceArguments{PDDisaggMode: true}, 3, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := &config.Rule{ServiceID: 7, Args: tc.args, Endpoints: []config.Endpoint{
				{Idx: 0, IP: "127.0.0.1", TargetPort: 1, Weight: 1, Role: config.RolePrefill},
				{Idx: 1, IP: "127.0.0.1", TargetPort: 2, Weight: 1, Role: config.RoleDecode},
			}}
			m := metrics.New(metrics.Options{NoProcessCollectors: true})
			h, err := newRuleHealth(rule, config.DefaultSettings(), nil, m, quietLogger())
			if err != nil {
				t.Fatal(err)
			}
			for range tc.failures {
				h.ConnectFailure(0)
			}
			if got := h.tracker.Load().Breaker(0) == health.BreakerOpen; got != tc.open {
				t.Fatalf("breaker open = %v after %d connect failures, want %v", got, tc.failures, tc.open)
			}
			if got := h.Allow(0); got == tc.open {
				t.Fatalf("Allow = %v with the breaker open = %v", got, tc.open)
			}
		})
	}
}
