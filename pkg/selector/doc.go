// Package selector is kvgate's routing decision: given a rule, its endpoints'
// states and live loads, the facts of one request and an inventory scorer, it
// returns the prefill (or serving) endpoint, the decode endpoint in P/D mode,
// the tier that decided and the reason.
//
// The ladder (docs/selection.md has the full text and every formula):
//
//   - Tier 1, conversation affinity (P/D rules): a session key sticks to its
//     (prefill, decode) pair for the rule's sliding session TTL.
//   - Tier 1, trie affinity (P/D rules with pd_cache_aware_mode): an
//     approximate radix tree over request text, fed from Tier-2 decisions.
//   - Tier 1.5, KV overlap: the guard ladder (mode_off, warmup, text_empty,
//     model_empty, tokenize, hashes, no_worker, shallow, excluded), argmax of
//     the block overlap blended with a capacity-weighted bounded-load cap
//     (CHWBL), spill relief and cold-start seeding.
//   - Tier 2 (P/D): the prefill endpoint with the lowest in-flight + queued
//     count, round-robin on ties only; decode is chosen the same way.
//   - Tier 3 (single pool): the rule's selector sel.
//
// The package is pure: no sockets, no metrics registry, no global state. Its
// inputs arrive through small interfaces (Scorer, LoadSource, EngineSource,
// StateSource) so the proxy and the health prober plug in later; time comes
// from an injectable clock. Every decision is deterministic given its inputs
// and the selector's own counters.
//
// A request is routed through an Attempt: Decide picks, Exclude re-enters
// after a connect failure with the failed endpoint excluded (so the
// second-best overlap wins), and Commit records the routed decision (session
// pin, trie insert) and reports whether it counts as a Tier-1.5 hit. A request
// is therefore one hit at most, however many retries it takes.
package selector
