// Package metrics holds every Prometheus metric name, label and collector of
// kvgate, registered against one *prometheus.Registry that the management API
// serves on GET /netlox/v1/metrics and /metrics.
//
// Names and labels are LoxiLB's (the table in docs/api.md), so dashboards
// and the go/no-go checks of docs/deploy.md work unchanged. Where kvgate
// adds a label to a LoxiLB series it says so; series of kvgate's own use the
// kvgate_ prefix.
//
// Other packages do not import this one: each defines a small observer
// interface, and the daemon adapts *Metrics to it with the helper methods
// below. Label values for service, service_id, ep_idx and the subscriber's
// ep are decimal strings, as in the reference.
package metrics

import (
	"runtime"
	"strconv"
	"sync"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// MissReasons are the nine Tier-1.5 guard reasons, in ladder order. Each is
// pre-created at 0 for every rule (InitRule).
var MissReasons = []string{"mode_off", "warmup", "text_empty", "model_empty", "tokenize", "hashes", "no_worker", "excluded", "shallow"}

// DecisionStages are the stages timed by kvgate_decision_stage_seconds.
var DecisionStages = []string{"extract", "tokenize", "hash", "score", "select"}

// Options configure New.
type Options struct {
	// Version and Revision label kvgate_build_info.
	Version, Revision string
	// NoProcessCollectors leaves out the Go runtime and process collectors
	// (tests that compare the full exposition set it).
	NoProcessCollectors bool
}

// Metrics is the set of kvgate's collectors, all registered on Registry.
type Metrics struct {
	Registry *prometheus.Registry

	// KV tier (docs/selection.md). kvgate adds the service label to
	// the hit, miss, fallthrough, spill and cold-seed counters so that several
	// rules do not collide; queries by ep_idx or reason keep working.
	Tier15Hits        *prometheus.CounterVec // loxilb_pd_kv_tier15_hits_total{service,ep_idx}
	Tier15MissReason  *prometheus.CounterVec // loxilb_pd_kv_tier15_miss_reason_total{service,reason}
	Tier15Fallthrough *prometheus.CounterVec // loxilb_pd_kv_tier15_fallthrough_total{service}
	Tier15Spills      *prometheus.CounterVec // loxilb_pd_kv_tier15_spills_total{service,ep_idx}
	Tier15ColdSeeds   *prometheus.CounterVec // loxilb_pd_kv_tier15_cold_seeds_total{service,ep_idx}
	ZeroHitWatchdog   *prometheus.CounterVec // loxilb_pd_kv_zero_hit_watchdog_total{service_id}
	Tier1SessionHits  *prometheus.CounterVec // kvgate_tier1_session_hits_total{service}
	Tier1TrieHits     *prometheus.CounterVec // kvgate_tier1_trie_hits_total{service}

	// Inventory and subscribers (LoxiLB's, plus kvgate's own; docs/ingest.md).
	KVBlocks             *prometheus.GaugeVec   // loxilb_pd_kv_blocks{service,ep_idx}
	KVBlocksOtherMedium  *prometheus.GaugeVec   // kvgate_kv_blocks_other_medium{service,ep_idx}
	EPInfo               *prometheus.GaugeVec   // loxilb_pd_ep_info{service,ep_idx,ep,addr}
	SubscriberConnected  *prometheus.GaugeVec   // loxilb_kv_subscriber_connected{service,ep}
	SubscriberReconnects *prometheus.CounterVec // loxilb_kv_subscriber_reconnect_total{service,ep}
	SubscriberRecvErrors *prometheus.CounterVec // loxilb_kv_subscriber_recv_error_total{service,ep}
	InvCapEvictions      *prometheus.CounterVec // loxilb_kv_inv_cap_evictions_total{service,ep}
	RankConnected        *prometheus.GaugeVec   // kvgate_kv_subscriber_rank_connected{service,ep,rank}
	SubscriberGaps       *prometheus.CounterVec // kvgate_kv_subscriber_gaps_total{service,ep,kind}
	SubscriberClears     *prometheus.CounterVec // kvgate_kv_subscriber_clears_total{service,ep,reason}
	SeqMissing           *prometheus.CounterVec // kvgate_kv_seq_missing_total{service,ep}
	DecodeErrors         *prometheus.CounterVec // kvgate_kv_decode_errors_total{service,ep}
	KVSkips              *prometheus.CounterVec // kvgate_kv_skip_total{service,cause}
	SubscriberReplays    *prometheus.CounterVec // kvgate_kv_subscriber_replays_total{service,ep,outcome}
	ReplayedBatches      *prometheus.CounterVec // kvgate_kv_subscriber_replayed_batches_total{service,ep}
	EventBatches         *prometheus.CounterVec // kvgate_kv_subscriber_batches_total{service,ep}
	EventHashes          *prometheus.CounterVec // kvgate_kv_subscriber_hashes_total{service,ep,event}
	// Live parity self-check (docs/parity.md).
	ParityChecked   *prometheus.CounterVec // kvgate_kv_parity_checked_total{service,ep_idx}
	ParityUnchecked *prometheus.CounterVec // kvgate_kv_parity_unchecked_total{service,ep_idx,cause}
	ParityMismatch  *prometheus.CounterVec // kvgate_kv_parity_mismatch_total{service,ep_idx,reason}
	ParityState     *prometheus.GaugeVec   // kvgate_kv_parity_state{service,ep_idx}
	// Per-request usage audit (docs/parity.md; audit.go).
	UsageAudits          *prometheus.CounterVec   // kvgate_kv_usage_audit_total{model,result}
	PromptTokensMismatch *prometheus.CounterVec   // kvgate_kv_prompt_tokens_mismatch_total{model}
	CachedTokensError    *prometheus.HistogramVec // kvgate_kv_cached_tokens_error_tokens{model}

	// Proxy (docs/dataplane.md).
	TTFB             *prometheus.HistogramVec // loxilb_proxy_http_ttfb_seconds{service}
	Requests         *prometheus.CounterVec   // kvgate_requests_total{service,ep_idx,outcome}
	RequestDuration  *prometheus.HistogramVec // kvgate_request_duration_seconds{service,ep_idx,outcome}
	Inflight         *prometheus.GaugeVec     // kvgate_endpoint_inflight{service,ep_idx}
	ConnectFailures  *prometheus.CounterVec   // kvgate_backend_connect_failures_total{service,ep_idx}
	BrokenResponses  *prometheus.CounterVec   // kvgate_backend_broken_responses_total{service,ep_idx}
	DecisionStage    *prometheus.HistogramVec // kvgate_decision_stage_seconds{service,stage}
	DecisionTier     *prometheus.CounterVec   // kvgate_decisions_total{service,tier}
	SelectFailures   *prometheus.CounterVec   // loxilb_lb_select_failure_shutdown_total{service}
	AIRequests       *prometheus.CounterVec   // loxilb_ai_requests_total{model,tenant,status}
	AIRequestSeconds *prometheus.HistogramVec // loxilb_ai_request_duration_seconds{model,tenant}
	AIActiveStreams  *prometheus.GaugeVec     // loxilb_ai_active_streams{model}

	// P/D, circuit breaker and admission (LoxiLB's names; docs/pd.md).
	PDSessionsActive   *prometheus.GaugeVec     // loxilb_pd_sessions_active{service}
	PDTrieNodes        *prometheus.GaugeVec     // loxilb_pd_trie_nodes{service}
	PDCBFlips          *prometheus.CounterVec   // loxilb_pd_cb_flips_total{service,ep_idx}
	CBState            *prometheus.GaugeVec     // kvgate_circuit_breaker_state{service,ep_idx}
	PDFallbackToNormal *prometheus.CounterVec   // loxilb_pd_fallback_to_normal_total{service}
	PDAdmissionShed    *prometheus.CounterVec   // loxilb_pd_admission_shed_total{service}
	PDAdmissionQueued  *prometheus.CounterVec   // loxilb_pd_admission_queued_total{service}
	PDParkTimeouts     *prometheus.CounterVec   // kvgate_pd_admission_park_timeout_total{service}
	PDPrefillEPDied    *prometheus.CounterVec   // loxilb_pd_prefill_ep_died_total{service}
	PDDecodeEPDied     *prometheus.CounterVec   // loxilb_pd_decode_ep_died_total{service}
	PDDecodeZeroByte   *prometheus.CounterVec   // loxilb_pd_decode_zero_byte_eof_total{service}
	PDConnectFailover  *prometheus.CounterVec   // loxilb_pd_connect_failover_total{service}
	PDTimeouts         *prometheus.CounterVec   // kvgate_pd_timeouts_total{service,kind}
	PDRetries          *prometheus.CounterVec   // kvgate_pd_retries_total{service,leg}
	PDLegDuration      *prometheus.HistogramVec // kvgate_pd_leg_duration_seconds{service,leg}
	AIPDPrefillSeconds *prometheus.HistogramVec // loxilb_ai_pd_prefill_duration_seconds{model}
	AIPDDecodeTTFT     *prometheus.HistogramVec // loxilb_ai_pd_decode_ttft_seconds{model}
	AIPDRequests       *prometheus.CounterVec   // loxilb_ai_pd_requests_total{model,phase,status}
	AIPDKVParamsFound  *prometheus.CounterVec   // loxilb_ai_pd_kv_params_found_total{model}
	AIPDKVParamsMiss   *prometheus.CounterVec   // loxilb_ai_pd_kv_params_missing_total{model}
	AIPDSessionHits    *prometheus.CounterVec   // loxilb_ai_pd_session_hits_total{model}

	// Health (docs/health.md).
	ProbeUp          *prometheus.GaugeVec   // kvgate_endpoint_probe_up{service,ep_idx}
	ProbeTransitions *prometheus.CounterVec // kvgate_endpoint_probe_transitions_total{service,ep_idx,to}
	AdminDown        *prometheus.GaugeVec   // kvgate_endpoint_admin_down{service,ep_idx}
	EngineQueued     *prometheus.GaugeVec   // kvgate_endpoint_engine_waiting{service,ep_idx}
	EngineCapacity   *prometheus.GaugeVec   // kvgate_endpoint_capacity_blocks{service,ep_idx}

	// Data path (docs/body-leg.md).
	DatapathInfo *prometheus.GaugeVec // kvgate_datapath_info{path}
	spliced      *splicedBytes        // kvgate_spliced_bytes_total{path}

	// TLS termination and each rule's body leg (docs/security.md, tls.go).
	RuleDatapath       *prometheus.GaugeVec   // kvgate_rule_datapath_info{service,path,reason}
	TLSHandshakeErrors *prometheus.CounterVec // kvgate_tls_handshake_errors_total{service,reason}
	TLSCertReloads     *prometheus.CounterVec // kvgate_tls_cert_reloads_total{service,result}

	// BackendConns: how requests of a rule with an engine connection pool
	// got their connection (docs/security.md, "Engine connection pool").
	BackendConns *prometheus.CounterVec // kvgate_backend_connections_total{service,result}

	// Reliability: recovered panics.
	Panics *prometheus.CounterVec // kvgate_panics_total{where}

	// Control plane.
	Rules     prometheus.Gauge // kvgate_rules
	Ready     prometheus.Gauge // kvgate_ready (docs/api.md "Readiness")
	BuildInfo *prometheus.GaugeVec
	// VIPAddresses counts rule VIPs on the --vip-dev device by owner
	// (kvgate: added by kvgate; host: already there when claimed).
	VIPAddresses *prometheus.GaugeVec // kvgate_vip_addresses{owner}
	// The management API's guard (package apiauth).
	APIInsecure     prometheus.Gauge       // kvgate_api_insecure
	APIAuthFailures *prometheus.CounterVec // kvgate_api_auth_failures_total{reason}
	APIReloads      *prometheus.CounterVec // kvgate_api_reloads_total{file,result}
	// Active-active replicas (replicas.go).
	Replicas ReplicaMetrics

	// perModel holds the series labelled by discovered model (models.go).
	modelOnce sync.Once
	perModel  *modelSeries

	// Tokenizers' conversation prefix cache (convcache.go).
	convLookups *prometheus.CounterVec
	convReused  prometheus.Counter

	// Decoded-message cache of the chat bodies (msgcache.go).
	msgLookups *prometheus.CounterVec
	msgReused  prometheus.Counter

	models    modelLabels
	rulesMu   sync.Mutex
	ruleIDs   map[int]bool // rules initialised, so InitRule and DeleteRule are idempotent
	scopeOnce sync.Once
	scope     *scoped
}

var (
	// Latency buckets for one decision stage: 1 µs to ~1 s.
	stageBuckets = prometheus.ExponentialBuckets(1e-6, 4, 11)
	// TTFB and leg buckets, as the reference's 0.001..10 s, stretched to 300 s for long prefill.
	ttfbBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 600}
	// Whole-request buckets, as the reference's 0.001..300 s.
	requestBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// New creates every collector and registers it on a new registry.
func New(opts Options) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{Registry: reg, models: modelLabels{seen: map[string]bool{}}, ruleIDs: map[int]bool{}}
	f := factory{reg: reg}

	m.Tier15Hits = f.counter("loxilb_pd_kv_tier15_hits_total", "Requests routed by the KV-overlap tier (Tier 1.5) to this endpoint: the decision proof.", "service", "ep_idx")
	m.Tier15MissReason = f.counter("loxilb_pd_kv_tier15_miss_reason_total", "Tier-1.5 guard misses by reason (mode_off, warmup, text_empty, model_empty, tokenize, hashes, no_worker, excluded, shallow).", "service", "reason")
	m.Tier15Fallthrough = f.counter("loxilb_pd_kv_tier15_fallthrough_total", "Requests that left the KV tier for the topology fallback (P/D min-load in mode 1, the rule's selector in mode 3).", "service")
	m.Tier15Spills = f.counter("loxilb_pd_kv_tier15_spills_total", "Tier-1.5 decisions that the load blend moved off the best-overlap endpoint, by the endpoint spilled to.", "service", "ep_idx")
	m.Tier15ColdSeeds = f.counter("loxilb_pd_kv_tier15_cold_seeds_total", "Tier-1.5 hits redirected to a cold endpoint by cold-start seeding, by the endpoint seeded.", "service", "ep_idx")
	m.ZeroHitWatchdog = f.counter("loxilb_pd_kv_zero_hit_watchdog_total", "Lookups made after LOXILB_KV_ZERO_HIT_N consecutive zero-overlap lookups against a non-empty inventory (a parity alarm).", "service_id")
	m.Tier1SessionHits = f.counter("kvgate_tier1_session_hits_total", "Requests routed by Tier-1 conversation affinity.", "service")
	m.Tier1TrieHits = f.counter("kvgate_tier1_trie_hits_total", "Requests routed by Tier-1 trie affinity (pd_cache_aware_mode).", "service")

	m.KVBlocks = f.gauge("loxilb_pd_kv_blocks", "Blocks in the endpoint's mirrored KV inventory (GPU medium).", "service", "ep_idx")
	m.KVBlocksOtherMedium = f.gauge("kvgate_kv_blocks_other_medium", "Blocks the endpoint reported on a non-GPU medium; those on a CPU or STORAGE tier extend the leading-run score (LLB_KV_TIER_WEIGHTS).", "service", "ep_idx")
	m.EPInfo = f.gauge("loxilb_pd_ep_info", "Always 1: joins ep_idx to the endpoint IP (ep) and its ip:port (addr).", "service", "ep_idx", "ep", "addr")
	m.SubscriberConnected = f.gauge("loxilb_kv_subscriber_connected", "1 when every rank of the endpoint's KV-event subscriber is connected; ep holds the ep_idx.", "service", "ep")
	m.SubscriberReconnects = f.counter("loxilb_kv_subscriber_reconnect_total", "Successful KV-event socket rebuilds after receive errors.", "service", "ep")
	m.SubscriberRecvErrors = f.counter("loxilb_kv_subscriber_recv_error_total", "KV-event receive errors.", "service", "ep")
	m.InvCapEvictions = f.counter("loxilb_kv_inv_cap_evictions_total", "Blocks evicted by the per-endpoint inventory cap (LOXILB_KV_MAX_BLOCKS).", "service", "ep")
	m.RankConnected = f.gauge("kvgate_kv_subscriber_rank_connected", "1 when the KV-event subscriber of this data-parallel rank is connected.", "service", "ep", "rank")
	m.SubscriberGaps = f.counter("kvgate_kv_subscriber_gaps_total", "Sequence gaps seen on the KV-event stream (kind small, large or restart).", "service", "ep", "kind")
	m.SubscriberClears = f.counter("kvgate_kv_subscriber_clears_total", "Rank inventories cleared (reason large_gap, restart or unverified).", "service", "ep", "reason")
	m.SeqMissing = f.counter("kvgate_kv_seq_missing_total", "Sequence numbers the KV-event stream skipped over, summed over its gaps (a small gap's are replayed; a large gap's or a restart's clear the rank).", "service", "ep")
	m.DecodeErrors = f.counter("kvgate_kv_decode_errors_total", "KV-event frames that did not decode (also counted in loxilb_kv_subscriber_recv_error_total): an engine speaking another event schema.", "service", "ep")
	m.KVSkips = f.counter("kvgate_kv_skip_total", "Requests whose KV tier was skipped, by kvgate's own cause (the guard reason stays one of the spec's nine; cause block_size: the engines publish a block_size that is not a multiple of kvBlockSize; the request-side bounds of docs/tokenizer.md, under reason tokenize: prompt_tokens, word_bytes, tokenize_time, inspect_busy, request_chat_template, template_limit, tokenizer, error; under reason tokenize, multimodal and unpredictable for Responses and Messages API requests whose ids cannot be computed; under reason text_empty, path: a body sent to a path that is not a prompt-bearing API).", "service", "cause")
	m.SubscriberReplays = f.counter("kvgate_kv_subscriber_replays_total", "Replay requests to the engine's replay endpoint (outcome ok or error).", "service", "ep", "outcome")
	m.ReplayedBatches = f.counter("kvgate_kv_subscriber_replayed_batches_total", "Event batches applied from replay.", "service", "ep")
	m.ParityChecked = f.counter("kvgate_kv_parity_checked_total", "BlockStored events whose hashes kvgate recomputed under the rule's contract (match or mismatch).", "service", "ep_idx")
	m.ParityUnchecked = f.counter("kvgate_kv_parity_unchecked_total", "BlockStored events the parity check could not verify (cause no_token_ids, parent_unknown, sampled_out).", "service", "ep_idx", "cause")
	m.ParityMismatch = f.counter("kvgate_kv_parity_mismatch_total", "BlockStored events whose hashes differ from kvgate's, by what differs (reason seed, algo, block_size, granularity, lora, unknown).", "service", "ep_idx", "reason")
	m.ParityState = f.gauge("kvgate_kv_parity_state", "Live parity of the endpoint's block hashes: -1 after 3 consecutive mismatches, 1 after a match with no mismatch for 60 s, 0 otherwise.", "service", "ep_idx")
	m.registerUsageAudit(f)
	m.EventBatches = f.counter("kvgate_kv_subscriber_batches_total", "Live event batches applied.", "service", "ep")
	m.EventHashes = f.counter("kvgate_kv_subscriber_hashes_total", "Block hashes in the BlockStored (event stored) and BlockRemoved (event removed) events of live batches applied.", "service", "ep", "event")

	m.TTFB = f.histogram("loxilb_proxy_http_ttfb_seconds", "Time from forwarding the request to the backend's first response byte.", ttfbBuckets, "service")
	m.Requests = f.counter("kvgate_requests_total", "Proxied requests by endpoint and outcome.", "service", "ep_idx", "outcome")
	m.RequestDuration = f.histogram("kvgate_request_duration_seconds", "Proxied request duration, from the request head to the end of the response.", requestBuckets, "service", "ep_idx", "outcome")
	m.Inflight = f.gauge("kvgate_endpoint_inflight", "In-flight requests on the endpoint (the bounded-load cap's input).", "service", "ep_idx")
	m.ConnectFailures = f.counter("kvgate_backend_connect_failures_total", "Backend connect failures (each re-enters selection with the endpoint excluded).", "service", "ep_idx")
	m.BrokenResponses = f.counter("kvgate_backend_broken_responses_total", "Responses the backend cut before their body's end (chunked without its last chunk, Content-Length short); the client connection was closed.", "service", "ep_idx")
	m.DecisionStage = f.histogram("kvgate_decision_stage_seconds", "Time spent per routing-decision stage (extract, tokenize, hash, score, select).", stageBuckets, "service", "stage")
	m.DecisionTier = f.counter("kvgate_decisions_total", "Routing decisions by the tier that made them (1-session, 1-trie, 1.5, 2, selector, decode-only).", "service", "tier")
	m.SelectFailures = f.counter("loxilb_lb_select_failure_shutdown_total", "Client connections closed because no endpoint could be selected.", "service")
	m.AIRequests = f.counter("loxilb_ai_requests_total", "AI-gateway requests by model, tenant and HTTP status.", "model", "tenant", "status")
	m.AIRequestSeconds = f.histogram("loxilb_ai_request_duration_seconds", "AI-gateway request duration by model and tenant.", requestBuckets, "model", "tenant")
	m.AIActiveStreams = f.gauge("loxilb_ai_active_streams", "Responses streaming now, by model.", "model")

	m.PDSessionsActive = f.gauge("loxilb_pd_sessions_active", "Tier-1 sessions held.", "service")
	m.PDTrieNodes = f.gauge("loxilb_pd_trie_nodes", "Nodes in the Tier-1 radix trie.", "service")
	m.PDCBFlips = f.counter("loxilb_pd_cb_flips_total", "Circuit-breaker state changes.", "service", "ep_idx")
	m.CBState = f.gauge("kvgate_circuit_breaker_state", "Circuit-breaker state: 0 closed, 1 open, 2 half-open.", "service", "ep_idx")
	m.PDFallbackToNormal = f.counter("loxilb_pd_fallback_to_normal_total", "P/D requests sent decode-only because every prefill endpoint failed.", "service")
	m.PDAdmissionShed = f.counter("loxilb_pd_admission_shed_total", "P/D requests refused with 429 pd_overloaded.", "service")
	m.PDAdmissionQueued = f.counter("loxilb_pd_admission_queued_total", "P/D requests parked in an admission queue.", "service")
	m.PDParkTimeouts = f.counter("kvgate_pd_admission_park_timeout_total", "Parked P/D requests answered 504 pd_admission_park_timeout.", "service")
	m.PDPrefillEPDied = f.counter("loxilb_pd_prefill_ep_died_total", "Prefill endpoints that failed (connect, 5xx, reset) during a P/D request.", "service")
	m.PDDecodeEPDied = f.counter("loxilb_pd_decode_ep_died_total", "Decode endpoints that failed during a P/D request.", "service")
	m.PDDecodeZeroByte = f.counter("loxilb_pd_decode_zero_byte_eof_total", "Decode legs that ended before their first byte (502 pd_decode_backend_died).", "service")
	m.PDConnectFailover = f.counter("loxilb_pd_connect_failover_total", "Prefill retries on the next endpoint after a connect failure or 5xx.", "service")
	m.PDTimeouts = f.counter("kvgate_pd_timeouts_total", "P/D timeouts by kind (pd_prefill_timeout, pd_decode_timeout, pd_decode_stream_timeout).", "service", "kind")
	m.PDRetries = f.counter("kvgate_pd_retries_total", "P/D leg retries by leg (prefill, decode).", "service", "leg")
	m.PDLegDuration = f.histogram("kvgate_pd_leg_duration_seconds", "P/D leg latency: prefill to its response, decode to its first byte.", ttfbBuckets, "service", "leg")
	m.AIPDPrefillSeconds = f.histogram("loxilb_ai_pd_prefill_duration_seconds", "P/D prefill leg duration by model.", ttfbBuckets, "model")
	m.AIPDDecodeTTFT = f.histogram("loxilb_ai_pd_decode_ttft_seconds", "P/D decode leg time to first byte by model.", ttfbBuckets, "model")
	m.AIPDRequests = f.counter("loxilb_ai_pd_requests_total", "P/D requests by model, phase and status: (complete, success), (prefill, timeout), (decode, error).", "model", "phase", "status")
	m.AIPDKVParamsFound = f.counter("loxilb_ai_pd_kv_params_found_total", "Prefill responses carrying kv_transfer_params.", "model")
	m.AIPDKVParamsMiss = f.counter("loxilb_ai_pd_kv_params_missing_total", "Prefill responses without kv_transfer_params.", "model")
	m.AIPDSessionHits = f.counter("loxilb_ai_pd_session_hits_total", "Tier-0/Tier-1 session hits by model.", "model")

	m.ProbeUp = f.gauge("kvgate_endpoint_probe_up", "1 when the endpoint's health probe passes.", "service", "ep_idx")
	m.ProbeTransitions = f.counter("kvgate_endpoint_probe_transitions_total", "Health-probe state changes by new state (up, down).", "service", "ep_idx", "to")
	m.AdminDown = f.gauge("kvgate_endpoint_admin_down", "1 when the endpoint is administratively down.", "service", "ep_idx")
	m.EngineQueued = f.gauge("kvgate_endpoint_engine_waiting", "The engine's vllm:num_requests_waiting, as last scraped.", "service", "ep_idx")
	m.EngineCapacity = f.gauge("kvgate_endpoint_capacity_blocks", "The engine's num_gpu_blocks (vllm:cache_config_info), the capacity weight.", "service", "ep_idx")

	m.DatapathInfo = f.gauge("kvgate_datapath_info", "Always 1 for the response body path in use (sockmap or userspace).", "path")
	m.spliced = newSplicedBytes()
	reg.MustRegister(m.spliced)
	m.RuleDatapath = f.gauge("kvgate_rule_datapath_info", "Always 1 for the body path a rule's responses take (sockmap or userspace) and why (datapath: the daemon's --datapath choice; tls: TLS rules are copied in userspace).", "service", "path", "reason")
	m.TLSHandshakeErrors = f.counter("kvgate_tls_handshake_errors_total", "Client TLS handshakes that failed, by reason (timeout, plain_http, oversize, bad_record, client_cert, eof, protocol).", "service", "reason")
	m.BackendConns = f.counter("kvgate_backend_connections_total", "Engine connections taken by requests of a rule with a connection pool (security 2), by result (reused: an idle pooled one; dialed: a new one; stale: a pooled one the engine had closed, replaced by a new one).", "service", "result")
	m.TLSCertReloads = f.counter("kvgate_tls_cert_reloads_total", "Reloads of a TLS rule's certificate, key or client CA files, by result (ok, error: the previous files stay in force).", "service", "result")

	m.Panics = f.counter("kvgate_panics_total", "Panics recovered, by goroutine family (conn, api, subscriber, replay, probe, scrape, poller); the goroutine ended and the process kept serving.", "where")
	for _, w := range recovery.Wheres {
		m.Panics.WithLabelValues(w)
	}

	m.Rules = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_rules", Help: "Load-balancer rules configured."})
	reg.MustRegister(m.Rules)
	m.Ready = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_ready", Help: "1 when GET /readyz answers 200: every staged tokenizer has finished its first load."})
	reg.MustRegister(m.Ready)
	m.BuildInfo = f.gauge("kvgate_build_info", "Always 1: the running kvgate build.", "version", "revision", "goversion")
	m.BuildInfo.WithLabelValues(orUnknown(opts.Version), orUnknown(opts.Revision), runtime.Version()).Set(1)
	m.APIInsecure = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_api_insecure",
		Help: "1 when the management API listens beyond loopback without TLS or tokens (--api-insecure)."})
	reg.MustRegister(m.APIInsecure)
	m.APIAuthFailures = f.counter("kvgate_api_auth_failures_total", "Management API requests refused: missing, invalid or forbidden (a read token on a mutating call).", "reason")
	m.APIReloads = f.counter("kvgate_api_reloads_total", "Reloads of the API's token file and certificates, by file and result (ok, error).", "file", "result")
	m.Replicas = newReplicaMetrics(f)
	m.VIPAddresses = f.gauge("kvgate_vip_addresses", "Rule VIPs on the --vip-dev device, by owner (kvgate added it, or the host had it).", "owner")
	m.modelSeries()

	m.initConversationCache(f)
	m.initMessageCache(f)

	if !opts.NoProcessCollectors {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

type factory struct{ reg *prometheus.Registry }

func (f factory) counter(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(h)
	return h
}

func itoa(i int) string { return strconv.Itoa(i) }

// modelLabels bounds the model label as the reference does: characters
// outside [a-zA-Z0-9._-] become _, values are cut to 64 bytes, and after 64
// distinct models new ones read "other".
type modelLabels struct {
	mu   sync.Mutex
	seen map[string]bool
}

const maxModelLabels = 64

func (l *modelLabels) label(model string) string {
	b := []byte(model)
	if len(b) > 64 {
		b = b[:64]
	}
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			b[i] = '_'
		}
	}
	s := string(b)
	if s == "" {
		s = "unknown"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[s] {
		return s
	}
	if len(l.seen) >= maxModelLabels {
		return "other"
	}
	l.seen[s] = true
	return s
}

// ModelLabel returns the bounded model label for a client-supplied model name.
func (m *Metrics) ModelLabel(model string) string { return m.models.label(model) }
