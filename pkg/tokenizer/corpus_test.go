package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// loadTestTokenizer loads testdata/<name> once per test binary.
var testTokenizers sync.Map // name -> *Tokenizer

func testTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	if v, ok := testTokenizers.Load(name); ok {
		return v.(*Tokenizer)
	}
	tk, err := Load(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	v, _ := testTokenizers.LoadOrStore(name, tk)
	return v.(*Tokenizer)
}

// readJSONLines decodes one JSON value per line of path into a slice of T.
func readJSONLines[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCorpusExact checks ids against HuggingFace's (@huggingface/tokenizers
// 0.2.0, add_special_tokens=false) for every string of every corpus.
func TestCorpusExact(t *testing.T) {
	cases := []struct{ corpus, tokenizer, ids string }{
		{"corpus.jsonl", "qwen3", "corpus.qwen3.ids"},
		{"corpus.jsonl", "llama3", "corpus.llama3.ids"},
		{"extra.jsonl", "qwen3", "extra.qwen3.ids"},
		{"extra.jsonl", "llama3", "extra.llama3.ids"},
		{"corpus.jsonl", "llama2", "corpus.llama2.ids"},
		{"extra.jsonl", "llama2", "extra.llama2.ids"},
	}
	for _, c := range cases {
		t.Run(c.ids, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join("testdata", c.ids)); err != nil {
				t.Skipf("no %s", c.ids)
			}
			tk := testTokenizer(t, c.tokenizer)
			texts := readJSONLines[string](t, filepath.Join("testdata", c.corpus))
			want := readJSONLines[[]uint32](t, filepath.Join("testdata", c.ids))
			if len(texts) != len(want) {
				t.Fatalf("%d texts, %d id lines", len(texts), len(want))
			}
			bad := 0
			for i, text := range texts {
				got, err := tk.Encode(text, false)
				if err != nil {
					t.Fatalf("line %d: %v", i+1, err)
				}
				if !slices.Equal(got, want[i]) {
					bad++
					if bad <= 5 {
						t.Errorf("line %d %q:\n got %v\nwant %v", i+1, truncate(text, 200), truncateIDs(got), truncateIDs(want[i]))
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d lines differ", bad, len(texts))
			}
		})
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func truncateIDs(ids []uint32) []uint32 {
	if len(ids) > 40 {
		return ids[:40]
	}
	return ids
}

// TestLlama2SpecialTokens: the SentencePiece-style tokenizer adds its BOS on
// completions (TemplateProcessing and add_bos_token agree), as HF does.
func TestLlama2SpecialTokens(t *testing.T) {
	m, err := LoadModel(filepath.Join("testdata", "llama2"))
	if err != nil {
		t.Fatal(err)
	}
	texts := readJSONLines[string](t, filepath.Join("testdata", "corpus.jsonl"))
	want := readJSONLines[[]uint32](t, filepath.Join("testdata", "corpus.llama2.special.ids"))
	for i, text := range texts {
		for _, got := range [][]uint32{mustEncode(t, m.Tokenizer, text, true), mustEncodePrompt(t, m, text)} {
			if !slices.Equal(got, want[i]) {
				t.Fatalf("line %d %q:\n got %v\nwant %v", i+1, text, truncateIDs(got), truncateIDs(want[i]))
			}
		}
	}
}

func mustEncode(t *testing.T, tk *Tokenizer, text string, special bool) []uint32 {
	t.Helper()
	ids, err := tk.Encode(text, special)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func mustEncodePrompt(t *testing.T, m *Model, text string) []uint32 {
	t.Helper()
	ids, err := m.EncodePrompt(text, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
