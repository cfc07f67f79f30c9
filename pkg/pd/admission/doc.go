// Package admission shapes the load of a P/D rule's prefill endpoints: a
// per-endpoint in-flight cap (LLB_PD_MAX_INFLIGHT_PER_EP) that sheds with
// 429 pd_overloaded or parks the request in a bounded per-endpoint FIFO
// (LLB_PD_QUEUE_DEPTH_PER_EP) with a park timeout (LLB_PD_MAX_PARK_SEC, 504
// pd_admission_park_timeout), and a process-wide cap (TotalGate,
// LLB_PD_MAX_TOTAL_INFLIGHT).
//
// A Controller is also the authoritative in-flight count L_i of each
// endpoint (selector.LoadSource). A health.Tracker reports its saturated
// endpoints to selection and drains the parked requests of an endpoint that
// goes down. pkg/pd's Flow drives it; docs/pd.md (step 2) and docs/health.md
// ("Admission control") describe the behaviour.
package admission
