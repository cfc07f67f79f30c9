package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Benchmarks (compare with bench/tokenizer/run.sh, which runs the
// HuggingFace JS reference on the same inputs in the same run):
//
//	go test -run XXX -bench . ./pkg/tokenizer
//
// Each reports MB/s (b.SetBytes) and tokens/s.

func warAndPeace(b *testing.B) []string {
	b.Helper()
	path := filepath.Join("testdata", "bench_war_and_peace.jsonl")
	if _, err := os.Stat(path); err != nil {
		path = "/work/shared/vectors/tokenizer/bench_war_and_peace.jsonl"
		if _, err := os.Stat(path); err != nil {
			b.Skip("no bench_war_and_peace.jsonl")
		}
	}
	return readJSONLines[string](b, path)
}

func benchTokenizer(b *testing.B, name string, opts ...Option) *Tokenizer {
	b.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name, "tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	return mustParse(b, data, opts...)
}

func (t *Tokenizer) resetCaches() {
	if c := t.model.cache; c != nil {
		for i := range c.shards {
			c.shards[i].mu.Lock()
			clear(c.shards[i].m)
			c.shards[i].mu.Unlock()
		}
	}
	if c := t.chunks; c != nil {
		c.reset()
	}
}

func reportTokens(b *testing.B, tokens int) {
	b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkWarAndPeace encodes the 4,000 paragraphs one by one (as 4,000
// requests). cold: caches emptied before each pass (the word cache fills
// during the pass, as HF's does); nocache: no caches at all; warm: a second
// pass over the same paragraphs.
func BenchmarkWarAndPeace(b *testing.B) {
	paras := warAndPeace(b)
	total := 0
	for _, p := range paras {
		total += len(p)
	}
	for _, name := range []string{"qwen3", "llama3"} {
		tk := benchTokenizer(b, name)
		nocache := benchTokenizer(b, name, WithWordCache(0), WithPrefixCache(0))
		tokens := 0
		for _, p := range paras {
			ids, _ := tk.Encode(p, false)
			tokens += len(ids)
		}
		run := func(b *testing.B, tk *Tokenizer, reset bool) {
			b.SetBytes(int64(total))
			for i := 0; i < b.N; i++ {
				if reset {
					b.StopTimer()
					tk.resetCaches()
					b.StartTimer()
				}
				for _, p := range paras {
					if _, err := tk.Encode(p, false); err != nil {
						b.Fatal(err)
					}
				}
			}
			reportTokens(b, tokens)
		}
		b.Run(name+"/cold", func(b *testing.B) { run(b, tk, true) })
		b.Run(name+"/nocache", func(b *testing.B) { run(b, nocache, false) })
		b.Run(name+"/warm", func(b *testing.B) { tk.resetCaches(); run(b, tk, false) })
	}
}

// longPrompt joins paragraphs from start until about n tokens.
func longPrompt(tk *Tokenizer, paras []string, start, tokens int) string {
	var sb strings.Builder
	count := 0
	for i := start; count < tokens; i = (i + 1) % len(paras) {
		sb.WriteString(paras[i])
		sb.WriteString("\n\n")
		ids, _ := tk.Encode(paras[i]+"\n\n", false)
		count += len(ids)
	}
	return sb.String()
}

// BenchmarkLongPrompt: a 32k-token prompt. cold: no caches warm (the
// issue's ≤ 30 ms goal); warm90: 90% of the prompt was seen in an earlier
// request and the last 10% is new each time (goal ≤ 3 ms); repeat: the same
// prompt again.
func BenchmarkLongPrompt(b *testing.B) {
	paras := warAndPeace(b)
	for _, name := range []string{"qwen3", "llama3"} {
		tk := benchTokenizer(b, name)
		prompt := longPrompt(tk, paras, 100, 32000)
		ids, _ := tk.Encode(prompt, false)
		b.Run(fmt.Sprintf("%s/cold/%dtokens", name, len(ids)), func(b *testing.B) {
			b.SetBytes(int64(len(prompt)))
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				tk.resetCaches()
				b.StartTimer()
				if _, err := tk.Encode(prompt, false); err != nil {
					b.Fatal(err)
				}
			}
			reportTokens(b, len(ids))
		})
		b.Run(fmt.Sprintf("%s/repeat/%dtokens", name, len(ids)), func(b *testing.B) {
			tk.resetCaches()
			_, _ = tk.Encode(prompt, false)
			b.SetBytes(int64(len(prompt)))
			for i := 0; i < b.N; i++ {
				if _, err := tk.Encode(prompt, false); err != nil {
					b.Fatal(err)
				}
			}
			reportTokens(b, len(ids))
		})
		b.Run(fmt.Sprintf("%s/warm90/%dtokens", name, len(ids)), func(b *testing.B) {
			tk.resetCaches()
			seen := prompt[:len(prompt)*9/10]
			_, _ = tk.Encode(seen, false)
			rng := rand.New(rand.NewPCG(7, uint64(b.N)))
			// Fresh 10% suffixes: random paragraph sequences from elsewhere.
			suffixes := make([]string, b.N)
			for i := range suffixes {
				var sb strings.Builder
				for sb.Len() < len(prompt)/10 {
					sb.WriteString(paras[1000+rng.IntN(len(paras)-1000)])
					sb.WriteString("\n\n")
				}
				suffixes[i] = sb.String()[:len(prompt)/10]
			}
			b.SetBytes(int64(len(prompt)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := tk.Encode(seen+suffixes[i], false); err != nil {
					b.Fatal(err)
				}
			}
			reportTokens(b, len(ids))
		})
	}
}

// BenchmarkLoad parses a tokenizer.json (the pool's first-use cost).
func BenchmarkLoad(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3"} {
		data, err := os.ReadFile(filepath.Join("testdata", name, "tokenizer.json"))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := 0; i < b.N; i++ {
				if _, err := Parse(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
