// Package demo is `kvgate demo`: it starts simulated vLLM engines in-process
// on 127.0.0.11… (internal/enginesim, with the Qwen3 tokenizer committed in the
// repo), a kvgate gateway with a KV rule (kvExactMode 3) and, for contrast,
// a plain round-robin rule over a second, identical set of engines, then runs
// the same bounded shared-prefix workload (RAG preambles, few-shot headers,
// multi-turn chats, a hot system prompt) through each and prints a table:
// requests, tier-1.5 hits, hit ratio, cached-token ratio and client-measured
// TTFT p50/p90. No root, no network beyond loopback, no flags.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// Model is the model name the demo serves.
const Model = "Qwen/Qwen3-0.6B"

// PerfModel is the engines' timing profile: vLLM's step loop with an 8B
// model's costs on an H100 (docs/enginesim.md), so load and cache affinity
// cost what they would on a real fleet.
const PerfModel = enginesim.DefaultPerfModel

// Options tune the demo; the zero value is the README's run.
type Options struct {
	// TokenizerDir holds tokenizer.json and tokenizer_config.json of the
	// Qwen3 tokenizer; "" finds pkg/tokenizer/testdata/qwen3 from the
	// working directory upwards.
	TokenizerDir string
	Engines      int // simulated engines per side (default 4)
	Concurrency  int // concurrent clients (default 6)
	Seed         uint64
	Logger       *slog.Logger // nil: discard
}

// Result is one side of the comparison.
type Result struct {
	Name          string
	Requests      int
	Errors        int
	Hits          int
	PromptTokens  int
	CachedTokens  int
	TTFT          []time.Duration
	PerEngineReqs map[string]int
}

// HitRatio is hits / requests.
func (r Result) HitRatio() float64 { return ratio(r.Hits, r.Requests) }

// CachedRatio is cached prompt tokens / prompt tokens.
func (r Result) CachedRatio() float64 { return ratio(r.CachedTokens, r.PromptTokens) }

// Percentile returns the p-th TTFT percentile (0 < p ≤ 100).
func (r Result) Percentile(p float64) time.Duration {
	if len(r.TTFT) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), r.TTFT...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// FindTokenizerDir looks for pkg/tokenizer/testdata/qwen3 from dir upwards.
func FindTokenizerDir(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		cand := filepath.Join(d, "pkg", "tokenizer", "testdata", "qwen3")
		if _, err := os.Stat(filepath.Join(cand, "tokenizer.json")); err == nil {
			return cand, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("demo: no pkg/tokenizer/testdata/qwen3/tokenizer.json above %s; run from the kvgate repository or pass --tokenizer-dir", dir)
		}
	}
}

// Run runs the demo and writes the table to out.
func Run(ctx context.Context, out io.Writer, opts Options) error {
	if opts.Engines <= 0 {
		opts.Engines = 4
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 6
	}
	if opts.Seed == 0 {
		opts.Seed = 42
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.TokenizerDir == "" {
		wd, _ := os.Getwd()
		d, err := FindTokenizerDir(wd)
		if err != nil {
			return err
		}
		opts.TokenizerDir = d
	}
	// Stage the tokenizer where the gateway's pool looks: <dir>/<slug>/.
	staging, err := os.MkdirTemp("", "kvgate-demo-tokenizers-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer os.RemoveAll(staging)
	abs, err := filepath.Abs(opts.TokenizerDir)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := os.Symlink(abs, filepath.Join(staging, "Qwen__Qwen3-0.6B")); err != nil {
		return fmt.Errorf("demo: stage tokenizer: %w", err)
	}
	tok, err := enginesim.LoadTokenizer(abs)
	if err != nil {
		return fmt.Errorf("demo: load tokenizer from %s: %w", abs, err)
	}

	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: staging, DecisionHeader: true,
		Logger: log, ShutdownGrace: 2 * time.Second})
	if err != nil {
		return err
	}
	defer g.Shutdown()

	work := Workload(opts.Seed)
	fmt.Fprintf(out, "kvgate demo: %d simulated vLLM engines per side (%s, Qwen3 tokenizer, block 16, sha256_cbor), %d requests, %d clients\n",
		opts.Engines, Model, len(work), opts.Concurrency)

	var results []Result
	for side, kv := range []bool{true, false} {
		name := "kvgate (KV-aware)"
		if !kv {
			name = "round-robin"
		}
		engines, zmqPort, err := startEngines(tok, opts.Engines, 11+side*10, log)
		if err != nil {
			return err
		}
		res, err := runSide(ctx, g, name, kv, engines, zmqPort, work, opts.Concurrency)
		for _, e := range engines {
			e.Close()
		}
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	PrintTable(out, results)
	return nil
}

// startEngines starts n engines on 127.0.0.<first>…, all publishing KV
// events on one free port (a rule has one kvZmqPort).
func startEngines(tok enginesim.Tokenizer, n, first int, log *slog.Logger) ([]*enginesim.Engine, int, error) {
	engines, port, err := enginesim.StartGroup(n, 20,
		func() (int, error) { return freePort(fmt.Sprintf("127.0.0.%d", first)) },
		func(i, port int) enginesim.Config {
			host := fmt.Sprintf("127.0.0.%d", first+i)
			return enginesim.Config{
				Host: host, ID: fmt.Sprintf("engine-%d", i), Model: Model, Tokenizer: tok,
				PythonHashSeed: "0", HashSeedSet: true,
				KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port),
				ReplayEndpoint:   "none",
				PerfModel:        PerfModel,
				Logger:           log,
			}
		})
	if err != nil {
		return nil, 0, fmt.Errorf("demo: %w", err)
	}
	return engines, port, nil
}

func freePort(host string) (int, error) {
	for i := 0; i < 50; i++ {
		ln, err := net.Listen("tcp", host+":0")
		if err != nil {
			return 0, fmt.Errorf("demo: %w", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if p+1000 <= 65535 {
			return p, nil
		}
	}
	return 0, errors.New("demo: no free port")
}

func runSide(ctx context.Context, g *gateway.Gateway, name string, kv bool, engines []*enginesim.Engine, zmqPort int, work []Request, conc int) (Result, error) {
	port, err := freePort("127.0.0.1")
	if err != nil {
		return Result{}, err
	}
	args := map[string]any{"externalIP": "127.0.0.1", "port": port, "protocol": "tcp", "sel": 0, "mode": 4}
	if kv {
		args["kvExactMode"] = 3
		args["kvZmqPort"] = zmqPort
		args["kvBlockSize"] = 16
		args["kvHashAlgo"] = "sha256_cbor"
	}
	var eps []map[string]any
	for _, e := range engines {
		host, port, err := hostPort(e.URL())
		if err != nil {
			return Result{}, err
		}
		eps = append(eps, map[string]any{"endpointIP": host, "targetPort": port, "weight": 1})
	}
	body, _ := json.Marshal(map[string]any{"serviceArguments": args, "endpoints": eps})
	var rule config.Rule
	if err := json.Unmarshal(body, &rule); err != nil {
		return Result{}, fmt.Errorf("demo: rule: %w", err)
	}
	id, err := g.API.Apply(&rule, nil)
	if err != nil {
		return Result{}, fmt.Errorf("demo: create rule: %w", err)
	}
	if kv {
		if err := waitSubscribers(ctx, g, id, len(engines)); err != nil {
			return Result{}, err
		}
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	res := runWorkload(ctx, base, work, conc)
	res.Name = name
	return res, nil
}

// hostPort splits an engine URL ("http://127.0.0.11:34567") into its parts.
func hostPort(u string) (string, int, error) {
	h, p, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
	if err != nil {
		return "", 0, fmt.Errorf("demo: engine URL %q: %w", u, err)
	}
	n, err := strconv.Atoi(p)
	return h, n, err
}

func waitSubscribers(ctx context.Context, g *gateway.Gateway, id, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		up := g.ConnectedSubscribers(id)
		if up >= n {
			// ZeroMQ subscriptions settle just after the connect.
			time.Sleep(200 * time.Millisecond)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: only %d of %d KV-event subscribers connected", up, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Request is one workload step: a chat whose messages may extend an
// earlier step of the same conversation (Conv ≥ 0, Turn > 0 waits for it).
type Request struct {
	Conv     int
	Turn     int
	Messages []map[string]string
}

func runWorkload(ctx context.Context, base string, work []Request, conc int) Result {
	res := Result{PerEngineReqs: map[string]int{}}
	var mu sync.Mutex
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	// Turns of one conversation run in order; conversations run in parallel.
	convs := map[int][]Request{}
	var order []int
	for _, r := range work {
		if _, ok := convs[r.Conv]; !ok {
			order = append(order, r.Conv)
		}
		convs[r.Conv] = append(convs[r.Conv], r)
	}
	jobs := make(chan []Request)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range jobs {
				for _, r := range seq {
					one := doChat(ctx, client, base, r.Messages)
					mu.Lock()
					res.Requests++
					if one.err != nil {
						res.Errors++
					} else {
						res.PromptTokens += one.prompt
						res.CachedTokens += one.cached
						res.TTFT = append(res.TTFT, one.ttft)
						res.PerEngineReqs[one.engine]++
						if strings.Contains(one.decision, "tier=1.5") {
							res.Hits++
						}
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, c := range order {
		select {
		case jobs <- convs[c]:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	return res
}

type chatResult struct {
	ttft           time.Duration
	prompt, cached int
	engine         string
	decision       string
	err            error
}

// doChat sends one streaming chat completion and measures the time to the
// first content chunk.
func doChat(ctx context.Context, client *http.Client, base string, msgs []map[string]string) chatResult {
	body, _ := json.Marshal(map[string]any{
		"model": Model, "messages": msgs, "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return chatResult{err: err}
	}
	defer resp.Body.Close()
	out := chatResult{engine: resp.Header.Get("x-engine-id"), decision: resp.Header.Get("x-kvgate-decision")}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		out.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		if line == sc.Text() || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		if out.ttft == 0 && len(chunk.Choices) > 0 {
			out.ttft = time.Since(start)
		}
		if chunk.Usage != nil {
			out.prompt = chunk.Usage.PromptTokens
			if chunk.Usage.Details != nil {
				out.cached = chunk.Usage.Details.Cached
			}
		}
	}
	if out.ttft == 0 {
		out.err = errors.New("stream ended without a token")
	}
	return out
}

// PrintTable writes the side-by-side comparison.
func PrintTable(out io.Writer, results []Result) {
	fmt.Fprintf(out, "\n%-20s %9s %14s %10s %19s %10s %10s\n", "routing", "requests", "tier-1.5 hits", "hit ratio", "cached-token ratio", "TTFT p50", "TTFT p90")
	for _, r := range results {
		fmt.Fprintf(out, "%-20s %9d %14d %9.1f%% %18.1f%% %10s %10s\n", r.Name, r.Requests, r.Hits, 100*r.HitRatio(),
			100*r.CachedRatio(), fmtDur(r.Percentile(50)), fmtDur(r.Percentile(90)))
	}
	for _, r := range results {
		if r.Errors > 0 {
			fmt.Fprintf(out, "%s: %d requests failed\n", r.Name, r.Errors)
		}
	}
	if len(results) == 2 && results[1].Percentile(50) > 0 {
		fmt.Fprintf(out, "\nSame workload on identical engines: kvgate sends each request to the engine that already holds its prefix,\n"+
			"so engines skip recomputing it (%.1f%% of prompt tokens cached against %.1f%%; %s).\n",
			100*results[0].CachedRatio(), 100*results[1].CachedRatio(), compareP50(results[0], results[1]))
	}
}

// compareP50 words the TTFT p50 comparison without claiming a gain the run
// did not show: within 5% is a tie on a machine this noisy.
func compareP50(kv, rr Result) string {
	ratio := float64(rr.Percentile(50)) / float64(max(kv.Percentile(50), 1))
	switch {
	case ratio >= 1.05:
		return fmt.Sprintf("TTFT p50 %.1fx lower than round-robin", ratio)
	case ratio > 1/1.05:
		return "TTFT p50 within 5% of round-robin"
	default:
		return fmt.Sprintf("TTFT p50 %.1fx higher than round-robin", 1/ratio)
	}
}

func fmtDur(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + "ms"
}

// Workload builds the bounded shared-prefix workload: a hot system prompt
// shared by every conversation, RAG conversations that each carry one of a
// few document preambles, few-shot conversations that share a header, and
// multi-turn chats whose turns extend each other.
func Workload(seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	system := "You are a careful assistant for an operations team. " + prose(rng, 220)
	var docs []string
	for i := 0; i < 8; i++ {
		docs = append(docs, fmt.Sprintf("Document %d. ", i+1)+prose(rng, 500))
	}
	fewShot := "Answer in the style of these examples.\n"
	for i := 0; i < 5; i++ {
		fewShot += fmt.Sprintf("Q: %s?\nA: %s.\n", prose(rng, 12), prose(rng, 30))
	}
	var out []Request
	conv := 0
	add := func(turns int, first string) {
		msgs := []map[string]string{{"role": "system", "content": system}}
		for t := 0; t < turns; t++ {
			q := first
			if t > 0 {
				q = "Follow-up: " + prose(rng, 25) + "?"
			}
			msgs = append(msgs, map[string]string{"role": "user", "content": q})
			out = append(out, Request{Conv: conv, Turn: t, Messages: append([]map[string]string(nil), msgs...)})
			msgs = append(msgs, map[string]string{"role": "assistant", "content": prose(rng, 40)})
		}
		conv++
	}
	for i := 0; i < 24; i++ { // RAG: document preamble + question, 2 turns
		add(2, "Context:\n"+docs[i%len(docs)]+"\n\nQuestion: "+prose(rng, 20)+"?")
	}
	for i := 0; i < 12; i++ { // few-shot header + question
		add(1, fewShot+"Q: "+prose(rng, 15)+"?")
	}
	for i := 0; i < 10; i++ { // multi-turn chats
		add(4, prose(rng, 60)+"?")
	}
	return out
}

var words = strings.Fields(`the cluster node queue latency request token cache block prefix engine worker
route balance shard replica memory budget window stream event batch sequence gap replay tensor prompt model
scheduler throughput capacity policy fleet region service gateway upstream response header status metric
label counter gauge histogram alert incident review deploy rollout canary config secret volume network
packet socket kernel splice buffer thread core mutex channel context deadline retry backoff circuit probe`)

func prose(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}
