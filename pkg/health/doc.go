// Package health keeps the per-endpoint state that selection excludes on and
// the engine figures it weighs with:
//
//   - active probes (http | tcp | none): an endpoint starts healthy,
//     probeRetries consecutive failures mark it down, one success marks it up;
//   - the engine /metrics scrape: vllm:num_requests_waiting (Tier-2 queue
//     depth) and vllm:cache_config_info's num_gpu_blocks (CHWBL capacity);
//   - the circuit breaker: consecutive connect failures (5, or 3 for P/D
//     rules) or consecutive origin 5xx (LLB_PD_ORIGIN_ERR_THRESHOLD) open it
//     for 30 s, then half-open admits at most 3 trial requests and a success
//     closes it;
//   - admin state (an operator's up/down).
//
// P/D admission control (the in-flight caps, parking and shedding) is load
// shaping, not health: it lives in pkg/pd/admission, and a Tracker only
// reports its saturated endpoints (AttachAdmission) and drains it when an
// endpoint drops.
//
// A Tracker (one per rule) satisfies selector.StateSource and
// selector.EngineSource. Every
// transition is pushed at once to subscribers, so the selector's exclusion
// state is current and Selector.DropEndpoint can drop the sessions and trie
// entries of an endpoint that went down. Time comes from a Clock so the state
// machines are tested with a fake one; probes are tested against real
// loopback servers.
package health
