package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseConfigForms(t *testing.T) {
	cases := []struct {
		name, json string
		check      func(t *testing.T, c *Config)
	}{
		{"string template", `{"chat_template": "{{ x }}", "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "pad_token": null, "add_bos_token": true}`,
			func(t *testing.T, c *Config) {
				if c.ChatTemplate != "{{ x }}" || c.BOSToken != "<s>" || c.EOSToken != "</s>" || c.PADToken != "" {
					t.Errorf("%+v", c)
				}
				if c.AddBOSToken == nil || !*c.AddBOSToken || c.AddEOSToken != nil {
					t.Errorf("add flags %v %v", c.AddBOSToken, c.AddEOSToken)
				}
				if m := c.SpecialTokensMap(); len(m) != 2 || m["bos_token"] != "<s>" || m["eos_token"] != "</s>" {
					t.Errorf("special map %v", m)
				}
			}},
		{"named templates", `{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}`,
			func(t *testing.T, c *Config) {
				if c.ChatTemplate != "D" {
					t.Errorf("default %q", c.ChatTemplate)
				}
				if s, _ := c.SelectChatTemplate(true); s != "T" {
					t.Errorf("with tools %q", s)
				}
				if s, _ := c.SelectChatTemplate(false); s != "D" {
					t.Errorf("without tools %q", s)
				}
			}},
		{"no template", `{}`, func(t *testing.T, c *Config) {
			if _, err := c.SelectChatTemplate(false); !errors.Is(err, ErrNoChatTemplate) {
				t.Errorf("err %v", err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(c.json))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, cfg)
		})
	}
	for _, bad := range []string{`{"chat_template": 5}`, `{"bos_token": 5}`, `[`} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestRealConfigs(t *testing.T) {
	q, err := LoadConfig(filepath.Join("testdata", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(q.ChatTemplate, "<|im_start|>") || q.EOSToken != "<|im_end|>" || q.BOSToken != "" || q.AddBOSToken == nil || *q.AddBOSToken {
		t.Errorf("qwen3 config %+v", q)
	}
	l, err := LoadConfig(filepath.Join("testdata", "llama3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if l.BOSToken != "<|begin_of_text|>" || l.AddBOSToken != nil {
		t.Errorf("llama3 config %+v", l)
	}
}

func boolp(b bool) *bool { return &b }

// TestEncodePromptSpecialTokens: completions add what the tokenizer says
// (vLLM: add_special_tokens defaults to true), and a request can turn it off.
func TestEncodePromptSpecialTokens(t *testing.T) {
	qwen, err := NewModel(testTokenizer(t, "qwen3"), mustConfig(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	llama, err := NewModel(testTokenizer(t, "llama3"), mustConfig(t, "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	// A Llama-3 config as Meta ships it: tokenizer.json's post-processor adds
	// BOS. Simulated here with add_bos_token, which rebuilds the template.
	llamaCfg := mustConfig(t, "llama3")
	llamaCfg.AddBOSToken = boolp(true)
	llamaBOS, err := NewModel(testTokenizer(t, "llama3"), llamaCfg)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := NewModel(mustParse(t, sentencePieceJSON(t)), Config{BOSToken: "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello world"
	cases := []struct {
		name   string
		m      *Model
		add    *bool
		prefix []uint32
	}{
		{"qwen3 default: no BOS (post-processor ByteLevel, add_bos_token false)", qwen, nil, nil},
		{"llama3 lenml file: post-processor adds nothing", llama, nil, nil},
		{"llama3 add_bos_token", llamaBOS, nil, []uint32{128000}},
		{"llama3 add_bos_token but request add_special_tokens=false", llamaBOS, boolp(false), nil},
		{"template post-processor", sp, nil, []uint32{1}},
		{"template post-processor, add_special_tokens=true", sp, boolp(true), []uint32{1}},
		{"template post-processor, off", sp, boolp(false), nil},
	}
	for _, c := range cases {
		got, err := c.m.EncodePrompt(text, c.add)
		if err != nil {
			t.Fatal(err)
		}
		plain, _ := c.m.Encode(text, false)
		want := append(slices.Clone(c.prefix), plain...)
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %v want %v", c.name, got, want)
		}
	}
}

func mustConfig(t *testing.T, name string) Config {
	c, err := LoadConfig(filepath.Join("testdata", name, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return *c
}

// stage copies testdata/<src> into dir/<slug>.
func stage(t *testing.T, dir, slug, src string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, slug), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, slug, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type countingObserver struct {
	mu             sync.Mutex
	loads, reloads int
	fails          []string
}

func (o *countingObserver) TokenizerLoaded(_ string, reload bool, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if reload {
		o.reloads++
	} else {
		o.loads++
	}
}

func (o *countingObserver) TokenizerLoadFailed(_ string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fails = append(o.fails, ErrorReason(err))
}

func TestPoolLifecycle(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	obs := &countingObserver{}
	p := NewPool(dir, withClock(clk.now), WithCheckInterval(time.Second), WithRetryBackoff(time.Second, 4*time.Second), WithObserver(obs))
	model := "Qwen/Qwen3-0.6B"
	if got := p.Path(model); got != filepath.Join(dir, "Qwen__Qwen3-0.6B", "tokenizer.json") {
		t.Fatalf("path %s", got)
	}

	// Not staged: typed not-found error, retried only after the backoff...
	if _, err := p.Get(model); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unstaged: %v", err)
	}
	if _, err := p.Get(model); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unstaged again: %v", err)
	}
	if len(obs.fails) != 1 {
		t.Fatalf("a second attempt ran inside the backoff: %v", obs.fails)
	}
	// ...but at once when the file appears (not cached forever).
	stage(t, dir, "Qwen__Qwen3-0.6B", "qwen3")
	m, err := p.Get(model)
	if err != nil {
		t.Fatalf("staged: %v", err)
	}
	if m.EOSToken != "<|im_end|>" {
		t.Errorf("config not loaded: %+v", m.Config)
	}

	// Shared: concurrent Gets return the same model.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := p.Get(model)
			if err != nil || got != m {
				t.Errorf("concurrent get: %v %p %p", err, got, m)
			}
		}()
	}
	wg.Wait()

	// A broken replacement: the old model keeps serving, the failure is
	// recorded, and a fixed file is picked up.
	tokPath := filepath.Join(dir, "Qwen__Qwen3-0.6B", "tokenizer.json")
	good, _ := os.ReadFile(tokPath)
	if err := os.WriteFile(tokPath, []byte("{broken"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk.advance(2 * time.Second)
	if got, err := p.Get(model); err != nil || got != m {
		t.Fatalf("broken reload: %v, same model %v", err, got == m)
	}
	if obs.fails[len(obs.fails)-1] != "parse" {
		t.Errorf("fail reasons %v", obs.fails)
	}
	if err := os.WriteFile(tokPath, append(good, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	clk.advance(5 * time.Second)
	m2, err := p.Get(model)
	if err != nil || m2 == m {
		t.Fatalf("reload after fix: %v, new model %v", err, m2 != m)
	}
	if obs.loads != 1 || obs.reloads != 1 {
		t.Errorf("loads %d reloads %d", obs.loads, obs.reloads)
	}

	// Unsupported and bad names are typed.
	if err := os.MkdirAll(filepath.Join(dir, "wp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "wp", "tokenizer.json"), []byte(`{"model":{"type":"WordPiece","vocab":{}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var unsup *UnsupportedModelError
	if _, err := p.Get("wp"); !errors.As(err, &unsup) || ErrorReason(err) != "unsupported" {
		t.Errorf("WordPiece: %v", err)
	}
	for _, bad := range []string{"", "..", "a\\b", "x\x00"} {
		if _, err := p.Get(bad); !errors.Is(err, ErrBadModelName) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestPoolBounded(t *testing.T) {
	p := NewPool(t.TempDir(), WithMaxModels(3))
	for i := 0; i < 20; i++ {
		if _, err := p.Get("missing-" + string(rune('a'+i))); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%d: %v", i, err)
		}
	}
	if n := len(p.entries); n > 3 {
		t.Errorf("%d entries", n)
	}
}
