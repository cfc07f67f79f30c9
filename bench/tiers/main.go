// Command tiers measures tier-aware scoring against GPU-only scoring on a
// workload whose working set exceeds the fleet's GPU KV cache but fits its
// GPU and CPU tiers together: enginesim engines with a CPU offload tier
// (--num-cpu-blocks) behind an in-process kvgate (pkg/gateway, the userspace
// data path, as bench/routing does), once with the default
// LLB_KV_TIER_WEIGHTS and once with CPU=0,STORAGE=0. Results go in
// docs/selection.md ("Offload tiers in the score: routing effect").
//
//	go run ./bench/tiers -tokenizer pkg/tokenizer/testdata/qwen3
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/inventory"
)

const model = "Qwen/Qwen3-0.6B"

type options struct {
	tokDir               string
	engines, gpu, cpu    int
	docs, requests, conc int
	docChars             int
	seed                 uint64
	timeScale            float64
	weights              []string
}

func main() {
	var o options
	flag.StringVar(&o.tokDir, "tokenizer", "pkg/tokenizer/testdata/qwen3", "Qwen3 tokenizer directory")
	flag.IntVar(&o.engines, "engines", 4, "engines in the fleet")
	flag.IntVar(&o.gpu, "num-gpu-blocks", 300, "each engine's GPU KV blocks (16 tokens)")
	flag.IntVar(&o.cpu, "num-cpu-blocks", 1200, "each engine's CPU offload tier in blocks")
	flag.IntVar(&o.docs, "docs", 40, "distinct shared prefixes (documents)")
	flag.IntVar(&o.docChars, "doc-chars", 4000, "characters per document (~1000 tokens)")
	flag.IntVar(&o.requests, "requests", 400, "requests per policy")
	flag.IntVar(&o.conc, "concurrency", 4, "clients in flight")
	flag.Uint64Var(&o.seed, "seed", 1, "workload seed")
	flag.Float64Var(&o.timeScale, "time-scale", 1, "enginesim --time-scale")
	flag.Parse()
	o.weights = []string{"GPU=1.0,CPU=0.8,STORAGE=0.25", "CPU=0,STORAGE=0"}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "tiers:", err)
		os.Exit(1)
	}
}

type result struct {
	weights        string
	prompt, cached int
	ttft           []time.Duration
	reloaded       float64
	errors         int
}

func run(o options) error {
	abs, err := filepath.Abs(o.tokDir)
	if err != nil {
		return fmt.Errorf("tokenizer dir: %w", err)
	}
	tok, err := enginesim.LoadTokenizer(abs)
	if err != nil {
		return fmt.Errorf("load tokenizer: %w", err)
	}
	stage, err := os.MkdirTemp("", "kvgate-bench-tiers-")
	if err != nil {
		return fmt.Errorf("staging dir: %w", err)
	}
	defer os.RemoveAll(stage)
	if err := os.Symlink(abs, filepath.Join(stage, "Qwen__Qwen3-0.6B")); err != nil {
		return fmt.Errorf("stage tokenizer: %w", err)
	}
	fmt.Printf("fleet: %d engines × %d GPU + %d CPU blocks (llama3-8b-h100, time scale %g); %d docs of %d chars, %d requests, concurrency %d, seed %d\n",
		o.engines, o.gpu, o.cpu, o.timeScale, o.docs, o.docChars, o.requests, o.conc, o.seed)
	fmt.Println("| LLB_KV_TIER_WEIGHTS | cached-token ratio | TTFT p50 (ms) | TTFT p90 (ms) | tokens reloaded from CPU | errors |")
	fmt.Println("|---|---|---|---|---|---|")
	var rows []result
	for _, w := range o.weights {
		r, err := runPolicy(o, tok, stage, w)
		if err != nil {
			return err
		}
		rows = append(rows, r)
		fmt.Printf("| `%s` | %.3f | %.1f | %.1f | %.0f | %d |\n", w, float64(r.cached)/float64(max(r.prompt, 1)),
			ms(pct(r.ttft, 50), o.timeScale), ms(pct(r.ttft, 90), o.timeScale), r.reloaded, r.errors)
	}
	if len(rows) == 2 {
		a, b := rows[0], rows[1]
		fmt.Printf("ratios tier-aware / GPU-only: cached-token ratio %.2f, TTFT p50 %.2f, p90 %.2f\n",
			(float64(a.cached)/float64(max(a.prompt, 1)))/(float64(b.cached)/float64(max(b.prompt, 1))),
			float64(pct(a.ttft, 50))/float64(pct(b.ttft, 50)), float64(pct(a.ttft, 90))/float64(pct(b.ttft, 90)))
	}
	return nil
}

func ms(d time.Duration, scale float64) float64 {
	return float64(d) / float64(time.Millisecond) / scale
}

func pct(v []time.Duration, p int) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func runPolicy(o options, tok enginesim.Tokenizer, stage, weights string) (result, error) {
	res := result{weights: weights}
	block := fmt.Sprintf("127.%d.%d.", 100+rand.IntN(150), rand.IntN(250))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	engines, zmq, err := enginesim.StartGroup(o.engines, 10,
		func() (int, error) { return testnet.FreePortPair(block+"11", 1000) },
		func(i, port int) enginesim.Config {
			host := fmt.Sprintf("%s%d", block, 11+i)
			return enginesim.Config{Host: host, ID: fmt.Sprintf("engine-%d", i), Model: model, Tokenizer: tok,
				PythonHashSeed: "0", HashSeedSet: true,
				KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port), ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", host, port+1000),
				PerfModel: "llama3-8b-h100", NumGPUBlocks: o.gpu, NumCPUBlocks: o.cpu, TimeScale: o.timeScale, Logger: log}
		})
	if err != nil {
		return res, fmt.Errorf("start fleet: %w", err)
	}
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	if settings.TierWeights, err = inventory.ParseTierWeights(weights); err != nil {
		return res, fmt.Errorf("weights: %w", err)
	}
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: stage, Datapath: "userspace", Logger: log, ShutdownGrace: time.Second})
	if err != nil {
		return res, fmt.Errorf("kvgate: %w", err)
	}
	defer g.Shutdown()
	url, err := applyRule(g, block, zmq, engines)
	if err != nil {
		return res, err
	}
	docs := make([]string, o.docs)
	for i := range docs {
		var b strings.Builder
		fmt.Fprintf(&b, "Document %d.", i)
		for j := 0; b.Len() < o.docChars; j++ {
			fmt.Fprintf(&b, " Section %d of record %d notes that shard %d replicated item %d.", j, i, (i*7+j)%13, i*1000+j)
		}
		docs[i] = b.String()
	}
	rng := rand.New(rand.NewPCG(o.seed, 7))
	order := make([]int, o.requests)
	for i := range order {
		order[i] = rng.IntN(o.docs)
	}
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	cl := &http.Client{Timeout: 60 * time.Second}
	for range o.conc {
		wg.Go(func() {
			for {
				mu.Lock()
				if next >= len(order) {
					mu.Unlock()
					return
				}
				i := next
				next++
				mu.Unlock()
				prompt := docs[order[i]] + fmt.Sprintf(" Question %d: what did shard %d replicate?", i, i%13)
				t0 := time.Now()
				p, c, err := complete(cl, url, prompt)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					res.errors++
				} else {
					res.prompt += p
					res.cached += c
					res.ttft = append(res.ttft, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, e := range engines {
		res.reloaded += scrape(cl, e.URL(), "vllm:external_prefix_cache_hits_total")
	}
	return res, nil
}

func applyRule(g *gateway.Gateway, block string, zmq int, engines []*enginesim.Engine) (string, error) {
	host := block + "1"
	port, err := testnet.FreePort(host)
	if err != nil {
		return "", err
	}
	args := map[string]any{"externalIP": host, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
		"kvExactMode": 3, "kvZmqPort": zmq, "kvBlockSize": 16, "kvHashAlgo": "sha256_cbor"}
	var eps []map[string]any
	for _, e := range engines {
		h, p, err := net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
		if err != nil {
			return "", fmt.Errorf("engine URL %q: %w", e.URL(), err)
		}
		pn, _ := strconv.Atoi(p)
		eps = append(eps, map[string]any{"endpointIP": h, "targetPort": pn, "weight": 1})
	}
	body, _ := json.Marshal(map[string]any{"serviceArguments": args, "endpoints": eps})
	var rule config.Rule
	if err := json.Unmarshal(body, &rule); err != nil {
		return "", fmt.Errorf("rule: %w", err)
	}
	id, err := g.API.Apply(&rule, nil)
	if err != nil {
		return "", fmt.Errorf("create rule: %w", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for g.ConnectedSubscribers(id) < len(engines) {
		if time.Now().After(deadline) {
			return "", errors.New("KV-event subscribers did not connect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // ZeroMQ subscriptions settle just after the connect
	return fmt.Sprintf("http://%s:%d", host, port), nil
}

func complete(cl *http.Client, url, prompt string) (promptTokens, cached int, err error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	resp, err := cl.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return 0, 0, fmt.Errorf("post: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var out struct {
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
		return 0, 0, fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	return out.Usage.Prompt, out.Usage.Details.Cached, nil
}

func scrape(cl *http.Client, base, name string) float64 {
	resp, err := cl.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			v, err := strconv.ParseFloat(rest[strings.LastIndex(rest, " ")+1:], 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}
