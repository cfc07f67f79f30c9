// Package config is kvgate's rule model and its process settings.
//
// A Rule is one load-balancer rule as the management API receives it
// (docs/api.md; LoxiLB's serviceArguments and endpoints, with their exact JSON
// names). Fields keep the value the operator posted: an omitted field is zero,
// and the Effective*/accessor methods apply the defaults, as the reference
// does, so a GET shows what was configured rather than the defaults.
//
// Settings is the process-wide environment (LoxiLB's variables, listed in
// docs/configuration.md), parsed and validated once at start-up. Other packages
// take their own option structs; the daemon maps Settings into them.
package config

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/selector"
)

// Role is an endpoint's P/D role (the reference's ep_role).
type Role int

const (
	// RoleNone is a role-less endpoint (mode 3 pools, plain rules).
	RoleNone Role = 0
	// RolePrefill marks a prefill worker; mode 1 subscribes and scores only these.
	RolePrefill Role = 1
	// RoleDecode marks a decode worker.
	RoleDecode Role = 2
)

func (r Role) String() string {
	switch r {
	case RoleNone:
		return "none"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// KV exact modes (kvExactMode).
const (
	KVModeOff        = 0 // no KV tier
	KVModePD         = 1 // ZeroMQ events over a P/D pool; prefill endpoints are scored
	KVModeNATS       = 2 // reserved by the reference; rejected
	KVModeSinglePool = 3 // role-less single pool; every endpoint is scored
)

// LB modes (mode). kvgate is a fullproxy; KV and P/D rules need ModeFullProxy.
const ModeFullProxy = 4

// Engines (kvEngineType).
const (
	EngineVLLM     = "vllm"
	EngineSGLang   = "sglang"
	EngineTRTLLM   = "trtllm"
	EngineLlamaCpp = "llamacpp"
)

// Hash algorithms (kvHashAlgo). The first four are vLLM's; the last two belong
// to engines not supported yet.
const (
	HashSHA256CBOR      = "sha256_cbor"
	HashXXHashCBOR      = "xxhash_cbor"
	HashSHA256          = "sha256"
	HashXXHash          = "xxhash"
	HashSHA256SGLang    = "sha256_sglang"
	HashBlockHashTRTLLM = "blockhash_trtllm"
)

// Defaults applied by the effective accessors.
const (
	DefaultZmqPort             = 5557
	DefaultBlockSize           = 16
	DefaultDpRankCount         = 1
	DefaultSessionTTL          = 300 * time.Second
	DefaultCacheThreshold      = 20
	DefaultBalanceAbsThreshold = 3
	DefaultProbeTimeout        = 2 * time.Second
	DefaultProbeRetries        = 2
	DefaultProbeInterval       = 5 * time.Second
	DefaultProbeHTTPPath       = "/health"
	DefaultPDBootstrapPort     = 8998
)

// Probe types (probetype).
const (
	ProbeHTTP = "http"
	ProbeTCP  = "tcp"
	ProbeNone = "none"
)

// MaxEndpoints is the most endpoints a rule may hold (ep_idx is in [0, MaxEndpoints)).
const MaxEndpoints = 256

// ServiceArguments is the rule's serviceArguments object. JSON names are the
// reference's, snake_case and camelCase mixed exactly as LoxiLB spells them.
type ServiceArguments struct {
	ExternalIP string       `json:"externalIP"`
	Port       int          `json:"port"`
	Protocol   string       `json:"protocol"`
	Sel        selector.Sel `json:"sel"`
	Mode       int          `json:"mode"`
	Name       string       `json:"name,omitempty"`
	// WildcardVIP must be true for an externalIP of 0.0.0.0 or ::, which
	// listens on every interface of the host. Ours (docs/api.md "Addresses").
	WildcardVIP bool `json:"wildcardVip,omitempty"`
	// Security is LoxiLB's TLS termination mode: 0 plain, 1 https (TLS to
	// clients), 2 e2ehttps (TLS to clients and backends); any other value is
	// refused rather than silently served in the clear (docs/security.md,
	// "TLS termination on the data plane").
	Security int `json:"security,omitempty"`
	// MTLSFrontend and MTLSBackend are LoxiLB's client-certificate and
	// backend-verification objects (tls.go).
	MTLSFrontend *MTLSFrontend `json:"mtls_frontend,omitempty"`
	MTLSBackend  *MTLSBackend  `json:"mtls_backend,omitempty"`

	KVExactMode   int    `json:"kvExactMode,omitempty"`
	KVZmqPort     int    `json:"kvZmqPort,omitempty"`
	KVHashAlgo    string `json:"kvHashAlgo,omitempty"`
	KVBlockSize   int    `json:"kvBlockSize,omitempty"`
	KVWarmupSec   int    `json:"kvWarmupSec,omitempty"`
	KVEngineType  string `json:"kvEngineType,omitempty"`
	KVDpRankCount int    `json:"kvDpRankCount,omitempty"`
	// KVReplayPort overrides the replay endpoint (PUB port + LLB_KV_REPLAY_PORT_OFFSET). Ours.
	KVReplayPort int `json:"kvReplayPort,omitempty"`
	// KVHashSeed overrides LLB_KV_NONE_HASH_SEED for this rule. Nil means not
	// set; a pointer to "" is an explicitly empty seed (vLLM's PYTHONHASHSEED="").
	KVHashSeed *string `json:"kvHashSeed,omitempty"`
	// KVLoraAdapters names the LoRA adapters the rule's engines serve (vLLM's
	// --lora-modules names). A request whose model is one of them hashes with
	// the adapter name in every block's extra keys, as vLLM does. An entry is
	// "name" or "name=base-model": the prompt is tokenized with base-model's
	// staged tokenizer (vLLM tokenizes adapter requests with the base model's
	// tokenizer); a bare name uses the tokenizer staged under the adapter's
	// own name. Ours; the reference has no LoRA support.
	KVLoraAdapters []string `json:"kvLoraAdapters,omitempty"`
	// KVLoraTaskIDs maps kvLoraAdapters names to TensorRT-LLM lora_task_ids
	// (kvEngineType trtllm only): TensorRT-LLM mixes the task id, not the
	// name, into every block key. Ours (docs/engines.md).
	KVLoraTaskIDs map[string]uint64 `json:"kvLoraTaskIds,omitempty"`
	// TrustRequestChatTemplate lets a request's own chat_template be
	// rendered to route it, mirroring vLLM's --trust-request-chat-template
	// (set it when the engines run with that flag). Off (the default), a
	// request carrying chat_template is forwarded unchanged under guard
	// reason tokenize: vLLM refuses such requests, and rendering untrusted
	// Jinja costs kvgate CPU and memory. Ours.
	TrustRequestChatTemplate bool `json:"trustRequestChatTemplate,omitempty"`

	PDBootstrapPort       int  `json:"pdBootstrapPort,omitempty"`
	PDDisaggMode          bool `json:"pd_disagg_mode,omitempty"`
	PDCacheAwareMode      bool `json:"pd_cache_aware_mode,omitempty"`
	PDSessionTTLSec       int  `json:"pd_session_ttl_sec,omitempty"`
	PDCacheThreshold      int  `json:"pd_cache_threshold,omitempty"`
	PDBalanceAbsThreshold int  `json:"pd_balance_abs_threshold,omitempty"`
	CBEnable              bool `json:"cb_enable,omitempty"`
	// PDRequestIDReceipt makes the P/D X-Request-Id the receipt form that
	// P2P-NCCL-style connectors parse. Ours; the reference always uses it.
	PDRequestIDReceipt bool `json:"pd_request_id_receipt,omitempty"`

	// CHWBL ring knobs of the reference (sel 8 or 10); stored, not used by kvgate's KV tier.
	CHWBLMeanLoadFactor  int  `json:"chwbl_mean_load_factor,omitempty"`
	CHWBLReplication     int  `json:"chwbl_replication,omitempty"`
	CHWBLPrefixHashLevel int  `json:"chwbl_prefix_hash_level,omitempty"`
	CHWBLPrefixHashFlags int  `json:"chwbl_prefix_hash_flags,omitempty"`
	CHWBLEnableCacheSalt bool `json:"chwbl_enable_cache_salt,omitempty"`

	ProbeType    string `json:"probetype,omitempty"`
	ProbePort    int    `json:"probeport,omitempty"`
	ProbeReq     string `json:"probereq,omitempty"`
	ProbeTimeout int    `json:"probeTimeout,omitempty"`
	ProbeRetries int    `json:"probeRetries,omitempty"`
	// ProbeInterval is seconds between probes. Ours (LoxiLB has a global interval).
	ProbeInterval int `json:"probeInterval,omitempty"`

	// BackendTokenFile is the path of a file holding the key the rule's
	// engines require (vLLM's --api-key). kvgate sends it as a bearer token
	// on its own calls to them (probes, the /metrics scrape, preflight) and
	// never on clients' requests, whose credentials are the client's. The
	// file follows the API token file's mode rules and reloads on change.
	// Ours (docs/security.md, "Engines that require a key").
	BackendTokenFile string `json:"backendTokenFile,omitempty"`
}

// Endpoint is one backend of a rule. Idx (ep_idx) is allocated by the rule
// store when the endpoint joins and never changes while it stays.
type Endpoint struct {
	Idx        int
	IP         string
	TargetPort int
	Weight     int
	Role       Role
	NixlPort   int
	AdminDown  bool
}

// Key is the endpoint's identity within its rule, "ip:port" (IPv6 bracketed).
func (e Endpoint) Key() string { return EndpointKey(e.IP, e.TargetPort) }

// EndpointKey formats an endpoint identity from its address and target port.
func EndpointKey(ip string, port int) string {
	return net.JoinHostPort(canonicalIP(ip), strconv.Itoa(port))
}

// Addr is the dial address of the endpoint's HTTP server.
func (e Endpoint) Addr() string { return e.Key() }

// EffectiveNixlPort is the port advertised in the P/D request-id receipt:
// nixl_port, else targetPort.
func (e Endpoint) EffectiveNixlPort() int {
	if e.NixlPort != 0 {
		return e.NixlPort
	}
	return e.TargetPort
}

// Admin is the JSON spelling of AdminDown.
func (e Endpoint) Admin() string {
	if e.AdminDown {
		return "down"
	}
	return "up"
}

// endpointJSON is the wire form of an endpoint. ep_idx is output-only: a
// posted ep_idx is ignored (the store allocates indices by identity).
type endpointJSON struct {
	EndpointIP string `json:"endpointIP"`
	TargetPort int    `json:"targetPort"`
	Weight     int    `json:"weight"`
	EPRole     int    `json:"ep_role"`
	NixlPort   int    `json:"nixl_port,omitempty"`
	Admin      string `json:"admin,omitempty"`
	EPIdx      *int   `json:"ep_idx,omitempty"`
}

// MarshalJSON writes the reference's endpoint fields plus ep_idx and admin.
func (e Endpoint) MarshalJSON() ([]byte, error) {
	idx := e.Idx
	return json.Marshal(endpointJSON{
		EndpointIP: e.IP, TargetPort: e.TargetPort, Weight: e.Weight,
		EPRole: int(e.Role), NixlPort: e.NixlPort, Admin: e.Admin(), EPIdx: &idx,
	})
}

// UnmarshalJSON reads an endpoint. admin must be "up", "down" or absent.
func (e *Endpoint) UnmarshalJSON(b []byte) error {
	var w endpointJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = Endpoint{IP: w.EndpointIP, TargetPort: w.TargetPort, Weight: w.Weight, Role: Role(w.EPRole), NixlPort: w.NixlPort}
	if w.EPIdx != nil {
		e.Idx = *w.EPIdx
	}
	switch strings.ToLower(w.Admin) {
	case "", "up":
	case "down":
		e.AdminDown = true
	default:
		return &ValidationError{Field: "endpoints[].admin", Msg: fmt.Sprintf("endpoints[].admin: %q is invalid; allowed values: up, down", w.Admin)}
	}
	return nil
}

// RuleKey identifies a rule: re-posting the same key updates the rule.
type RuleKey struct {
	ExternalIP string
	Port       int
	Protocol   string
}

func (k RuleKey) String() string {
	return net.JoinHostPort(k.ExternalIP, strconv.Itoa(k.Port)) + "/" + k.Protocol
}

// Rule is one load-balancer rule.
type Rule struct {
	// ServiceID is the rule number (the reference's service_id), allocated from 1.
	ServiceID int
	Args      ServiceArguments
	Endpoints []Endpoint
	// NextIdx is the next never-used ep_idx. Kept so an index is not handed to
	// another endpoint while the rule lives.
	NextIdx int
	// Owner names the declarative source that owns the rule ("" for a rule
	// created over REST): the --rules-file path. An owned rule changes only
	// through its file; REST changes to it answer 409 (docs/replicas.md).
	Owner string
}

type ruleJSON struct {
	ServiceArguments json.RawMessage `json:"serviceArguments"`
	Endpoints        []Endpoint      `json:"endpoints"`
	NextIdx          int             `json:"next_ep_idx,omitempty"`
	Owner            string          `json:"owner,omitempty"`
}

// MarshalJSON writes {"serviceArguments":{…,"service_id":N},"endpoints":[…]}.
func (r Rule) MarshalJSON() ([]byte, error) {
	args, err := json.Marshal(r.Args)
	if err != nil {
		return nil, err
	}
	// Append service_id inside serviceArguments, as the GET shape wants.
	if len(args) >= 2 {
		sid := `"service_id":` + strconv.Itoa(r.ServiceID)
		if string(args) == "{}" {
			args = []byte("{" + sid + "}")
		} else {
			args = append(append(args[:len(args)-1:len(args)-1], []byte(","+sid)...), '}')
		}
	}
	eps := r.Endpoints
	if eps == nil {
		eps = []Endpoint{}
	}
	return json.Marshal(ruleJSON{ServiceArguments: args, Endpoints: eps, NextIdx: r.NextIdx, Owner: r.Owner})
}

// UnmarshalJSON reads a rule. service_id inside serviceArguments is read back
// (for the state file); the API ignores it on POST.
func (r *Rule) UnmarshalJSON(b []byte) error {
	var w ruleJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Rule{Endpoints: w.Endpoints, NextIdx: w.NextIdx, Owner: w.Owner}
	if len(w.ServiceArguments) > 0 && string(w.ServiceArguments) != "null" {
		if err := json.Unmarshal(w.ServiceArguments, &r.Args); err != nil {
			return fmt.Errorf("serviceArguments: %w", err)
		}
		var sid struct {
			ServiceID int `json:"service_id"`
		}
		if err := json.Unmarshal(w.ServiceArguments, &sid); err == nil {
			r.ServiceID = sid.ServiceID
		}
	}
	return nil
}

// Key is the rule's identity, with the address and protocol canonicalised.
func (r *Rule) Key() RuleKey {
	return RuleKey{ExternalIP: canonicalIP(r.Args.ExternalIP), Port: r.Args.Port, Protocol: EffectiveProtocol(r.Args.Protocol)}
}

// EffectiveProtocol lower-cases the protocol; empty means tcp.
func EffectiveProtocol(p string) string {
	p = strings.ToLower(strings.TrimSpace(p))
	if p == "" {
		return "tcp"
	}
	return p
}

func canonicalIP(s string) string {
	if ip := net.ParseIP(strings.TrimSpace(s)); ip != nil {
		return ip.String()
	}
	return s
}

// Clone returns a deep copy (endpoints and the seed pointer are not shared).
func (r *Rule) Clone() *Rule {
	c := *r
	c.Endpoints = append([]Endpoint(nil), r.Endpoints...)
	if r.Args.KVHashSeed != nil {
		s := *r.Args.KVHashSeed
		c.Args.KVHashSeed = &s
	}
	c.Args.KVLoraAdapters = append([]string(nil), r.Args.KVLoraAdapters...)
	c.Args.MTLSFrontend, c.Args.MTLSBackend = r.Args.MTLSFrontend.clone(), r.Args.MTLSBackend.clone()
	if r.Args.KVLoraTaskIDs != nil {
		c.Args.KVLoraTaskIDs = make(map[string]uint64, len(r.Args.KVLoraTaskIDs))
		for k, v := range r.Args.KVLoraTaskIDs {
			c.Args.KVLoraTaskIDs[k] = v
		}
	}
	return &c
}

// Endpoint returns the endpoint with the given ep_idx.
func (r *Rule) Endpoint(idx int) (Endpoint, bool) {
	for _, e := range r.Endpoints {
		if e.Idx == idx {
			return e, true
		}
	}
	return Endpoint{}, false
}

// EndpointByKey returns the endpoint with the given "ip:port" key.
func (r *Rule) EndpointByKey(key string) (Endpoint, bool) {
	for _, e := range r.Endpoints {
		if e.Key() == key {
			return e, true
		}
	}
	return Endpoint{}, false
}

// KVEnabled reports whether the rule runs the KV tier (kvExactMode 1 or 3).
func (r *Rule) KVEnabled() bool {
	return r.Args.KVExactMode == KVModePD || r.Args.KVExactMode == KVModeSinglePool
}

// PDDisagg reports whether the rule is a P/D rule: pd_disagg_mode, or implied
// by kvExactMode 1 (the example rule of docs/api.md omits pd_disagg_mode).
func (r *Rule) PDDisagg() bool {
	return r.Args.PDDisaggMode || r.Args.KVExactMode == KVModePD
}

// KVEndpoints are the endpoints the KV tier subscribes to and scores: the
// prefill endpoints in mode 1, every endpoint in mode 3, none otherwise.
func (r *Rule) KVEndpoints() []Endpoint {
	var out []Endpoint
	switch r.Args.KVExactMode {
	case KVModePD:
		for _, e := range r.Endpoints {
			if e.Role == RolePrefill {
				out = append(out, e)
			}
		}
	case KVModeSinglePool:
		out = append(out, r.Endpoints...)
	}
	return out
}

// EffectiveEngine is kvEngineType with "" meaning vllm.
func (r *Rule) EffectiveEngine() string {
	if r.Args.KVEngineType == "" {
		return EngineVLLM
	}
	return strings.ToLower(r.Args.KVEngineType)
}

// EffectiveHashAlgo is kvHashAlgo, or the engine's default when omitted.
func (r *Rule) EffectiveHashAlgo() string {
	if r.Args.KVHashAlgo != "" {
		return r.Args.KVHashAlgo
	}
	switch r.EffectiveEngine() {
	case EngineSGLang:
		return HashSHA256SGLang
	case EngineTRTLLM:
		return HashBlockHashTRTLLM
	}
	return HashSHA256CBOR
}

// ZmqPort is the base KV-event PUB port; rank r publishes on ZmqPort()+r.
func (r *Rule) ZmqPort() int {
	if r.Args.KVZmqPort == 0 {
		return DefaultZmqPort
	}
	return r.Args.KVZmqPort
}

// DefaultTRTLLMBlockSize is TensorRT-LLM's default tokens_per_block, the
// block size of a trtllm rule without kvBlockSize.
const DefaultTRTLLMBlockSize = 32

// BlockSize is the number of tokens per hashed block.
func (r *Rule) BlockSize() int {
	if r.Args.KVBlockSize <= 0 {
		if r.EffectiveEngine() == EngineTRTLLM {
			return DefaultTRTLLMBlockSize
		}
		return DefaultBlockSize
	}
	return r.Args.KVBlockSize
}

// DpRankCount is the number of data-parallel ranks per endpoint.
func (r *Rule) DpRankCount() int {
	if r.Args.KVDpRankCount <= 0 {
		return DefaultDpRankCount
	}
	return r.Args.KVDpRankCount
}

// ReplayPort is the replay endpoint port for rank 0: kvReplayPort when set,
// else ZmqPort()+offset; 0 when replay is disabled or out of range.
// Rank r's replay endpoint is ReplayPort()+r.
func (r *Rule) ReplayPort(offset int) int {
	if r.Args.KVReplayPort != 0 {
		return r.Args.KVReplayPort
	}
	if offset == 0 {
		return 0
	}
	p := r.ZmqPort() + offset
	if p < 1 || p > 65535 {
		return 0
	}
	return p
}

// HashSeed is the NONE_HASH seed for this rule: kvHashSeed when set, else the
// process seed. ok is false when neither is set (unset differs from empty).
func (r *Rule) HashSeed(s Settings) (seed string, ok bool) {
	if r.Args.KVHashSeed != nil {
		return *r.Args.KVHashSeed, true
	}
	return s.NoneHashSeed, s.NoneHashSeedSet
}

// LoraAdapter is one kvLoraAdapters entry.
type LoraAdapter struct {
	// Name is the adapter's served name: a request's model equal to it selects it.
	Name string
	// TokenizerModel is the model whose staged tokenizer encodes the adapter's
	// prompts: the base model given as "name=base", else Name itself.
	TokenizerModel string
}

// ParseLoraAdapter splits a kvLoraAdapters entry, "name" or "name=base-model".
func ParseLoraAdapter(entry string) LoraAdapter {
	name, base, ok := strings.Cut(entry, "=")
	if !ok || base == "" {
		return LoraAdapter{Name: name, TokenizerModel: name}
	}
	return LoraAdapter{Name: name, TokenizerModel: base}
}

// LoraAdapters parses the rule's kvLoraAdapters.
func (r *Rule) LoraAdapters() []LoraAdapter {
	if len(r.Args.KVLoraAdapters) == 0 {
		return nil
	}
	out := make([]LoraAdapter, 0, len(r.Args.KVLoraAdapters))
	for _, e := range r.Args.KVLoraAdapters {
		out = append(out, ParseLoraAdapter(e))
	}
	return out
}

// SessionTTL is the sliding Tier-1 session TTL; 0 means 300 s.
func (r *Rule) SessionTTL() time.Duration {
	if r.Args.PDSessionTTLSec <= 0 {
		return DefaultSessionTTL
	}
	return time.Duration(r.Args.PDSessionTTLSec) * time.Second
}

// CacheThreshold is the trie match-rate percentage; 0 means 20.
func (r *Rule) CacheThreshold() int {
	if r.Args.PDCacheThreshold <= 0 {
		return DefaultCacheThreshold
	}
	return r.Args.PDCacheThreshold
}

// BalanceAbsThreshold is the max−min load spread gate; 0 means 3.
func (r *Rule) BalanceAbsThreshold() int {
	if r.Args.PDBalanceAbsThreshold <= 0 {
		return DefaultBalanceAbsThreshold
	}
	return r.Args.PDBalanceAbsThreshold
}

// ProbeType is probetype, defaulting to http for KV and P/D rules and tcp otherwise.
func (r *Rule) ProbeType() string {
	if t := strings.ToLower(r.Args.ProbeType); t != "" {
		return t
	}
	if r.KVEnabled() || r.PDDisagg() {
		return ProbeHTTP
	}
	return ProbeTCP
}

// ProbePort is the port probed on an endpoint: probeport, else its targetPort.
func (r *Rule) ProbePort(e Endpoint) int {
	if r.Args.ProbePort != 0 {
		return r.Args.ProbePort
	}
	return e.TargetPort
}

// ProbePath is the HTTP probe's request path (probereq), default /health.
func (r *Rule) ProbePath() string {
	if r.Args.ProbeReq != "" {
		return r.Args.ProbeReq
	}
	return DefaultProbeHTTPPath
}

// ProbeTimeout bounds one probe; 0 means 2 s.
func (r *Rule) ProbeTimeout() time.Duration {
	if r.Args.ProbeTimeout <= 0 {
		return DefaultProbeTimeout
	}
	return time.Duration(r.Args.ProbeTimeout) * time.Second
}

// ProbeRetries is the consecutive failures that mark an endpoint down; 0 means 2.
func (r *Rule) ProbeRetries() int {
	if r.Args.ProbeRetries <= 0 {
		return DefaultProbeRetries
	}
	return r.Args.ProbeRetries
}

// ProbeInterval is the time between probes; 0 means 5 s.
func (r *Rule) ProbeInterval() time.Duration {
	if r.Args.ProbeInterval <= 0 {
		return DefaultProbeInterval
	}
	return time.Duration(r.Args.ProbeInterval) * time.Second
}

// CircuitBreakerEnabled: cb_enable, forced on for P/D rules as the reference does.
func (r *Rule) CircuitBreakerEnabled() bool { return r.Args.CBEnable || r.PDDisagg() }

// CircuitBreakerThreshold is the consecutive failures that open the breaker:
// 3 for P/D rules (as the reference forces), 5 otherwise.
func (r *Rule) CircuitBreakerThreshold() int {
	if r.PDDisagg() {
		return 3
	}
	return 5
}

// AssignIndices gives the posted endpoints of r their ep_idx values. With old
// nil (a new rule) they take their posted order, 0, 1, 2, …. On an update,
// an endpoint that stays (same ip:port) keeps its index; newcomers take the
// next never-used index, so an index is not reused while the rule lives.
// Only when all MaxEndpoints indices have been used once does a newcomer take
// the lowest index free at that moment. Posted ep_idx values are ignored.
func (r *Rule) AssignIndices(old *Rule) {
	if old == nil {
		for i := range r.Endpoints {
			r.Endpoints[i].Idx = i
		}
		r.NextIdx = len(r.Endpoints)
		return
	}
	r.NextIdx = old.NextIdx
	inUse := make(map[int]bool, len(r.Endpoints))
	pending := make([]int, 0)
	for i := range r.Endpoints {
		if prev, ok := old.EndpointByKey(r.Endpoints[i].Key()); ok {
			r.Endpoints[i].Idx = prev.Idx
			inUse[prev.Idx] = true
		} else {
			pending = append(pending, i)
		}
	}
	lowestFree := 0
	for _, i := range pending {
		if r.NextIdx < MaxEndpoints {
			r.Endpoints[i].Idx = r.NextIdx
			inUse[r.NextIdx] = true
			r.NextIdx++
			continue
		}
		for inUse[lowestFree] {
			lowestFree++
		}
		r.Endpoints[i].Idx = lowestFree
		inUse[lowestFree] = true
	}
}
