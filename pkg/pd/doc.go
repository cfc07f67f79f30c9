// Package pd carries a request on a P/D (kvExactMode 1) rule through vLLM's
// NixlConnector protocol: the KV tier picks a prefill endpoint, which gets a
// one-token, non-streaming rewrite of the request; its kv_transfer_params go
// verbatim, with the original body, to a decode endpoint, whose answer
// streams to the client through the proxy's body leg.
//
// Flow is a P/D rule's fullproxy.Handler: pkg/fullproxy hands it each
// request as an Exchange, and it hands what it does not take to the rule's
// plain forward (Config.Plain); pkg/gateway builds one Flow per P/D rule.
// The flow drives selection (pkg/selector), per-endpoint admission
// (pkg/pd/admission) and health (pkg/health), timeouts, failover to the next
// prefill endpoint (both legs retry through pkg/attempt) and the
// decode-only fallback, and reports what it measures through Observer.
//
// docs/pd.md walks the flow step by step, with its error bodies and limits.
package pd
