package selector

import (
	"net/netip"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// Scorer is the inventory as the selector sees it. *inventory.Index
// implements it.
type Scorer interface {
	// Score writes, for every endpoint in eligible, the number of the
	// request's block hashes found in that endpoint's inventory into
	// counts[ep]. With leadingRun it counts only the leading run of
	// consecutive matches (the prefix vLLM can reuse). Entries for
	// endpoints outside eligible are left alone.
	Score(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32)
	// Blocks is the number of blocks in the endpoint's inventory.
	Blocks(ep int) int
}

// LoadSource gives L_i, the in-flight requests on an endpoint: in mode 1 from
// prefill admission to the end of the decode stream, in mode 3 while the
// request is served. The proxy's own counts are authoritative.
type LoadSource interface {
	InFlight(ep int) int
}

// CostSource feeds LOXILB_KV_LB_MODE=cost: the prefill work kvgate has
// sent each endpoint and how fast the endpoint gets through it. *Costs
// implements it.
type CostSource interface {
	// PendingTokens is the uncached prompt tokens routed to ep whose
	// response has not yet produced its first body byte.
	PendingTokens(ep int) int64
	// PrefillPerToken is ep's learned prefill time per token; known is
	// false until ep has produced a sample.
	PrefillPerToken(ep int) (perToken time.Duration, known bool)
}

// EngineSource gives what the health prober scrapes from each engine's
// /metrics.
type EngineSource interface {
	// GPUBlocks is num_gpu_blocks from vllm:cache_config_info; known is
	// false until it has been scraped.
	GPUBlocks(ep int) (blocks int64, known bool)
	// Waiting is vllm:num_requests_waiting and the time it was scraped;
	// known is false until it has been scraped.
	Waiting(ep int) (waiting int, scrapedAt time.Time, known bool)
}

// States is the exclusion state of a rule's endpoints at one instant.
type States struct {
	ProbeDown   epset.Set // the active probe says down
	AdminDown   epset.Set // an operator took the endpoint out
	BreakerOpen epset.Set // the circuit breaker is open
	// Saturated holds prefill endpoints at the admission in-flight cap
	// (LLB_PD_MAX_INFLIGHT_PER_EP). Mode 1 does not choose them as prefill.
	Saturated epset.Set
}

// Unavailable is the union of the down and open sets (not Saturated).
func (s States) Unavailable() epset.Set {
	return s.ProbeDown.Or(s.AdminDown).Or(s.BreakerOpen)
}

// StateSource gives the current States. It is read once when a decision
// starts (to seed the exclusion mask) and once more for the Tier-1.5
// post-filter, so a transition in between is caught as reason excluded.
type StateSource interface {
	States() States
}

// Observer receives the counters that are not per-decision. Each method
// feeds one metric; the daemon wires it to pkg/metrics. Methods must be
// cheap and safe for concurrent use.
type Observer interface {
	// ZeroHitWatchdog: loxilb_pd_kv_zero_hit_watchdog_total{service_id}, once per
	// zero-overlap lookup at or beyond LOXILB_KV_ZERO_HIT_N in a row.
	ZeroHitWatchdog(serviceID uint32)
	// SessionHit: tier-1 session affinity routed a request (counted at Commit).
	SessionHit(serviceID uint32)
	// TrieHit: tier-1 trie affinity routed a request (counted at Commit).
	TrieHit(serviceID uint32)
	// Sessions: the number of live session entries of the rule changed
	// (loxilb_pd_sessions_active).
	Sessions(serviceID uint32, n int)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) ZeroHitWatchdog(uint32) {}
func (NopObserver) SessionHit(uint32)      {}
func (NopObserver) TrieHit(uint32)         {}
func (NopObserver) Sessions(uint32, int)   {}

// Role is an endpoint's ep_role.
type Role uint8

const (
	RoleNormal  Role = 0
	RolePrefill Role = 1
	RoleDecode  Role = 2
)

// Endpoint is one endpoint of a rule as the selector sees it.
type Endpoint struct {
	Idx  int  // ep_idx, in [0, epset.Max)
	Role Role // ep_role
	// Weight is the rule's endpoint weight; only sel 2 (priority) reads it.
	Weight int
	// CapacityWeight is the AI-controller weight in percent applied to
	// num_gpu_blocks; 0 means 100 (no controller). Values above 100 are 100.
	CapacityWeight int
}

// Rule is the view of a load-balancer rule the selector needs.
type Rule struct {
	ServiceID uint32
	// KVExactMode: 0 off, 1 P/D (ZMQ), 2 reserved (treated as off), 3 single pool.
	KVExactMode int
	// PD is pd_disagg_mode: endpoints carry prefill/decode roles and the
	// mode-1 flow (tiers 1, 1.5, 2) applies. Otherwise the single-pool flow
	// (tier 1.5, then sel) applies.
	PD bool
	// Sel is the rule's selector, the single-pool fallback.
	Sel Sel
	// BlockSize is kvBlockSize; 0 means 16.
	BlockSize int
	// KVWarmupSec is stored and inert: bootstrap replay fills inventories,
	// so the warmup guard never fires (docs/selection.md, guard ladder).
	KVWarmupSec int
	// SessionTTL is pd_session_ttl_sec; 0 means 300 s. It is sliding. It is
	// also the idle timeout of the sel=3 (persist) table.
	SessionTTL time.Duration
	// CacheAware is pd_cache_aware_mode: enables the tier-1 trie.
	CacheAware bool
	// CacheThreshold is pd_cache_threshold in percent (0 means 20).
	CacheThreshold int
	// BalanceThreshold is pd_balance_abs_threshold (0 means 3).
	BalanceThreshold int
	Endpoints        []Endpoint
}

// Request is the facts of one request that selection reads. The proxy fills
// it; it computes the block hashes (or records the guard that failed).
type Request struct {
	// SessionKey is the tier-1 conversation key (see Options.SessionKey).
	SessionKey string
	// Model is the resolved model name; empty fires model_empty.
	Model string
	// HasText reports that the request carried prompt text; false fires
	// text_empty.
	HasText bool
	// TrieText is the text the tier-1 trie keys on (the completions prompt,
	// or the first system message of a chat); at most TrieKeyMax bytes are used.
	TrieText string
	// Upstream is the guard that failed before hashing: ReasonTokenize or
	// ReasonHashes (ReasonTextEmpty / ReasonModelEmpty are accepted too).
	// ReasonNone when Hashes are valid.
	Upstream Reason
	// Hashes are the request's full-block hashes, in order.
	Hashes []uint64
	// PromptTokens is the tokenized prompt's length (0: unknown, taken as
	// len(Hashes) × BlockTokens). Only the cost mode reads it.
	PromptTokens int
	// BlockTokens is the prompt tokens one hash covers (0: the rule's
	// block size); larger when engines publish coarser blocks than
	// kvBlockSize (docs/parity.md, "Hash granularity").
	BlockTokens int
	// Client is the client address (sel 1 hash and sel 3 persist).
	Client netip.Addr
}

// Tier names which stage decided.
type Tier uint8

const (
	TierNone     Tier = iota // nothing could be chosen (Endpoint is -1)
	TierSession              // tier 1, conversation affinity
	TierTrie                 // tier 1, trie affinity
	TierKV                   // tier 1.5, KV overlap
	TierLoad                 // tier 2, P/D min-load fallback
	TierSelector             // tier 3, the rule's selector (single pool)
	TierNormal               // P/D with no prefill candidate: a role-0 endpoint in plain mode
)

var tierNames = [...]string{"none", "1", "1", "1.5", "2", "3", "normal"}

// String is the tier as the docs number it ("1", "1.5", "2", "3").
func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return "unknown"
}

// Reason is the tier-1.5 outcome: a hit or exactly one miss reason.
type Reason uint8

const (
	ReasonNone Reason = iota // tier 1.5 was not evaluated (tier 1 decided, or LLB_KV_LOADGUARD skipped it)
	ReasonHit
	ReasonModeOff
	ReasonWarmup
	ReasonTextEmpty
	ReasonModelEmpty
	ReasonTokenize
	ReasonHashes
	ReasonNoWorker
	ReasonShallow
	ReasonExcluded
)

var reasonNames = [...]string{"", "hit", "mode_off", "warmup", "text_empty", "model_empty", "tokenize", "hashes", "no_worker", "shallow", "excluded"}

// String is the metric label value.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Miss reports whether r is one of the nine miss reasons.
func (r Reason) Miss() bool { return r >= ReasonModeOff && r <= ReasonExcluded }

// MissReasons lists the nine miss reasons in ladder order, for pre-creating
// loxilb_pd_kv_tier15_miss_reason_total at 0.
func MissReasons() []Reason {
	return []Reason{ReasonModeOff, ReasonWarmup, ReasonTextEmpty, ReasonModelEmpty, ReasonTokenize,
		ReasonHashes, ReasonNoWorker, ReasonShallow, ReasonExcluded}
}

// Decision is one pass of the ladder.
type Decision struct {
	// Endpoint is the prefill target (P/D) or the serving endpoint (single
	// pool); -1 when nothing can be chosen.
	Endpoint int
	// Decode is the decode endpoint in P/D mode; -1 otherwise or when no
	// decode endpoint is available.
	Decode int
	Tier   Tier
	// Reason is ReasonHit when tier 1.5 routed, a miss reason when it
	// missed (count loxilb_pd_kv_tier15_miss_reason_total per Decision), or
	// ReasonNone when it was not evaluated.
	Reason Reason
	// Score is the overlap credited to the decision: the winner's overlap,
	// or, for a cold seed, the displaced winner's.
	Score int
	// BestScore is the highest overlap among the scanned endpoints.
	BestScore int
	// Argmax is the best-overlap endpoint (ties to the lowest ep_idx), -1
	// when tier 1.5 did not score.
	Argmax int
	// Spilled: the load blend or spill relief moved the winner off the argmax.
	Spilled bool
	// ColdSeed: cold-start seeding replaced the winner.
	ColdSeed bool
	// ColdPlaced: cold placement (LLB_KV_COLD_PLACEMENT=hash or cost) chose
	// the endpoint: by the prompt's rendezvous hash or by predicted TTFT for
	// a request no engine held (Reason no_worker or shallow, Tier 3 or 2),
	// or, with hash, for a hit whose holders were all this replica's
	// predictions (Reason hit).
	ColdPlaced bool
	// Fallthrough: in P/D mode, tier 1.5 missed or LLB_KV_LOADGUARD skipped it
	// (loxilb_pd_kv_tier15_fallthrough_total). Never set in single-pool mode.
	Fallthrough bool
	// LoadGuard: LLB_KV_LOADGUARD skipped tier 1.5.
	LoadGuard bool
	// Saturated: no prefill endpoint was available only because every
	// eligible one is at its admission cap; the proxy sheds (429) or parks.
	Saturated bool
	// MinBlocks is the shallow threshold applied (0 when the guard is off).
	MinBlocks int
}

// Outcome is what Commit reports about the routed decision.
type Outcome struct {
	Endpoint int
	Decode   int
	Tier     Tier
	// Hit: tier 1.5 routed this request (loxilb_pd_kv_tier15_hits_total{ep_idx=Endpoint}).
	Hit bool
	// Spilled: loxilb_pd_kv_tier15_spills_total{ep_idx=Endpoint}.
	Spilled bool
	// ColdSeed: loxilb_pd_kv_tier15_cold_seeds_total{ep_idx=Endpoint}.
	ColdSeed bool
}
