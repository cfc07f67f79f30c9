package selector

import (
	"fmt"
	"strings"
	"time"
)

// The knob types below are the selector's; pkg/config parses the environment
// into them (docs/configuration.md), so each value has one spelling table.

// ParseError is a value a Parse function does not accept. Allowed lists the
// accepted spellings, in the words docs/configuration.md and docs/api.md use.
type ParseError struct {
	What    string // what was parsed, e.g. "load-blend mode"
	Value   string
	Allowed string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s %q: allowed values: %s", e.What, e.Value, e.Allowed)
}

// LBMode is LOXILB_KV_LB_MODE, the load-blend policy of tier 1.5.
type LBMode uint8

const (
	LBHard         LBMode = iota // best overlap under its cap (default)
	LBOff                        // pure argmax
	LBSoft                       // lowest cost (P-o)*1000 + floor(λ·L/ĉ)
	LBAdaptive                   // hard with mlf following the load
	LBAdaptiveSoft               // soft with λ following the load
	// LBCost picks the least predicted time to first token: (pending
	// prefill tokens + this request's uncached tokens) × the endpoint's
	// learned per-token prefill time, under the fleet-wide load cap
	// (docs/selection.md, "Cost mode").
	LBCost
)

var lbModeNames = [...]string{"hard", "off", "soft", "adaptive", "adaptive-soft", "cost"}

func (m LBMode) String() string {
	if int(m) < len(lbModeNames) {
		return lbModeNames[m]
	}
	return "unknown"
}

// ParseLBMode parses a LOXILB_KV_LB_MODE value, case-insensitively; empty
// means hard.
func ParseLBMode(s string) (LBMode, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return LBHard, nil
	}
	for i, n := range lbModeNames {
		if strings.EqualFold(s, n) {
			return LBMode(i), nil
		}
	}
	return 0, &ParseError{What: "load-blend mode", Value: s, Allowed: "off, hard, soft, adaptive, adaptive-soft, cost"}
}

// Relief is LOXILB_KV_SPILL_RELIEF.
type Relief uint8

const (
	ReliefAuto Relief = iota // on for single-pool rules, off for P/D
	ReliefOn
	ReliefOff
)

func (r Relief) String() string {
	switch r {
	case ReliefOn:
		return "on"
	case ReliefOff:
		return "off"
	}
	return "auto"
}

// ParseRelief parses a LOXILB_KV_SPILL_RELIEF value: auto (or empty), or a
// boolean word.
func ParseRelief(s string) (Relief, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "auto") {
		return ReliefAuto, nil
	}
	b, err := parseBool(s)
	if err != nil {
		return 0, &ParseError{What: "spill relief", Value: s, Allowed: "auto, on (1, true, yes), off (0, false, no)"}
	}
	if b {
		return ReliefOn, nil
	}
	return ReliefOff, nil
}

// ScoreMode is LOXILB_KV_SCORE: how an endpoint's overlap is counted.
type ScoreMode uint8

const (
	// ScorePrefix counts the leading run of consecutive matched blocks, the
	// prefix vLLM can reuse (the default; spelled leading or prefix).
	ScorePrefix ScoreMode = iota
	// ScoreOverlap counts every matched block, LoxiLB's literal definition.
	ScoreOverlap
)

func (m ScoreMode) String() string {
	if m == ScoreOverlap {
		return "overlap"
	}
	return "leading"
}

// ParseScoreMode parses a LOXILB_KV_SCORE value: leading (alias prefix; also
// empty, the default) or overlap, case-insensitively.
func ParseScoreMode(s string) (ScoreMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "leading", "prefix":
		return ScorePrefix, nil
	case "overlap":
		return ScoreOverlap, nil
	}
	return 0, &ParseError{What: "score mode", Value: strings.TrimSpace(s), Allowed: "leading (the default; alias prefix), overlap"}
}

// parseBool reads the boolean words LoxiLB's variables accept.
func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "on", "yes":
		return true, nil
	case "0", "false", "off", "no":
		return false, nil
	}
	return false, &ParseError{What: "boolean", Value: strings.TrimSpace(s), Allowed: "1, true, on or yes; or 0, false, off or no"}
}

// Limits and defaults of the options.
const (
	DefaultMinMatchTokens     = 16
	MaxMinMatchTokens         = 4096
	DefaultMeanLoadFactor     = 175
	MinMeanLoadFactor         = 100
	MaxMeanLoadFactor         = 1000
	DefaultLoadPenalty        = 32
	MaxLoadPenalty            = 100000
	DefaultColdStartSeedN     = 16
	DefaultColdStartMinBlocks = 16
	DefaultZeroHitN           = 50
	DefaultCostWorkWeight     = 300
	DefaultCapFullGain        = 0
	MaxCapFullGain            = 100
	MaxCostWorkWeight         = 1000
	DefaultMaxSessions        = 4096
	DefaultTrieMaxNodes       = 8192
	DefaultQueueStaleAfter    = 30 * time.Second
	DefaultSessionTTL         = 300 * time.Second
	// TrieKeyMax bounds the bytes of request text the trie keys on.
	TrieKeyMax = 511
	// SessionKeyMax bounds a session key; longer keys are ignored.
	SessionKeyMax = 127
	maxCountLimit = 1 << 20
)

// Options holds every process-wide knob of selection. Start from
// DefaultOptions; New rejects an Options that fails Validate.
type Options struct {
	MinMatchTokens     int       // LLB_KV_MIN_MATCH_TOKENS: 0..4096, default 16, 0 disables shallow
	LBMode             LBMode    // LOXILB_KV_LB_MODE: default hard
	MeanLoadFactor     int       // LOXILB_KV_MEAN_LOAD_FACTOR: percent 100..1000, default 175 (ε = 0.75)
	LoadPenalty        int       // LOXILB_KV_LOAD_PENALTY: λ for soft, 1..100000, default 32
	SpillRelief        Relief    // LOXILB_KV_SPILL_RELIEF: auto|on|off, default auto
	ColdStartSeedN     int       // LOXILB_KV_COLDSTART_SEED_N: ≥0, default 16, 0 disables
	ColdStartMinBlocks int       // LOXILB_KV_COLDSTART_MIN_BLOCKS: ≥0, default 16, 0 treated as 1
	ZeroHitN           int       // LOXILB_KV_ZERO_HIT_N: ≥1, default 50
	Score              ScoreMode // LOXILB_KV_SCORE: leading (alias prefix, default) | overlap
	// CostWorkWeight (LOXILB_KV_COST_WORK_WEIGHT, percent 0..1000, default
	// 300, chosen on the routing benchmark): the cost mode also charges this share of the prefill work a
	// choice adds to the fleet (the request's own uncached tokens), so a
	// prefix still being computed on one endpoint is not copied to an idle
	// one for a marginally earlier first token (docs/selection.md).
	CostWorkWeight int
	// CapFullGain (LOXILB_KV_CAP_FULL_GAIN, percent of the prompt's blocks,
	// 0..100, 0 off): in hard and adaptive, an endpoint gets the full
	// MeanLoadFactor cap only when its overlap beats the least-loaded
	// endpoint's by this share of the prompt; a smaller gain gets a
	// proportionally tighter cap, down to the fleet mean (docs/selection.md).
	CapFullGain int
	LoadGuard   bool // LLB_KV_LOADGUARD: default off
	// SessionHash derives an unpinned conversation's tier-1 pair from its
	// key (LLB_PD_SESSION_HASH, default off; sessionhash.go).
	SessionHash bool
	// ColdPlacement is where a request without a holder goes
	// (LLB_KV_COLD_PLACEMENT, default cost; coldplace.go).
	ColdPlacement ColdPlacement
	// ReliefTarget is where spill relief may move a hit
	// (LLB_KV_RELIEF_TARGET, default fleet; replica_relief.go).
	ReliefTarget ReliefTarget
	// CursorStart is where the round-robin cursors start (default 0).
	// Replicas of one fleet start theirs apart, so the requests a client
	// spreads over them do not reach the same endpoint in step
	// (docs/replicas.md).
	CursorStart uint64
	// SessionHeaders are the request headers that carry a conversation key,
	// in priority order (default X-Conversation-ID, X-Session-ID).
	SessionHeaders []string
	// MaxSessions bounds the session table of each rule (default 4096).
	MaxSessions int
	// TrieMaxNodes bounds the trie of each rule (default 8192).
	TrieMaxNodes int
	// QueueStaleAfter: a vllm:num_requests_waiting sample older than this is
	// replaced by the fleet mean (default 30 s).
	QueueStaleAfter time.Duration
}

// DefaultOptions returns the documented defaults.
func DefaultOptions() Options {
	return Options{
		MinMatchTokens:     DefaultMinMatchTokens,
		LBMode:             LBHard,
		MeanLoadFactor:     DefaultMeanLoadFactor,
		LoadPenalty:        DefaultLoadPenalty,
		SpillRelief:        ReliefAuto,
		ColdStartSeedN:     DefaultColdStartSeedN,
		ColdStartMinBlocks: DefaultColdStartMinBlocks,
		ZeroHitN:           DefaultZeroHitN,
		Score:              ScorePrefix,
		CostWorkWeight:     DefaultCostWorkWeight,
		CapFullGain:        DefaultCapFullGain,
		SessionHeaders:     []string{"X-Conversation-ID", "X-Session-ID"},
		MaxSessions:        DefaultMaxSessions,
		TrieMaxNodes:       DefaultTrieMaxNodes,
		QueueStaleAfter:    DefaultQueueStaleAfter,
		ColdPlacement:      DefaultColdPlacement,
	}
}

// Validate checks every field and names the variable of the first bad one.
func (o Options) Validate() error {
	switch {
	case o.MinMatchTokens < 0 || o.MinMatchTokens > MaxMinMatchTokens:
		return fmt.Errorf("LLB_KV_MIN_MATCH_TOKENS=%d: want 0..%d", o.MinMatchTokens, MaxMinMatchTokens)
	case o.LBMode > LBCost:
		return fmt.Errorf("LOXILB_KV_LB_MODE: unknown mode %d", o.LBMode)
	case o.MeanLoadFactor < MinMeanLoadFactor || o.MeanLoadFactor > MaxMeanLoadFactor:
		return fmt.Errorf("LOXILB_KV_MEAN_LOAD_FACTOR=%d: want %d..%d", o.MeanLoadFactor, MinMeanLoadFactor, MaxMeanLoadFactor)
	case o.LoadPenalty < 1 || o.LoadPenalty > MaxLoadPenalty:
		return fmt.Errorf("LOXILB_KV_LOAD_PENALTY=%d: want 1..%d", o.LoadPenalty, MaxLoadPenalty)
	case o.SpillRelief > ReliefOff:
		return fmt.Errorf("LOXILB_KV_SPILL_RELIEF: unknown value %d", o.SpillRelief)
	case o.ReliefTarget > ReliefToHolders:
		return fmt.Errorf("LLB_KV_RELIEF_TARGET: unknown value %d", o.ReliefTarget)
	case o.ColdStartSeedN < 0 || o.ColdStartSeedN > maxCountLimit:
		return fmt.Errorf("LOXILB_KV_COLDSTART_SEED_N=%d: want 0..%d", o.ColdStartSeedN, maxCountLimit)
	case o.ColdStartMinBlocks < 0 || o.ColdStartMinBlocks > 1<<30:
		return fmt.Errorf("LOXILB_KV_COLDSTART_MIN_BLOCKS=%d: want 0..%d", o.ColdStartMinBlocks, 1<<30)
	case o.ZeroHitN < 1 || o.ZeroHitN > maxCountLimit:
		return fmt.Errorf("LOXILB_KV_ZERO_HIT_N=%d: want 1..%d", o.ZeroHitN, maxCountLimit)
	case o.CostWorkWeight < 0 || o.CostWorkWeight > MaxCostWorkWeight:
		return fmt.Errorf("LOXILB_KV_COST_WORK_WEIGHT=%d: want 0..%d", o.CostWorkWeight, MaxCostWorkWeight)
	case o.CapFullGain < 0 || o.CapFullGain > MaxCapFullGain:
		return fmt.Errorf("LOXILB_KV_CAP_FULL_GAIN=%d: want 0..%d", o.CapFullGain, MaxCapFullGain)
	case o.Score > ScoreOverlap:
		return fmt.Errorf("LOXILB_KV_SCORE: unknown value %d", o.Score)
	case o.ColdPlacement > ColdPlacementCost:
		return fmt.Errorf("LLB_KV_COLD_PLACEMENT: unknown value %d", o.ColdPlacement)
	case o.MaxSessions < 1 || o.MaxSessions > maxCountLimit:
		return fmt.Errorf("selector: MaxSessions=%d: want 1..%d", o.MaxSessions, maxCountLimit)
	case o.TrieMaxNodes < 16 || o.TrieMaxNodes > maxCountLimit:
		return fmt.Errorf("selector: TrieMaxNodes=%d: want 16..%d", o.TrieMaxNodes, maxCountLimit)
	case o.QueueStaleAfter <= 0:
		return fmt.Errorf("selector: QueueStaleAfter=%v: want > 0", o.QueueStaleAfter)
	}
	for _, h := range o.SessionHeaders {
		if strings.TrimSpace(h) == "" {
			return fmt.Errorf("selector: empty session header name")
		}
	}
	return nil
}

// SessionKey picks the tier-1 conversation key: the first configured
// header present (header returns "" when absent), else the body's top-level
// user. Keys longer than SessionKeyMax bytes are ignored.
func (o Options) SessionKey(header func(name string) string, bodyUser string) string {
	for _, h := range o.SessionHeaders {
		if v := strings.TrimSpace(header(h)); v != "" && len(v) <= SessionKeyMax {
			return v
		}
	}
	if len(bodyUser) <= SessionKeyMax {
		return bodyUser
	}
	return ""
}
