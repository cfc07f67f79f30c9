package config

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
)

// ValidationError is a rule the API answers with 400. Msg names the field and
// the allowed values.
type ValidationError struct {
	Field string
	Msg   string
}

func (e *ValidationError) Error() string { return e.Msg }

// ConflictError is a change to an existing rule that is not allowed (409).
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Msg: field + ": " + fmt.Sprintf(format, args...)}
}

// Bounds on values that have no natural limit, so a typo cannot configure
// something absurd.
const (
	maxBlockSize   = 65536
	maxWarmupSec   = 86400
	maxSessionTTL  = 7 * 86400
	maxProbeSec    = 3600
	maxProbeRetry  = 100
	maxSeedLen     = 4096
	maxProbeReqLen = 1024
	maxNameLen     = 256
	// MaxLoraAdapters bounds kvLoraAdapters; MaxLoraAdapterLen bounds each entry.
	MaxLoraAdapters   = 64
	MaxLoraAdapterLen = 256
)

// Validate checks a posted rule against docs/api.md and LoxiLB's check
// list. env supplies the process seed (an xxhash rule needs a seed). The first
// failure is returned as a *ValidationError.
func Validate(r *Rule, env Settings) error {
	if err := validateService(&r.Args); err != nil {
		return err
	}
	if err := validateEngine(&r.Args); err != nil {
		return err
	}
	if err := validateKV(r, env); err != nil {
		return err
	}
	if err := validatePD(&r.Args); err != nil {
		return err
	}
	if err := validateBackendTokenFile(&r.Args); err != nil {
		return err
	}
	return validateTopology(r)
}

// MaxBackendTokenPathLen bounds backendTokenFile (PATH_MAX).
const MaxBackendTokenPathLen = 4096

// validateBackendTokenFile checks the path's shape only; the file itself
// (its mode, owner and token) is checked where the filesystem is, by the
// API when the rule is posted (docs/security.md).
func validateBackendTokenFile(a *ServiceArguments) error {
	p := a.BackendTokenFile
	if p == "" {
		return nil
	}
	if len(p) > MaxBackendTokenPathLen {
		return invalid("serviceArguments.backendTokenFile", "longer than %d bytes", MaxBackendTokenPathLen)
	}
	// The path is logged and shown by GET: control characters would forge
	// log lines.
	if i := strings.IndexFunc(p, func(c rune) bool { return c < 0x20 || c == 0x7f }); i >= 0 {
		return invalid("serviceArguments.backendTokenFile", "byte %d is a control character; give the file's absolute path", i)
	}
	if !filepath.IsAbs(p) {
		return invalid("serviceArguments.backendTokenFile", "%q is not an absolute path; kvgate's working directory is not the operator's", p)
	}
	return nil
}

// validateService checks the LoxiLB service fields: address, port,
// protocol, name, mode and selection.
func validateService(a *ServiceArguments) error {
	if ip := net.ParseIP(strings.TrimSpace(a.ExternalIP)); ip == nil {
		return invalid("serviceArguments.externalIP", "%q is not an IP address", a.ExternalIP)
	}
	if a.Port < 1 || a.Port > 65535 {
		return invalid("serviceArguments.port", "%d is out of range; allowed 1-65535", a.Port)
	}
	if p := EffectiveProtocol(a.Protocol); p != "tcp" {
		return invalid("serviceArguments.protocol", "%q is not supported; allowed values: tcp (kvgate proxies HTTP over TCP)", a.Protocol)
	}
	if len(a.Name) > maxNameLen {
		return invalid("serviceArguments.name", "longer than %d bytes", maxNameLen)
	}
	// Names end up in logs, kvctl tables and the DELETE …/name/{name} path:
	// control characters and NUL would forge log lines or break the path.
	if i := strings.IndexFunc(a.Name, func(c rune) bool { return c < 0x20 || c > 0x7e }); i >= 0 {
		return invalid("serviceArguments.name", "byte %d is not printable ASCII; allowed: 1-%d printable ASCII characters (0x20-0x7e)", i, maxNameLen)
	}
	if a.Mode < 0 || a.Mode > 5 {
		return invalid("serviceArguments.mode", "%d is out of range; allowed 0-5 (4 = fullproxy)", a.Mode)
	}
	if a.Sel < 0 || a.Sel > 10 {
		return invalid("serviceArguments.sel", "%d is out of range; allowed 0 rr, 1 hash, 2 priority, 3 persist, 4 lc, 5 n2, 6 n3, 8 chwbl, 9 gpuaware, 10 wrr-hash", a.Sel)
	}
	if a.Sel == 7 {
		return invalid("serviceArguments.sel", "7 is reserved; allowed 0 rr, 1 hash, 2 priority, 3 persist, 4 lc, 5 n2, 6 n3, 8 chwbl, 9 gpuaware, 10 wrr-hash")
	}
	if (a.Sel == 5 || a.Sel == 8 || a.Sel == 9 || a.Sel == 10) && a.Mode != ModeFullProxy {
		return invalid("serviceArguments.sel", "%d requires mode 4 (fullproxy)", a.Sel)
	}
	return nil
}

// validateEngine checks kvExactMode and kvEngineType.
func validateEngine(a *ServiceArguments) error {
	switch a.KVExactMode {
	case KVModeOff, KVModePD, KVModeSinglePool:
	case KVModeNATS:
		return invalid("serviceArguments.kvExactMode", "2 (NATS) is reserved and not supported; allowed values: 0 off, 1 P/D, 3 single pool")
	default:
		return invalid("serviceArguments.kvExactMode", "%d is out of range; allowed values: 0 off, 1 P/D, 3 single pool (2 is reserved)", a.KVExactMode)
	}

	engine := strings.ToLower(a.KVEngineType)
	switch engine {
	case "", EngineVLLM, EngineSGLang:
	case EngineTRTLLM:
		if err := validateTRTLLM(a); err != nil {
			return err
		}
	case EngineLlamaCpp:
		if f := firstKVField(a); f != "" {
			return invalid("serviceArguments."+f, "kvEngineType llamacpp publishes no KV events, so KV-exact fields are rejected; remove %s or use kvEngineType vllm, sglang or trtllm", f)
		}
	default:
		return invalid("serviceArguments.kvEngineType", "%q is invalid: kv-engine-type must be one of \"vllm\", \"sglang\", \"trtllm\" (or llamacpp, without KV-exact fields)", a.KVEngineType)
	}
	return nil
}

// validateKV checks the KV-exact fields: that they sit on a fullproxy rule,
// their ranges, the hash algorithm and its seed (env supplies the process
// seed).
func validateKV(r *Rule, env Settings) error {
	a := &r.Args
	// KV and P/D fields need a fullproxy rule.
	if a.Mode != ModeFullProxy {
		if f := firstKVField(a); f != "" {
			return invalid("serviceArguments."+f, "requires mode 4 (fullproxy); got mode %d", a.Mode)
		}
		if f := firstPDField(r); f != "" {
			return invalid(f, "requires mode 4 (fullproxy); got mode %d", a.Mode)
		}
	}

	if a.KVBlockSize < 0 || a.KVBlockSize > maxBlockSize {
		return invalid("serviceArguments.kvBlockSize", "%d is out of range; allowed 1-%d (0 = default 16, 32 for trtllm); it must equal the engine's block size (vLLM --block-size, SGLang --page-size, TensorRT-LLM tokens_per_block)", a.KVBlockSize, maxBlockSize)
	}
	if a.KVZmqPort < 0 || a.KVZmqPort > 65535 {
		return invalid("serviceArguments.kvZmqPort", "%d is out of range; allowed 1-65535 (0 = default 5557)", a.KVZmqPort)
	}
	if a.KVDpRankCount < 0 || a.KVDpRankCount > 8 {
		return invalid("serviceArguments.kvDpRankCount", "%d is out of range; allowed 1-8 (0 = default 1)", a.KVDpRankCount)
	}
	if r.ZmqPort()+r.DpRankCount()-1 > 65535 {
		return invalid("serviceArguments.kvZmqPort", "%d plus kvDpRankCount %d runs past port 65535 (rank r uses kvZmqPort+r)", r.ZmqPort(), r.DpRankCount())
	}
	if a.KVReplayPort < 0 || a.KVReplayPort+r.DpRankCount()-1 > 65535 {
		return invalid("serviceArguments.kvReplayPort", "%d is out of range; allowed 1-65535 (0 = kvZmqPort + LLB_KV_REPLAY_PORT_OFFSET)", a.KVReplayPort)
	}
	if a.KVWarmupSec < 0 || a.KVWarmupSec > maxWarmupSec {
		return invalid("serviceArguments.kvWarmupSec", "%d is out of range; allowed 0-%d", a.KVWarmupSec, maxWarmupSec)
	}
	if err := validateHashSeed(r); err != nil {
		return err
	}
	if err := validateTLS(r); err != nil {
		return err
	}
	if err := validateLoraAdapters(r); err != nil {
		return err
	}
	if err := validateLoraTaskIDs(r); err != nil {
		return err
	}
	if err := validateHashAlgo(r); err != nil {
		return err
	}
	if r.KVEnabled() {
		algo := r.EffectiveHashAlgo()
		if algo == HashXXHashCBOR || algo == HashXXHash {
			if _, ok := r.HashSeed(env); !ok {
				return invalid("serviceArguments.kvHashAlgo",
					"%q needs a hash seed: with PYTHONHASHSEED unset, vLLM seeds the xxhash NONE_HASH from os.urandom, so no gateway can reproduce its block hashes. Set kvHashSeed on the rule (or LLB_KV_NONE_HASH_SEED) to the engine's PYTHONHASHSEED, or use sha256_cbor", algo)
			}
		}
	}
	return nil
}

// validatePD checks the P/D, CHWBL and probe fields.
func validatePD(a *ServiceArguments) error {
	if a.PDBootstrapPort < 0 || a.PDBootstrapPort > 65535 {
		return invalid("serviceArguments.pdBootstrapPort", "%d is out of range; allowed 0-65535", a.PDBootstrapPort)
	}
	if a.PDBootstrapPort != 0 {
		return invalid("serviceArguments.pdBootstrapPort", "requires kvEngineType sglang with pd_disagg_mode, which is not supported yet")
	}
	if a.PDSessionTTLSec < 0 || a.PDSessionTTLSec > maxSessionTTL {
		return invalid("serviceArguments.pd_session_ttl_sec", "%d is out of range; allowed 0-%d (0 = default 300)", a.PDSessionTTLSec, maxSessionTTL)
	}
	if a.PDCacheThreshold < 0 || a.PDCacheThreshold > 100 {
		return invalid("serviceArguments.pd_cache_threshold", "%d is out of range; allowed 0-100 (0 = default 20)", a.PDCacheThreshold)
	}
	if a.PDBalanceAbsThreshold < 0 || a.PDBalanceAbsThreshold > 255 {
		return invalid("serviceArguments.pd_balance_abs_threshold", "%d is out of range; allowed 0-255 (0 = default 3)", a.PDBalanceAbsThreshold)
	}
	if err := validateCHWBL(a); err != nil {
		return err
	}
	if err := validateProbe(a); err != nil {
		return err
	}

	return nil
}

// validateTopology checks the endpoints and that their roles fit the rule's
// topology (P/D needs both roles; a single pool takes none).
func validateTopology(r *Rule) error {
	a := &r.Args
	if a.PDDisaggMode && a.KVExactMode == KVModeSinglePool {
		return invalid("serviceArguments.pd_disagg_mode", "kvExactMode 3 (single pool) is incompatible with pd_disagg_mode; use kvExactMode 1 for P/D")
	}
	if a.PDCacheAwareMode && !r.PDDisagg() {
		return invalid("serviceArguments.pd_cache_aware_mode", "requires pd_disagg_mode=true (or kvExactMode 1)")
	}
	if err := validateEndpoints(r); err != nil {
		return err
	}
	if r.PDDisagg() {
		var prefill, decode int
		for _, e := range r.Endpoints {
			switch e.Role {
			case RolePrefill:
				prefill++
			case RoleDecode:
				decode++
			}
		}
		if prefill == 0 || decode == 0 {
			what := "pd_disagg_mode"
			if a.KVExactMode == KVModePD {
				what = "kvExactMode 1"
			}
			return invalid("endpoints[].ep_role", "%s needs at least one prefill (ep_role 1) and one decode (ep_role 2) endpoint; got %d prefill, %d decode", what, prefill, decode)
		}
	}
	if a.KVExactMode == KVModeSinglePool {
		for i, e := range r.Endpoints {
			if e.Role != RoleNone {
				return invalid(fmt.Sprintf("endpoints[%d].ep_role", i), "kvExactMode 3 (single pool) endpoints must not carry roles; got ep_role %d, allowed 0", int(e.Role))
			}
		}
	}
	return nil
}

func validateEndpoints(r *Rule) error {
	if len(r.Endpoints) > MaxEndpoints {
		return invalid("endpoints", "%d endpoints; at most %d per rule", len(r.Endpoints), MaxEndpoints)
	}
	seen := make(map[string]int, len(r.Endpoints))
	for i, e := range r.Endpoints {
		f := func(name string) string { return fmt.Sprintf("endpoints[%d].%s", i, name) }
		if net.ParseIP(strings.TrimSpace(e.IP)) == nil {
			return invalid(f("endpointIP"), "%q is not an IP address", e.IP)
		}
		if e.TargetPort < 1 || e.TargetPort > 65535 {
			return invalid(f("targetPort"), "%d is out of range; allowed 1-65535", e.TargetPort)
		}
		if e.Weight < 0 || e.Weight > 255 {
			return invalid(f("weight"), "%d is out of range; allowed 0-255", e.Weight)
		}
		if e.Role < RoleNone || e.Role > RoleDecode {
			return invalid(f("ep_role"), "%d is invalid; allowed values: 0 none, 1 prefill, 2 decode", int(e.Role))
		}
		if e.NixlPort < 0 || e.NixlPort > 65535 {
			return invalid(f("nixl_port"), "%d is out of range; allowed 0-65535 (0 = targetPort)", e.NixlPort)
		}
		k := e.Key()
		if j, dup := seen[k]; dup {
			return invalid(f("endpointIP"), "endpoint %s is listed twice (also endpoints[%d]); an endpoint is identified by ip:targetPort", k, j)
		}
		seen[k] = i
	}
	return nil
}

// validateLoraAdapters checks kvLoraAdapters: a KV rule's list of at most
// MaxLoraAdapters distinct entries, each "name" or "name=base-model", non-empty,
// at most MaxLoraAdapterLen bytes, without spaces or control characters (a
// request's model is trimmed before it is compared).
func validateLoraAdapters(r *Rule) error {
	const field = "serviceArguments.kvLoraAdapters"
	list := r.Args.KVLoraAdapters
	if len(list) == 0 {
		return nil
	}
	if !r.KVEnabled() {
		return invalid(field, "applies to KV rules only; set kvExactMode 1 or 3, or remove kvLoraAdapters")
	}
	if len(list) > MaxLoraAdapters {
		return invalid(field, "%d adapters; at most %d per rule", len(list), MaxLoraAdapters)
	}
	seen := make(map[string]int, len(list))
	for i, entry := range list {
		if entry == "" {
			return invalid(field, "entry %d is empty; each entry is an adapter name, or name=base-model", i)
		}
		if len(entry) > MaxLoraAdapterLen {
			return invalid(field, "entry %d is longer than %d bytes", i, MaxLoraAdapterLen)
		}
		if strings.IndexFunc(entry, func(c rune) bool { return c <= ' ' || c == 0x7f }) >= 0 {
			return invalid(field, "entry %d (%q) contains a space or control character; allowed: an adapter name, or name=base-model", i, entry)
		}
		ad := ParseLoraAdapter(entry)
		if ad.Name == "" || strings.HasSuffix(entry, "=") {
			return invalid(field, "entry %d (%q) is malformed; allowed: an adapter name, or name=base-model", i, entry)
		}
		if strings.HasPrefix(ad.TokenizerModel, "/") || strings.HasPrefix(ad.TokenizerModel, ".") {
			return invalid(field, "entry %d (%q): %q looks like a path; after \"=\" give the base model's name (its tokenizer is staged under that name), not vLLM's adapter path", i, entry, ad.TokenizerModel)
		}
		if j, dup := seen[ad.Name]; dup {
			return invalid(field, "adapter %q is listed twice (entries %d and %d)", ad.Name, j, i)
		}
		seen[ad.Name] = i
	}
	return nil
}

// validateLoraTaskIDs checks kvLoraTaskIds: a trtllm rule's map from its
// kvLoraAdapters names to TensorRT-LLM lora_task_ids.
func validateLoraTaskIDs(r *Rule) error {
	const field = "serviceArguments.kvLoraTaskIds"
	ids := r.Args.KVLoraTaskIDs
	if len(ids) == 0 {
		return nil
	}
	if r.EffectiveEngine() != EngineTRTLLM {
		return invalid(field, "applies to kvEngineType trtllm only (other engines key LoRA blocks by adapter name); remove kvLoraTaskIds")
	}
	if len(ids) > MaxLoraAdapters {
		return invalid(field, "%d entries; at most %d per rule", len(ids), MaxLoraAdapters)
	}
	names := make(map[string]bool, len(r.Args.KVLoraAdapters))
	for _, a := range r.LoraAdapters() {
		names[a.Name] = true
	}
	for name := range ids {
		if !names[name] {
			return invalid(field, "%q is not a kvLoraAdapters name; each key must name an adapter the rule lists", name)
		}
	}
	return nil
}

func validateCHWBL(a *ServiceArguments) error {
	if a.CHWBLMeanLoadFactor != 0 && (a.CHWBLMeanLoadFactor < 100 || a.CHWBLMeanLoadFactor > 300) {
		return invalid("serviceArguments.chwbl_mean_load_factor", "%d is out of range; allowed 100-300", a.CHWBLMeanLoadFactor)
	}
	if a.CHWBLReplication != 0 && (a.CHWBLReplication < 1 || a.CHWBLReplication > 1024) {
		return invalid("serviceArguments.chwbl_replication", "%d is out of range; allowed 1-1024", a.CHWBLReplication)
	}
	if a.CHWBLPrefixHashLevel != 0 && (a.CHWBLPrefixHashLevel < 1 || a.CHWBLPrefixHashLevel > 3) {
		return invalid("serviceArguments.chwbl_prefix_hash_level", "%d is invalid; allowed values: 1, 2, 3", a.CHWBLPrefixHashLevel)
	}
	if a.CHWBLPrefixHashFlags < 0 || a.CHWBLPrefixHashFlags > 255 {
		return invalid("serviceArguments.chwbl_prefix_hash_flags", "%d is out of range; allowed 0-255", a.CHWBLPrefixHashFlags)
	}
	return nil
}

func validateProbe(a *ServiceArguments) error {
	switch strings.ToLower(a.ProbeType) {
	case "", ProbeHTTP, ProbeTCP, ProbeNone:
	default:
		return invalid("serviceArguments.probetype", "%q is not supported; allowed values: http, tcp, none", a.ProbeType)
	}
	if a.ProbePort < 0 || a.ProbePort > 65535 {
		return invalid("serviceArguments.probeport", "%d is out of range; allowed 0-65535 (0 = targetPort)", a.ProbePort)
	}
	if a.ProbeReq != "" {
		if len(a.ProbeReq) > maxProbeReqLen || !strings.HasPrefix(a.ProbeReq, "/") || strings.ContainsAny(a.ProbeReq, " \t\r\n") {
			return invalid("serviceArguments.probereq", "%q is invalid; it must be an HTTP path such as /health (at most %d bytes, no spaces)", a.ProbeReq, maxProbeReqLen)
		}
	}
	if a.ProbeTimeout < 0 || a.ProbeTimeout > maxProbeSec {
		return invalid("serviceArguments.probeTimeout", "%d is out of range; allowed 0-%d seconds (0 = default 2)", a.ProbeTimeout, maxProbeSec)
	}
	if a.ProbeRetries < 0 || a.ProbeRetries > maxProbeRetry {
		return invalid("serviceArguments.probeRetries", "%d is out of range; allowed 0-%d (0 = default 2)", a.ProbeRetries, maxProbeRetry)
	}
	if a.ProbeInterval < 0 || a.ProbeInterval > maxProbeSec {
		return invalid("serviceArguments.probeInterval", "%d is out of range; allowed 0-%d seconds (0 = default 5)", a.ProbeInterval, maxProbeSec)
	}
	return nil
}

// validateHashSeed checks kvHashSeed: bounded, and only for vLLM, the one
// engine whose hashes take a seed.
func validateHashSeed(r *Rule) error {
	seed := r.Args.KVHashSeed
	if seed == nil {
		return nil
	}
	if engine := r.EffectiveEngine(); engine == EngineSGLang || engine == EngineTRTLLM {
		return invalid("serviceArguments.kvHashSeed", "kvEngineType %s hashes without a seed (PYTHONHASHSEED plays no part, see docs/engines.md); remove kvHashSeed", engine)
	}
	if len(*seed) > maxSeedLen {
		return invalid("serviceArguments.kvHashSeed", "longer than %d bytes", maxSeedLen)
	}
	return nil
}

// validateTRTLLM holds the reference's TensorRT-LLM checks: its events come
// from polling POST /kv_cache_events on the endpoint, not from ZeroMQ, and
// the drain carries every attention-DP rank (docs/engines.md).
func validateTRTLLM(a *ServiceArguments) error {
	if a.KVExactMode != KVModePD && a.KVExactMode != KVModeSinglePool {
		return invalid("serviceArguments.kvExactMode", "kv-engine-type trtllm supports kvExactMode 1 or 3 (HTTP-polled event plane); got %d", a.KVExactMode)
	}
	if a.KVZmqPort != 0 && a.KVZmqPort != DefaultZmqPort {
		return invalid("serviceArguments.kvZmqPort", "kvZmqPort is meaningless for kv-engine-type trtllm (events are drained from POST /kv_cache_events on the endpoint's targetPort); got %d, allowed 0 or %d", a.KVZmqPort, DefaultZmqPort)
	}
	if a.KVDpRankCount > 1 {
		return invalid("serviceArguments.kvDpRankCount", "kvDpRankCount is meaningless for kv-engine-type trtllm (the drain carries every attention_dp_rank); got %d, allowed 0 or 1", a.KVDpRankCount)
	}
	if a.KVReplayPort != 0 {
		return invalid("serviceArguments.kvReplayPort", "kvReplayPort is meaningless for kv-engine-type trtllm (it has no replay socket); got %d, allowed 0", a.KVReplayPort)
	}
	return nil
}

// engineHashAlgos lists the kvHashAlgo values each engine can publish; the
// first is the engine's default (Rule.EffectiveHashAlgo).
var engineHashAlgos = map[string][]string{
	EngineVLLM:   {HashSHA256CBOR, HashXXHashCBOR, HashSHA256, HashXXHash},
	EngineSGLang: {HashSHA256SGLang},
	EngineTRTLLM: {HashBlockHashTRTLLM},
}

// validateHashAlgo checks kvHashAlgo and that it fits kvEngineType, with the
// reference's messages.
func validateHashAlgo(r *Rule) error {
	const field = "serviceArguments.kvHashAlgo"
	algo := r.Args.KVHashAlgo
	switch algo {
	case "":
		return nil
	case HashSHA256CBOR, HashXXHashCBOR, HashSHA256, HashXXHash, HashSHA256SGLang, HashBlockHashTRTLLM:
	default:
		return invalid(field, "%q is invalid: kv-hash-algo must be one of \"sha256_cbor\", \"xxhash_cbor\", \"sha256_sglang\", \"blockhash_trtllm\" (or vLLM's pickle algorithms sha256, xxhash)", algo)
	}
	engine := r.EffectiveEngine()
	allowed, ok := engineHashAlgos[engine]
	if !ok {
		return nil // llamacpp: KV fields were refused above
	}
	for _, a := range allowed {
		if a == algo {
			return nil
		}
	}
	return invalid(field, "kv-hash-algo %q is incompatible with kv-engine-type %q (omit kvHashAlgo to take the engine default %q); serviceArguments.kvEngineType %s allows %s",
		algo, engine, allowed[0], engine, strings.Join(allowed, ", "))
}

// firstKVField names the first KV-exact field set on a, or "".
func firstKVField(a *ServiceArguments) string {
	switch {
	case a.KVExactMode != 0:
		return "kvExactMode"
	case a.KVZmqPort != 0:
		return "kvZmqPort"
	case a.KVHashAlgo != "":
		return "kvHashAlgo"
	case a.KVBlockSize != 0:
		return "kvBlockSize"
	case a.KVWarmupSec != 0:
		return "kvWarmupSec"
	case a.KVDpRankCount != 0:
		return "kvDpRankCount"
	case a.KVReplayPort != 0:
		return "kvReplayPort"
	case a.KVHashSeed != nil:
		return "kvHashSeed"
	case len(a.KVLoraAdapters) > 0:
		return "kvLoraAdapters"
	case len(a.KVLoraTaskIDs) > 0:
		return "kvLoraTaskIds"
	case a.TrustRequestChatTemplate:
		return "trustRequestChatTemplate"
	}
	return ""
}

// firstPDField names the first P/D field set on r (with its JSON path), or "".
func firstPDField(r *Rule) string {
	a := &r.Args
	switch {
	case a.PDDisaggMode:
		return "serviceArguments.pd_disagg_mode"
	case a.PDCacheAwareMode:
		return "serviceArguments.pd_cache_aware_mode"
	case a.PDSessionTTLSec != 0:
		return "serviceArguments.pd_session_ttl_sec"
	case a.PDCacheThreshold != 0:
		return "serviceArguments.pd_cache_threshold"
	case a.PDBalanceAbsThreshold != 0:
		return "serviceArguments.pd_balance_abs_threshold"
	case a.PDBootstrapPort != 0:
		return "serviceArguments.pdBootstrapPort"
	case a.PDRequestIDReceipt:
		return "serviceArguments.pd_request_id_receipt"
	}
	for i, e := range r.Endpoints {
		if e.Role != RoleNone {
			return fmt.Sprintf("endpoints[%d].ep_role", i)
		}
		if e.NixlPort != 0 {
			return fmt.Sprintf("endpoints[%d].nixl_port", i)
		}
	}
	return ""
}

// CheckUpdate reports a change from old to updated that must be a delete and
// recreate (409): the engine type is immutable.
func CheckUpdate(old, updated *Rule) error {
	if old.EffectiveEngine() != updated.EffectiveEngine() {
		return &ConflictError{Msg: fmt.Sprintf("serviceArguments.kvEngineType: cannot change the KV engine type of an existing rule from %q to %q; delete and recreate the rule", old.EffectiveEngine(), updated.EffectiveEngine())}
	}
	return checkTLSUpdate(old, updated)
}
