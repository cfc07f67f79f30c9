package enginesim

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevents"
)

// Role is the engine's part in prefill/decode disaggregation.
type Role string

// Roles, as --role spells them.
const (
	RoleBoth    Role = "both"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Defaults: a small model (about 1B parameters) served by vLLM on one
// mid-range GPU. Prefill runs at roughly 16k tokens/s, a sequence decodes at
// about 80 tokens/s, and each request pays a 15 ms scheduling/launch floor
// before its first token.
const (
	DefaultHost      = "127.0.0.1"
	DefaultPort      = 8000
	DefaultModel     = "Qwen/Qwen3-0.6B"
	DefaultBlockSize = 16
	DefaultHashAlgo  = "sha256_cbor"
	// EngineVLLM and EngineSGLang are the engines enginesim speaks
	// (--engine); docs/enginesim.md, "SGLang mode".
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTRTLLM = "trtllm"
	// DefaultTRTLLMHashAlgo and DefaultTRTLLMTokensPerBlock are
	// TensorRT-LLM's v1 block key and default tokens_per_block.
	DefaultTRTLLMHashAlgo       = "blockhash_trtllm"
	DefaultTRTLLMTokensPerBlock = 32
	// DefaultEventBufferMaxSize bounds the drain buffer (TensorRT-LLM's
	// KvCacheConfig.event_buffer_max_size; the oldest events go first).
	DefaultEventBufferMaxSize = 10000
	// DefaultSGLangHashAlgo is the only hash SGLang publishes.
	DefaultSGLangHashAlgo    = "sha256_sglang"
	DefaultNumGPUBlocks      = 8192
	DefaultKVEventsPort      = 5557
	DefaultReplayPortOffset  = 1000
	DefaultEventLayout       = "map"
	DefaultPrefillUsPerToken = 60.0
	// DefaultCPUReloadUsPerToken: 128 KiB of KV per token (Llama-3.1-8B,
	// BF16) over ~50 GB/s of host-to-device copy.
	DefaultCPUReloadUsPerToken = 2.5
	DefaultTTFTFloor           = 15 * time.Millisecond
	DefaultDecodeTokensPerS    = 80.0
	DefaultMaxNumSeqs          = 64
	DefaultMaxWaiting          = 4096
	DefaultMaxModelLen         = 32768
	DefaultMaxTokens           = 16
	DefaultReplayBufferSteps   = 10000
	DefaultKVEventsHWM         = 100000
	DefaultNixlSideChannel     = 5600
	DefaultKVTransferTimeout   = 480 * time.Second // VLLM_NIXL_ABORT_REQUEST_TIMEOUT
	DefaultMaxRequestBytes     = 8 << 20
)

// Config is everything an engine needs. The zero value of each field means
// its default, so tests and `kvgate demo` set only what they care about.
type Config struct {
	// Engine is the engine simulated: "vllm" (default) or "sglang", whose
	// page hash (sha256_sglang), KV-event payloads, legacy replay shape and
	// /get_server_info it speaks (docs/enginesim.md, "SGLang mode").
	Engine string
	Host   string // address to listen on (HTTP and, by default, KV events)
	Port   int    // HTTP port; 0 picks a free one
	ID     string // x-engine-id; default "<host>:<port>"
	Model  string // served model name
	// LoRAModules are LoRA adapter names served on top of Model (vLLM's
	// --lora-modules). A request naming one is tokenized like the base
	// model and hashed with the adapter name in every block's extra keys;
	// its events carry it as lora_name. No weights: only the cache identity.
	LoRAModules []string
	// LoRATaskIDs gives each LoRA module its TensorRT-LLM lora_task_id
	// (--engine trtllm, where block keys mix the task id, not the name).
	LoRATaskIDs map[string]uint64

	// Tokenizer turns text and chat into token ids. Nil means the built-in
	// byte-level tokenizer, which matches no real model (token-id prompts are
	// exact either way).
	Tokenizer Tokenizer

	BlockSize int
	// HashBlockSize is the hash block size when the KV block is a multiple
	// of it (vLLM's hybrid models and prefix_match_unit): events then carry
	// block_size BlockSize and, per block, the hash-chain value at its last
	// hash boundary. 0 means BlockSize.
	HashBlockSize int
	HashAlgo      string // sha256_cbor | xxhash_cbor | sha256 | xxhash
	// PythonHashSeed is the PYTHONHASHSEED value; HashSeedSet false means
	// unset (vLLM's fixed "vllm-none-hash" for sha256*, random for xxhash*).
	PythonHashSeed string
	HashSeedSet    bool

	NumGPUBlocks int
	// NumCPUBlocks is the CPU offload tier's size in blocks, named after
	// vLLM's OffloadingConnector option num_cpu_blocks
	// (kv_connector_extra_config); 0 turns the tier off. vLLM engine only.
	NumCPUBlocks int
	// CPUReloadUsPerToken is the timing model's cost of reloading one token's
	// KV from the CPU tier to the GPU, µs (docs/enginesim.md, "CPU offload tier").
	CPUReloadUsPerToken float64

	KVEventsEndpoint string // "tcp://<host>:5557" by default; "none" disables
	ReplayEndpoint   string // default PUB port + 1000; "none" disables
	EventLayout      string // "map" (vLLM >= 0.26), "array" (the last array layout) or "array-v0.15|v0.11|v0.9"
	EventTopic       string // ZMQ topic frame; vLLM's default is ""
	ReplayBuffer     int    // batches kept for replay (vLLM buffer_steps)
	// ReplayLayout is the replay ROUTER's reply shape: "current" (every
	// reply carries the topic frame, as vLLM does today; the default) or
	// "legacy" (["", seq, payload], older vLLM). See docs/parity.md.
	ReplayLayout     string
	DataParallelRank int
	// DPSize is SGLang's --dp-size with --enable-dp-attention: that many
	// attention-DP ranks, each with its own radix cache and KV-event PUB on
	// the events port + rank (replay: its port + rank), behind one HTTP
	// server that dispatches round robin, SGLang's default
	// load_balance_method. 0 or 1: one rank. SGLang only.
	DPSize int
	// EventBufferMaxSize bounds the events a TensorRT-LLM engine keeps
	// for POST /kv_cache_events (0: DefaultEventBufferMaxSize).
	EventBufferMaxSize int
	// BytesBlockHashes sends raw digests instead of 64-bit integers, as vLLM
	// does with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
	BytesBlockHashes bool

	Role Role

	// PerfModel picks the timing model: "" or "simple" is the per-request
	// model below (a zero Config is instant), any other name a Profile run
	// by the step loop (docs/enginesim.md, "Timing models").
	PerfModel string
	// Step overrides the profile's step costs; the zero value means the
	// profile's own.
	Step StepPerf
	// MaxNumBatchedTokens is the step's token budget (vLLM's
	// --max-num-batched-tokens); step models only.
	MaxNumBatchedTokens int
	// DisableChunkedPrefill makes a prompt wait until it fits one step's
	// budget whole, as vLLM with --no-enable-chunked-prefill.
	DisableChunkedPrefill bool
	// TimeScale stretches every modelled duration: wall time = model time ×
	// TimeScale. 0 means 1 (real time); reported figures stay model time.
	TimeScale float64

	PrefillUsPerToken float64       // simple model: prefill time per uncached prompt token, µs
	TTFTFloor         time.Duration // simple model: fixed part of every prefill
	DecodeTokensPerS  float64       // simple model: per-sequence decode speed; 0 = instant
	MaxNumSeqs        int           // running sequences; more wait FIFO
	MaxWaiting        int           // waiting queue bound (503 beyond)
	MaxModelLen       int           // prompt + completion tokens
	DefaultMaxTokens  int           // completion length when the request gives none
	MaxRequestBytes   int64         // HTTP body bound

	// DisablePromptTokensDetails drops usage.prompt_tokens_details, as vLLM
	// does unless started with --enable-prompt-tokens-details (enginesim's
	// flag defaults to on, because the benchmarks read cached_tokens).
	DisablePromptTokensDetails bool
	// RuntimeLoRA serves POST /v1/load_lora_adapter and
	// /v1/unload_lora_adapter, as vLLM does with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (lora_runtime.go).
	RuntimeLoRA bool

	// DebugState serves GET /debug/state and POST /debug/match, the
	// engine's true queue and cache for a benchmark oracle; off, they 404.
	DebugState bool

	// APIKeys are vLLM's --api-key values (or VLLM_API_KEY): when any is
	// set, paths under /v1, /v2, /inference and /cohere answer 401 without
	// Authorization: Bearer <one of them>, exactly as vLLM (apikey.go).
	APIKeys []string

	// SSLCertFile and SSLKeyFile are vLLM's --ssl-certfile and
	// --ssl-keyfile (uvicorn's): when both are set the HTTP port speaks
	// https only (TLS 1.2+), as an https-only engine behind a security-2
	// rule does. The ZeroMQ sockets stay plain, as vLLM's.
	SSLCertFile string
	SSLKeyFile  string

	NixlSideChannelPort int           // remote_port in kv_transfer_params
	KVTransferTimeout   time.Duration // prefill role: how long blocks wait for the decoder

	Logger *slog.Logger
}

// engineDefaults fills the fields whose default depends on Engine: the
// hash, the block size, where events go and the replay shape.
func (c Config) engineDefaults() Config {
	if c.Engine == "" {
		c.Engine = EngineVLLM
	}
	hash, block := DefaultHashAlgo, DefaultBlockSize
	switch c.Engine {
	case EngineSGLang:
		hash = DefaultSGLangHashAlgo
		if c.ReplayLayout == "" {
			c.ReplayLayout = "legacy" // SGLang's publisher answers replay with [seq, payload], no topic
		}
	case EngineTRTLLM:
		hash, block = DefaultTRTLLMHashAlgo, DefaultTRTLLMTokensPerBlock
		if c.KVEventsEndpoint == "" {
			c.KVEventsEndpoint = "none" // no ZeroMQ: events are drained over HTTP
		}
		if c.EventBufferMaxSize == 0 {
			c.EventBufferMaxSize = DefaultEventBufferMaxSize
		}
	}
	if c.HashAlgo == "" {
		c.HashAlgo = hash
	}
	if c.BlockSize == 0 {
		c.BlockSize = block
	}
	return c
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	c = c.engineDefaults()
	if c.PerfModel == "" {
		c.PerfModel = PerfModelSimple
	}
	if prof, ok := LookupProfile(c.PerfModel); ok {
		c.PerfModel = prof.Name
		if c.Step == (StepPerf{}) {
			c.Step = prof.Perf
		}
		if c.NumGPUBlocks == 0 {
			c.NumGPUBlocks = prof.NumGPUBlocks
		}
		if c.MaxNumSeqs == 0 {
			c.MaxNumSeqs = prof.MaxNumSeqs
		}
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = DefaultNumGPUBlocks
	}
	if c.CPUReloadUsPerToken == 0 {
		c.CPUReloadUsPerToken = DefaultCPUReloadUsPerToken // a free reload is not a model anyone runs
	}
	if c.KVEventsEndpoint == "" {
		c.KVEventsEndpoint = "tcp://" + net.JoinHostPort(c.Host, strconv.Itoa(DefaultKVEventsPort))
	}
	if c.EventLayout == "" {
		c.EventLayout = DefaultEventLayout
	}
	if c.ReplayBuffer == 0 {
		c.ReplayBuffer = DefaultReplayBufferSteps
	}
	if c.Role == "" {
		c.Role = RoleBoth
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = DefaultMaxWaiting
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = DefaultMaxModelLen
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.NixlSideChannelPort == 0 {
		c.NixlSideChannelPort = DefaultNixlSideChannel
	}
	if c.KVTransferTimeout == 0 {
		c.KVTransferTimeout = DefaultKVTransferTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// DefaultConfig returns a Config with every default filled in, for flag
// defaults and documentation: the default profile's step model, and the
// simple model's constants for --perf-model simple.
func DefaultConfig() Config {
	c := Config{
		Port:                DefaultPort,
		PerfModel:           DefaultPerfModel,
		PrefillUsPerToken:   DefaultPrefillUsPerToken,
		CPUReloadUsPerToken: DefaultCPUReloadUsPerToken,
		TTFTFloor:           DefaultTTFTFloor,
		DecodeTokensPerS:    DefaultDecodeTokensPerS,
	}
	return c.withDefaults()
}

// stepped reports whether the engine runs vLLM's step loop (any profile)
// rather than the simple per-request model.
func (c Config) stepped() bool { return c.PerfModel != PerfModelSimple }

func (c Config) validate() error {
	var errs []error
	if (c.SSLCertFile == "") != (c.SSLKeyFile == "") {
		errs = append(errs, errors.New("ssl-certfile and ssl-keyfile go together: give both for https, or neither"))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range", c.Port))
	}
	if c.BlockSize < 1 || c.BlockSize > 4096 {
		errs = append(errs, fmt.Errorf("block-size %d: want 1..4096", c.BlockSize))
	}
	if c.HashBlockSize < 0 || (c.HashBlockSize > 0 && c.BlockSize%c.HashBlockSize != 0) {
		errs = append(errs, fmt.Errorf("hash-block-size %d: block-size %d must be a multiple of it", c.HashBlockSize, c.BlockSize))
	}
	if c.NumGPUBlocks < 2 || c.NumGPUBlocks > 1<<24 {
		errs = append(errs, fmt.Errorf("num-gpu-blocks %d: want 2..16777216", c.NumGPUBlocks))
	}
	if _, err := parseEventLayout(c.EventLayout); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateOffload())
	errs = append(errs, c.validateEngine())
	switch c.Role {
	case RoleBoth, RolePrefill, RoleDecode:
	default:
		errs = append(errs, fmt.Errorf("role %q: want both, prefill or decode", c.Role))
	}
	if c.PrefillUsPerToken < 0 || c.TTFTFloor < 0 || c.DecodeTokensPerS < 0 {
		errs = append(errs, errors.New("timing flags must not be negative"))
	}
	if err := checkPerfModel(c.PerfModel); err != nil {
		errs = append(errs, err)
	}
	if err := c.Step.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxNumBatchedTokens < 1 || c.MaxNumBatchedTokens > 1<<20 {
		errs = append(errs, fmt.Errorf("max-num-batched-tokens %d: want 1..1048576", c.MaxNumBatchedTokens))
	} else if c.stepped() && c.DisableChunkedPrefill && c.MaxNumBatchedTokens < c.MaxModelLen {
		// vLLM refuses this too: a prompt longer than the budget could never run.
		errs = append(errs, fmt.Errorf("max-num-batched-tokens %d is smaller than max-model-len %d with chunked prefill disabled", c.MaxNumBatchedTokens, c.MaxModelLen))
	}
	if !(c.TimeScale > 0 && c.TimeScale <= 1000) {
		errs = append(errs, fmt.Errorf("time-scale %v: want a number in (0, 1000]", c.TimeScale))
	}
	if c.MaxNumSeqs < 1 || c.MaxWaiting < 1 || c.MaxModelLen < 1 || c.DefaultMaxTokens < 1 || c.ReplayBuffer < 1 {
		errs = append(errs, errors.New("max-num-seqs, max-waiting, max-model-len, default-max-tokens and the replay buffer must be positive"))
	}
	errs = append(errs, c.validateLoRA()...)
	if c.DataParallelRank < 0 {
		errs = append(errs, errors.New("data-parallel-rank must not be negative"))
	}
	if _, err := kvevents.ParseReplayLayout(c.ReplayLayout); err != nil {
		errs = append(errs, fmt.Errorf("replay-layout: %w", err))
	}
	errs = append(errs, c.validateEventEndpoints()...)
	return errors.Join(errs...)
}

// validateLoRA checks --lora-modules: non-empty trimmed names, distinct, none
// the served model's own name.
func (c Config) validateLoRA() []error {
	var errs []error
	seen := map[string]bool{}
	for _, name := range c.LoRAModules {
		switch {
		case name == "" || strings.TrimSpace(name) != name:
			errs = append(errs, fmt.Errorf("lora-modules: adapter name %q must be non-empty without surrounding spaces", name))
		case name == c.Model:
			errs = append(errs, fmt.Errorf("lora-modules: adapter %q has the served model's name", name))
		case seen[name]:
			errs = append(errs, fmt.Errorf("lora-modules: adapter %q is listed twice", name))
		}
		seen[name] = true
	}
	return errs
}

// validateEventEndpoints checks the KV-event PUB and replay endpoints ("none"
// disables either; an empty replay endpoint is derived from the PUB one).
func (c Config) validateEventEndpoints() []error {
	var errs []error
	if c.KVEventsEndpoint != "none" {
		if err := checkTCPEndpoint(c.KVEventsEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("kv-events-endpoint: %w", err))
		}
	}
	if c.ReplayEndpoint != "" && c.ReplayEndpoint != "none" {
		if err := checkTCPEndpoint(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("kv-events-replay-endpoint: %w", err))
		}
	}
	return errs
}

// validateDP checks --dp-size (SGLang attention-DP ranks).
func (c Config) validateDP() error {
	var errs []error
	if c.DPSize < 0 || c.DPSize > 8 {
		errs = append(errs, fmt.Errorf("dp-size %d: want 1..8", c.DPSize))
	}
	if c.DPSize > 1 {
		if c.Engine != EngineSGLang {
			errs = append(errs, errors.New("dp-size: attention-DP ranks behind one server are simulated for --engine sglang only"))
		}
		if c.DataParallelRank != 0 {
			errs = append(errs, errors.New("dp-size: the ranks are 0..dp-size-1; leave data-parallel-rank at 0"))
		}
		if c.KVEventsEndpoint == "none" || strings.HasSuffix(c.KVEventsEndpoint, ":0") {
			errs = append(errs, errors.New("dp-size: rank r publishes on the events port + r, so kv-events-endpoint needs a fixed port"))
		}
		if c.ReplayEndpoint != "" && strings.HasSuffix(c.ReplayEndpoint, ":0") {
			errs = append(errs, errors.New("dp-size: rank r's replay is on the replay port + r, so kv-events-replay-endpoint needs a fixed port"))
		}
	}
	return errors.Join(errs...)
}

// validateEngine checks the fields that must fit --engine.
func (c Config) validateEngine() error {
	if err := c.validateDP(); err != nil {
		return err
	}
	switch c.Engine {
	case EngineVLLM:
		if c.HashAlgo == DefaultSGLangHashAlgo || c.HashAlgo == DefaultTRTLLMHashAlgo {
			return fmt.Errorf("prefix-caching-hash-algo %q is not vLLM's; use --engine sglang or trtllm", c.HashAlgo)
		}
		return nil
	case EngineSGLang:
		return c.validateSGLang()
	case EngineTRTLLM:
		return c.validateTRTLLM()
	}
	return fmt.Errorf("engine %q: want vllm, sglang or trtllm", c.Engine)
}

// validateSGLang checks what SGLang mode cannot have.
func (c Config) validateSGLang() error {
	var errs []error
	if c.HashAlgo != DefaultSGLangHashAlgo {
		errs = append(errs, fmt.Errorf("engine sglang hashes pages with %s, not %q", DefaultSGLangHashAlgo, c.HashAlgo))
	}
	if c.EventLayout != "map" && c.EventLayout != "array" {
		errs = append(errs, fmt.Errorf("engine sglang: event-layout %q: want map (tagged maps) or array (legacy tagged arrays)", c.EventLayout))
	}
	if c.HashBlockSize != 0 && c.HashBlockSize != c.BlockSize {
		errs = append(errs, errors.New("engine sglang hashes whole pages: hash-block-size must be 0 or equal to block-size (the page size)"))
	}
	if c.BytesBlockHashes {
		errs = append(errs, errors.New("engine sglang publishes int64 hashes only (no raw digests)"))
	}
	if c.Role != RoleBoth {
		errs = append(errs, errors.New("engine sglang: P/D roles simulate vLLM's NixlConnector only; use role both"))
	}
	return errors.Join(errs...)
}

// validateTRTLLM checks what TensorRT-LLM mode cannot have.
func (c Config) validateTRTLLM() error {
	var errs []error
	if c.HashAlgo != DefaultTRTLLMHashAlgo {
		errs = append(errs, fmt.Errorf("engine trtllm keys blocks with %s (v1_block_key), not %q", DefaultTRTLLMHashAlgo, c.HashAlgo))
	}
	if c.KVEventsEndpoint != "none" {
		errs = append(errs, errors.New("engine trtllm publishes no ZeroMQ events (POST /kv_cache_events drains them); leave kv-events-endpoint unset"))
	}
	if c.HashBlockSize != 0 && c.HashBlockSize != c.BlockSize {
		errs = append(errs, errors.New("engine trtllm: hash-block-size must be 0 or equal to block-size (tokens_per_block)"))
	}
	if c.Role != RoleBoth || c.BytesBlockHashes {
		errs = append(errs, errors.New("engine trtllm: P/D roles and raw-digest hashes are not simulated"))
	}
	for _, m := range c.LoRAModules {
		if _, ok := c.LoRATaskIDs[m]; !ok {
			errs = append(errs, fmt.Errorf("engine trtllm: lora module %q has no lora_task_id (--lora-task-ids %s=N)", m, m))
		}
	}
	if c.EventBufferMaxSize < 1 || c.EventBufferMaxSize > 1<<20 {
		errs = append(errs, fmt.Errorf("event-buffer-max-size %d: want 1..1048576", c.EventBufferMaxSize))
	}
	return errors.Join(errs...)
}

// offsetEndpoint returns tcp endpoint ep with its port + n, as SGLang's
// publisher offsets its endpoints by the attention-DP rank.
func offsetEndpoint(ep string, n int) (string, error) {
	u, err := url.Parse(ep)
	if err != nil {
		return "", fmt.Errorf("%q: %w", ep, err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil || p+n > 65535 {
		return "", fmt.Errorf("%q: no port to offset by %d", ep, n)
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(p+n)), nil
}

// checkTCPEndpoint accepts tcp://host:port (vLLM's "*" host means all
// interfaces).
func checkTCPEndpoint(ep string) error {
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "tcp" || u.Host == "" {
		return fmt.Errorf("%q: want tcp://HOST:PORT", ep)
	}
	if _, err := strconv.ParseUint(u.Port(), 10, 16); err != nil {
		return fmt.Errorf("%q: bad port", ep)
	}
	return nil
}

// listenEndpoint turns vLLM's "tcp://*:5557" into something zmq4 can bind.
func listenEndpoint(ep string) string {
	return strings.Replace(ep, "tcp://*:", "tcp://0.0.0.0:", 1)
}

// replayEndpointFor derives the default replay endpoint: the PUB endpoint's
// host with its port + 1000 (kvgate's default replay port).
func replayEndpointFor(pub string, pubPort int) string {
	u, err := url.Parse(pub)
	if err != nil {
		return "none"
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(pubPort+DefaultReplayPortOffset))
}

// WithSpeed returns c on a GPU speed times as fast as its profile's (or the
// simple model's constants): every step cost, or prefill and decode time,
// divided by speed. It lets one fleet mix engines of different throughput.
// A speed that is not positive makes the config invalid.
func (c Config) WithSpeed(speed float64) Config {
	if !(speed > 0) {
		c.Step = StepPerf{StepFloorS: math.NaN()}
		c.PrefillUsPerToken = -1
		return c
	}
	if prof, ok := LookupProfile(c.PerfModel); ok && c.Step == (StepPerf{}) {
		c.Step = prof.Perf
	}
	c.Step.StepFloorS /= speed
	c.Step.PrefillSPerToken /= speed
	c.Step.DecodeSPerSeq /= speed
	c.Step.AttnSPerContextToken /= speed
	c.PrefillUsPerToken /= speed
	c.TTFTFloor = time.Duration(float64(c.TTFTFloor) / speed)
	c.DecodeTokensPerS *= speed
	return c
}
