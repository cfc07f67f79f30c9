// Package enginesim is a vLLM stand-in for machines without a GPU: an
// OpenAI-compatible engine that is exact on every surface kvgate reads and
// synthetic elsewhere. It powers cmd/enginesim, `kvgate demo` and the
// end-to-end tests, which run several engines in one process.
//
// Exact: prompt tokenization (chat templates via pkg/chattemplate, BOS rules,
// token-id prompts verbatim), block hashes (pkg/kvhash with the configured
// algorithm, block size and PYTHONHASHSEED), the prefix cache's observable
// behaviour (vLLM's block pool: LRU free queue that keeps hashes until a block
// is reallocated, pinning of running requests' blocks, the floor((n-1)/bs)
// cap on cached blocks, decode-filled blocks), the ZeroMQ KV events byte for
// byte (pkg/kvevents; one batch per engine step, sequence from 0, replay
// ROUTER), usage.prompt_tokens_details.cached_tokens, NixlConnector's P/D
// kv_transfer_params, and vLLM's metric names, types and labels.
//
// Synthetic: the output text (deterministic words from the vocabulary) and
// time, which follows a model: by default vLLM V1's step loop (chunked
// prefill within a token budget, FIFO admission, preemption of the newest)
// with a per-step GPU cost model per model/GPU profile; PerfModel "simple"
// keeps the per-request model (floor + per-token cost of uncached prompt
// tokens, a fixed decode rate). docs/enginesim.md, "Timing models".
//
// Knobs: Config (see cmd/enginesim --help and docs/enginesim.md).
//
// Metrics (own registry per engine, labels model_name and engine):
// vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, vllm:cache_config_info, vllm:prompt_tokens_total,
// vllm:generation_tokens_total, vllm:prefix_cache_queries_total,
// vllm:prefix_cache_hits_total, vllm:external_prefix_cache_queries_total,
// vllm:external_prefix_cache_hits_total, vllm:request_success_total,
// vllm:time_to_first_token_seconds, enginesim_decode_local_prefills_total.
package enginesim
