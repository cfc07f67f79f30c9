package pd

import (
	"time"

	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Observer receives what the P/D flow measures. The daemon wires it to
// pkg/metrics; each method names the metric it feeds. Methods must be cheap
// and safe for concurrent use.
//
// Counted elsewhere: admission sheds and queued requests
// (loxilb_pd_admission_shed_total, loxilb_pd_admission_queued_total, park
// timeouts) by the admission.Controller's observer; breaker flips
// (loxilb_pd_cb_flips_total) by health.Tracker's; prefill and decode connect
// failures by the proxy observer's ConnectFailed
// (loxilb_pd_connect_failover_total); sessions
// (loxilb_pd_sessions_active) by the selector's.
type Observer interface {
	// Decided: one pass of the ladder (loxilb_pd_kv_tier15_miss_reason_total
	// for d.Reason.Miss(), loxilb_pd_kv_tier15_fallthrough_total for
	// d.Fallthrough).
	Decided(d selector.Decision)
	// Committed: the routed decision, once per request
	// (loxilb_pd_kv_tier15_hits_total, _spills_total, _cold_seeds_total, the
	// decision tier, the decision stage latencies, and
	// loxilb_ai_pd_session_hits_total{model} for a Tier-1 session hit).
	Committed(o selector.Outcome, model string, stages []fullproxy.Stage)
	// Leg: a leg's latency, prefill to its full response, decode to its
	// first byte (kvgate_pd_leg_duration_seconds{leg},
	// loxilb_ai_pd_prefill_duration_seconds, loxilb_ai_pd_decode_ttft_seconds).
	Leg(leg, model string, d time.Duration)
	// Timeout: kind is pd_prefill_timeout, pd_decode_timeout or
	// pd_decode_stream_timeout (kvgate_pd_timeouts_total{kind}).
	Timeout(kind string)
	// Retry: a leg is retried on another endpoint (kvgate_pd_retries_total{leg}).
	Retry(leg string)
	// Failover: a prefill 5xx or a prefill that died after connecting sent
	// the request to the next prefill endpoint
	// (loxilb_pd_connect_failover_total; connect failures are counted by the
	// proxy observer).
	Failover()
	// EndpointDied: leg's endpoint failed during the request
	// (loxilb_pd_prefill_ep_died_total, loxilb_pd_decode_ep_died_total).
	EndpointDied(leg string)
	// DecodeZeroByte: the decode leg ended before its first byte
	// (loxilb_pd_decode_zero_byte_eof_total; 502 pd_decode_backend_died).
	DecodeZeroByte()
	// DecodeOnly: every prefill endpoint failed or none was available, and
	// the plain request went to a decode (or role-0) endpoint
	// (loxilb_pd_fallback_to_normal_total).
	DecodeOnly()
	// KVParams: a prefill response carried kv_transfer_params or not
	// (loxilb_ai_pd_kv_params_found_total / _missing_total).
	KVParams(model string, found bool)
	// Request: loxilb_ai_pd_requests_total{model,phase,status}: (complete,
	// success), (prefill, timeout), (prefill, error), (decode, timeout),
	// (decode, error).
	Request(model, phase, status string)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) Decided(selector.Decision)                             {}
func (NopObserver) Committed(selector.Outcome, string, []fullproxy.Stage) {}
func (NopObserver) Leg(string, string, time.Duration)                     {}
func (NopObserver) Timeout(string)                                        {}
func (NopObserver) Retry(string)                                          {}
func (NopObserver) Failover()                                             {}
func (NopObserver) EndpointDied(string)                                   {}
func (NopObserver) DecodeZeroByte()                                       {}
func (NopObserver) DecodeOnly()                                           {}
func (NopObserver) KVParams(string, bool)                                 {}
func (NopObserver) Request(string, string, string)                        {}
