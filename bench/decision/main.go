// Command decision measures what one routing decision costs at long context:
// the gateway's own stages (extract, tokenize = chat-template render + encode,
// hash) run in-process on the same functions the router calls, for ~100k-token
// chat prompts whose first ~90% was seen before (warm) and for conversations
// never seen (cold). It reports CPU per request (getrusage, so GC counts) and
// per-stage latency p50/p99, and the goal's figures: the wall p99 of the
// decision (sum of stages) and process CPU p50/p99 per request, over 300
// requests by default so that a p99 is not just the slowest of a few. See
// docs/tokenizer.md, "Decision cost at long context".
//
//	go run ./bench/decision                       # both modes, the staged tokenizer of pkg/tokenizer/testdata/qwen3
//	go run ./bench/decision -requests 40 -tokens 100000 -seen 0.9
package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/pkg/chattemplate"
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/reqfacts"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"golang.org/x/sys/unix"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "decision:", err)
		os.Exit(1)
	}
}

type config struct {
	tokenizerPath string
	requests      int
	tokens        int
	seen          float64
	blockSize     int
	modes         string
	variants      string
	cpuProfile    string
	memProfile    string
	slowest       int
	users         int
}

func run() error {
	var c config
	flag.StringVar(&c.tokenizerPath, "tokenizer", "pkg/tokenizer/testdata/qwen3/tokenizer.json", "tokenizer.json (with tokenizer_config.json beside it)")
	flag.IntVar(&c.requests, "requests", 300, "measured requests per mode (≥ 300 for a p99 that means something)")
	flag.IntVar(&c.tokens, "tokens", 100_000, "approximate prompt tokens per request")
	flag.Float64Var(&c.seen, "seen", 0.9, "fraction of the prompt seen before in warm mode")
	flag.IntVar(&c.blockSize, "block-size", 16, "KV block size in tokens")
	flag.StringVar(&c.modes, "modes", "cold,warm", "modes to run, in order: cold, warm, users (-users conversations under one system prompt, each seen before, taking turns)")
	flag.IntVar(&c.users, "users", 4, "conversations of the users mode")
	flag.StringVar(&c.variants, "variants", "before,after", "before: message cache, tokenizer conversation cache and hash chain cache off; after: all on (the daemon's defaults) and the ids in a reused buffer (tokenizer.IDPool, as the router releases it after hashing); nopool: after without the IDPool")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured requests here")
	flag.IntVar(&c.slowest, "slowest", 0, "also list the n requests of longest decision wall time, stage by stage (what makes the tail)")
	flag.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile (go tool pprof -sample_index=alloc_space) here at the end")
	flag.Parse()
	if c.requests < 1 || c.requests > 1_000_000 || c.tokens < 1000 || c.seen <= 0 || c.seen >= 1 || c.users < 1 || c.users > 64 {
		return fmt.Errorf("need 1 ≤ -requests ≤ 1e6, -tokens ≥ 1000, 0 < -seen < 1, 1 ≤ -users ≤ 64")
	}
	fmt.Printf("machine: %s; tokenizer %s; %d requests per mode, ~%d tokens, %.0f%% seen (warm)\n",
		machine(), c.tokenizerPath, c.requests, c.tokens, c.seen*100)
	if c.cpuProfile != "" {
		pf, err := os.Create(c.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if c.memProfile != "" {
		defer writeMemProfile(c.memProfile)
	}
	for _, mode := range strings.Split(c.modes, ",") {
		for _, variant := range strings.Split(c.variants, ",") {
			res, err := measure(c, mode, variant)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", mode, variant, err)
			}
			res.print(mode+"/"+variant, min(c.slowest, c.requests))
		}
	}
	return nil
}

func writeMemProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "decision: memprofile:", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "decision: memprofile:", err)
	}
}

func machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown"
}

// words is a fixed English-like vocabulary; text drawn from it behaves like
// prose for the pre-tokenizer and BPE (the word cache warms up as it would
// on real traffic).
var words = strings.Fields(`the of and to in a is that for it as was with be by on not he I this are or his
from at which but have an they you were her she there would their we him been has when who will more no if
out so said what up its about into than them can only other new some could time these two may then do first
any my now such like our over man me even most made after also did many before must through back years where
much your way well down should because each just those people Mr how too little state good very make world
still own see men work long get here between both life being under never day same another know while last
might us great old year off come since against go came right used take three conversation routing kernel
cache block token engine gateway request 2024 3.14159 x=42; func() { return nil } café naïve 東京 🙂`)

func sentence(r *rand.Rand, approxTokens int) string {
	var sb strings.Builder
	for n := 0; n < approxTokens*4/5; n++ {
		if n > 0 {
			switch k := r.IntN(480); {
			case k < 40:
				sb.WriteString(". ")
			case k < 52:
				sb.WriteString("\n\n")
			default:
				sb.WriteByte(' ')
			}
		}
		sb.WriteString(words[r.IntN(len(words))])
	}
	return sb.String()
}

// conversation returns alternating user/assistant messages of about tokens
// tokens in turns of turnTokens, under a system prompt unique to seed.
func conversation(r *rand.Rand, seed uint64, tokens, turnTokens int) []map[string]string {
	msgs := []map[string]string{{"role": "system", "content": fmt.Sprintf("You are assistant #%d. %s", seed, sentence(r, 200))}}
	for left, i := tokens, 0; left > 0; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		n := min(turnTokens, left)
		msgs = append(msgs, map[string]string{"role": role, "content": sentence(r, n)})
		left -= n
	}
	return msgs
}

func body(model string, msgs []map[string]string) ([]byte, error) {
	return json.Marshal(map[string]any{"model": model, "messages": msgs, "stream": true, "max_tokens": 64})
}

type result struct {
	stages    map[string][]time.Duration
	stageCPU  map[string][]time.Duration
	cpu       []time.Duration
	tokens    []int
	bodyBytes []int
	allocs    []uint64 // heap bytes allocated per request
	gcs       []uint32 // GC cycles completed during each request
}

func measure(c config, mode, variant string) (*result, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var opts []tokenizer.Option
	var ids *tokenizer.IDPool
	switch variant {
	case "before":
		opts = append(opts, tokenizer.WithConversationCache(0))
	case "after":
		ids = &tokenizer.IDPool{}
	case "nopool":
	default:
		return nil, fmt.Errorf("unknown variant %q", variant)
	}
	m, err := tokenizer.LoadModel(c.tokenizerPath, opts...)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	var hopts []kvhash.Option
	if variant != "before" {
		hopts = append(hopts, kvhash.WithChainCache(16<<20)) // as the gateway's rules
	}
	h, err := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: c.blockSize, Seed: kvhash.SeedOf(kvhash.DefaultSHA256Seed)}, hopts...)
	if err != nil {
		return nil, fmt.Errorf("hasher: %w", err)
	}
	var fopts reqfacts.Options
	if variant != "before" {
		fopts.Messages = reqfacts.NewMessageCache(reqfacts.DefaultMessageCacheBytes) // as the gateway's rules
	}
	d := decider{m: m, h: h, fopts: fopts, ids: ids, append: variant != "before"}
	r := rand.New(rand.NewPCG(1, 2))
	const model = "Qwen/Qwen3-0.6B"
	seenTokens := int(float64(c.tokens) * c.seen)
	base := conversation(r, 0, seenTokens, 2000)
	var users [][]map[string]string
	switch mode {
	case "warm":
		// The conversation so far was routed before (as the previous turn).
		b, err := body(model, base)
		if err != nil {
			return nil, err
		}
		if _, err := d.decide(b); err != nil {
			return nil, err
		}
	case "users":
		// Users of one application: base's system prompt, then each user's
		// own history, each routed before.
		for u := range c.users {
			h := append([]map[string]string{base[0]}, conversation(r, uint64(u+1), seenTokens, 2000)[1:]...)
			users = append(users, h)
			b, err := body(model, h)
			if err != nil {
				return nil, err
			}
			if _, err := d.decide(b); err != nil {
				return nil, err
			}
		}
	case "cold":
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	res := &result{stages: map[string][]time.Duration{}, stageCPU: map[string][]time.Duration{}}
	for i := range c.requests {
		var msgs []map[string]string
		switch mode {
		case "cold":
			msgs = conversation(r, uint64(i+1), c.tokens, 2000)
		case "users":
			// The users take turns, a new question after their history.
			msgs = append(slices.Clone(users[i%len(users)]), map[string]string{"role": "user", "content": sentence(r, c.tokens-seenTokens)})
		default:
			// A new question each time after the same seen conversation.
			msgs = append(slices.Clone(base), map[string]string{"role": "user", "content": sentence(r, c.tokens-seenTokens)})
		}
		b, err := body(model, msgs)
		if err != nil {
			return nil, err
		}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		cpu0 := cpuTime()
		st, err := d.decide(b)
		res.cpu = append(res.cpu, cpuTime()-cpu0)
		runtime.ReadMemStats(&ms1)
		res.allocs = append(res.allocs, ms1.TotalAlloc-ms0.TotalAlloc)
		res.gcs = append(res.gcs, ms1.NumGC-ms0.NumGC)
		if err != nil {
			return nil, err
		}
		for k, v := range st.d {
			res.stages[k] = append(res.stages[k], v)
			res.stageCPU[k] = append(res.stageCPU[k], st.cpu[k])
		}
		res.tokens = append(res.tokens, st.tokens)
		res.bodyBytes = append(res.bodyBytes, len(b))
	}
	return res, nil
}

type stageTimes struct {
	d      map[string]time.Duration // wall time
	cpu    map[string]time.Duration // this thread's CPU time (no GC, no waiting for a core)
	tokens int
}

// threadCPU is the calling thread's CPU time; measure locks its goroutine
// to one thread so stage differences are the stage's own work.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// stage runs fn and records its wall and thread CPU time under name.
func (st *stageTimes) stage(name string, fn func()) {
	c0, t0 := threadCPU(), time.Now()
	fn()
	st.d[name], st.cpu[name] = time.Since(t0), threadCPU()-c0
}

// decider runs what router.prepare runs for a chat request with KV routing.
type decider struct {
	m     *tokenizer.Model
	h     *kvhash.Hasher
	fopts reqfacts.Options
	// ids, when set, lends the id buffers, given back after hashing as the
	// router does; append uses AppendChat (else EncodeChat, as before it).
	ids    *tokenizer.IDPool
	append bool
}

// decide extracts the facts, renders + encodes, hashes the blocks.
func (d *decider) decide(raw []byte) (stageTimes, error) {
	m, h, fopts := d.m, d.h, d.fopts
	st := stageTimes{d: map[string]time.Duration{}, cpu: map[string]time.Duration{}}
	var f reqfacts.Facts
	st.stage("extract", func() { f = reqfacts.ExtractPath("/v1/chat/completions", raw, "", fopts) })
	if f.Problem != "" {
		return st, fmt.Errorf("extract: %s", f.Problem)
	}
	var ids []uint32
	var err error
	st.stage("tokenize", func() {
		tools := f.Tools
		if len(tools) > 0 {
			if tools, err = chattemplate.VLLMToolDicts(tools, true); err != nil {
				err = fmt.Errorf("tools: %w", err)
				return
			}
		}
		agp := f.AddGenerationPrompt
		req := tokenizer.ChatRequest{
			Messages: f.Messages, Tools: tools, Documents: f.Documents, AddGenerationPrompt: &agp,
			ContinueFinalMessage: f.ContinueFinalMessage, ChatTemplateKwargs: f.ChatTemplateKwargs,
			AddSpecialTokens: f.SpecialTokens(),
			Limits:           tokenizer.Limits{MaxWordBytes: tokenizer.DefaultMaxWordBytes, Deadline: time.Now().Add(10 * time.Second)},
		}
		switch {
		case d.ids != nil:
			ids, err = m.AppendChat(d.ids.Get(), req)
		case d.append:
			ids, err = m.AppendChat(nil, req)
		default:
			ids, _, err = m.EncodeChat(req)
		}
	})
	if err != nil {
		return st, fmt.Errorf("tokenize: %w", err)
	}
	var hashes []uint64
	st.stage("hash", func() { hashes = h.AppendHashes(nil, ids, kvhash.Extra{}) })
	st.tokens = len(ids)
	if d.ids != nil {
		d.ids.Put(ids) // hashed: the router gives the buffer back here
	}
	if len(hashes) == 0 {
		return st, fmt.Errorf("no block hashes for %d tokens", st.tokens)
	}
	return st, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(int(float64(len(s))*p), len(s)-1)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func (r *result) print(name string, slowest int) {
	sum := func(m map[string][]time.Duration) []time.Duration {
		total := make([]time.Duration, len(r.cpu))
		for _, ds := range m {
			for i, d := range ds {
				total[i] += d
			}
		}
		return total
	}
	fmt.Printf("\n%s: median %d prompt tokens, %d KB body\n", name, r.tokens[len(r.tokens)/2], r.bodyBytes[len(r.bodyBytes)/2]>>10)
	fmt.Printf("| stage | wall p50 ms | wall p99 ms | CPU p50 ms | CPU p99 ms |\n|---|---|---|---|---|\n")
	for _, s := range []string{"extract", "tokenize", "hash"} {
		fmt.Printf("| %s | %s | %s | %s | %s |\n", s, ms(pct(r.stages[s], 0.5)), ms(pct(r.stages[s], 0.99)), ms(pct(r.stageCPU[s], 0.5)), ms(pct(r.stageCPU[s], 0.99)))
	}
	wall, cpu := sum(r.stages), sum(r.stageCPU)
	fmt.Printf("| decision | %s | %s | %s | %s |\n", ms(pct(wall, 0.5)), ms(pct(wall, 0.99)), ms(pct(cpu, 0.5)), ms(pct(cpu, 0.99)))
	fmt.Printf("| process CPU per request (GC included) | | | %s | %s |\n", ms(pct(r.cpu, 0.5)), ms(pct(r.cpu, 0.99)))
	allocs := slices.Clone(r.allocs)
	slices.Sort(allocs)
	fmt.Printf("heap allocated per request: p50 %.2f MB\n", float64(allocs[len(allocs)/2])/(1<<20))
	cycles, hit := 0, 0
	for _, n := range r.gcs {
		cycles += int(n)
		if n > 0 {
			hit++
		}
	}
	fmt.Printf("GC cycles ended during the requests: %d, in %d of %d requests\n", cycles, hit, len(r.gcs))
	// The goal figures (docs/tokenizer.md, "Decision cost at long context").
	if slowest > 0 {
		order := make([]int, len(wall))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int { return cmp.Compare(wall[b], wall[a]) })
		fmt.Printf("slowest requests (#, decision wall / CPU, extract, tokenize, hash wall / CPU ms, process CPU, GC cycles ended):\n")
		for _, i := range order[:slowest] {
			fmt.Printf("  #%d %s / %s", i, ms(wall[i]), ms(cpu[i]))
			for _, s := range []string{"extract", "tokenize", "hash"} {
				fmt.Printf(", %s %s / %s", s, ms(r.stages[s][i]), ms(r.stageCPU[s][i]))
			}
			fmt.Printf(", process %s, gc %d\n", ms(r.cpu[i]), r.gcs[i])
		}
	}
	fmt.Printf("goal figures: decision wall p99 %s ms over %d requests; process CPU per request p50 %s ms, p99 %s ms\n",
		ms(pct(wall, 0.99)), len(wall), ms(pct(r.cpu, 0.5)), ms(pct(r.cpu, 0.99)))
}
