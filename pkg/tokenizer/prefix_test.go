package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// growthAtoms are pieces whose joins stress the cut: a pre-tokenizer split
// or a BPE merge across the old/new boundary, an added token completed by
// the new text, whitespace runs that change how the scanner splits, and
// characters NFC composes with what follows; and invalid UTF-8 (a stray
// byte, a rune cut in two that the next text may complete), which the
// encode replaces by U+FFFD and the cache checks only past the reused bytes.
var growthAtoms = []string{
	"\xff", "\xc3", "\xa9", "\xe6\x9d", "\xb1",
	"hello", "world", " the", "ab", "c", "abc", "hi", " ", "  ", "\n", "\n\n", " \n", "\t", "'s", "'S", "'ll",
	"123", "4567", "3.14", "東京", "語", "🙂", "👩\u200d💻", "e", "\u0301", "é", "ﬁ", "\u00a0", "x=42;", "{", "}",
	"<", "|", ">", "<|", "|>", "_start", "_end", "</s>", "<s>", "[INST]",
}

func randomGrowth(r *rand.Rand, tk *Tokenizer, n int) string {
	added := tk.AddedTokens()
	var sb strings.Builder
	for sb.Len() < n {
		switch k := r.IntN(20); {
		case k == 0 && len(added) > 0:
			sb.WriteString(added[r.IntN(min(len(added), 12))].Content)
		case k == 1 && len(added) > 0:
			// Half an added token: the next text may complete it.
			c := added[r.IntN(min(len(added), 12))].Content
			sb.WriteString(c[:len(c)/2])
		default:
			sb.WriteString(growthAtoms[r.IntN(len(growthAtoms))])
		}
	}
	return sb.String()
}

// syntheticFlagsTokenizer has added tokens with lstrip, rstrip, single_word
// and normalized set, which no staged model family uses in chat templates.
func syntheticFlagsTokenizer(t testing.TB, cache int, opts ...Option) *Tokenizer {
	added := []AddedToken{
		{ID: 400, Content: "<|a|>", Special: true},
		{ID: 401, Content: "<L>", LStrip: true, Special: true},
		{ID: 402, Content: "<R>", RStrip: true, Special: true},
		{ID: 403, Content: "abc", SingleWord: true},
		{ID: 404, Content: "hi", Normalized: true},
		{ID: 405, Content: "<|a|><L>", Special: true},
	}
	return mustParse(t, byteLevelJSON(t, false, added, nil), append([]Option{WithConversationCache(cache), withChunkMin(64)}, opts...)...)
}

// withoutConversationCache runs fn with tk's conversation cache off: the
// reference is then a full encode by the same tokenizer (one load instead of
// two; these tests do not run in parallel with others using tk).
func withoutConversationCache[T any](tk *Tokenizer, fn func() T) T {
	saved := tk.prefixes
	tk.prefixes = nil
	defer func() { tk.prefixes = saved }()
	return fn()
}

type encoded struct {
	ids []uint32
	err error
}

func TestIncrementalEncodeEqualsFull(t *testing.T) {
	type tk struct {
		name   string
		cached *Tokenizer
	}
	var cases []tk
	for _, name := range []string{"qwen3", "llama3", "llama2"} {
		data, err := os.ReadFile(filepath.Join("testdata", name, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, tk{name, mustParse(t, data, withChunkMin(64))})
	}
	cases = append(cases, tk{"synthetic-flags", syntheticFlagsTokenizer(t, DefaultConversationCacheBytes)})
	// -short (the race step) grows two conversations per tokenizer instead of
	// six; make test runs all six.
	convs := 6
	if testing.Short() {
		convs = 2
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(c.name))))
			for conv := range convs {
				text := randomGrowth(r, c.cached, minPrefixText+r.IntN(2000))
				for turn := range 8 {
					for _, special := range []bool{false, true} {
						got, err := c.cached.Encode(text, special)
						if err != nil {
							t.Fatal(err)
						}
						ref := withoutConversationCache(c.cached, func() encoded {
							ids, err := c.cached.Encode(text, special)
							return encoded{ids, err}
						})
						if ref.err != nil {
							t.Fatal(ref.err)
						}
						want := ref.ids
						if !slices.Equal(got, want) {
							i := 0
							for i < min(len(got), len(want)) && got[i] == want[i] {
								i++
							}
							t.Fatalf("conversation %d turn %d: incremental ids differ from a full encode at id %d of %d/%d", conv, turn, i, len(got), len(want))
						}
					}
					// Grow: sometimes keep it all, sometimes rewrite the tail (a
					// template that renders the last turn differently).
					keep := len(text)
					if r.IntN(2) == 0 {
						keep -= r.IntN(min(len(text), 300))
					}
					text = text[:keep] + randomGrowth(r, c.cached, 50+r.IntN(3000))
				}
			}
			if st := c.cached.PrefixStats(); st.Hits == 0 {
				t.Fatalf("no encode reused a prefix: %+v", st)
			}
		})
	}
}

func TestPrefixCacheBounded(t *testing.T) {
	const budget = 256 << 10
	tk := syntheticFlagsTokenizer(t, budget)
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 200 {
		text := fmt.Sprintf("conversation %d ", i) + randomGrowth(r, tk, minPrefixText+r.IntN(20000))
		if _, err := tk.Encode(text, false); err != nil {
			t.Fatal(err)
		}
		if st := tk.PrefixStats(); st.Bytes > budget {
			t.Fatalf("after %d texts the cache holds %d bytes, budget %d", i+1, st.Bytes, budget)
		}
	}
	if st := tk.PrefixStats(); st.Entries == 0 {
		t.Fatalf("nothing cached: %+v", st)
	}
}

// A reused prefix must still count against the token bound, and entries
// made without a word bound must not serve a bounded encode. (The chunk
// cache is off: it serves cached chunks without the word bound.)
func TestIncrementalEncodeKeepsLimits(t *testing.T) {
	tk := syntheticFlagsTokenizer(t, DefaultConversationCacheBytes, WithPrefixCache(0))
	long := "<|a|>" + strings.Repeat("q", 9000) + "<|a|>" + strings.Repeat("ab ", 3000)
	if _, err := tk.EncodeLimited(long, false, Limits{}); err != nil {
		t.Fatal(err)
	}
	grown := long + "<|a|> more"
	if _, err := tk.EncodeLimited(grown, false, Limits{MaxWordBytes: 100}); err == nil {
		t.Fatal("a 9000-byte word passed a 100-byte word bound through the cache")
	}
	ids, err := tk.EncodeLimited(grown, false, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.EncodeLimited(grown+"x", false, Limits{MaxTokens: len(ids) - 10}); err == nil {
		t.Fatal("the token bound was not applied to reused ids")
	}
}

// A growing conversation rendered by each model's own template: the
// rendering of earlier turns can change with later ones (Qwen3 drops the
// reasoning of older assistant turns; the generation prompt moves), so the
// reused ids must be those of the shared bytes only.
func TestIncrementalEncodeChatEqualsFull(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name, "tokenizer.json")
			cached, err := LoadModel(path)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(3, 4))
			msgs := []map[string]any{{"role": "system", "content": randomGrowth(r, cached.Tokenizer, 3000)}}
			for turn := range 10 {
				if turn%2 == 1 {
					content := randomGrowth(r, cached.Tokenizer, 2000)
					if name == "qwen3" && r.IntN(2) == 0 {
						content = "<think>\n" + randomGrowth(r, cached.Tokenizer, 300) + "\n</think>\n\n" + content
					}
					msgs = append(msgs, map[string]any{"role": "assistant", "content": content})
				} else {
					msgs = append(msgs, map[string]any{"role": "user", "content": randomGrowth(r, cached.Tokenizer, 2000)})
				}
				if msgs[len(msgs)-1]["role"] != "user" {
					continue // templates require ending with a user turn
				}
				req := ChatRequest{Messages: slices.Clone(msgs)}
				got, _, err := cached.EncodeChat(req)
				if err != nil {
					t.Fatal(err)
				}
				ref := withoutConversationCache(cached.Tokenizer, func() encoded {
					ids, _, err := cached.EncodeChat(req)
					return encoded{ids, err}
				})
				if ref.err != nil {
					t.Fatal(ref.err)
				}
				want := ref.ids
				if !slices.Equal(got, want) {
					t.Fatalf("turn %d: incremental chat ids differ from a full encode (%d vs %d ids)", turn, len(got), len(want))
				}
			}
			if st := cached.PrefixStats(); st.Hits == 0 {
				t.Fatalf("no turn reused a prefix: %+v", st)
			}
		})
	}
}

// The pool's models report their cache lookups to the observer the daemon
// wires to kvgate_tokenize_prefix_lookups_total, and their held bytes.
func TestPoolConversationCacheObserved(t *testing.T) {
	dir := t.TempDir()
	stage(t, dir, "Qwen__Qwen3-0.6B", "qwen3")
	var hits, misses, reused int
	pool := NewPool(dir, WithTokenizerOptions(WithConversationObserver(func(hit bool, n int) {
		if hit {
			hits++
		} else {
			misses++
		}
		reused += n
	})))
	m, err := pool.Get("Qwen/Qwen3-0.6B")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	msgs := []map[string]any{{"role": "system", "content": randomGrowth(r, m.Tokenizer, 9000)}, {"role": "user", "content": "first question"}}
	for turn := range 3 {
		if _, _, err := m.EncodeChat(ChatRequest{Messages: slices.Clone(msgs)}); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprintf("answer %d", turn)}, map[string]any{"role": "user", "content": "and then?"})
	}
	if misses != 1 || hits != 2 || reused < 2*9000 {
		t.Fatalf("observed %d misses, %d hits, %d reused bytes; want 1, 2, ≥ 18000", misses, hits, reused)
	}
	if st := pool.PrefixStats(); st.Entries != 1 || st.Bytes <= 9000 || st.Hits != 2 {
		t.Fatalf("pool stats %+v: want one entry (each turn supersedes the last) of more than 9000 bytes, 2 hits", st)
	}
}
