// Command enginesim is a vLLM stand-in for machines without a GPU: an
// OpenAI-compatible server with vLLM's prefix cache, block hashes, ZeroMQ KV
// events, P/D roles and metrics, and a timing model in which cached tokens
// shorten time to first token. All logic lives in internal/enginesim; this file
// only maps flags and the environment onto enginesim.Config.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/enginesim"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(2)
	}
}

// applyEnv reads the environment variables vLLM reads: PYTHONHASHSEED and
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES.
func applyEnv(cfg *enginesim.Config) error {
	if v, ok := os.LookupEnv("PYTHONHASHSEED"); ok {
		cfg.PythonHashSeed, cfg.HashSeedSet = v, true
	}
	// vLLM: --api-key takes precedence over VLLM_API_KEY.
	if v := os.Getenv("VLLM_API_KEY"); v != "" && len(cfg.APIKeys) == 0 {
		cfg.APIKeys = []string{v}
	}
	if v, ok := os.LookupEnv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=%q: want 0 or 1", v)
		}
		cfg.BytesBlockHashes = n == 0
	}
	return nil
}

// loadTokenizer loads --tokenizer into cfg; without one it warns (cfg.Logger
// must be set) and the engine falls back to its byte-level tokenizer.
func loadTokenizer(cfg *enginesim.Config, path string) error {
	if path == "" {
		cfg.Logger.Warn("no --tokenizer: text prompts use a byte-level tokenizer that matches no real model; token-id prompts are exact")
		return nil
	}
	tok, err := enginesim.LoadTokenizer(path)
	if err != nil {
		return fmt.Errorf("--tokenizer: %w", err)
	}
	cfg.Tokenizer = tok
	return nil
}

// checkReplicaFlags checks --replicas and that the per-replica lists, when
// given, have one value per replica.
func checkReplicaFlags(replicas int, blocks []int, speed []float64) error {
	if replicas < 1 || replicas > 64 {
		return errors.New("--replicas must be 1..64")
	}
	if len(blocks) > 0 && len(blocks) != replicas {
		return fmt.Errorf("--replica-num-gpu-blocks has %d values for %d replicas", len(blocks), replicas)
	}
	if len(speed) > 0 && len(speed) != replicas {
		return fmt.Errorf("--replica-gpu-speed has %d values for %d replicas", len(speed), replicas)
	}
	return nil
}

// waitAndClose blocks until SIGINT, SIGTERM or the end of ctx, then closes
// every engine.
func waitAndClose(ctx context.Context, log *slog.Logger, engines []*enginesim.Engine) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case got := <-sig:
		log.Info("shutting down", "signal", got.String())
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	}
	for _, e := range engines {
		if err := e.Close(); err != nil {
			log.Warn("close", "id", e.ID(), "err", err)
		}
	}
	log.Info("stopped")
}

func newCommand() *cobra.Command {
	def := enginesim.DefaultConfig()
	cfg := enginesim.Config{}
	var (
		tokenizerPath string
		role          string
		logLevel      string
		replicas      int
		step          enginesim.StepPerf
		stepFloor     time.Duration
		promptDetails bool
		chunked       bool
		replicaBlocks []int
		replicaSpeed  []float64
		loraTaskIDs   map[string]int64
	)
	cmd := &cobra.Command{
		Use:   "enginesim",
		Short: "A vLLM-compatible engine simulator (no GPU) for kvgate's demo, tests and benchmarks",
		Long: `enginesim serves vLLM's OpenAI API with a simulated GPU prefix cache. It is exact
where a KV-cache-aware router looks: block hashes (PYTHONHASHSEED, --block-size,
--prefix-caching-hash-algo), ZeroMQ KV events byte for byte (vLLM's msgpack
layout, sequence numbers, replay socket), usage.prompt_tokens_details.cached_tokens,
vLLM's metric families, and NixlConnector's P/D kv_transfer_params.

Output text is synthetic (deterministic words from the vocabulary). Timing:
--perf-model names a model/GPU profile (default ` + enginesim.DefaultPerfModel + `) run by vLLM V1's step
loop: each step decodes one token of every running request and fills the rest
of --max-num-batched-tokens with prefill chunks; waiting requests are admitted
FIFO while --max-num-seqs and free KV blocks allow; prefix-cache hits skip their
tokens; when blocks run out the newest request is preempted and recomputed.
A step takes
  --step-floor + --step-prefill-us-per-token × prefill tokens
  + --step-decode-us-per-seq × decoding sequences
  + --step-attn-ns-per-kv-token × KV tokens the batch attends to
(the profile's constants unless a flag overrides them). --perf-model simple is
the older per-request model:
  TTFT = queueing + --ttft-floor + --prefill-us-per-token × uncached prompt tokens
  inter-token time = 1 / --decode-tokens-per-s
Profiles: ` + profileList() + `

Environment: VLLM_API_KEY (--api-key when the flag is not given), PYTHONHASHSEED
(the NONE_HASH seed, exactly as vLLM reads it; unset
means "vllm-none-hash" for sha256*, a random seed for xxhash*) and
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1: 64-bit integer hashes in events;
0: raw digest bytes, as vLLM).

--engine sglang speaks SGLang instead where a router looks: page hashes
(sha256_sglang, --block-size is --page-size), its KV-event payloads
(--event-layout map: tagged maps; array: legacy tagged arrays with medium),
attn_dp_rank (--data-parallel-rank), the legacy replay shape, and
GET /get_server_info with page_size.

Endpoints: POST /v1/completions, POST /v1/chat/completions, POST /v1/responses
(OpenAI Responses API), POST /v1/messages (Anthropic Messages API), GET /v1/models,
GET /health, POST /tokenize, POST /reset_prefix_cache, GET /metrics, GET /version,
and with --debug-state GET /debug/state and POST /debug/match (a benchmark
oracle's view of the true queue and cache), with --allow-runtime-lora-updating
POST /v1/load_lora_adapter and /v1/unload_lora_adapter (listed on /v1/models
with their parent, as vLLM does). Every response carries x-engine-id;
responses also carry the model's own figures in x-enginesim-ttft-us,
x-enginesim-queue-us and x-enginesim-cached-tokens (trailers on a stream, whose
head is sent when the request is queued, before the first token, as vLLM does).

Example (three engines on separate loopback addresses, same ports):
  for i in 11 12 13; do
    PYTHONHASHSEED=0 enginesim --host 127.0.0.$i --port 8000 \
      --tokenizer /path/to/qwen3 --prefix-caching-hash-algo sha256_cbor &
  done`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Role = enginesim.Role(role)
			engineFlagDefaults(cmd, &cfg)
			for name, id := range loraTaskIDs {
				if id < 0 {
					return fmt.Errorf("--lora-task-ids %s=%d: a task id is not negative", name, id)
				}
				if cfg.LoRATaskIDs == nil {
					cfg.LoRATaskIDs = map[string]uint64{}
				}
				cfg.LoRATaskIDs[name] = uint64(id)
			}
			if err := checkExplicitZeros(cmd, cfg); err != nil {
				return err
			}
			if err := applyPerfFlags(cmd, &cfg, step, stepFloor); err != nil {
				return err
			}
			cfg.DisablePromptTokensDetails = !promptDetails
			cfg.DisableChunkedPrefill = !chunked
			for i, m := range cfg.LoRAModules {
				// vLLM spells an adapter name=path; only the name matters here.
				cfg.LoRAModules[i], _, _ = strings.Cut(strings.TrimSpace(m), "=")
			}
			if err := applyEnv(&cfg); err != nil {
				return err
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if err := loadTokenizer(&cfg, tokenizerPath); err != nil {
				return err
			}
			if err := checkReplicaFlags(replicas, replicaBlocks, replicaSpeed); err != nil {
				return err
			}
			engines, err := startReplicas(cfg, replicas, cmd.Flags().Changed("kv-events-endpoint"), replicaBlocks, replicaSpeed)
			if err != nil {
				return err
			}
			waitAndClose(cmd.Context(), cfg.Logger, engines)
			return nil
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&cfg.Engine, "engine", enginesim.EngineVLLM, "engine to simulate: vllm; sglang (sha256_sglang page hashes, SGLang's KV-event payloads, legacy replay, /get_server_info; --block-size is the page size); trtllm (v1 block keys over all but the last token, no ZeroMQ: POST /kv_cache_events drain, /server_info; --block-size is tokens_per_block, default 32)")
	f.StringToInt64Var(&loraTaskIDs, "lora-task-ids", nil, "--engine trtllm: each LoRA module's lora_task_id, name=N[,name=N] (TensorRT-LLM keys LoRA blocks by task id)")
	f.IntVar(&cfg.EventBufferMaxSize, "event-buffer-max-size", 0, "--engine trtllm: events kept for POST /kv_cache_events, oldest dropped beyond (KvCacheConfig.event_buffer_max_size; default 10000)")
	f.StringVar(&cfg.Host, "host", def.Host, "address to listen on (HTTP, and the default KV-event endpoints)")
	f.IntVar(&cfg.Port, "port", def.Port, "HTTP port")
	f.StringVar(&cfg.ID, "id", "", `engine id for the x-engine-id header (default "<host>:<port>")`)
	f.StringVar(&cfg.Model, "model", def.Model, "served model name")
	f.BoolVar(&cfg.RuntimeLoRA, "allow-runtime-lora-updating", false, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
	f.StringArrayVar(&cfg.APIKeys, "api-key", nil, "vLLM's --api-key: paths under /v1, /v2, /inference and /cohere answer 401 without Authorization: Bearer KEY; /health and /metrics stay open (repeat the flag for several keys; default $VLLM_API_KEY)")
	f.StringVar(&cfg.SSLCertFile, "ssl-certfile", "", "vLLM's --ssl-certfile: the HTTP port speaks https only with this certificate (PEM, leaf first; needs --ssl-keyfile)")
	f.StringVar(&cfg.SSLKeyFile, "ssl-keyfile", "", "vLLM's --ssl-keyfile: the private key of --ssl-certfile (PEM)")
	f.StringSliceVar(&cfg.LoRAModules, "lora-modules", nil, "LoRA adapter names served on the model, name[,name] (vLLM's name=path is accepted; the path is ignored): requests naming one hash with its lora_name")
	f.StringVar(&tokenizerPath, "tokenizer", "", "tokenizer.json, or a directory with tokenizer.json and tokenizer_config.json (chat template)")
	f.IntVar(&cfg.BlockSize, "block-size", def.BlockSize, "KV block size in tokens")
	f.IntVar(&cfg.HashBlockSize, "hash-block-size", 0, "hash block size when --block-size is a multiple of it (hybrid models, prefix_match_unit): events carry every k-th hash of the finer chain (0 = --block-size)")
	f.StringVar(&cfg.HashAlgo, "prefix-caching-hash-algo", def.HashAlgo, "block hash: sha256_cbor, xxhash_cbor, sha256 (pickle) or xxhash (pickle)")
	f.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks", 0, "KV cache capacity in blocks, block 0 reserved as in vLLM (default: the profile's, 8192 with simple)")
	f.IntVar(&cfg.NumCPUBlocks, "num-cpu-blocks", 0, "CPU offload tier in blocks, as vLLM's OffloadingConnector num_cpu_blocks: full blocks are also stored in CPU memory and reload from it (0 = off; vLLM engine only)")
	f.Float64Var(&cfg.CPUReloadUsPerToken, "cpu-reload-us-per-token", def.CPUReloadUsPerToken, "cost of reloading one token's KV from the CPU tier, microseconds (any timing model)")
	f.StringVar(&cfg.KVEventsEndpoint, "kv-events-endpoint", "", `ZMQ PUB endpoint to bind (default "tcp://<host>:5557"; "none" disables events)`)
	f.StringVar(&cfg.ReplayEndpoint, "kv-events-replay-endpoint", "", `ZMQ ROUTER for replay (default: PUB port + 1000 on the PUB host; "none" disables)`)
	f.StringVar(&cfg.EventLayout, "event-layout", def.EventLayout, "KV-event payload layout: map (vLLM >= 0.26) or array (the last array layout, before 0.26)")
	f.StringVar(&cfg.EventTopic, "kv-events-topic", "", `ZMQ topic frame (vLLM's default is "")`)
	f.StringVar(&cfg.ReplayLayout, "replay-layout", "current", `replay reply shape: current (["", topic, seq, payload], vLLM today) or legacy (["", seq, payload])`)
	f.IntVar(&cfg.ReplayBuffer, "kv-events-buffer-steps", def.ReplayBuffer, "batches kept for replay (vLLM buffer_steps)")
	f.IntVar(&cfg.DataParallelRank, "data-parallel-rank", 0, "data_parallel_rank in event batches and the engine metric label")
	f.IntVar(&cfg.DPSize, "dp-size", 0, "--engine sglang: attention-DP ranks (SGLang's --dp-size with --enable-dp-attention), each with its own cache and PUB on the events port + rank, requests round robin (0 or 1: one rank)")
	f.StringVar(&role, "role", string(def.Role), "P/D role: both, prefill or decode (NixlConnector protocol)")
	f.StringVar(&cfg.PerfModel, "perf-model", def.PerfModel, "timing model: "+strings.Join(enginesim.PerfModelNames(), ", ")+" (simple: the per-request model of the three flags below)")
	f.DurationVar(&stepFloor, "step-floor", 0, "step models: fixed cost of every engine step (default: the profile's)")
	f.Float64Var(&step.PrefillSPerToken, "step-prefill-us-per-token", 0, "step models: cost of each prefill token in a step, microseconds (default: the profile's)")
	f.Float64Var(&step.DecodeSPerSeq, "step-decode-us-per-seq", 0, "step models: cost of each decoding sequence in a step, microseconds (default: the profile's)")
	f.Float64Var(&step.AttnSPerContextToken, "step-attn-ns-per-kv-token", 0, "step models: cost of each KV token the step's sequences attend to, nanoseconds (default: the profile's)")
	f.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", def.MaxNumBatchedTokens, "step models: tokens scheduled per step (vLLM's default on an 80 GB GPU)")
	f.BoolVar(&chunked, "enable-chunked-prefill", true, "step models: split prompts longer than the step budget across steps, as vLLM V1 does")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "wall time per model second (0.1 runs 10x faster); reported figures stay model time")
	f.Float64Var(&cfg.PrefillUsPerToken, "prefill-us-per-token", def.PrefillUsPerToken, "simple model: prefill time per uncached prompt token, microseconds")
	f.DurationVar(&cfg.TTFTFloor, "ttft-floor", def.TTFTFloor, "simple model: fixed part of every prefill (scheduling, launch)")
	f.Float64Var(&cfg.DecodeTokensPerS, "decode-tokens-per-s", def.DecodeTokensPerS, "simple model: decode speed of one sequence, tokens/s (0 = instant)")
	f.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", 0, "running sequences; more wait in a FIFO queue (default: the profile's, 64 with simple)")
	f.BoolVar(&promptDetails, "enable-prompt-tokens-details", true, "report usage.prompt_tokens_details.cached_tokens (vLLM's flag; on here because the benchmarks read it)")
	f.BoolVar(&cfg.DebugState, "debug-state", false, "serve GET /debug/state and POST /debug/match (true queue and cache, for a benchmark oracle)")
	f.IntVar(&cfg.MaxWaiting, "max-waiting", def.MaxWaiting, "waiting-queue bound; beyond it requests get 503")
	f.IntVar(&cfg.MaxModelLen, "max-model-len", def.MaxModelLen, "prompt + completion tokens per request")
	f.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", def.DefaultMaxTokens, "completion length when a request sets no max_tokens")
	f.Int64Var(&cfg.MaxRequestBytes, "max-request-bytes", def.MaxRequestBytes, "request body bound")
	f.IntVar(&cfg.NixlSideChannelPort, "nixl-side-channel-port", def.NixlSideChannelPort, "remote_port a prefill engine reports (VLLM_NIXL_SIDE_CHANNEL_PORT)")
	f.DurationVar(&cfg.KVTransferTimeout, "kv-transfer-timeout", def.KVTransferTimeout, "prefill role: how long handed-off blocks stay pinned if no decoder reads them (VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	f.IntVar(&replicas, "replicas", 1, "start this many engines on consecutive addresses from --host (127.0.0.11, .12, …), same ports")
	f.IntSliceVar(&replicaBlocks, "replica-num-gpu-blocks", nil, "with --replicas: each engine's --num-gpu-blocks, one value per replica (a heterogeneous fleet)")
	f.Float64SliceVar(&replicaSpeed, "replica-gpu-speed", nil, "with --replicas: each engine's speed relative to its profile (2 = every step cost halved), one value per replica")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// checkExplicitZeros rejects a zero given on the command line for a flag
// whose zero means "the default" inside Config, so it is never taken silently.
func checkExplicitZeros(cmd *cobra.Command, cfg enginesim.Config) error {
	for _, f := range []struct {
		name string
		bad  bool
	}{
		{"num-gpu-blocks", cfg.NumGPUBlocks < 2},
		{"max-num-seqs", cfg.MaxNumSeqs < 1},
		{"max-num-batched-tokens", cfg.MaxNumBatchedTokens < 1},
		{"time-scale", !(cfg.TimeScale > 0)},
	} {
		if f.bad && cmd.Flags().Changed(f.name) {
			v := cmd.Flags().Lookup(f.name).Value.String()
			return fmt.Errorf("--%s %s: must be positive (num-gpu-blocks at least 2)", f.name, v)
		}
	}
	return nil
}

// applyPerfFlags resolves --perf-model and overrides the profile's step
// costs with the --step-* flags given (in seconds inside Config).
func applyPerfFlags(cmd *cobra.Command, cfg *enginesim.Config, step enginesim.StepPerf, floor time.Duration) error {
	changed := cmd.Flags().Changed
	prof, ok := enginesim.LookupProfile(cfg.PerfModel)
	if !ok {
		for _, name := range []string{"step-floor", "step-prefill-us-per-token", "step-decode-us-per-seq", "step-attn-ns-per-kv-token"} {
			if changed(name) {
				return fmt.Errorf("--%s needs a --perf-model profile, not %q", name, cfg.PerfModel)
			}
		}
		return nil
	}
	cfg.Step = prof.Perf
	if changed("step-floor") {
		cfg.Step.StepFloorS = floor.Seconds()
	}
	if changed("step-prefill-us-per-token") {
		cfg.Step.PrefillSPerToken = step.PrefillSPerToken * 1e-6
	}
	if changed("step-decode-us-per-seq") {
		cfg.Step.DecodeSPerSeq = step.DecodeSPerSeq * 1e-6
	}
	if changed("step-attn-ns-per-kv-token") {
		cfg.Step.AttnSPerContextToken = step.AttnSPerContextToken * 1e-9
	}
	return nil
}

func profileList() string {
	var parts []string
	for _, p := range enginesim.Profiles() {
		parts = append(parts, p.Name+" ("+p.Description+")")
	}
	return strings.Join(parts, "; ")
}

// startReplicas starts n engines on consecutive IPv4 addresses from
// cfg.Host, all with the same ports, as separate hosts would run them;
// blocks and speed, when given, differ per engine.
func startReplicas(cfg enginesim.Config, n int, explicitEvents bool, blocks []int, speed []float64) ([]*enginesim.Engine, error) {
	if n == 1 {
		if len(blocks) == 1 {
			cfg.NumGPUBlocks = blocks[0]
		}
		if len(speed) == 1 {
			cfg = cfg.WithSpeed(speed[0])
		}
		e, err := enginesim.New(cfg)
		if err != nil {
			return nil, err
		}
		return []*enginesim.Engine{e}, nil
	}
	addr, err := netip.ParseAddr(cfg.Host)
	if err != nil || !addr.Is4() {
		return nil, fmt.Errorf("--replicas needs an IPv4 --host, got %q", cfg.Host)
	}
	if explicitEvents {
		return nil, errors.New("--replicas derives each engine's KV-event endpoints from its address; do not set --kv-events-endpoint")
	}
	var engines []*enginesim.Engine
	for i := range n {
		c := cfg
		c.Host = addr.String()
		if len(blocks) > 0 {
			c.NumGPUBlocks = blocks[i]
		}
		if len(speed) > 0 {
			c = c.WithSpeed(speed[i])
		}
		if cfg.ID != "" {
			c.ID = cfg.ID + "-" + strconv.Itoa(i)
		}
		e, err := enginesim.New(c)
		if err != nil {
			for _, started := range engines {
				started.Close()
			}
			return nil, err
		}
		engines = append(engines, e)
		addr = addr.Next()
	}
	return engines, nil
}

// engineFlagDefaults gives --engine sglang|trtllm their engine's defaults
// for the flags whose defaults are vLLM's, unless the flag was given.
func engineFlagDefaults(cmd *cobra.Command, cfg *enginesim.Config) {
	changed := cmd.Flags().Changed
	switch cfg.Engine {
	case enginesim.EngineSGLang:
		if !changed("prefix-caching-hash-algo") {
			cfg.HashAlgo = enginesim.DefaultSGLangHashAlgo
		}
		if !changed("replay-layout") {
			cfg.ReplayLayout = "legacy"
		}
	case enginesim.EngineTRTLLM:
		if !changed("prefix-caching-hash-algo") {
			cfg.HashAlgo = enginesim.DefaultTRTLLMHashAlgo
		}
		if !changed("block-size") {
			cfg.BlockSize = enginesim.DefaultTRTLLMTokensPerBlock
		}
	}
}
