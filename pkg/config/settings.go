package config

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Settings is kvgate's process environment, parsed and validated once.
// Variable names are LoxiLB's (docs/configuration.md). The selector's knobs
// carry pkg/selector's own types and spellings, so the daemon hands them over
// without translating.
type Settings struct {
	// LLB_KV_NONE_HASH_SEED: the NONE_HASH seed; must equal vLLM's PYTHONHASHSEED.
	// NoneHashSeedSet distinguishes unset from set-but-empty.
	NoneHashSeed    string
	NoneHashSeedSet bool
	// LLB_KV_HASH_DEBUG: log each computed block hash.
	HashDebug bool
	// LLB_KV_MIN_MATCH_TOKENS: the shallow guard, 0-4096 tokens (0 disables). Default 16.
	MinMatchTokens int
	// LLB_KV_LOADGUARD: mode 1 only; skip Tier 1.5 when the prefill load spread
	// exceeds pd_balance_abs_threshold.
	LoadGuard bool
	// LLB_PD_SESSION_HASH: a P/D conversation no replica-local pin covers
	// routes by a bounded-load rendezvous hash of its session key, so every
	// replica picks the same pair (docs/replicas.md). Default off.
	SessionHash bool
	// LLB_KV_COLD_PLACEMENT: where a request no engine holds goes: cost
	// (the default: the least predicted TTFT from pending prefill work;
	// docs/selection.md), sel (the rule's sel, the spec's fallback) or hash
	// (a bounded-load rendezvous hash of the prompt's first blocks, alike on
	// every replica; docs/replicas.md).
	ColdPlacement selector.ColdPlacement
	// LLB_KV_LOAD_SCRAPE_MS: when set (100-60000; 0 is the default), KV and P/D rules scrape
	// their engines' /metrics on this interval instead of with each probe,
	// for a fresher shared load view across replicas (docs/replicas.md).
	// Default 0: with each probe.
	LoadScrapeInterval time.Duration
	// LLB_KV_LOAD_MIRROR: between two scrapes, move the other replicas' part
	// of the shared load view as this replica's own count moved since the
	// scrape, scaled by their share of the fleet's load (docs/replicas.md).
	// Default off; with one replica it changes nothing.
	LoadMirror bool

	// LOXILB_KV_LB_MODE (or the legacy LOXILB_KV_UNIFIED_MODE). Default hard.
	LBMode selector.LBMode
	// LOXILB_KV_MEAN_LOAD_FACTOR: (1+ε)·100, 100-1000. Default 175.
	MeanLoadFactor int
	// LOXILB_KV_LOAD_PENALTY: soft-mode λ, 1-100000. Default 32.
	LoadPenalty int
	// LOXILB_KV_SPILL_RELIEF: auto, on or off. Default auto.
	SpillRelief selector.Relief
	// LLB_KV_RELIEF_TARGET: fleet (the spec's relief, the default) or
	// holders (relief moves a hit only to an endpoint holding part of its
	// prefix; for replicas, docs/replicas.md).
	ReliefTarget selector.ReliefTarget
	// LOXILB_KV_COLDSTART_SEED_N: every Nth hit seeds a cold endpoint; 0 disables. Default 16.
	ColdStartSeedN int
	// LOXILB_KV_COLDSTART_MIN_BLOCKS: fewer blocks than this is cold. Default 16; 0 is read as 1.
	ColdStartMinBlocks int
	// LOXILB_KV_MAX_BLOCKS: per-endpoint inventory cap, 1000-100000000. Default 1000000.
	MaxBlocks int
	// LOXILB_KV_ZERO_HIT_N: zero-hit watchdog threshold, > 0. Default 50.
	ZeroHitN int
	// LOXILB_KV_SCORE: leading (alias prefix; the leading run, default) or overlap.
	Score selector.ScoreMode
	// LLB_KV_TIER_WEIGHTS: what the leading-run score credits a block on each
	// offload tier with, relative to one on the GPU. Default
	// GPU=1.0,CPU=0.8,STORAGE=0.25 (docs/selection.md, "Offload tiers in the score").
	TierWeights inventory.TierWeights
	// LOXILB_KV_PROVISIONAL_WEIGHT: credit of a predicted (routed, not yet
	// reported) block in percent of a stored one, 0-100; 0 turns
	// provisional blocks off. Default 90 (docs/selection.md).
	ProvisionalWeight int
	// LOXILB_KV_COST_WORK_WEIGHT: the cost mode's charge for the prefill work
	// a choice adds to the fleet, percent 0-1000. Default 300.
	CostWorkWeight int
	// LOXILB_KV_CAP_FULL_GAIN: hard and adaptive give an endpoint the full
	// mean-load-factor cap only when its overlap beats the least-loaded
	// endpoint's by this percent of the prompt, less below; 0-100, 0 off
	// (docs/selection.md, "Gain-scaled cap").
	CapFullGain int
	// LOXILB_KV_PROVISIONAL_TTL_MS: how long a predicted block waits for its
	// BlockStored, 100-600000 ms. Default 10000.
	ProvisionalTTL time.Duration
	// LLB_KV_REPLAY_PORT_OFFSET: replay port = PUB port + offset; 0 disables. Default 1000.
	ReplayPortOffset int
	// LLB_KV_MAX_PROMPT_TOKENS: a prompt with more tokens is not routed by
	// KV (guard reason tokenize), 1-16777216. Default 262144.
	MaxPromptTokens int
	// LLB_KV_MAX_FRAME_BYTES: largest ZMTP frame or message taken from a KV peer, 4096-1073741824. Default 64 MiB.
	MaxFrameBytes int
	// LOXILB_KV_TRTLLM_POLL_MIN_MS / _MAX_MS: bounds of the TensorRT-LLM
	// event-drain poll interval, 1-10000 ms each. Defaults 5 / 20; when min >
	// max both revert to the defaults, as the reference does.
	TRTLLMPollMin, TRTLLMPollMax time.Duration
	// LLB_KV_MODEL_DISCOVERY_SEC: how often each KV rule re-reads its
	// endpoints' GET /v1/models (and at once on a probe coming up), 0-3600 s;
	// 0 turns discovery off, so every endpoint is a candidate for every
	// model as before. Default 30. Ours (docs/selection.md, "Many models
	// behind one rule").
	ModelDiscoveryInterval time.Duration

	// LLB_KV_AUDIT_SAMPLE: 1 in N streamed responses that would be spliced
	// in the kernel is copied in userspace instead, so the per-request usage
	// audit reads its usage (docs/parity.md); 0 = none, 0-1000000.
	// Default 64.
	AuditSample int

	// LLB_PD_PREFILL_TIMEOUT_SEC: prefill leg and decode first-byte bound, 1-99999 s. Default 30.
	PrefillTimeout time.Duration
	// LLB_PD_DECODE_SILENCE_SEC: decode stream silence bound, 1-99999 s. Default 120.
	DecodeSilence time.Duration
	// LLB_PD_MAX_INFLIGHT_PER_EP: per-prefill-endpoint in-flight cap; 0 = off.
	MaxInflightPerEP int
	// LLB_PD_QUEUE_DEPTH_PER_EP: parked FIFO depth per endpoint; 0 = off (shed with 429).
	QueueDepthPerEP int
	// LLB_PD_MAX_PARK_SEC: how long a parked request waits; 0 = PrefillTimeout.
	MaxPark time.Duration
	// LLB_PD_MAX_TOTAL_INFLIGHT: process-wide in-flight cap; 0 = off.
	MaxTotalInflight int
	// LLB_PD_ORIGIN_ERR_THRESHOLD: consecutive prefill 5xx that open the breaker; 0 disables. Default 3.
	OriginErrThreshold int
	// LLB_PD_DECODE_ONLY_FALLBACK: when every prefill fails, send the plain request to decode. Default on.
	DecodeOnlyFallback bool
}

// DefaultSettings is the environment with nothing set.
func DefaultSettings() Settings {
	return Settings{
		// The selector's and the inventory's own defaults, so the two
		// cannot drift apart (TestSettingsDefaultsAreThePackages').
		MinMatchTokens:     selector.DefaultMinMatchTokens,
		LBMode:             selector.LBHard,
		MeanLoadFactor:     selector.DefaultMeanLoadFactor,
		LoadPenalty:        selector.DefaultLoadPenalty,
		SpillRelief:        selector.ReliefAuto,
		ColdStartSeedN:     selector.DefaultColdStartSeedN,
		ColdStartMinBlocks: selector.DefaultColdStartMinBlocks,
		MaxBlocks:          inventory.DefaultMaxBlocks,
		TierWeights:        inventory.DefaultTierWeights(),
		ZeroHitN:           selector.DefaultZeroHitN,
		Score:              selector.ScorePrefix,
		ProvisionalWeight:  inventory.DefaultProvisionalWeight,
		CostWorkWeight:     selector.DefaultCostWorkWeight,
		CapFullGain:        selector.DefaultCapFullGain,
		ColdPlacement:      selector.DefaultColdPlacement,
		ProvisionalTTL:     inventory.DefaultProvisionalTTL,
		ReplayPortOffset:   1000,
		MaxPromptTokens:    262144,
		MaxFrameBytes:      64 << 20,
		TRTLLMPollMin:      5 * time.Millisecond,
		TRTLLMPollMax:      20 * time.Millisecond,
		AuditSample:        64,
		PrefillTimeout:     30 * time.Second,
		DecodeSilence:      120 * time.Second,
		OriginErrThreshold: 3,
		DecodeOnlyFallback: true,

		// A probe coming up re-reads /v1/models at once, so the period
		// only bounds how late an adapter loaded at run time is seen.
		ModelDiscoveryInterval: 30 * time.Second,
	}
}

// EffectiveColdStartMinBlocks reads a 0 minimum as 1 (strictly empty only).
func (s Settings) EffectiveColdStartMinBlocks() int {
	if s.ColdStartMinBlocks <= 0 {
		return 1
	}
	return s.ColdStartMinBlocks
}

// EffectiveMaxPark is MaxPark, or PrefillTimeout when MaxPark is 0.
func (s Settings) EffectiveMaxPark() time.Duration {
	if s.MaxPark <= 0 {
		return s.PrefillTimeout
	}
	return s.MaxPark
}

// SettingsFromOS parses the process environment.
func SettingsFromOS() (Settings, error) { return SettingsFromLookup(os.LookupEnv) }

// SettingsFromEnv parses the environment through getenv. getenv cannot tell
// an unset variable from an empty one, so an empty LLB_KV_NONE_HASH_SEED reads
// as unset here; use SettingsFromLookup (os.LookupEnv) to keep them apart.
func SettingsFromEnv(getenv func(string) string) (Settings, error) {
	return SettingsFromLookup(func(k string) (string, bool) {
		v := getenv(k)
		return v, v != ""
	})
}

// SettingsFromLookup parses the environment through lookup (os.LookupEnv).
// Every invalid variable is reported; each error names its variable.
func SettingsFromLookup(lookup func(string) (string, bool)) (Settings, error) {
	s := DefaultSettings()
	p := envParser{lookup: lookup}

	s.NoneHashSeed, s.NoneHashSeedSet = lookup("LLB_KV_NONE_HASH_SEED")
	if len(s.NoneHashSeed) > maxSeedLen {
		p.fail("LLB_KV_NONE_HASH_SEED", s.NoneHashSeed, fmt.Sprintf("longer than %d bytes", maxSeedLen))
	}
	p.boolean("LLB_KV_HASH_DEBUG", &s.HashDebug)
	p.integer("LLB_KV_MIN_MATCH_TOKENS", &s.MinMatchTokens, 0, selector.MaxMinMatchTokens)
	p.boolean("LLB_KV_LOADGUARD", &s.LoadGuard)
	p.boolean("LLB_PD_SESSION_HASH", &s.SessionHash)
	p.boolean("LLB_KV_LOAD_MIRROR", &s.LoadMirror)
	parsed(&p, "LLB_KV_COLD_PLACEMENT", &s.ColdPlacement, selector.ParseColdPlacement)
	if v, ok := p.get("LLB_KV_LOAD_SCRAPE_MS"); ok {
		// 0 is the default spelled out (the DaemonSet sets every variable).
		ms := 0
		p.integer("LLB_KV_LOAD_SCRAPE_MS", &ms, 0, 60000)
		if ms > 0 && ms < 100 {
			p.fail("LLB_KV_LOAD_SCRAPE_MS", v, "want 0 (with each probe) or an integer in 100..60000")
		}
		s.LoadScrapeInterval = time.Duration(ms) * time.Millisecond
	}

	if _, ok := p.get("LOXILB_KV_LB_MODE"); ok {
		parsed(&p, "LOXILB_KV_LB_MODE", &s.LBMode, selector.ParseLBMode)
	} else if v, ok := p.get("LOXILB_KV_UNIFIED_MODE"); ok {
		// Legacy switch: an off spelling turns the blend off, anything else is hard.
		if isOffWord(v) {
			s.LBMode = selector.LBOff
		}
	}
	p.integer("LOXILB_KV_MEAN_LOAD_FACTOR", &s.MeanLoadFactor, selector.MinMeanLoadFactor, selector.MaxMeanLoadFactor)
	p.integer("LOXILB_KV_LOAD_PENALTY", &s.LoadPenalty, 1, selector.MaxLoadPenalty)
	parsed(&p, "LOXILB_KV_SPILL_RELIEF", &s.SpillRelief, selector.ParseRelief)
	parsed(&p, "LLB_KV_RELIEF_TARGET", &s.ReliefTarget, selector.ParseReliefTarget)
	p.integer("LOXILB_KV_COLDSTART_SEED_N", &s.ColdStartSeedN, 0, 1<<20)
	p.integer("LOXILB_KV_COLDSTART_MIN_BLOCKS", &s.ColdStartMinBlocks, 0, 1<<30)
	p.integer("LOXILB_KV_MAX_BLOCKS", &s.MaxBlocks, inventory.MinMaxBlocks, inventory.MaxMaxBlocks)
	p.integer("LOXILB_KV_ZERO_HIT_N", &s.ZeroHitN, 1, 1<<20)
	parsed(&p, "LOXILB_KV_SCORE", &s.Score, selector.ParseScoreMode)
	parsed(&p, "LLB_KV_TIER_WEIGHTS", &s.TierWeights, inventory.ParseTierWeights)
	p.integer("LOXILB_KV_PROVISIONAL_WEIGHT", &s.ProvisionalWeight, 0, 100)
	p.integer("LOXILB_KV_COST_WORK_WEIGHT", &s.CostWorkWeight, 0, selector.MaxCostWorkWeight)
	p.integer("LOXILB_KV_CAP_FULL_GAIN", &s.CapFullGain, 0, selector.MaxCapFullGain)
	provTTL := int(s.ProvisionalTTL / time.Millisecond)
	p.integer("LOXILB_KV_PROVISIONAL_TTL_MS", &provTTL, 100, int(inventory.MaxProvisionalTTL/time.Millisecond))
	s.ProvisionalTTL = time.Duration(provTTL) * time.Millisecond
	p.integer("LLB_KV_REPLAY_PORT_OFFSET", &s.ReplayPortOffset, -65535, 65535)
	p.integer("LLB_KV_MAX_PROMPT_TOKENS", &s.MaxPromptTokens, 1, 1<<24)
	p.integer("LLB_KV_MAX_FRAME_BYTES", &s.MaxFrameBytes, 4096, 1<<30)
	p.seconds("LLB_KV_MODEL_DISCOVERY_SEC", &s.ModelDiscoveryInterval, 0, 3600)
	pollMin, pollMax := int(s.TRTLLMPollMin/time.Millisecond), int(s.TRTLLMPollMax/time.Millisecond)
	p.integer("LOXILB_KV_TRTLLM_POLL_MIN_MS", &pollMin, 1, 10000)
	p.integer("LOXILB_KV_TRTLLM_POLL_MAX_MS", &pollMax, 1, 10000)
	if pollMin > pollMax {
		pollMin, pollMax = 5, 20
	}
	s.TRTLLMPollMin, s.TRTLLMPollMax = time.Duration(pollMin)*time.Millisecond, time.Duration(pollMax)*time.Millisecond
	p.integer("LLB_KV_AUDIT_SAMPLE", &s.AuditSample, 0, 1_000_000)

	p.seconds("LLB_PD_PREFILL_TIMEOUT_SEC", &s.PrefillTimeout, 1, 99999)
	p.seconds("LLB_PD_DECODE_SILENCE_SEC", &s.DecodeSilence, 1, 99999)
	p.integer("LLB_PD_MAX_INFLIGHT_PER_EP", &s.MaxInflightPerEP, 0, 99999)
	p.integer("LLB_PD_QUEUE_DEPTH_PER_EP", &s.QueueDepthPerEP, 0, 4096)
	p.seconds("LLB_PD_MAX_PARK_SEC", &s.MaxPark, 0, 99999)
	p.integer("LLB_PD_MAX_TOTAL_INFLIGHT", &s.MaxTotalInflight, 0, 2_000_000_000)
	p.integer("LLB_PD_ORIGIN_ERR_THRESHOLD", &s.OriginErrThreshold, 0, 1_000_000)
	p.boolean("LLB_PD_DECODE_ONLY_FALLBACK", &s.DecodeOnlyFallback)

	if len(p.errs) > 0 {
		return s, errors.Join(p.errs...)
	}
	return s, nil
}

// envParser collects one error per bad variable.
type envParser struct {
	lookup func(string) (string, bool)
	errs   []error
}

// get returns a variable's trimmed value; an empty value counts as unset.
func (p *envParser) get(name string) (string, bool) {
	v, ok := p.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

func (p *envParser) fail(name, value, why string) {
	p.errs = append(p.errs, fmt.Errorf("environment variable %s=%q is invalid: %s", name, value, why))
}

// parsed reads a variable through one of pkg/selector's Parse functions, so
// the spellings are the selector's and the error names the variable.
func parsed[T any](p *envParser, name string, dst *T, parse func(string) (T, error)) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	x, err := parse(v)
	if err != nil {
		why := err.Error()
		var pe *selector.ParseError
		if errors.As(err, &pe) {
			why = "allowed values: " + pe.Allowed
		}
		p.fail(name, v, why)
		return
	}
	*dst = x
}

func (p *envParser) integer(name string, dst *int, lo, hi int) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		p.fail(name, v, fmt.Sprintf("want an integer in %d..%d", lo, hi))
		return
	}
	*dst = n
}

func (p *envParser) seconds(name string, dst *time.Duration, lo, hi int) {
	n := -1
	p.integer(name, &n, lo, hi)
	if n >= 0 {
		*dst = time.Duration(n) * time.Second
	}
}

func (p *envParser) boolean(name string, dst *bool) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	switch {
	case isOnWord(v):
		*dst = true
	case isOffWord(v):
		*dst = false
	default:
		p.fail(name, v, "want 1, true, on or yes; or 0, false, off or no")
	}
}

func isOnWord(v string) bool {
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes":
		return true
	}
	return false
}

func isOffWord(v string) bool {
	switch strings.ToLower(v) {
	case "0", "false", "off", "no":
		return true
	}
	return false
}
