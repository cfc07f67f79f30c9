package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Profile is one engine fleet: how many engines, which enginesim
// performance profile (a vLLM V1 step loop with a GPU cost model), and the KV
// capacity each engine gets. Tuning runs on one profile, headline numbers on
// the other (docs/routing-benchmark.md, "Fairness").
type Profile struct {
	Name      string
	PerfModel string // enginesim's --perf-model
	Engines   int
	// NumGPUBlocks is each engine's KV capacity in 16-token blocks, scaled
	// down from the GPU's so the capacity working set exceeds one engine.
	NumGPUBlocks int
	// TimeScale runs the engines slower than the model (wall = model ×
	// TimeScale), so a shared 2-core machine can drive the fleet past its
	// knee; every reported duration and rate is converted back to model
	// time.
	TimeScale float64
}

// Profiles: "tune" is where the SGLang router's scaled thresholds were
// chosen (seeds 1–3); "headline" is what the doc reports (seeds 4–6).
func Profiles() map[string]Profile {
	return map[string]Profile{
		"tune":     {Name: "tune", PerfModel: "qwen2.5-32b-h100-tp2", Engines: 4, NumGPUBlocks: 4000, TimeScale: 3},
		"headline": {Name: "headline", PerfModel: "llama3-8b-h100", Engines: 6, NumGPUBlocks: 4000, TimeScale: 3},
	}
}

// Env is what every point shares: the tokenizer, its staging directory for
// kvgate, and a logger.
type Env struct {
	Tokenizer    enginesim.Tokenizer
	StagingDir   string
	Log          *slog.Logger
	cleanupStage func()
}

// NewEnv loads the Qwen3 tokenizer from tokDir and stages it for kvgate
// under its model slug (<dir>/Qwen__Qwen3-0.6B, as the gateway's pool looks
// it up).
func NewEnv(tokDir string, log *slog.Logger) (*Env, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	abs, err := filepath.Abs(tokDir)
	if err != nil {
		return nil, fmt.Errorf("tokenizer dir: %w", err)
	}
	tok, err := enginesim.LoadTokenizer(abs)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", abs, err)
	}
	stage, err := os.MkdirTemp("", "kvgate-bench-routing-")
	if err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	if err := os.Symlink(abs, filepath.Join(stage, "Qwen__Qwen3-0.6B")); err != nil {
		os.RemoveAll(stage)
		return nil, fmt.Errorf("stage tokenizer: %w", err)
	}
	return &Env{Tokenizer: tok, StagingDir: stage, Log: log, cleanupStage: func() { os.RemoveAll(stage) }}, nil
}

// Close removes the staging directory.
func (e *Env) Close() {
	if e.cleanupStage != nil {
		e.cleanupStage()
	}
}

// Fleet is one fresh set of engines (empty caches).
type Fleet struct {
	Host    string // the /24 prefix "127.a.b."
	Engines []*enginesim.Engine
	ZMQPort int
}

// URLs are the engines' base URLs.
func (f *Fleet) URLs() []string {
	out := make([]string, len(f.Engines))
	for i, e := range f.Engines {
		out[i] = e.URL()
	}
	return out
}

// Close stops every engine.
func (f *Fleet) Close() {
	for _, e := range f.Engines {
		e.Close()
	}
}

// StartFleet starts p.Engines engines on a random loopback /24 (.11, .12, …),
// all publishing KV events on one port, as a kvgate rule expects.
func StartFleet(env *Env, p Profile) (*Fleet, error) {
	var lastErr error
	for range 10 {
		block := fmt.Sprintf("127.%d.%d.", 100+rand.IntN(150), rand.IntN(250))
		engines, port, err := enginesim.StartGroup(p.Engines, 10,
			func() (int, error) { return testnet.FreePortPair(block+"11", 1000) },
			func(i, port int) enginesim.Config {
				host := fmt.Sprintf("%s%d", block, 11+i)
				cfg := enginesim.Config{
					Host: host, ID: fmt.Sprintf("engine-%d", i), Model: Model, Tokenizer: env.Tokenizer,
					PythonHashSeed: "0", HashSeedSet: true,
					KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port),
					ReplayEndpoint:   fmt.Sprintf("tcp://%s:%d", host, port+1000),
					PerfModel:        p.PerfModel, NumGPUBlocks: p.NumGPUBlocks, TimeScale: p.TimeScale,
					// Every fleet serves the oracle's hooks, so engines are
					// identical whichever policy runs; only the oracle reads them.
					DebugState: true,
					Logger:     env.Log,
				}
				return cfg
			})
		if err == nil {
			return &Fleet{Host: block, Engines: engines, ZMQPort: port}, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("start fleet: %w", lastErr)
}

// Front is what the client talks to: kvgate or the bench proxy. URL may
// list several replicas separated by commas (replicas.go).
type Front struct {
	URL   string
	close func()
}

// Close stops the front.
func (f *Front) Close() {
	if f.close != nil {
		f.close()
	}
}

// StartKVGate starts an in-process kvgate (pkg/gateway, as internal/demo and
// tests/e2e do) with a kvExactMode 3 rule over the fleet and waits until it
// follows every engine's KV events. The data path is the userspace copy, the
// same hop the bench proxy makes.
//
// lb is a LOXILB_KV_LB_MODE value ("" is kvgate's default), optionally
// followed by "-noprov" (or just "noprov") to turn provisional blocks off
// (LOXILB_KV_PROVISIONAL_WEIGHT=0), as kvgate ran before it had them.
func StartKVGate(ctx context.Context, env *Env, f *Fleet, lb string) (*Front, error) {
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	lb, knobs, _ := strings.Cut(lb, "@")
	if rest, ok := strings.CutSuffix(lb, "noprov"); ok {
		lb = strings.TrimSuffix(rest, "-")
		settings.ProvisionalWeight = 0
	}
	sel, knobs := ruleSel(knobs)
	if err := kvgateKnobs(knobs, &settings); err != nil {
		return nil, fmt.Errorf("kvgate: %w", err)
	}
	mode, err := selector.ParseLBMode(lb)
	if err != nil {
		return nil, fmt.Errorf("kvgate: %w", err)
	}
	settings.LBMode = mode
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: env.StagingDir, Datapath: "userspace", DecisionHeader: true,
		Logger: env.Log, ShutdownGrace: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("kvgate: %w", err)
	}
	host := f.Host + "1"
	port, err := testnet.FreePort(host)
	if err != nil {
		g.Shutdown()
		return nil, err
	}
	args := map[string]any{"externalIP": host, "port": port, "protocol": "tcp", "sel": sel, "mode": 4,
		"kvExactMode": 3, "kvZmqPort": f.ZMQPort, "kvBlockSize": 16, "kvHashAlgo": "sha256_cbor"}
	var eps []map[string]any
	for _, e := range f.Engines {
		h, p, err := net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
		if err != nil {
			g.Shutdown()
			return nil, fmt.Errorf("engine URL %q: %w", e.URL(), err)
		}
		pn, _ := strconv.Atoi(p)
		eps = append(eps, map[string]any{"endpointIP": h, "targetPort": pn, "weight": 1})
	}
	body, _ := json.Marshal(map[string]any{"serviceArguments": args, "endpoints": eps})
	var rule config.Rule
	if err := json.Unmarshal(body, &rule); err != nil {
		g.Shutdown()
		return nil, fmt.Errorf("kvgate rule: %w", err)
	}
	id, err := g.API.Apply(&rule, nil)
	if err != nil {
		g.Shutdown()
		return nil, fmt.Errorf("kvgate create rule: %w", err)
	}
	if err := waitSubscribers(ctx, g, id, len(f.Engines)); err != nil {
		g.Shutdown()
		return nil, err
	}
	return &Front{URL: fmt.Sprintf("http://%s:%d", host, port), close: g.Shutdown}, nil
}

func waitSubscribers(ctx context.Context, g *gateway.Gateway, id, n int) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		up := g.ConnectedSubscribers(id)
		if up >= n {
			// ZeroMQ subscriptions settle just after the connect.
			time.Sleep(200 * time.Millisecond)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvgate: only %d of %d KV-event subscribers connected", up, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ruleSel takes a "selN" part out of a kvgate policy's "@" settings: the
// rule's sel, which places the requests tier 1.5 does not (0, round-robin,
// unless given).
func ruleSel(spec string) (int, string) {
	sel := 0
	var rest []string
	for _, part := range strings.Split(spec, "-") {
		if v, ok := strings.CutPrefix(part, "sel"); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= 10 {
				sel = n
				continue
			}
		}
		if part != "" {
			rest = append(rest, part)
		}
	}
	return sel, strings.Join(rest, "-")
}

// kvgateKnobs applies a kvgate policy's "@" settings, for tuning:
// "mlf150" (LOXILB_KV_MEAN_LOAD_FACTOR), "provw100"
// (LOXILB_KV_PROVISIONAL_WEIGHT), "costw100" (LOXILB_KV_COST_WORK_WEIGHT),
// "gain50" (LOXILB_KV_CAP_FULL_GAIN), "coldcost" or "coldhash"
// (LLB_KV_COLD_PLACEMENT), joined by "-".
func kvgateKnobs(spec string, s *config.Settings) error {
	if spec == "" {
		return nil
	}
	for _, part := range strings.Split(spec, "-") {
		var err error
		switch {
		case strings.HasPrefix(part, "mlf"):
			s.MeanLoadFactor, err = strconv.Atoi(part[3:])
		case strings.HasPrefix(part, "provw"):
			s.ProvisionalWeight, err = strconv.Atoi(part[5:])
		case strings.HasPrefix(part, "costw"):
			s.CostWorkWeight, err = strconv.Atoi(part[5:])
		case strings.HasPrefix(part, "gain"):
			s.CapFullGain, err = strconv.Atoi(part[4:])
		case strings.HasPrefix(part, "cold"):
			s.ColdPlacement, err = selector.ParseColdPlacement(part[4:])
		default:
			err = fmt.Errorf("unknown setting %q (want mlfN, provwN, costwN, gainN, coldsel, coldhash, coldcost)", part)
		}
		if err != nil {
			return fmt.Errorf("policy settings %q: %w", spec, err)
		}
	}
	return nil
}

// Policies in report order. kvgate's default load blend is hard, so
// "kvgate" is also kvgate-hard; "kvgate-noprov" is the default without
// provisional blocks (docs/selection.md), to measure what they change.
func Policies() []string {
	return []string{"kvgate", "kvgate-cost", "kvgate-noprov", "kvgate-off", "kvgate-soft", "kvgate-adaptive", "kvgate-adaptive-soft",
		"round-robin", "least-inflight", "least-load", "sglang", "sglang-scaled", "oracle"}
}

// StartFront starts policy name in front of the fleet.
func StartFront(ctx context.Context, env *Env, f *Fleet, p Profile, name string) (*Front, error) {
	if n, flags, ok := replicaCount(name); ok {
		return StartKVGateReplicas(ctx, env, f, n, flags)
	}
	if lb, ok := strings.CutPrefix(name, "kvgate"); ok {
		return StartKVGate(ctx, env, f, strings.TrimPrefix(lb, "-"))
	}
	urls := f.URLs()
	var pol Policy
	switch name {
	case "round-robin":
		pol = &roundRobin{n: len(urls)}
	case "least-inflight":
		pol = &leastInflight{inflight: make([]int, len(urls))}
	case "least-load":
		pol = newLeastLoad(urls)
	case "sglang":
		pol = newSGLang(name, len(urls), SGLangDefaults())
	case "sglang-scaled":
		pol = newSGLang(name, len(urls), SGLangScaled(p.NumGPUBlocks*16*charsPerToken))
	case "oracle":
		c := &http.Client{Timeout: 2 * time.Second}
		for _, u := range urls {
			if err := probeDebug(c, u); err != nil {
				return nil, err
			}
		}
		pol = newOracle(urls)
	default:
		spec, ok := strings.CutPrefix(name, "sglang@")
		if !ok {
			return nil, fmt.Errorf("policy %q: want one of %s, or sglang@absN-relF-thrF", name, strings.Join(Policies(), ", "))
		}
		cfg, err := parseSGLangSpec(spec, SGLangScaled(p.NumGPUBlocks*16*charsPerToken))
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", name, err)
		}
		pol = newSGLang(name, len(urls), cfg)
	}
	px, err := StartProxy(f.Host+"1", urls, pol, env.Log)
	if err != nil {
		pol.Close()
		return nil, err
	}
	return &Front{URL: px.URL(), close: px.Close}, nil
}

// charsPerToken is about how many characters of the workloads' English prose
// one Qwen3 token covers (a word and its space).
const charsPerToken = 7

// parseSGLangSpec reads "abs5-rel1.25-thr0.3" over base.
func parseSGLangSpec(spec string, base SGLangConfig) (SGLangConfig, error) {
	for _, part := range strings.Split(spec, "-") {
		var err error
		switch {
		case strings.HasPrefix(part, "abs"):
			base.BalanceAbsThreshold, err = strconv.Atoi(part[3:])
		case strings.HasPrefix(part, "rel"):
			base.BalanceRelThreshold, err = strconv.ParseFloat(part[3:], 64)
		case strings.HasPrefix(part, "thr"):
			base.CacheThreshold, err = strconv.ParseFloat(part[3:], 64)
		default:
			err = fmt.Errorf("unknown part %q (want absN, relF, thrF)", part)
		}
		if err != nil {
			return base, fmt.Errorf("sglang spec %q: %w", spec, err)
		}
	}
	return base, nil
}
