// Command kvgate is the KV-cache-aware gateway daemon. It only parses flags
// and the environment; pkg/gateway does the work.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/demo"
	"github.com/kvgate/kvgate/pkg/aictrl"
	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/splice"
	"github.com/kvgate/kvgate/pkg/state"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// version is set with -ldflags "-X main.version=…".
var version = "dev"

const envHelp = `Environment (parsed once at start; a bad value is a start-up error naming the variable):
  LLB_KV_NONE_HASH_SEED        NONE_HASH seed; must equal vLLM's PYTHONHASHSEED (unset = unset)
  LLB_KV_HASH_DEBUG=1          log every computed block hash (parity forensics)
  LLB_KV_MIN_MATCH_TOKENS      shallow guard in tokens, 0-4096, 0 disables (16)
  LLB_KV_LOADGUARD             mode 1: skip tier 1.5 when the prefill load spread is too wide (off)
  LLB_PD_SESSION_HASH          mode 1: route unpinned conversations by a bounded-load hash of their key, alike on every replica (off)
  LLB_KV_REPLAY_PORT_OFFSET    KV replay port = PUB port + offset, 0 disables (1000)
  LLB_KV_MAX_PROMPT_TOKENS     longer prompts are not KV-routed (reason tokenize), 1-16777216 (262144)
  LLB_KV_MAX_FRAME_BYTES       largest ZMTP frame/message from a KV peer, 4096-1073741824 (67108864)
  LLB_KV_MODEL_DISCOVERY_SEC   re-read each KV endpoint's /v1/models every N s, 0-3600, 0 = off (30)
  LLB_KV_AUDIT_SAMPLE          1 in N streams the sockmap would splice is read for the usage audit, 0 = none (64)
  LOXILB_KV_TRTLLM_POLL_MIN_MS TensorRT-LLM drain poll interval while events flow, 1-10000 ms (5)
  LOXILB_KV_TRTLLM_POLL_MAX_MS TensorRT-LLM drain poll interval while idle, 1-10000 ms (20)
  LOXILB_KV_LB_MODE            off|hard|soft|adaptive|adaptive-soft|cost load blend (hard)
  LOXILB_KV_UNIFIED_MODE       legacy switch, read only when LOXILB_KV_LB_MODE is unset
  LOXILB_KV_MEAN_LOAD_FACTOR   CHWBL cap factor (1+eps)*100, 100-1000 (175)
  LOXILB_KV_LOAD_PENALTY       soft-mode lambda, 1-100000 (32)
  LOXILB_KV_SPILL_RELIEF       auto|on|off (auto: on for mode 3, off for mode 1)
  LOXILB_KV_COLDSTART_SEED_N   every Nth hit seeds a cold endpoint, 0 disables (16)
  LOXILB_KV_COLDSTART_MIN_BLOCKS  fewer blocks than this is cold (16)
  LOXILB_KV_PROVISIONAL_WEIGHT credit of a routed, not yet reported block, percent 0-100, 0 off (90)
  LOXILB_KV_COST_WORK_WEIGHT   cost mode: percent of a request's uncached prefill charged as fleet work, 0-1000 (300)
  LOXILB_KV_CAP_FULL_GAIN      overlap gain (percent of the prompt) that earns the full cap; less, a tighter cap; 0 off (0)
  LOXILB_KV_PROVISIONAL_TTL_MS how long a predicted block waits for its BlockStored, 100-600000 ms (10000)
  LOXILB_KV_MAX_BLOCKS         per-endpoint inventory cap, 1000-100000000 (1000000)
  LOXILB_KV_ZERO_HIT_N         zero-hit watchdog threshold (50)
  LOXILB_KV_SCORE              leading|overlap block scoring (leading)
  LLB_PD_PREFILL_TIMEOUT_SEC   P/D prefill leg and decode first-byte bound (30)
  LLB_PD_DECODE_SILENCE_SEC    P/D decode stream silence bound (120)
  LLB_PD_MAX_INFLIGHT_PER_EP   per-prefill-endpoint in-flight cap, 0 = off
  LLB_PD_QUEUE_DEPTH_PER_EP    parked FIFO per endpoint instead of 429, 0 = off
  LLB_PD_MAX_PARK_SEC          park bound (0 = the prefill timeout)
  LLB_PD_MAX_TOTAL_INFLIGHT    process-wide in-flight cap, 0 = off
  LLB_PD_ORIGIN_ERR_THRESHOLD  consecutive prefill 5xx that open the breaker (3)
  LLB_PD_DECODE_ONLY_FALLBACK  send to decode when every prefill fails (1)
  LOXILB_AI_CTRL_ADDR          experimental AI controller host:port to watch; unset = off (docs/controller.md)`

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate:", err)
		os.Exit(1)
	}
}

type daemonFlags struct {
	api            string
	tokenizerDir   string
	stateDir       string
	datapath       string
	bpfPinDir      string
	shutdownGrace  time.Duration
	decisionHeader bool
	accessLog      string
	logLevel       string
	vipDev         string
	vipGARP        bool
	apiTLSCert     string
	apiTLSKey      string
	apiClientCA    string
	apiTokenFile   string
	apiInsecure    bool
	metricsAddr    string
	endpointCIDRs  string
	rulesFile      string
	rulesFileEvery time.Duration
	// backendTokenDir confines rules' backendTokenFile (backendtoken.go).
	backendTokenDir string
	dataTLS         dataTLSFlags
}

func newRoot() *cobra.Command {
	var f daemonFlags
	root := &cobra.Command{
		Use:   "kvgate",
		Short: "kvgate: KV-cache-aware gateway for vLLM fleets",
		Long: `kvgate routes each OpenAI-compatible request to the vLLM worker that already holds the
most KV blocks of its prompt. It mirrors every worker's block-hash inventory from its
ZeroMQ KV-event stream, recomputes vLLM's block hashes for each prompt and picks the
endpoint through the guard ladder blended with a capacity-weighted bounded-load cap.

Without a subcommand kvgate runs the daemon: the management API on --api (LoxiLB's
/netlox/v1 REST paths; rules persist in --state-dir) and one HTTP/1.1 proxy listener
per load-balancer rule on its externalIP:port. SIGTERM or SIGINT stops accepting, lets
in-flight streams finish within --shutdown-grace, cuts what is left, then exits;
the process exits at most 5 s after the grace whatever is still running (a second
signal exits at once).

Tokenizers are staged at <tokenizer-dir>/<model slug>/tokenizer.json, where the slug
is the client's model string with "/" replaced by "__" (Qwen/Qwen3-0.6B ->
Qwen__Qwen3-0.6B). No network fetch happens.

` + envHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          func(cmd *cobra.Command, _ []string) error { return runDaemon(cmd.Context(), f) },
	}
	fl := root.Flags()
	fl.StringVar(&f.api, "api", api.DefaultAddr, "management API listen address; beyond loopback it needs --api-tls-cert, --api-tls-key and --api-token-file (or --api-insecure)")
	fl.StringVar(&f.apiTLSCert, "api-tls-cert", "", "serve the management API over TLS 1.2+ with this certificate (PEM; reloads when the file changes)")
	fl.StringVar(&f.apiTLSKey, "api-tls-key", "", "the --api-tls-cert key (PEM; mode 0600 or 0400, owned by kvgate's user or root)")
	fl.StringVar(&f.apiClientCA, "api-client-ca", "", "require API clients to present a certificate signed by this CA (mTLS; reloads)")
	fl.StringVar(&f.apiTokenFile, "api-token-file", "", "require Authorization: Bearer tokens from this file: '<name> <admin|read> <token>' per line; mode 0600 or 0400 (reloads)")
	fl.BoolVar(&f.apiInsecure, "api-insecure", false, "allow a management API beyond loopback without TLS and tokens (logged, and kvgate_api_insecure 1)")
	fl.StringVar(&f.endpointCIDRs, "endpoint-cidrs", "", "only allow rule endpoints in these comma-separated CIDRs (their KV-event and replay ports too); default: any address")
	fl.StringVar(&f.backendTokenDir, "backend-token-dir", defaultBackendTokenDir, "the only directory a rule's backendTokenFile may be in (the engines' keys; kvgate reads them as its own user); / allows any path")
	addDataTLSFlags(fl, &f.dataTLS)
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "also serve /metrics, unauthenticated and nothing else, on this address (off by default)")
	fl.StringVar(&f.tokenizerDir, "tokenizer-dir", tokenizer.DefaultDir, "tokenizer staging directory (<dir>/<model slug>/tokenizer.json)")
	fl.StringVar(&f.rulesFile, "rules-file", "", "reconcile rules with this YAML or JSON file (a ConfigMap every replica mounts) at start and whenever it changes; endpoints carry fixed ep_idx, and REST changes to its rules answer 409 (docs/replicas.md)")
	fl.DurationVar(&f.rulesFileEvery, "rules-file-interval", 2*time.Second, "how often --rules-file is checked for changes (100ms-5m)")
	fl.StringVar(&f.stateDir, "state-dir", state.DefaultDir, "directory where rules persist across restarts")
	fl.StringVar(&f.datapath, "datapath", "auto", "response body path: auto|sockmap|userspace (sockmap: eBPF splice, needs root/CAP_BPF; auto picks what the benchmark favours for token streams, see docs/body-leg.md)")
	fl.StringVar(&f.bpfPinDir, "bpf-pin-dir", splice.DefaultPinDir, "where the sockmap path pins its maps and programs (one subdirectory per instance, derived from --api)")
	fl.DurationVar(&f.shutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight streams may finish after SIGTERM; then they are cut and kvgate exits (hard bound: grace + 5s)")
	fl.BoolVar(&f.decisionHeader, "decision-header", false, "add x-kvgate-decision: tier=…; ep=…; score=…; reason=… to proxied responses")
	fl.StringVar(&f.accessLog, "access-log", "", "one JSON line per request to FILE ('-' or the bare flag: stdout)")
	fl.Lookup("access-log").NoOptDefVal = "-"
	fl.StringVar(&f.logLevel, "log-level", "info", "debug|info|warn|error")
	fl.StringVar(&f.vipDev, "vip-dev", "", "add each rule's VIP to this device (/32 or /128) while the rule exists, and remove the ones kvgate added at exit (off by default; see docs/vip.md)")
	fl.BoolVar(&f.vipGARP, "vip-garp", false, "with --vip-dev, announce each VIP added: gratuitous ARP (IPv4), unsolicited neighbour advertisement (IPv6); for VIPs one host owns at a time, not for ECMP replicas")

	root.AddCommand(newDemo(), &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "kvgate %s (%s)\n", version, revision())
		},
	})
	return root
}

func newDemo() *cobra.Command {
	var opts demo.Options
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "run simulated vLLM engines in-process and compare kvgate with round-robin",
		Long: `demo starts simulated vLLM engines on 127.0.0.11… and 127.0.0.21… (no root, no network),
a kvgate rule with KV-aware routing (kvExactMode 3) and a plain round-robin rule, runs the
same bounded shared-prefix workload (RAG preambles, few-shot headers, multi-turn chats,
a hot system prompt) through each, and prints requests, tier-1.5 hits, hit ratio,
cached-token ratio and TTFT p50/p90 side by side. It uses the Qwen3 tokenizer committed
in the repository (pkg/tokenizer/testdata/qwen3, found from the working directory).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if verbose {
				opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return demo.Run(ctx, cmd.OutOrStdout(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.TokenizerDir, "tokenizer-dir", "", "directory holding the Qwen3 tokenizer.json and tokenizer_config.json (default: found in the repository)")
	cmd.Flags().IntVar(&opts.Engines, "engines", 4, "simulated engines per side")
	cmd.Flags().IntVar(&opts.Concurrency, "concurrency", 6, "concurrent clients")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log the engines and the gateway to stderr")
	return cmd
}

func runDaemon(ctx context.Context, f daemonFlags) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level=%q: want debug, info, warn or error", f.logLevel)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	settings, err := config.SettingsFromOS()
	if err != nil {
		return err
	}
	ctrl, ctrlOn, err := aictrl.ConfigFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	if f.shutdownGrace <= 0 {
		return fmt.Errorf("--shutdown-grace=%s: want > 0", f.shutdownGrace)
	}
	var access io.Writer
	switch f.accessLog {
	case "":
	case "-":
		access = os.Stdout
	default:
		fh, err := os.OpenFile(f.accessLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o640)
		if err != nil {
			return fmt.Errorf("--access-log: %w", err)
		}
		defer fh.Close()
		access = fh
	}
	sec, err := openAPISecurity(f, log)
	if err != nil {
		return err
	}
	cidrs, err := config.ParseCIDRs(f.endpointCIDRs)
	if err != nil {
		return fmt.Errorf("--endpoint-cidrs: %w", err)
	}
	vips, vipObs, err := openVIPs(f, log)
	if err != nil {
		return err
	}
	if err := f.dataTLS.check(); err != nil {
		return err
	}
	gopts := gateway.Options{
		Settings: settings, TokenizerDir: f.tokenizerDir, StateDir: f.stateDir, Datapath: f.datapath,
		BPFPinDir: f.bpfPinDir, BPFInstance: pinInstance(f.api),
		DecisionHeader: f.decisionHeader, AccessLog: access, ShutdownGrace: f.shutdownGrace,
		Version: version, Revision: revision(), Logger: log, APIMiddleware: sec.guard.Wrap, EndpointCIDRs: cidrs,
		RulesFile: f.rulesFile, RulesFileInterval: f.rulesFileEvery,
		TLSCertDir: f.dataTLS.certDir, TLSReloadInterval: f.dataTLS.reloadInterval, TLSHandshakeTimeout: f.dataTLS.handshakeTimeout,
	}
	if f.rulesFile != "" {
		// Replicas load one file: start the round-robin cursors at a random
		// point so replicas do not pick endpoints in step (docs/replicas.md).
		gopts.CursorStart = rand.Uint64()
	}
	if gopts.BackendTokenDir, err = backendTokenDir(f.backendTokenDir); err != nil {
		return err
	}
	if vips != nil {
		gopts.VIPs = vips
		defer func() {
			if err := vips.Close(); err != nil {
				log.Warn("removing VIPs at exit", "err", err)
			}
		}()
	}
	g, err := gateway.New(gopts)
	if err != nil {
		return err
	}
	if vips != nil {
		vipObs.m.Store(g.Metrics)
		// The persisted rules have claimed their VIPs again: what the record
		// still holds belongs to rules deleted while kvgate was down.
		if err := vips.Prune(); err != nil {
			log.Warn("removing VIPs of deleted rules", "err", err)
		}
	}
	sec.bind(g.Metrics)
	ln, err := net.Listen("tcp", f.api)
	if err != nil {
		g.Shutdown()
		return fmt.Errorf("--api %s: %w", f.api, err)
	}
	ln = sec.listen(ln)

	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	sec.run(ctx)
	if f.metricsAddr != "" {
		maddr, err := serveMetrics(ctx, f.metricsAddr, g.Metrics, log)
		if err != nil {
			_ = ln.Close()
			g.Shutdown()
			return err
		}
		log.Info("metrics listener", "addr", maddr.String())
	}
	if ctrlOn {
		// Experimental and off unless LOXILB_AI_CTRL_ADDR is set (docs/controller.md).
		app, err := aictrl.NewApplier(ctrl, g, g.Metrics.Registry, log)
		if err != nil {
			_ = ln.Close()
			g.Shutdown()
			return err
		}
		go app.Run(ctx)
		log.Info("ai controller applier on", "addr", ctrl.Addr, "gateway_id", ctrl.GatewayID)
	}
	log.Info("kvgate started", "version", version, "api", ln.Addr().String(), "api_tls", sec.tls != nil,
		"api_tokens", sec.guard.Enabled(), "tokenizer_dir", f.tokenizerDir, "state_dir", f.stateDir, "datapath", f.datapath)
	err = runBounded(ctx, g.Run, ln, f.shutdownGrace, shutdownCut, log)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	log.Info("kvgate stopped")
	return err
}

// shutdownCut is how long, after --shutdown-grace, the gateway may take to
// cut the streams still running and stop before the process exits anyway.
const shutdownCut = 5 * time.Second

// errShutdownBound says the shutdown outlived its hard bound.
var errShutdownBound = errors.New("shutdown exceeded --shutdown-grace plus the cut bound; exiting with streams cut")

// runBounded runs the gateway until ctx ends and makes the shutdown grace a
// hard bound (docs/body-leg.md, "Shutdown"): once ctx ends, run has grace to
// let streams finish, during which the gateway cuts what is left at the
// grace's end, plus cut to return. If it has not returned by then (a body
// leg that does not honour its cancellation), runBounded returns
// errShutdownBound and the process exits: the kernel closes every socket,
// which ends the remaining streams, and the next start removes the BPF pins
// left behind. A second signal during the shutdown exits at once.
func runBounded(ctx context.Context, run func(context.Context, net.Listener) error, ln net.Listener,
	grace, cut time.Duration, log *slog.Logger) error {
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", grace)
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	bound := time.NewTimer(grace + cut)
	defer bound.Stop()
	select {
	case err := <-done:
		return err
	case <-bound.C:
		log.Error("shutdown did not finish within its bound; exiting", "grace", grace, "cut", cut)
		return errShutdownBound
	case sig := <-again:
		log.Warn("second signal during shutdown; exiting now", "signal", sig.String())
		return fmt.Errorf("%s during shutdown: exiting with streams cut", sig)
	}
}

// pinInstance names this daemon's BPF pin subdirectory after its API
// address, so a restart of the same instance finds (and clears) its own
// stale pins and two instances never share pins. bpffs refuses names with a
// dot (EPERM), so 127.0.0.1:9090 becomes api_127_0_0_1_9090.
func pinInstance(api string) string {
	r := strings.NewReplacer("/", "_", ":", "_", ".", "_", "%", "_", "[", "", "]", "")
	return "api_" + r.Replace(api)
}

func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return strings.TrimSpace(s.Value)
			}
		}
	}
	return "unknown"
}
